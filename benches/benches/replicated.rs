//! R3 against R1 through the broker (issue 22; a bench binary that prints
//! its figures).
//!
//! etcd and three `ricochet-broker` child processes in cluster mode on
//! loopback; topic `r1` created with factor 1 (one broker's disk) and
//! topic `r3` with factor 3 (a Raft group of the three). For each, through
//! the client:
//!
//! 1. **publish**: `PRODUCERS` producers (default 4) each publish
//!    `MESSAGES / PRODUCERS` messages of 100 B (default 200 000 in all),
//!    batched as the client batches them (up to 1 000 a batch, 1 ms
//!    linger), `IN_FLIGHT` (default 1 000, the client's default queue)
//!    receipts outstanding each (the producer's `max_pending_messages` set
//!    to it); from the first send to the last receipt;
//! 2. **consume + ack**: one Shared consumer receives them all and acks
//!    each (acks grouped by the client as it does by default), then
//!    `flush` confirms every ack is durable; from the subscribe to the
//!    flush's answer;
//! 3. **latency at half rate**: one producer publishes at half the rate
//!    the publish part measured for that topic, for `LATENCY_SECS`
//!    (default 10), one message every tick of the pacing loop; each
//!    message's time from `send_async` to its receipt.
//!
//! Then R3/R1 for both throughputs. `DURABILITY=interval` starts the
//! brokers with `--durability interval` (default `sync`: a receipt once
//! the entry is fsynced, on a majority for R3). The machine's load average
//! is printed at the start and the end: figures taken while other builds
//! run are not quiet-machine figures.
//!
//! ```text
//! cargo build --release -p ricochet-broker --bin ricochet-broker
//! cargo bench -p ricochet-benches --bench replicated --no-run
//! RICOCHET_BROKER_BIN=target/release/ricochet-broker target/release/deps/replicated-<hash>
//! ```
//!
//! Without `RICOCHET_BROKER_BIN` the broker next to the bench executable is
//! used. `BROKER_LOG` is the brokers' `RUST_LOG` (their logs then go to
//! stderr). Without etcd it prints that it is skipped.

use hdrhistogram::Histogram;
use ricochet_client::{Client, InitialPosition, SubscriptionType};
use ricochet_testkit::{SpawnOptions, etcd_or_skip, spawn_cluster};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// One topic's figures.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    publish: f64,
    consume: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    rate: f64,
    achieved: f64,
}

struct Setup {
    messages: usize,
    producers: usize,
    in_flight: usize,
    latency: Duration,
}

