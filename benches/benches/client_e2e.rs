//! End-to-end client figures through an in-process broker (a plain `main`
//! that prints them):
//!
//! 1. produce → consume → ack throughput of 100-byte messages with batching,
//!    in `Durability::Sync` and `Durability::Interval`;
//! 2. publish latency p50/p99 at a fixed moderate rate (hdrhistogram);
//! 3. the negative-ack tracker at 1 000 000 outstanding ids: memory per id
//!    and the cost of an insert and of an expiry;
//! 4. redelivery lateness for 10 000 concurrent nacks: how long after its
//!    delay each nacked message is delivered again (and that none is early),
//!    for the timer alone and end to end through the broker;
//! 5. the cost of ack receipts: consume + ack of a stored backlog with
//!    receipts off and on (acks pipelined, up to 10 000 awaiting their
//!    receipt), in both durability modes, and receipts off with a 30 s ack
//!    timeout (each take told to the consumer's driver);
//! 6. one producer, many in flight: 200 000 messages (100 B, then 1 KiB) on
//!    a fresh topic, at most 256 sends awaiting their receipt, both modes;
//! 7. the producer's queue bound: the same with 20 000 sends awaiting their
//!    receipt, `Sync`, once with the default bound (1000 pending messages,
//!    so `send_async` waits for room) and once with a bound of 1 000 000
//!    messages and 4 GiB, and the ratio of the two.
//!
//! `cargo bench -p ricochet-benches --bench client_e2e`. Environment:
//! `CLIENT_E2E_QUICK=1` for a short run, `CLIENT_E2E_ONLY=lateness` (or
//! `tracker`, `receipts`, `window`, `queue`) for part 4 (or 3, 5, 6, 7) only, `CLIENT_E2E_NACKS=N` for another burst size,
//! `CLIENT_E2E_DEBUG=1` to print when nacks and redeliveries happened.
//!
//! The in-process broker runs on mimalloc, the broker binary's allocator,
//! so the figures are the binary's allocator's (and `MIMALLOC_*` options,
//! such as `MIMALLOC_PURGE_DELAY`, act on them), with transparent huge
//! pages off as the binary runs (`ricochet_broker::process`). Part 3's RSS
//! delta is mimalloc's too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ricochet_broker::Durability;
use ricochet_client::tracker::DelayTracker;
use ricochet_client::{Client, InitialPosition, SubscriptionType};
use ricochet_testkit::InProcessBroker;

// The same allocator as the broker binary (jemalloc with the feature).
#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn quick() -> bool {
    std::env::var_os("CLIENT_E2E_QUICK").is_some()
}

fn main() -> Result<(), BoxError> {
    // As the broker binary does at start (every later fault obeys it).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    // Criterion-style filters may be passed by `cargo bench`; ignore them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "client_e2e: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let only = std::env::var("CLIENT_E2E_ONLY").unwrap_or_default();
    if only.is_empty() {
        rt.block_on(async {
            for durability in [Durability::Sync, Durability::Interval] {
                throughput(durability).await?;
            }
            publish_latency().await?;
            Ok::<_, BoxError>(())
        })?;
        tracker_at_scale();
    }
    if only == "tracker" {
        tracker_at_scale();
        return Ok(());
    }
    if only.is_empty() || only == "window" {
        rt.block_on(async {
            for durability in [Durability::Sync, Durability::Interval] {
                for size in [100, 1024] {
                    single_producer(durability, size, 256, None).await?;
                }
            }
            Ok::<_, BoxError>(())
        })?;
        if only == "window" {
            return Ok(());
        }
    }
    if only.is_empty() || only == "queue" {
        rt.block_on(async {
            for size in [100, 1024] {
                let bounded = single_producer(Durability::Sync, size, 20_000, None).await?;
                let large =
                    single_producer(Durability::Sync, size, 20_000, Some(1_000_000)).await?;
                println!(
                    "queue bound, Sync, {size} B: default (1000) / 1 000 000 = {:.2}",
                    bounded / large
                );
            }
            Ok::<_, BoxError>(())
        })?;
        if only == "queue" {
            return Ok(());
        }
    }
    if only.is_empty() || only == "receipts" {
        rt.block_on(async {
            for durability in [Durability::Sync, Durability::Interval] {
                for (receipts, group) in [(false, 100), (true, 100), (true, 5)] {
                    ack_receipts(durability, receipts, Duration::from_millis(group), None).await?;
                }
                // With an ack timeout each take is told to the consumer's
                // driver too.
                let timeout = Some(Duration::from_secs(30));
                ack_receipts(durability, false, Duration::from_millis(100), timeout).await?;
            }
            Ok::<_, BoxError>(())
        })?;
        if only == "receipts" {
            return Ok(());
        }
    }
    rt.block_on(async {
        timer_lateness().await;
        let sizes = match std::env::var("CLIENT_E2E_NACKS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            Some(n) => vec![n],
            None => vec![100, 1_000, 10_000],
        };
        for durability in [Durability::Sync, Durability::Interval] {
            for &n in &sizes {
                redelivery_lateness(durability, n).await?;
            }
        }
        Ok::<_, BoxError>(())
    })?;
    Ok(())
}

