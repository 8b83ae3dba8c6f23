//! Bursts of failures, through the client against an in-process broker
//! (a plain `main` that prints its figures):
//!
//! 1. **Redelivery lateness of a burst**: N messages (10 000, 100 B) are
//!    received, then all failed at once with a fixed 200 ms delay, and
//!    received again. Lateness = receive time − (fail time + 200 ms). Three
//!    variants: `nack` with the consumer's defaults, `nack, broker-held`
//!    (broker nack threshold 0: the broker holds every nack) and
//!    `reconsume_later` (through the retry tier).
//!
//!    A burst cannot come back faster than the broker redelivers, so each
//!    line also gives the lateness *beyond the drain*: the i-th redelivery
//!    (in receive order) against the earliest it could have come at the
//!    run's own redelivery rate r — e₀ = first due time, eᵢ = max(i-th due
//!    time, eᵢ₋₁ + 1/r) — where r = (N − 1) / (last receive − first receive).
//! 2. **An awaited `reconsume_later` loop**: M messages (20 000) received,
//!    then `reconsume_later(&m, 1 h).await` one after the other, then
//!    `flush().await`; messages per second over the whole loop and flush,
//!    with the default (queued: returns once sent) and with ack receipts
//!    (each call waits until the move is durable).
//!
//! Both in `Durability::Sync` and `Durability::Interval` (50 ms).
//! `cargo bench -p ricochet-benches --bench bursts`. Environment:
//! `BURSTS_N` (burst size), `BURSTS_DELAY_MS` (the delay, 200 by default;
//! the idle row is `BURSTS_N=1000 BURSTS_DELAY_MS=1000`),
//! `BURSTS_M` (loop size), `BURSTS_ONLY=burst|loop`,
//! `BURSTS_VARIANT=nack|broker|reconsume` (one burst variant),
//! `BURSTS_MODE=sync|interval` (one durability mode),
//! `BURSTS_NACK_LEAD_MS` (the consumer's `nack_lead`, its default unless
//! set; 0 sends a client-held nack at its due time, as before the lead),
//! `BURSTS_LOCAL=on|off` (the consumer's `local_redelivery`; unset, its
//! default, which is off on the bench's Shared subscription).
//! `BURSTS_TRACE=1` prints a burst's timeline to stderr (µs timestamps):
//! the scheduler's fire, the subscription actor's read-ahead and hand-off,
//! the consume stream's frames, the client's decoded frames, the client's
//! nack (`Redeliver`) frames as the transport takes them (with their time
//! in the stream's queue) and the bench's first and last arrival (`RUST_LOG` overrides the filter,
//! `ricochet::burst=trace`).
//!
//! The in-process broker runs on mimalloc, the broker binary's allocator,
//! so the figures are the binary's allocator's (and `MIMALLOC_*` options,
//! such as `MIMALLOC_PURGE_DELAY`, act on them), and with transparent huge
//! pages off, as the binary runs (`ricochet_broker::process`; the first line
//! says what the kernel applied). With them on, a burst's first touch of a
//! fresh 2 MiB region could stall the thread redelivering it for 4-21 ms
//! on this project's virtual machine: the 1 000 burst's slow rounds
//! (session 20, `docs/src/parked-retries-bursts-2.md`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use hdrhistogram::Histogram;
use ricochet_broker::Durability;
use ricochet_client::{Client, Consumer, InitialPosition, Message, SubscriptionType};
use ricochet_testkit::InProcessBroker;

// The same allocator as the broker binary (jemalloc with the feature).
#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The failure delay: `BURSTS_DELAY_MS`, 200 ms by default.
fn delay() -> Duration {
    Duration::from_millis(env_usize("BURSTS_DELAY_MS", 200) as u64)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Nack,
    NackBrokerHeld,
    Reconsume,
}

impl Variant {
    fn key(self) -> &'static str {
        match self {
            Variant::Nack => "nack",
            Variant::NackBrokerHeld => "broker",
            Variant::Reconsume => "reconsume",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Variant::Nack => "nack (in place)",
            Variant::NackBrokerHeld => "nack (in place), broker-held",
            Variant::Reconsume => "reconsume_later (retry tier)",
        }
    }
}

