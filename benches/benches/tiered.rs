//! Tiered storage figures (issue #23) against a local `moto_server` (an
//! S3-compatible server from Python's `moto[server]`, on loopback):
//!
//! 1. moto alone: a raw `object_store` put/get loop of segment-sized
//!    objects, and ranged GETs of one block: what the server itself does;
//! 2. offload throughput: a broker (in this process, `sync` durability)
//!    holds `TIERED_MB` MiB of `TIERED_MSG`-byte messages in batches of
//!    100, in segments of `segment_entries` (16384) ids; one `Offload` call
//!    writes every sealed segment as an object, reads it back to verify
//!    size and CRC-32C, and deletes the local copies (MB/s of segment
//!    files);
//! 3. cold reads: `message get` of one entry in each offloaded segment
//!    never read before (its footer, then one block: the first-byte
//!    latency of a cold read), then a consumer reading the whole topic
//!    from the earliest position through the 64 MiB block cache (MB/s of
//!    payload).
//!
//! `cargo bench -p ricochet-benches --bench tiered`. Environment:
//! `TIERED_MB` (default 256), `TIERED_MSG` (1024), `RICOCHET_MOTO_SERVER`
//! (default: `moto_server` on PATH; without one the bench says so and
//! stops).

use futures::TryStreamExt as _;
use object_store::ObjectStore as _;
use object_store::path::Path as ObjectPath;
use ricochet_broker::storage::tiered::TieredConfig;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use ricochet_testkit::raw::{RawConsumer, RawProducer, channel};
use std::time::{Duration, Instant};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mbps(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / took.as_secs_f64()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// moto alone: put and get `n` objects of `size` bytes, then ranged GETs.
async fn raw_store(endpoint: &str, size: usize, n: usize) {
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(ricochet_testkit::moto::BUCKET)
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .unwrap();
    let body = bytes::Bytes::from(vec![7u8; size]);
    let started = Instant::now();
    for i in 0..n {
        store
            .put(&ObjectPath::from(format!("raw/{i}")), body.clone().into())
            .await
            .unwrap();
    }
    let put = started.elapsed();
    let started = Instant::now();
    for i in 0..n {
        let got = store
            .get(&ObjectPath::from(format!("raw/{i}")))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(got.len(), size);
    }
    let get = started.elapsed();
    let mut ranged = Vec::new();
    for i in 0..50u64 {
        let at = (i * 997 * 4096) % (size as u64 - (1 << 20));
        let started = Instant::now();
        store
            .get_range(
                &ObjectPath::from(format!("raw/{}", i as usize % n)),
                at..at + (1 << 20),
            )
            .await
            .unwrap();
        ranged.push(started.elapsed());
    }
    ranged.sort();
    let total = (size * n) as u64;
    println!(
        "moto alone (object_store put/get of {n} objects of {} MiB, one at a time): put {:.1} MB/s, get {:.1} MB/s; 1 MiB ranged GET p50 {:.1} ms, p99 {:.1} ms",
        size >> 20,
        mbps(total, put),
        mbps(total, get),
        pct(&ranged, 0.5).as_secs_f64() * 1e3,
        pct(&ranged, 0.99).as_secs_f64() * 1e3,
    );
    let keys: Vec<ObjectPath> = store
        .list(Some(&ObjectPath::from("raw")))
        .map_ok(|o| o.location)
        .try_collect()
        .await
        .unwrap();
    for k in keys {
        store.delete(&k).await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let Some(moto) = ricochet_testkit::moto_or_skip("tiered bench") else {
        return;
    };
    let mb = env("TIERED_MB", 256);
    let msg = env("TIERED_MSG", 1024);
    let segment_entries = 16_384u64;
    raw_store(&moto.endpoint(), 16 << 20, 8).await;

    let cfg_dir = tempfile::tempdir().unwrap();
    let tier = TieredConfig {
        url: format!("s3://{}/bench", ricochet_testkit::moto::BUCKET),
        endpoint: Some(moto.endpoint()),
        region: Some("us-east-1".into()),
        allow_http: true,
        credentials_file: Some(ricochet_testkit::MotoServer::credentials_file(
            cfg_dir.path(),
        )),
        interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let b = InProcessBroker::start_with(move |c| {
        c.segment_entries = segment_entries;
        c.tiered = Some(tier);
    })
    .await;
    let url = b.url();
    let topic = "persistent://public/default/tiered-bench";
    let total = (mb << 20) / msg;
    let payload = "x".repeat(msg);
    let mut p = RawProducer::open(&url, topic, "").await.unwrap();
    let started = Instant::now();
    let batch: Vec<&str> = vec![payload.as_str(); 100];
    for _ in 0..total.div_ceil(100) {
        p.send(&batch).await;
    }
    let n = total.div_ceil(100) * 100;
    println!(
        "published {n} messages of {msg} B ({:.0} MiB) in {:.1} s (sync)",
        (n * msg) as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );

    let mut tiered = TieredClient::new(channel(&url).await);
    let started = Instant::now();
    let done = tiered
        .offload(TieredOffloadRequest {
            topic: topic.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    println!(
        "offload: {} segments, {:.0} MiB in {:.2} s = {:.1} MB/s (write + read-back verify + local delete)",
        done.offloaded_segments,
        done.offloaded_bytes as f64 / (1 << 20) as f64,
        took.as_secs_f64(),
        mbps(done.offloaded_bytes, took)
    );

    // Cold first-byte latency: one entry per offloaded segment, never read.
    let mut admin = AdminClient::new(channel(&url).await);
    let mut cold = Vec::new();
    for seg in 0..done.offloaded_segments as u64 {
        let id = seg * segment_entries + segment_entries / 2;
        let started = Instant::now();
        admin
            .get_message(GetMessageRequest {
                id: Some(MessageId {
                    topic: topic.into(),
                    entry_id: id,
                }),
            })
            .await
            .unwrap();
        cold.push(started.elapsed());
    }
    cold.sort();
    println!(
        "cold read (message get, footer + one 1 MiB block): p50 {:.1} ms, max {:.1} ms over {} segments",
        pct(&cold, 0.5).as_secs_f64() * 1e3,
        cold.last().unwrap().as_secs_f64() * 1e3,
        cold.len()
    );

    let mut c = RawConsumer::simple(&url, topic, "bench", SubscriptionType::Exclusive).await;
    let started = Instant::now();
    let mut got = 0usize;
    let mut bytes = 0u64;
    c.flow(1000).await;
    while got < n {
        let m = c.next(Duration::from_secs(30)).await.expect("a message");
        bytes += m.payload.len() as u64;
        got += 1;
        if got.is_multiple_of(500) {
            c.flow(500).await;
        }
        if got.is_multiple_of(1000) {
            c.ack_cumulative(m.id.clone().unwrap(), got as u64).await;
        }
    }
    let took = started.elapsed();
    println!(
        "tiered read (a consumer from earliest, {got} messages, {:.0} MiB of payload): {:.1} s = {:.1} MB/s",
        bytes as f64 / (1 << 20) as f64,
        took.as_secs_f64(),
        mbps(bytes, took)
    );
    drop(b);
}