async fn broker(durability: Durability) -> Result<(InProcessBroker, Client), BoxError> {
    let broker = InProcessBroker::start_with(|c| {
        c.durability = durability;
        c.flush_interval = Duration::from_millis(50);
    })
    .await;
    let client = Client::connect(broker.url()).await?;
    Ok((broker, client))
}

async fn throughput(durability: Durability) -> Result<(), BoxError> {
    let n: usize = if quick() { 20_000 } else { 200_000 };
    let (broker, client) = broker(durability).await?;
    let topic = format!("tput-{durability:?}");
    let mut consumer = client
        .consumer(&topic)
        .subscription("bench")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await?;
    let producer = client.producer(&topic).create().await?;
    let payload = vec![b'x'; 100];
    let start = Instant::now();
    let consume = tokio::spawn(async move {
        for _ in 0..n {
            let m = consumer.receive().await?;
            consumer.ack(&m).await?;
        }
        consumer.close().await?;
        Ok::<_, ricochet_client::Error>(Instant::now())
    });
    // Keep a window of receipts outstanding.
    let mut window = std::collections::VecDeque::new();
    for _ in 0..n {
        window.push_back(producer.send_async(payload.clone()).await?);
        if window.len() >= 20_000
            && let Some(f) = window.pop_front()
        {
            f.await?;
        }
    }
    for f in window {
        f.await?;
    }
    let produced = start.elapsed();
    let consumed = consume.await??.duration_since(start);
    producer.close().await?;
    println!(
        "throughput {durability:?}: {n} x 100 B, batching on: publish {:.0} msg/s ({:.2?}), produce->consume->ack {:.0} msg/s ({:.2?})",
        n as f64 / produced.as_secs_f64(),
        produced,
        n as f64 / consumed.as_secs_f64(),
        consumed
    );
    drop(client);
    broker.shutdown().await;
    Ok(())
}

/// One producer on one connection, `n` messages of `size` bytes, at most
/// `window` sends awaiting their receipt: the usual "async publish with a
/// window" shape; with `max_pending`, that queue bound (and 4 GiB) instead
/// of the default. Returns messages per second.
async fn single_producer(
    durability: Durability,
    size: usize,
    window: usize,
    max_pending: Option<usize>,
) -> Result<f64, BoxError> {
    let n: usize = if quick() { 20_000 } else { 200_000 };
    let (broker, client) = broker(durability).await?;
    let mut builder = client.producer(format!("window-{durability:?}-{size}"));
    if let Some(m) = max_pending {
        builder = builder.max_pending_messages(m).max_pending_bytes(4 << 30);
    }
    let producer = builder.create().await?;
    let bound = max_pending.map_or("default".to_owned(), |m| m.to_string());
    let payload = vec![b'x'; size];
    let start = Instant::now();
    let mut pending = std::collections::VecDeque::with_capacity(window);
    for _ in 0..n {
        if pending.len() >= window
            && let Some(f) = pending.pop_front()
        {
            f.await?;
        }
        pending.push_back(producer.send_async(payload.clone()).await?);
    }
    for f in pending {
        f.await?;
    }
    let took = start.elapsed();
    let rate = n as f64 / took.as_secs_f64();
    println!(
        "one producer, window {window}, queue bound {bound}, {durability:?}, {n} x {size} B: {rate:.0} msg/s ({took:.2?})"
    );
    producer.close().await?;
    drop(client);
    broker.shutdown().await;
    Ok(rate)
}

