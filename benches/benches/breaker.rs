//! The cost of the outage breaker on the hot path: consume + ack
//! throughput of a stored backlog of 100-byte messages through the client,
//! on an in-process broker in `Durability::Sync`, with the same dead-letter
//! policy and the breaker configured (`breaker:ratio=0.5,window=200`; every
//! settle is an ack, so it stays closed and only counts) or not. Each round
//! runs both on fresh topics (which goes first alternates); a plain `main`
//! prints each round and the median ratio.
//!
//! `cargo bench -p ricochet-benches --bench breaker`. Environment:
//! `BREAKER_BENCH_QUICK=1` for a short run, `BREAKER_BENCH_N` messages per
//! round (default 100 000), `BREAKER_BENCH_ROUNDS` (default 3).

use std::time::{Duration, Instant};

use futures::StreamExt;
use ricochet_broker::Durability;
use ricochet_client::{Client, InitialPosition};
use ricochet_policy::{BreakerSpec, PolicySpec};
use ricochet_testkit::InProcessBroker;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Consume + ack of `n` stored messages on a fresh topic; msg/s.
async fn round(client: &Client, topic: &str, n: usize, breaker: bool) -> Result<f64, BoxError> {
    let mut consumer = client
        .consumer(topic)
        .subscription("bench")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await?;
    let policy: PolicySpec = "backoff:fixed=1s,max=3".parse()?;
    let spec: BreakerSpec = "breaker:ratio=0.5,window=200".parse()?;
    client
        .admin()
        .set_policy_with_breaker(topic, "bench", Some(&policy), breaker.then_some(&spec))
        .await?;
    let producer = client.producer(topic).create().await?;
    let payload = vec![b'x'; 100];
    let mut sends = Vec::with_capacity(n);
    for _ in 0..n {
        sends.push(producer.send_async(payload.clone()).await?);
    }
    for f in sends {
        f.await?;
    }
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
    let stats = client.admin().subscription_stats(topic, "bench").await?;
    if breaker {
        let b = stats
            .breaker
            .ok_or("the breaker is missing from the stats")?;
        assert_eq!(b.state, "closed", "every settle was an ack");
    }
    consumer.close().await?;
    producer.close().await?;
    Ok(n as f64 / took.as_secs_f64())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), BoxError> {
    let quick = std::env::var_os("BREAKER_BENCH_QUICK").is_some();
    let n = env_usize("BREAKER_BENCH_N", if quick { 20_000 } else { 100_000 });
    let rounds = env_usize("BREAKER_BENCH_ROUNDS", if quick { 1 } else { 3 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let broker = InProcessBroker::start_with(|c| {
            c.durability = Durability::Sync;
            c.flush_interval = Duration::from_millis(50);
        })
        .await;
        let client = Client::connect(broker.url()).await?;
        println!(
            "breaker bench: consume + ack of {n} x 100 B stored, Sync, {} cores, {rounds} round(s)",
            std::thread::available_parallelism().map_or(0, |c| c.get())
        );
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            // Alternate which goes first, so neither always meets the
            // larger store.
            let order = if r % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for breaker in order {
                let topic = format!("breaker-bench-{r}-{breaker}");
                let rate = round(&client, &topic, n, breaker).await?;
                println!(
                    "  round {r}, breaker {}: {rate:.0} msg/s",
                    if breaker { "on " } else { "off" }
                );
                if breaker {
                    on.push(rate)
                } else {
                    off.push(rate)
                }
            }
        }
        let (off, on) = (median(off), median(on));
        println!(
            "median: breaker off {off:.0} msg/s, on {on:.0} msg/s, on/off {:.3}",
            on / off
        );
        drop(client);
        broker.shutdown().await;
        Ok::<_, BoxError>(())
    })
}