fn main() -> Result<(), BoxError> {
    // As the broker binary does at start (every later fault obeys it).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    if std::env::var_os("BURSTS_TRACE").is_some() {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("ricochet::burst=trace"));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let only = std::env::var("BURSTS_ONLY").unwrap_or_default();
    let n = env_usize("BURSTS_N", 10_000);
    let m = env_usize("BURSTS_M", 20_000);
    println!(
        "bursts: {} cores, in-process broker, 100 B messages, transparent huge pages {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        match ricochet_broker::process::transparent_huge_pages() {
            Some(true) => "on",
            Some(false) => "off",
            None => "unknown",
        }
    );
    rt.block_on(async {
        let mode = std::env::var("BURSTS_MODE").unwrap_or_default();
        let variant = std::env::var("BURSTS_VARIANT").unwrap_or_default();
        for durability in [Durability::Sync, Durability::Interval] {
            if !mode.is_empty() && !format!("{durability:?}").eq_ignore_ascii_case(&mode) {
                continue;
            }
            if only.is_empty() || only == "burst" {
                for v in [Variant::Nack, Variant::NackBrokerHeld, Variant::Reconsume] {
                    if variant.is_empty() || v.key() == variant {
                        burst(durability, v, n).await?;
                    }
                }
            }
            if only.is_empty() || only == "loop" {
                for receipts in [false, true] {
                    reconsume_loop(durability, receipts, m).await?;
                }
            }
        }
        Ok(())
    })
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

/// Publishes `n` messages and receives them all on a Shared subscription.
async fn received(
    client: &Client,
    topic: &str,
    n: usize,
    tune: impl FnOnce(ricochet_client::ConsumerBuilder) -> ricochet_client::ConsumerBuilder,
) -> Result<(Consumer, Vec<Message>), BoxError> {
    let producer = client.producer(topic).create().await?;
    for _ in 0..n {
        drop(producer.send_async(vec![b'x'; 100]).await?);
    }
    producer.flush().await?;
    producer.close().await?;
    let builder = client
        .consumer(topic)
        .subscription("bench")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(u32::try_from(n + 1_000)?)
        .negative_ack_delay(delay());
    let mut consumer = tune(builder).subscribe().await?;
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.push(tokio::time::timeout(Duration::from_secs(30), consumer.receive()).await??);
    }
    Ok((consumer, got))
}