/// Consume + ack of a stored backlog of 100-byte messages: every message is
/// acked as it arrives, the ack futures pipelined (at most 10 000 awaiting
/// their receipt), then `flush` confirms the last ones.
async fn ack_receipts(
    durability: Durability,
    receipts: bool,
    group: Duration,
    ack_timeout: Option<Duration>,
) -> Result<(), BoxError> {
    use futures::StreamExt;
    let n: usize = if quick() { 20_000 } else { 200_000 };
    let (broker, client) = broker(durability).await?;
    let topic = format!("receipts-{durability:?}-{receipts}-{}", group.as_millis());
    let producer = client.producer(&topic).create().await?;
    let payload = vec![b'x'; 100];
    let mut sends = Vec::with_capacity(n);
    for _ in 0..n {
        sends.push(producer.send_async(payload.clone()).await?);
    }
    for f in sends {
        f.await?;
    }
    let mut consumer = client
        .consumer(&topic)
        .subscription("bench")
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(receipts)
        .ack_group_time(group)
        .ack_timeout(ack_timeout.unwrap_or_default())
        .subscribe()
        .await?;
    let start = Instant::now();
    let mut pending = futures::stream::FuturesUnordered::new();
    for _ in 0..n {
        let m = consumer.receive().await?;
        let acker = consumer.acker();
        pending.push(async move { acker.ack(&m).await });
        while pending.len() >= 10_000 {
            if let Some(r) = pending.next().await {
                r?;
            }
        }
    }
    while let Some(r) = pending.next().await {
        r?;
    }
    consumer.flush().await?;
    let took = start.elapsed();
    consumer.close().await?;
    println!(
        "consume + ack {durability:?}, receipts {}, ack group {group:?}{}: {n} x 100 B in {took:.2?}, {:.0} msg/s",
        if receipts { "on " } else { "off" },
        ack_timeout.map_or(String::new(), |t| format!(", ack timeout {t:?}")),
        n as f64 / took.as_secs_f64()
    );
    producer.close().await?;
    drop(client);
    broker.shutdown().await;
    Ok(())
}

async fn publish_latency() -> Result<(), BoxError> {
    let rate = 2_000u64; // msg/s
    let secs = if quick() { 2 } else { 5 };
    for durability in [Durability::Sync, Durability::Interval] {
        let (broker, client) = broker(durability).await?;
        let producer = client.producer("latency").create().await?;
        let payload = vec![b'x'; 100];
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let total = rate * secs;
        let per_tick = rate / 1000;
        let mut sent = 0;
        while sent < total {
            tick.tick().await;
            for _ in 0..per_tick {
                let t0 = Instant::now();
                let f = producer.send_async(payload.clone()).await?;
                let tx = tx.clone();
                tokio::spawn(async move {
                    let ok = f.await.is_ok();
                    let _ = tx.send((ok, t0.elapsed()));
                });
                sent += 1;
            }
        }
        drop(tx);
        let mut h = Histogram::<u64>::new(3)?;
        let mut failed = 0;
        while let Some((ok, d)) = rx.recv().await {
            if ok {
                h.record(d.as_micros() as u64)?;
            } else {
                failed += 1;
            }
        }
        println!(
            "publish latency {durability:?} at {rate} msg/s x {secs} s (100 B, batching, linger 1 ms): p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms, failed {failed}",
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.value_at_quantile(0.999) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
        );
        producer.close().await?;
        drop(client);
        broker.shutdown().await;
    }
    Ok(())
}

/// Resident set size in bytes, from /proc (0 where unavailable).
fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<usize>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

fn tracker_at_scale() {
    const N: u64 = 1_000_000;
    // The consumer's key: (topic index, entry id).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build();
    let Ok(rt) = rt else { return };
    let _guard = rt.enter();
    let before = rss();
    let mut t: DelayTracker<(u32, u64)> = DelayTracker::new(Duration::from_millis(1));
    let now = tokio::time::Instant::now();
    let start = Instant::now();
    for i in 0..N {
        // Delays spread over 0..60 s, as with a multiplier backoff.
        let delay = Duration::from_millis((i.wrapping_mul(2_654_435_761)) % 60_000);
        t.insert_after((0, i), delay, now);
    }
    let insert = start.elapsed();
    let after = rss();
    let estimate = t.memory_estimate();
    // Expire in 1 ms steps, as the consumer's timer does.
    let mut out = Vec::with_capacity(64);
    let start = Instant::now();
    let mut fired = 0usize;
    let mut steps = 0usize;
    while let Some(next) = t.next_deadline() {
        out.clear();
        fired += t.pop_due(next, &mut out);
        steps += 1;
    }
    let expire = start.elapsed();
    println!(
        "nack tracker, {N} outstanding ids (16-byte keys, 1 ms buckets over 60 s): {:.1} B/id by capacity, {:.1} B/id by RSS delta; insert {:.0} ns/id; expire {:.0} ns/id ({fired} fired in {steps} buckets)",
        estimate as f64 / N as f64,
        after.saturating_sub(before) as f64 / N as f64,
        insert.as_nanos() as f64 / N as f64,
        expire.as_nanos() as f64 / fired.max(1) as f64,
    );
    // Removal (an ack or a re-nack) cost.
    let mut t: DelayTracker<(u32, u64)> = DelayTracker::new(Duration::from_millis(1));
    for i in 0..N {
        t.insert_after((0, i), Duration::from_secs(10), now);
    }
    let start = Instant::now();
    for i in 0..N {
        t.remove(&(0, i));
    }
    println!(
        "nack tracker remove: {:.0} ns/id",
        start.elapsed().as_nanos() as f64 / N as f64
    );
}