async fn publish(c: &Client, topic: &str, s: &Setup) -> f64 {
    let per = s.messages / s.producers;
    let mut producers = Vec::new();
    for _ in 0..s.producers {
        producers.push(
            c.producer(topic)
                .max_pending_messages(s.in_flight)
                .create()
                .await
                .expect("producer"),
        );
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in producers {
        let in_flight = s.in_flight;
        tasks.push(tokio::spawn(async move {
            let mut window = VecDeque::new();
            for _ in 0..per {
                window.push_back(p.send_async(vec![7u8; 100]).await.expect("send"));
                if window.len() >= in_flight
                    && let Some(f) = window.pop_front()
                {
                    f.await.expect("receipt");
                }
            }
            for f in window {
                f.await.expect("receipt");
            }
        }));
    }
    for t in tasks {
        t.await.expect("producer task");
    }
    (per * s.producers) as f64 / started.elapsed().as_secs_f64()
}

async fn consume(c: &Client, topic: &str, n: usize) -> f64 {
    let started = Instant::now();
    let mut consumer = c
        .consumer(topic)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .expect("subscribe");
    for _ in 0..n {
        let m = consumer.receive().await.expect("receive");
        consumer.ack(&m).await.expect("ack");
    }
    consumer.flush().await.expect("every ack durable");
    let rate = n as f64 / started.elapsed().as_secs_f64();
    consumer.close().await.expect("close");
    rate
}

/// Publishes at `rate` msg/s for `secs`; each message's send-to-receipt
/// latency in µs.
async fn paced(c: &Client, topic: &str, rate: f64, secs: Duration) -> (Histogram<u64>, f64) {
    let p = c.producer(topic).create().await.expect("producer");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waiter = tokio::spawn(async move {
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        while let Some((sent, receipt)) = rx.recv().await {
            let receipt: ricochet_client::Receipt = receipt;
            receipt.await.expect("receipt");
            let _ = h.record(Instant::elapsed(&sent).as_micros() as u64);
        }
        h
    });
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while started.elapsed() < secs {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        while sent < due {
            let at = Instant::now();
            let f = p.send_async(vec![7u8; 100]).await.expect("send");
            let _ = tx.send((at, f));
            sent += 1;
        }
    }
    drop(tx);
    let h = waiter.await.expect("waiter");
    (h, sent as f64 / started.elapsed().as_secs_f64())
}

async fn figures(c: &Client, topic: &str, s: &Setup) -> Figures {
    let publish = publish(c, topic, s).await;
    println!("  {topic}: publish {publish:>8.0} msg/s");
    let consume = consume(c, topic, s.messages / s.producers * s.producers).await;
    println!("  {topic}: consume + ack {consume:>8.0} msg/s");
    let rate = publish / 2.0;
    let (h, achieved) = paced(c, topic, rate, s.latency).await;
    println!(
        "  {topic}: at {rate:.0} msg/s ({achieved:.0} sent): p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
    Figures {
        publish,
        consume,
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        max_us: h.max(),
        rate,
        achieved,
    }
}

#[tokio::main]
async fn main() {
    // As the broker binary does at start (mimalloc would ask for huge pages).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let Some(etcd) = etcd_or_skip("replicated bench").await else {
        return;
    };
    let setup = Setup {
        messages: env_u64("MESSAGES", 200_000) as usize,
        producers: env_u64("PRODUCERS", 4).max(1) as usize,
        in_flight: env_u64("IN_FLIGHT", 1_000).max(1) as usize,
        latency: Duration::from_secs(env_u64("LATENCY_SECS", 10).max(1)),
    };
    let durability = std::env::var("DURABILITY").unwrap_or_else(|_| "sync".to_owned());
    let bin = ricochet_testkit::broker_bin(None);
    println!(
        "replicated: 3 brokers ({}) + etcd on loopback, durability {durability}, {} x 100 B, \
         {} producers x {} in flight; load average {}",
        bin.display(),
        setup.messages,
        setup.producers,
        setup.in_flight,
        load_average()
    );
    let root = tempfile::tempdir().expect("temp dir");
    let _brokers = spawn_cluster(
        &etcd,
        "replicated",
        3,
        root.path(),
        Duration::from_secs(10),
        &SpawnOptions::new()
            .bin(&bin)
            .args(["--durability", durability.as_str()])
            .rust_log(std::env::var("BROKER_LOG").unwrap_or_else(|_| "warn".to_owned()))
            .echo_log(std::env::var_os("BROKER_LOG").is_some()),
    )
    .await;
    let c = Client::builder(_brokers[0].url())
        .request_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    let admin = c.admin();
    admin
        .create_replicated_topic("r1", 1)
        .await
        .expect("create r1");
    admin
        .create_replicated_topic("r3", 3)
        .await
        .expect("create r3");
    let r1 = figures(&c, "r1", &setup).await;
    let r3 = figures(&c, "r3", &setup).await;
    println!();
    println!(
        "| {durability} | publish msg/s | consume + ack msg/s | latency at half rate: rate | p50 | p99 | max |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, f) in [("R1", r1), ("R3", r3)] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} msg/s ({:.0} sent) | {:.2} ms | {:.2} ms | {:.2} ms |",
            f.publish,
            f.consume,
            f.rate,
            f.achieved,
            f.p50_us as f64 / 1000.0,
            f.p99_us as f64 / 1000.0,
            f.max_us as f64 / 1000.0
        );
    }
    println!(
        "| R3 / R1 | {:.2} | {:.2} | | | | |",
        r3.publish / r1.publish,
        r3.consume / r1.consume
    );
    println!("load average at the end: {}", load_average());
}
