//! Catch-up time of a new replica of a replicated partition (issue 22; a
//! bench binary printing its figures).
//!
//! A group of one (node 1, `sync`: every log append and applied batch
//! fsynced) takes `RICOCHET_BENCH_MIB` MiB of messages (default 1024: 1
//! GiB) of `PAYLOAD` bytes in batches of `BATCH`, through
//! `ReplicatedPartition::publish`; then it builds a snapshot and purges its
//! log behind it, as the snapshot policy does. A new, empty node 2 is then
//! added with `ReplicaNode::change_voters` (what replacing a member does):
//! openraft adds it as a learner, sends it the snapshot in chunks over
//! gRPC on loopback, it installs it, takes the log after it, and the
//! membership switches. Printed: the fill, the snapshot build, and for the
//! catch-up the transfer (until the received file is complete and renamed),
//! the install (until node 2 reports the snapshot), and the switch.
//!
//! `cargo bench -p ricochet-benches --bench catch_up`

use ricochet_broker::BrokerConfig;
use ricochet_broker::replication::{
    GroupRegistry, NodeSettings, PartitionCommand, PublishBatch, PublishMessage,
    ReplicatedPartition, ReplicationService, open_store,
};
use ricochet_broker::storage::{TopicKind, TopicRecord};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

const BATCH: u64 = 64;
const PAYLOAD: usize = 16 << 10;
const IN_FLIGHT: usize = 8;
const TOPIC: &str = "persistent://public/default/catch-up-partition-0";

/// Batch `b` (its own producer: batches in flight together may be applied
/// in any order, and one producer's lower sequence ids after higher ones
/// would be dropped as duplicates).
fn batch(b: u64) -> PublishBatch {
    let seq = 1 + b * BATCH;
    PublishBatch {
        topic: TOPIC.to_owned(),
        producer: format!("bench-{b}"),
        publish_time_ms: 1,
        messages: (seq..seq + BATCH)
            .map(|s| PublishMessage {
                payload: vec![(s % 251) as u8; PAYLOAD],
                sequence_id: s,
                ..PublishMessage::default()
            })
            .collect(),
    }
}

fn settings() -> NodeSettings {
    NodeSettings {
        // Built explicitly once filled (the policy would build one every
        // so many entries; the catch-up is the same).
        snapshot_every: 0,
        snapshot_keep: 0,
        ..NodeSettings::default()
    }
}

async fn node(root: &Path, id: u64) -> (Arc<ReplicatedPartition>, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
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
    let part = ReplicatedPartition::start(id, TOPIC, &dir, &settings(), storage, &registry)
        .await
        .unwrap();
    (Arc::new(part), addr)
}

fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(list) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in list.flatten() {
        let Ok(m) = e.metadata() else { continue };
        total += if m.is_dir() {
            dir_size(&e.path())
        } else {
            m.len()
        };
    }
    total
}

/// Whether a whole snapshot file (`.snap`) is under `dir`.
fn has_snap(dir: &Path) -> bool {
    let Ok(groups) = std::fs::read_dir(dir) else {
        return false;
    };
    groups.flatten().any(|g| {
        std::fs::read_dir(g.path()).is_ok_and(|files| {
            files
                .flatten()
                .any(|f| f.path().extension().is_some_and(|e| e == "snap"))
        })
    })
}

fn main() {
    // As the broker binary does at start (mimalloc would ask for huge pages).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    let mib: u64 = std::env::var("RICOCHET_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let root = tempfile::tempdir().unwrap();
        let (leader, addr1) = node(root.path(), 1).await;
        leader
            .node()
            .initialize(BTreeMap::from([(1, addr1.clone())]))
            .await
            .unwrap();
        while leader.node().leader() != Some(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        leader
            .propose(&PartitionCommand::CreateTopic(TopicRecord {
                name: TOPIC.to_owned(),
                created_ms: 1,
                kind: TopicKind::Normal,
                replicas: 3,
                trimmed_below: 0,
            }))
            .await
            .unwrap();
        let batches = (mib << 20) / (BATCH * PAYLOAD as u64);
        println!(
            "catch-up: {batches} batches of {BATCH} x {PAYLOAD} B ({} MiB of payload), sync, loopback",
            (batches * BATCH * PAYLOAD as u64) >> 20
        );
        let window = Arc::new(Semaphore::new(IN_FLIGHT));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for b in 0..batches {
            let permit = window.clone().acquire_owned().await.unwrap();
            let leader = leader.clone();
            tasks.push(tokio::spawn(async move {
                leader.publish(batch(b)).await.unwrap();
                drop(permit);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let fill = started.elapsed();
        let store = dir_size(&root.path().join("node-1/store"));
        println!(
            "  fill (group of one)      {:>8.1} s  ({:.0} MiB/s; store {} MiB)",
            fill.as_secs_f64(),
            (mib as f64) / fill.as_secs_f64(),
            store >> 20
        );

        let started = Instant::now();
        leader.node().raft().trigger().snapshot().await.unwrap();
        let last = leader.node().applied_index();
        while leader.node().snapshot_index() < last {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        leader
            .node()
            .raft()
            .trigger()
            .purge_log(last.unwrap())
            .await
            .unwrap();
        let snap_bytes = dir_size(&root.path().join("node-1/raft-snapshots"));
        println!(
            "  snapshot build           {:>8.1} s  ({} MiB file, covers index {last:?})",
            started.elapsed().as_secs_f64(),
            snap_bytes >> 20
        );

        let (learner, addr2) = node(root.path(), 2).await;
        let snaps2 = root.path().join("node-2/raft-snapshots");
        let started = Instant::now();
        let change = {
            let leader = leader.clone();
            tokio::spawn(async move {
                leader
                    .node()
                    .change_voters(
                        BTreeMap::from([(1, addr1), (2, addr2)]),
                        Duration::from_secs(3600),
                    )
                    .await
            })
        };
        let mut transferred = None;
        let mut installed = None;
        while !change.is_finished() {
            if transferred.is_none() && has_snap(&snaps2) {
                transferred = Some(started.elapsed());
            }
            if installed.is_none() && learner.node().snapshot_index().is_some() {
                installed = Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        change.await.unwrap().unwrap();
        let total = started.elapsed();
        let caught = learner.node().applied_index();
        let t = transferred.unwrap_or(total);
        let i = installed.unwrap_or(total);
        println!(
            "  new replica caught up    {:>8.1} s  ({:.0} MiB/s of payload; applied index {caught:?})",
            total.as_secs_f64(),
            (mib as f64) / total.as_secs_f64()
        );
        println!(
            "    snapshot transfer      {:>8.1} s  (chunks over gRPC until the file is whole)",
            t.as_secs_f64()
        );
        println!(
            "    snapshot install       {:>8.1} s  (the replica's copy replaced, flushed)",
            i.saturating_sub(t).as_secs_f64()
        );
        println!(
            "    log after it + switch  {:>8.1} s  (joint consensus, two membership entries)",
            total.saturating_sub(i).as_secs_f64()
        );
        let held = |p: &ReplicatedPartition| p.storage().entry_range(TOPIC).unwrap();
        let (want, have) = (held(&leader), held(&learner));
        println!("  entries: leader {want:?}, new replica {have:?}");
        assert_eq!(want, have, "the new replica holds other entries");
        assert_eq!(want.1 - want.0, batches * BATCH, "entries missing");
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "  load average at the end: {}",
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
    });
}