fn summary(name: &str, h: &Histogram<u64>, early: u64) {
    println!(
        "{name}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms late; min {:.3} ms; early {early}",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0,
        h.min() as f64 / 1000.0,
    );
}

/// The tracker and the tokio timer alone: 10 000 ids with deadlines spread
/// over 1 s, popped by a task sleeping until the next deadline.
async fn timer_lateness() {
    const N: u64 = 10_000;
    let mut t: DelayTracker<u64> = DelayTracker::new(Duration::from_millis(1));
    let now = tokio::time::Instant::now();
    let mut due = HashMap::new();
    for i in 0..N {
        let d = Duration::from_micros(1_000_000 + (i * 7919) % 1_000_000);
        t.insert_after(i, d, now);
        due.insert(i, now + d);
    }
    let Ok(mut h) = Histogram::<u64>::new(3) else {
        return;
    };
    let mut early = 0;
    let mut out = Vec::new();
    while let Some(next) = t.next_deadline() {
        tokio::time::sleep_until(next).await;
        out.clear();
        let woke = tokio::time::Instant::now();
        t.pop_due(woke, &mut out);
        for k in &out {
            let deadline = due[k];
            if woke < deadline {
                early += 1;
            }
            let _ = h.record(woke.saturating_duration_since(deadline).as_micros() as u64);
        }
    }
    summary(
        "nack timer lateness, 10 000 ids over 1 s (tracker + tokio timer)",
        &h,
        early,
    );
}

/// End to end: `n` messages received, all nacked with a fixed 1 s delay;
/// lateness = time the redelivery is received - (time of its nack + 1 s).
async fn redelivery_lateness(durability: Durability, n: usize) -> Result<(), BoxError> {
    let delay = Duration::from_secs(1);
    let (broker, client) = broker(durability).await?;
    let topic = format!("lateness-{n}");
    let producer = client.producer(&topic).create().await?;
    for _ in 0..n {
        drop(producer.send_async(vec![b'x'; 100]).await?);
    }
    producer.flush().await?;
    let mut consumer = client
        .consumer(&topic)
        .subscription("bench")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(20_000)
        .negative_ack_delay(delay)
        .subscribe()
        .await?;
    let mut nacked_at = HashMap::with_capacity(n);
    let t0 = Instant::now();
    let mut first_nack = None;
    for _ in 0..n {
        let m = consumer.receive().await?;
        consumer.nack(&m).await?;
        let now = Instant::now();
        first_nack.get_or_insert(now - t0);
        nacked_at.insert(m.id().clone(), now);
    }
    let last_nack = t0.elapsed();
    let mut first_back = None;
    let mut h = Histogram::<u64>::new(3)?;
    let mut early = 0;
    for _ in 0..n {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.receive()).await??;
        let now = Instant::now();
        first_back.get_or_insert(now - t0);
        if let Some(at) = nacked_at.get(m.id()) {
            let due = *at + delay;
            if now < due {
                early += 1;
            }
            h.record(now.saturating_duration_since(due).as_micros() as u64)?;
        }
        consumer.ack(&m).await?;
    }
    if std::env::var_os("CLIENT_E2E_DEBUG").is_some() {
        println!(
            "nacks from {first_nack:?} to {last_nack:?}; redeliveries from {first_back:?} to {:?}",
            t0.elapsed()
        );
    }
    summary(
        &format!(
            "redelivery lateness {durability:?}, {n} concurrent nacks, 1 s delay (end to end)"
        ),
        &h,
        early,
    );
    consumer.close().await?;
    producer.close().await?;
    drop(client);
    broker.shutdown().await;
    Ok(())
}
