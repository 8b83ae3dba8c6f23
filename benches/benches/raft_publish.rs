//! Replicated-partition publish throughput (issue 22, first figures; a
//! bench binary printing its figures).
//!
//! One producer publishes `MESSAGES` 100-byte messages in batches of
//! `BATCH`, with up to `IN_FLIGHT` batches awaiting their receipts, `sync`
//! durability (every Raft log append and every applied batch fsynced),
//! through `ReplicatedPartition::publish` of the leader — the Raft group
//! in-process, its replicas talking gRPC over loopback; no client, no
//! broker service in front. Three setups on the same machine:
//!
//! * `R3`: a group of three replicas (each its own store and Raft log);
//! * `R1 raft`: a group of one (the same path, no peers);
//! * `R1 store`: the same batches applied straight to one store with one
//!   flush per batch, no Raft (what the state machine does alone).
//!
//! `cargo bench -p ricochet-benches --bench raft_publish`
//! (`RICOCHET_BENCH_MESSAGES` overrides the message count.)

use ricochet_broker::BrokerConfig;
use ricochet_broker::replication::{
    GroupRegistry, NodeSettings, PartitionCommand, PublishBatch, PublishMessage,
    ReplicatedPartition, ReplicationService, StorageApplier, open_store,
};
use ricochet_broker::storage::{TopicKind, TopicRecord};
use ricochet_replication::{Apply, encode};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

const BATCH: u64 = 100;
const IN_FLIGHT: usize = 16;
const PAYLOAD: usize = 100;
const TOPIC: &str = "persistent://public/default/bench-partition-0";

fn batch(seq: u64) -> PublishBatch {
    PublishBatch {
        topic: TOPIC.to_owned(),
        producer: "bench".to_owned(),
        publish_time_ms: 1,
        messages: (seq..seq + BATCH)
            .map(|s| PublishMessage {
                payload: vec![7; PAYLOAD],
                sequence_id: s,
                ..PublishMessage::default()
            })
            .collect(),
    }
}

fn create() -> PartitionCommand {
    PartitionCommand::CreateTopic(TopicRecord {
        name: TOPIC.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 1,
        trimmed_below: 0,
    })
}

async fn group(root: &Path, size: u64) -> Vec<Arc<ReplicatedPartition>> {
    let mut addrs = BTreeMap::new();
    let mut parts = Vec::new();
    for id in 1..=size {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.insert(id, format!("http://{}", listener.local_addr().unwrap()));
        let registry = GroupRegistry::default();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ReplicationService::new(registry.clone()).into_server())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let dir = root.join(format!("node-{id}"));
        let storage = open_store(&BrokerConfig::for_dir(dir.join("store")))
            .await
            .unwrap();
        let part = ReplicatedPartition::start(
            id,
            TOPIC,
            &dir,
            &NodeSettings::default(),
            storage,
            &registry,
        )
        .await
        .unwrap();
        parts.push(Arc::new(part));
    }
    parts[0].node().initialize(addrs).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while parts[0].node().leader() != Some(1) {
        assert!(Instant::now() < deadline, "node 1 did not become leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    parts
}

async fn run_raft(size: u64, messages: u64) -> f64 {
    let root = tempfile::tempdir().unwrap();
    let parts = group(root.path(), size).await;
    let leader = parts[0].clone();
    leader.propose(&create()).await.unwrap();
    let window = Arc::new(Semaphore::new(IN_FLIGHT));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for b in 0..messages / BATCH {
        let permit = window.clone().acquire_owned().await.unwrap();
        let leader = leader.clone();
        tasks.push(tokio::spawn(async move {
            let r = leader.publish(batch(1 + b * BATCH)).await.unwrap();
            assert_eq!(r.len() as u64, BATCH);
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    drop(parts);
    rate
}

async fn run_store(messages: u64) -> f64 {
    let root = tempfile::tempdir().unwrap();
    let storage = open_store(&BrokerConfig::for_dir(root.path().join("store")))
        .await
        .unwrap();
    let applier = StorageApplier::new(storage);
    applier.apply(1, &encode(&create()).unwrap()).unwrap();
    let started = Instant::now();
    for b in 0..messages / BATCH {
        let cmd = encode(&PartitionCommand::Publish(batch(1 + b * BATCH))).unwrap();
        applier.apply(2 + b, &cmd).unwrap();
        applier.flush().await.unwrap();
    }
    messages as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    // As the broker binary does at start (mimalloc would ask for huge pages).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    let messages: u64 = std::env::var("RICOCHET_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "raft publish: one producer, {messages} messages of {PAYLOAD} B, batches of {BATCH}, \
             {IN_FLIGHT} batches in flight, sync"
        );
        let r3 = run_raft(3, messages).await;
        println!("  R3        {r3:>10.0} msg/s");
        let r1 = run_raft(1, messages).await;
        println!("  R1 raft   {r1:>10.0} msg/s");
        let store = run_store(messages).await;
        println!("  R1 store  {store:>10.0} msg/s (no raft, one flush per batch)");
        println!("  R3 / R1 raft = {:.2}", r3 / r1);
    });
}
