//! Key order (per-key ordered retries): its cost, through the client against
//! an in-process broker in `Durability::Sync` (a plain `main` that prints
//! its figures; `cargo bench -p ricochet-benches --bench key_order`).
//!
//! 1. **Consume + ack throughput, key order off vs on**: N messages (100 B)
//!    are published over K keys first, then one Exclusive consumer
//!    (receiver queue 1 000) receives and acks them all; messages per second
//!    from subscribe to the last ack confirmed. Rows: K = 1 000 keys and
//!    K = 1 key (the worst case: key order lets one message of a key out at
//!    a time, so one key is one round trip per message), each without
//!    failures and with 1 % of messages nacked once (100 ms client delay).
//! 2. **Memory per held message**: one key is blocked (its first message
//!    sent to the retry tier for an hour), then H more messages (100 000) of
//!    that key are published and held; the process's resident set (`VmRSS`,
//!    broker and client in one process, mimalloc) is read before and once
//!    the stats show all H held, and the difference is divided by H. It
//!    includes whatever else grows with H stored messages (and what the
//!    allocator keeps of the buffers the publishes and reads went through),
//!    so it is an upper bound of the held set's cost.
//!
//! Environment: `KO_N` (messages, default 20 000), `KO_N1` (messages for
//! the one-key rows, default 2 000), `KO_H` (held, default 100 000),
//! `KO_ONLY=throughput|memory`.

use std::time::{Duration, Instant};

use ricochet_broker::Durability;
use ricochet_client::{
    Client, InitialPosition, KeyOrder, OutgoingMessage, Producer, SubscriptionType,
};
use ricochet_testkit::InProcessBroker;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

/// This process's resident set (`VmRSS`), in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), BoxError> {
    // As the broker binary does at start (mimalloc would ask for huge pages).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let only = std::env::var("KO_ONLY").unwrap_or_default();
    rt.block_on(async {
        if only.is_empty() || only == "throughput" {
            let n = env_usize("KO_N", 20_000);
            let n1 = env_usize("KO_N1", 2_000);
            println!("consume + ack, 100 B, durability sync, Exclusive, receiver queue 1000");
            println!(
                "{:>7} {:>6} {:>10} {:>12} {:>12}",
                "keys", "msgs", "nacked", "off msg/s", "on msg/s"
            );
            for (keys, n) in [(1_000, n), (1, n1)] {
                for nack_every in [0, 100] {
                    let off = throughput(keys, n, nack_every, false).await?;
                    let on = throughput(keys, n, nack_every, true).await?;
                    println!(
                        "{keys:>7} {n:>6} {:>10} {off:>12.0} {on:>12.0}",
                        if nack_every == 0 { "none" } else { "1 %" }
                    );
                }
            }
        }
        if only.is_empty() || only == "memory" {
            memory(env_usize("KO_H", 100_000)).await?;
        }
        Ok(())
    })
}

async fn broker() -> Result<(InProcessBroker, Client), BoxError> {
    let broker = InProcessBroker::start_with(|c| c.durability = Durability::Sync).await;
    let client = Client::connect(broker.url()).await?;
    Ok((broker, client))
}

async fn publish(
    p: &Producer,
    key_of: impl Fn(usize) -> String,
    range: std::ops::Range<usize>,
) -> Result<(), BoxError> {
    for i in range {
        let m = OutgoingMessage::builder(vec![b'x'; 100])
            .key(key_of(i))
            .build();
        drop(p.send_async(m).await?);
    }
    p.flush().await?;
    Ok(())
}

/// Messages per second received and acked (one in `nack_every` nacked once
/// first; 0: none).
async fn throughput(
    keys: usize,
    n: usize,
    nack_every: usize,
    ordered: bool,
) -> Result<f64, BoxError> {
    let (broker, client) = broker().await?;
    let topic = "ko-throughput";
    let p = client.producer(topic).create().await?;
    publish(&p, |i| format!("key-{}", i % keys), 0..n).await?;
    p.close().await?;
    let start = Instant::now();
    let mut b = client
        .consumer(topic)
        .subscription("bench")
        .subscription_type(SubscriptionType::Exclusive)
        .initial_position(InitialPosition::Earliest)
        .negative_ack_delay(Duration::from_millis(100));
    if ordered {
        b = b.key_order(KeyOrder::new());
    }
    let mut c = b.subscribe().await?;
    let mut acked = 0;
    let mut seen = 0usize;
    while acked < n {
        let m = tokio::time::timeout(Duration::from_secs(60), c.receive()).await??;
        seen += 1;
        if nack_every > 0 && seen.is_multiple_of(nack_every) && m.delivery_count() == 0 {
            c.nack(&m).await?;
            continue;
        }
        c.ack(&m).await?;
        acked += 1;
    }
    c.flush().await?;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    c.close().await?;
    drop(client);
    broker.shutdown().await;
    Ok(rate)
}

async fn held(client: &Client, topic: &str) -> Result<(u64, u64), BoxError> {
    let s = client.admin().subscription_stats(topic, "bench").await?;
    Ok((s.blocked_keys, s.held_messages))
}

async fn memory(h: usize) -> Result<(), BoxError> {
    let (broker, client) = broker().await?;
    let topic = "ko-memory";
    let p = client.producer(topic).create().await?;
    let mut c = client
        .consumer(topic)
        .subscription("bench")
        .subscription_type(SubscriptionType::Exclusive)
        .initial_position(InitialPosition::Earliest)
        .key_order(KeyOrder::new())
        .subscribe()
        .await?;
    publish(&p, |_| "held".into(), 0..1).await?;
    let first = c.receive().await?;
    c.reconsume_later(&first, Duration::from_secs(3600)).await?;
    c.flush().await?;
    while held(&client, topic).await?.0 != 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Warm up the paths a publish and a hold take, then measure from here.
    publish(&p, |_| "held".into(), 1..1_001).await?;
    while held(&client, topic).await?.1 != 1_000 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss();
    publish(&p, |_| "held".into(), 1_001..1_001 + h).await?;
    let t = Instant::now();
    while held(&client, topic).await?.1 != (1_000 + h) as u64 {
        if t.elapsed() > Duration::from_secs(120) {
            return Err("held messages did not reach the expected count".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = rss();
    let per = (after as f64 - before as f64) / h as f64;
    println!(
        "memory: {h} messages (100 B) held behind one blocked key: RSS {:.1} MiB -> {:.1} MiB, {per:.1} B per held message (whole process, upper bound)",
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
    );
    p.close().await?;
    drop(c);
    drop(client);
    broker.shutdown().await;
    Ok(())
}
