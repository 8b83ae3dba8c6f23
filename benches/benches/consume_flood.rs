//! A consumer that floods its stream without reading (a plain `main` that
//! prints its figures): what the broker's memory does, and whether another
//! consumer is still served meanwhile.
//!
//! The release `ricochet-broker` binary on a fresh temporary data directory
//! (defaults: `sync` durability). One raw gRPC consumer stream subscribes
//! and sends `FLOOD_FRAMES` (default 200 000) nack frames of one message
//! each (ids never delivered: each is answered INVALID_ARGUMENT), with
//! `FLOOD_DETAIL` bytes of reason text each (default 0), as fast as the
//! transport takes them, and reads nothing for `FLOOD_HOLD_SECS` (default
//! 10). Meanwhile the broker's resident set (`VmRSS`) is sampled every
//! 50 ms, and another subscription's consumer times a publish → receive
//! round trip once a second. Then the flooding client reads: the time until
//! every nack is answered. Printed: RSS before, peak RSS during the flood
//! (and `VmHWM` at the end), frames the transport took while nothing was
//! read, the other consumer's round trips, the time to answer every frame.
//!
//! `cargo build --release -p ricochet-broker && cargo bench -p
//! ricochet-benches --bench consume_flood`. `RICOCHET_BROKER_BIN` picks
//! another binary (e.g. a base build, for a before/after).

use futures::StreamExt as _;
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use ricochet_testkit::raw::{RawConsumer, RawProducer, channel};
use ricochet_testkit::{BrokerProcess, SpawnOptions, find_broker_bin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TOPIC: &str = "persistent://public/default/flood";
const OTHER: &str = "persistent://public/default/other";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A line of `/proc/<pid>/status` (`VmRSS`, `VmHWM`), in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn main() -> Result<(), BoxError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let frames = env_u64("FLOOD_FRAMES", 200_000);
    let detail = "x".repeat(env_u64("FLOOD_DETAIL", 0) as usize);
    let hold = Duration::from_secs(env_u64("FLOOD_HOLD_SECS", 10));
    let bin = find_broker_bin(None)?;
    let dir = tempfile::tempdir()?;
    let broker = BrokerProcess::spawn(dir.path(), &SpawnOptions::new().bin(&bin)).await;
    let url = broker.url().to_owned();
    let pid = broker.pid();
    println!(
        "consume_flood: {} ({frames} nack frames, {} B reason each, {} s unread)",
        bin.display(),
        detail.len(),
        hold.as_secs()
    );
    let mut p = RawProducer::open(&url, TOPIC, "p").await?;
    p.send(&["m"]).await;
    let mut other_p = RawProducer::open(&url, OTHER, "p").await?;
    let mut other = RawConsumer::simple(&url, OTHER, "other", SubscriptionType::Shared).await;
    other.flow(1_000_000).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = status_bytes(pid, "VmRSS:");

    let pulled = Arc::new(AtomicU64::new(0));
    let subscribe = ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(Subscribe {
            topic: TOPIC.into(),
            subscription: "flood".into(),
            subscription_type: SubscriptionType::Shared as i32,
            ..Default::default()
        })),
    };
    let counted = pulled.clone();
    let nacks = futures::stream::iter(1..=frames).map(move |rid| {
        counted.fetch_add(1, Ordering::Relaxed);
        ConsumeRequest {
            request: Some(consume_request::Request::Redeliver(Redeliver {
                request_id: rid,
                messages: vec![FailedDelivery {
                    id: Some(MessageId {
                        topic: TOPIC.into(),
                        entry_id: 1_000_000 + rid,
                    }),
                    detail: detail.clone(),
                    ..Default::default()
                }],
            })),
        }
    });
    let mut client = BrokerClient::new(channel(&url).await);
    let started = Instant::now();
    let mut flood = client
        .consume(futures::stream::once(async { subscribe }).chain(nacks))
        .await?
        .into_inner();

    // Unread: sample the broker's RSS; time the other consumer.
    let mut peak = before;
    let mut trips = Vec::new();
    let mut next_trip = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < hold {
        peak = peak.max(status_bytes(pid, "VmRSS:"));
        if Instant::now() >= next_trip {
            n += 1;
            let t = Instant::now();
            other_p.send(&[&format!("trip {n}")]).await;
            let got = other.next(Duration::from_secs(30)).await;
            trips.push(match got {
                Some(_) => format!("{:.1}", t.elapsed().as_secs_f64() * 1e3),
                None => "none in 30 s".to_owned(),
            });
            next_trip = t + Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let taken = pulled.load(Ordering::Relaxed);

    // Reading now: every nack is answered.
    let mut answered = 0u64;
    let read_from = Instant::now();
    let sampler = {
        let stop = Arc::new(AtomicU64::new(0));
        let s = stop.clone();
        let h = tokio::spawn(async move {
            let mut peak = 0;
            while s.load(Ordering::Relaxed) == 0 {
                peak = peak.max(status_bytes(pid, "VmRSS:"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        });
        (stop, h)
    };
    while answered < frames {
        match tokio::time::timeout(Duration::from_secs(300), flood.message()).await {
            Ok(Ok(Some(ConsumeResponse {
                response: Some(consume_response::Response::Result(_)),
            }))) => answered += 1,
            Ok(Ok(Some(_))) => {}
            other => {
                println!("flood stream ended after {answered} answers: {other:?}");
                break;
            }
        }
    }
    let read_secs = read_from.elapsed().as_secs_f64();
    sampler.0.store(1, Ordering::Relaxed);
    let peak_reading = sampler.1.await?;
    let hwm = status_bytes(pid, "VmHWM:");
    println!("RSS before the flood: {:.1} MB", mb(before));
    println!(
        "peak RSS, flood unread ({} s): {:.1} MB (+{:.1} MB); while reading: {:.1} MB; VmHWM: {:.1} MB",
        hold.as_secs(),
        mb(peak),
        mb(peak.saturating_sub(before)),
        mb(peak_reading),
        mb(hwm)
    );
    println!("frames the transport took while nothing was read: {taken} of {frames}");
    println!("other consumer's publish → receive during the flood (ms): {trips:?}");
    println!("every frame answered {read_secs:.2} s after reading began ({answered} of {frames})");
    drop(broker);
    Ok(())
}