async fn burst(durability: Durability, v: Variant, n: usize) -> Result<(), BoxError> {
    let delay = delay();
    let (broker, client) = broker(durability).await?;
    let topic = format!("burst-{v:?}-{durability:?}");
    let lead = std::env::var("BURSTS_NACK_LEAD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    let local = match std::env::var("BURSTS_LOCAL").as_deref() {
        Ok("on") => Some(true),
        Ok("off") => Some(false),
        _ => None,
    };
    let (mut consumer, got) = received(&client, &topic, n, |b| {
        let b = match (v, local) {
            (Variant::Nack, Some(on)) => b.local_redelivery(on),
            _ => b,
        };
        match (v, lead) {
            (Variant::NackBrokerHeld, _) => b.broker_nack_threshold(Duration::ZERO),
            (Variant::Nack, Some(lead)) => b.nack_lead(lead),
            _ => b,
        }
    })
    .await?;
    let mut due = HashMap::with_capacity(n);
    match v {
        Variant::Nack | Variant::NackBrokerHeld => {
            for m in &got {
                // The hold runs from the call (the client stamps it there),
                // so a redelivery is early only before call + delay; taken
                // after the call returned, an on-time one could count.
                let called = Instant::now();
                consumer.nack(m).await?;
                due.insert(m.id().clone(), called + delay);
            }
        }
        Variant::Reconsume => {
            let acker = consumer.acker();
            let sent = Instant::now();
            let calls = got.iter().map(|m| acker.reconsume_later(m, delay));
            for r in join_all(calls).await {
                r?;
            }
            // Each copy gets a new id in the retry tier: match by payload
            // order is impossible, so every due time is the burst's start.
            due.insert(got[0].id().clone(), sent + delay);
        }
    }
    let first_due = due.values().min().copied().unwrap_or_else(Instant::now);
    let last_due = due.values().max().copied().unwrap_or(first_due);
    tracing::trace!(
        target: "ricochet::burst",
        first_in_us = first_due.saturating_duration_since(Instant::now()).as_micros() as u64,
        last_in_us = last_due.saturating_duration_since(Instant::now()).as_micros() as u64,
        "bench: failed, due times ahead"
    );
    let mut lateness = Histogram::<u64>::new(3)?;
    let mut dues = Vec::with_capacity(n);
    let mut arrivals = Vec::with_capacity(n);
    let mut early = 0u64;
    for i in 0..n {
        let m = tokio::time::timeout(Duration::from_secs(60), consumer.receive()).await??;
        let now = Instant::now();
        let d = due.get(m.id()).copied().unwrap_or(first_due);
        if i == 0 || i == n - 1 {
            tracing::trace!(
                target: "ricochet::burst",
                i,
                late_us = now.saturating_duration_since(d).as_micros() as u64,
                "bench: arrival"
            );
        }
        if now < d {
            early += 1;
        }
        lateness.record(now.saturating_duration_since(d).as_micros() as u64)?;
        dues.push(d);
        arrivals.push(now);
        consumer.ack(&m).await?;
    }
    let beyond = beyond_drain(dues, &arrivals)?;
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let span = arrivals[n - 1].duration_since(arrivals[0]).as_secs_f64();
    println!(
        "burst {durability:?}, {n} x {}{}, {} ms: lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         beyond the drain p50 {:.1} ms, p99 {:.1} ms; drained at {:.0}/s; early {early}",
        v.label(),
        match (v, lead) {
            (Variant::Nack, Some(l)) => format!(" (nack lead {} ms)", l.as_millis()),
            _ => String::new(),
        } + match (v, local) {
            (Variant::Nack, Some(true)) => " (local redelivery)",
            (Variant::Nack, Some(false)) => " (local redelivery off)",
            _ => "",
        },
        delay.as_millis(),
        ms(&lateness, 0.5),
        ms(&lateness, 0.99),
        lateness.max() as f64 / 1000.0,
        ms(&beyond, 0.5),
        ms(&beyond, 0.99),
        if span > 0.0 {
            (n - 1) as f64 / span
        } else {
            0.0
        },
    );
    consumer.close().await?;
    drop(client);
    broker.shutdown().await;
    Ok(())
}

/// Lateness of each arrival beyond the earliest it could have come at the
/// run's own redelivery rate (see the module docs).
fn beyond_drain(mut dues: Vec<Instant>, arrivals: &[Instant]) -> Result<Histogram<u64>, BoxError> {
    dues.sort();
    let n = arrivals.len();
    let span = arrivals[n - 1].duration_since(arrivals[0]);
    let step = if n > 1 {
        span / (n as u32 - 1)
    } else {
        Duration::ZERO
    };
    let mut h = Histogram::<u64>::new(3)?;
    let mut earliest = dues[0];
    for (i, at) in arrivals.iter().enumerate() {
        if i > 0 {
            earliest = dues[i].max(earliest + step);
        }
        h.record(at.saturating_duration_since(earliest).as_micros() as u64)?;
    }
    Ok(h)
}

async fn reconsume_loop(durability: Durability, receipts: bool, m: usize) -> Result<(), BoxError> {
    let (broker, client) = broker(durability).await?;
    let topic = format!("loop-{receipts}-{durability:?}");
    let (consumer, got) = received(&client, &topic, m, |b| b.ack_receipts(receipts)).await?;
    let start = Instant::now();
    for msg in &got {
        consumer
            .reconsume_later(msg, Duration::from_secs(3600))
            .await?;
    }
    let looped = start.elapsed();
    consumer.flush().await?;
    let total = start.elapsed();
    println!(
        "awaited reconsume_later loop {durability:?}, {m} messages, {}: {:.0} msg/s \
         (loop {:.0} ms, then flush {:.0} ms)",
        if receipts {
            "ack receipts (each call durable)"
        } else {
            "default (queued)"
        },
        m as f64 / total.as_secs_f64(),
        looped.as_secs_f64() * 1000.0,
        (total - looped).as_secs_f64() * 1000.0,
    );
    consumer.close().await?;
    drop(client);
    broker.shutdown().await;
    Ok(())
}
