//! Cluster figures (a plain `main` that prints them): three release
//! `ricochet-broker` processes in cluster mode against one Debian `etcd`
//! (3.4) on loopback, lease TTL 2 s (`CLUSTER_TTL` seconds to change it),
//! all on this machine.
//!
//! 1. **Lookup latency**: the raw gRPC `Cluster/Lookup` (one channel, one
//!    call at a time) through one broker, for topics placed on it and on
//!    the others (each answer reads etcd: 2–3 ranges), and the first lookup
//!    of a new topic (which also places it: a "create if absent" txn).
//! 2. **Fencing of a paused owner**: SIGSTOP the owner of a topic; the time
//!    until its owner key disappears from etcd (read directly, every 5 ms)
//!    against the TTL; after SIGCONT, the time until it serves the topic
//!    again under a new epoch (a lookup through another broker shows it).
//! 3. **Restart after `kill -9`**: once the others report the broker down,
//!    restart it on its data directory; the time from the restart to its
//!    topics being served again (a lookup through another broker answers
//!    with a new epoch) and to the first produce receipt there.
//!
//! 4. **Throughput with 1, 2 and 3 brokers** (`CLUSTER_ONLY=throughput` for
//!    this part alone): a fresh etcd and N brokers, a topic of 8 partitions
//!    (spread over the N), 4 producers through the client (which routes each
//!    partition to its owner) publishing `CLUSTER_MESSAGES` (default 400 000)
//!    messages of 100 B, 1 000 in flight each; then one Shared consumer
//!    draining them, acking each.
//!
//! 5. **Drain time for 100 partitions** (`CLUSTER_ONLY=drain` for this part
//!    alone): a fresh etcd and 3 brokers, a topic of 300 partitions (100 on
//!    each broker), `CLUSTER_DRAIN_PER_PARTITION` (default 1 000) messages
//!    of 100 B published to each and left unconsumed by subscription `s`,
//!    then `ricochet cluster drain` of one broker through the client: the
//!    whole drain, and how long each partition was unavailable.
//!
//! `cargo bench -p ricochet-benches --bench cluster` (builds the release
//! broker first: `cargo build --release -p ricochet-broker`). Without etcd
//! it prints that it is skipped.

use hdrhistogram::Histogram;
use ricochet_client::{Admin, Client, ErrorKind, TopicOwner};
use ricochet_proto::produce_response;
use ricochet_testkit::raw::RawProducer;
use ricochet_testkit::{SpawnOptions, etcd_or_skip, spawn_cluster};
use std::time::{Duration, Instant};

const LOOKUPS: usize = 2_000;
const ROUNDS: usize = 3;

/// The typed admin API through the broker at `url`.
async fn admin(url: &str) -> Admin {
    Client::connect(url).await.unwrap().admin()
}

async fn lookup(admin: &Admin, topic: &str) -> ricochet_client::Result<TopicOwner> {
    admin.lookup(topic).await
}

fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn us_line(what: &str, h: &Histogram<u64>) {
    println!(
        "{what:<44} p50 {:>6} us  p99 {:>6} us  max {:>6} us  ({} calls)",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        h.len()
    );
}

/// Polls `f` every `every` until it gives `Some`, up to a minute.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    every: Duration,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up after a minute");
        tokio::time::sleep(every).await;
    }
}

#[tokio::main]
async fn main() {
    let only = std::env::var("CLUSTER_ONLY").unwrap_or_default();
    if only.is_empty() || only == "drain" {
        drain_time().await;
        if only == "drain" {
            return;
        }
    }
    if only.is_empty() || only == "throughput" {
        for n in 1..=3 {
            throughput(n).await;
        }
        if only == "throughput" {
            return;
        }
    }
    let Some(etcd) = etcd_or_skip("cluster bench").await else {
        return;
    };
    let ttl: u64 = std::env::var("CLUSTER_TTL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "bench",
        3,
        root.path(),
        Duration::from_secs(ttl),
        &SpawnOptions::new(),
    )
    .await;
    let urls: Vec<String> = brokers.iter().map(|b| b.url()).collect();
    println!("3 brokers (release binary) + etcd 3.4 on loopback, lease TTL {ttl} s");

    // 1. Lookup latency.
    let client = admin(&urls[0]).await;
    let mut first = Histogram::<u64>::new(3).unwrap();
    let mut names = Vec::new();
    for i in 0..60 {
        let t = topic(&format!("lookup-{i}"));
        let started = Instant::now();
        let owner = lookup(&client, &t).await.unwrap();
        first.record(started.elapsed().as_micros() as u64).unwrap();
        names.push((t, owner.url == urls[0]));
    }
    // Claimed by their owners (a lookup answers epoch 0 until then).
    for (t, _) in &names {
        let owner = lookup(&client, t).await.unwrap();
        let mut p = RawProducer::open(&owner.url, t, "bench").await.unwrap();
        let m = p.msg(b"x".to_vec());
        p.send_batch(vec![m]).await;
    }
    let (mut here, mut elsewhere) = (
        Histogram::<u64>::new(3).unwrap(),
        Histogram::<u64>::new(3).unwrap(),
    );
    for i in 0..LOOKUPS {
        let (t, local) = &names[i % names.len()];
        let started = Instant::now();
        lookup(&client, t).await.unwrap();
        let took = started.elapsed().as_micros() as u64;
        let h = if *local { &mut here } else { &mut elsewhere };
        h.record(took).unwrap();
    }
    us_line("lookup, first (places the topic)", &first);
    us_line("lookup, topic owned by the broker asked", &here);
    us_line("lookup, topic owned by another broker", &elsewhere);

    // 2. Fencing of a paused owner, and its return.
    let key_of = |t: &str| format!("/ricochet/bench/owners/{t}");
    for round in 0..ROUNDS {
        let t = topic(&format!("frozen-{round}"));
        let owner = lookup(&client, &t).await.unwrap();
        let mut p = RawProducer::open(&owner.url, &t, "bench").await.unwrap();
        let m = p.msg(b"x".to_vec());
        p.send_batch(vec![m]).await;
        let old = etcd.get(&key_of(&t)).await.unwrap().1;
        let b = brokers.iter().position(|b| b.url() == owner.url).unwrap();
        let other = urls.iter().find(|u| **u != owner.url).unwrap().clone();
        // Let a renewal go out, then freeze it at a random point of its cycle.
        tokio::time::sleep(Duration::from_millis(500 + 237 * round as u64)).await;
        let froze = Instant::now();
        brokers[b].process().freeze();
        let gone = until(Duration::from_millis(5), || {
            let etcd = &etcd;
            let key = key_of(&t);
            async move {
                match etcd.get(&key).await {
                    Some((_, rev)) if rev == old => None,
                    _ => Some(froze.elapsed()),
                }
            }
        })
        .await;
        brokers[b].process().thaw();
        let thawed = Instant::now();
        let other_url = other.clone();
        let back = until(Duration::from_millis(10), || {
            let (t, url) = (t.clone(), other_url.clone());
            async move {
                let c = admin(&url).await;
                match lookup(&c, &t).await {
                    Ok(o) if o.epoch as i64 > old => Some(thawed.elapsed()),
                    _ => None,
                }
            }
        })
        .await;
        println!(
            "paused owner: owner key gone {} after SIGSTOP (TTL {ttl} s); re-claimed {} after SIGCONT",
            ms(gone),
            ms(back)
        );
    }

    // 3. Restart after kill -9.
    for round in 0..ROUNDS {
        let t = topic(&format!("killed-{round}"));
        let owner = lookup(&client, &t).await.unwrap();
        let mut p = RawProducer::open(&owner.url, &t, "bench").await.unwrap();
        let m = p.msg(b"x".to_vec());
        p.send_batch(vec![m]).await;
        drop(p);
        let b = brokers.iter().position(|b| b.url() == owner.url).unwrap();
        let other = urls.iter().find(|u| **u != owner.url).unwrap().clone();
        brokers[b].kill9();
        let killed = Instant::now();
        let down = until(Duration::from_millis(20), || {
            let (t, url) = (t.clone(), other.clone());
            async move {
                let c = admin(&url).await;
                match lookup(&c, &t).await {
                    Err(e) if e.kind() == ErrorKind::OwnerDown => Some(killed.elapsed()),
                    _ => None,
                }
            }
        })
        .await;
        let restarted = Instant::now();
        brokers[b].restart().await;
        let listening = restarted.elapsed();
        let served = until(Duration::from_millis(10), || {
            let (t, url) = (t.clone(), other.clone());
            async move {
                let c = admin(&url).await;
                match lookup(&c, &t).await {
                    Ok(o) if o.epoch > 0 => Some(restarted.elapsed()),
                    _ => None,
                }
            }
        })
        .await;
        let mut p = RawProducer::open(&owner.url, &t, "bench").await.unwrap();
        let m = p.msg(b"y".to_vec());
        let receipt = p.send_batch(vec![m]).await;
        let produced = restarted.elapsed();
        assert!(matches!(receipt, produce_response::Response::Receipts(_)));
        println!(
            "kill -9: reported down {} after the kill; restart → listening {}, served (lookup elsewhere) {}, first receipt {}",
            ms(down),
            ms(listening),
            ms(served),
            ms(produced)
        );
    }
}

/// `n` brokers (lease TTL 10 s) in a temporary directory, a client of the
/// one at `via`, and partitioned topic `t` of `partitions` made through it.
async fn partitioned(
    etcd: &ricochet_testkit::EtcdProcess,
    n: usize,
    via: usize,
    t: &str,
    partitions: u32,
) -> (
    tempfile::TempDir,
    Vec<ricochet_testkit::ClusterBroker>,
    ricochet_client::Client,
) {
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        etcd,
        "bench",
        n,
        root.path(),
        Duration::from_secs(10),
        &SpawnOptions::new(),
    )
    .await;
    let client = Client::connect(brokers[via].url()).await.unwrap();
    client
        .admin()
        .create_partitioned_topic(t, partitions)
        .await
        .unwrap();
    (root, brokers, client)
}

/// Part 4: publish then drain 8 partitions spread over `n` brokers.
async fn throughput(n: usize) {
    let Some(etcd) = etcd_or_skip("cluster bench (throughput)").await else {
        return;
    };
    let total: usize = std::env::var("CLUSTER_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let t = "throughput";
    let (_root, _brokers, client) = partitioned(&etcd, n, 0, t, 8).await;
    let mut consumer = client
        .consumer(t)
        .subscription("s")
        .subscription_type(ricochet_client::SubscriptionType::Shared)
        .subscribe()
        .await
        .unwrap();
    const PRODUCERS: usize = 4;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..PRODUCERS {
        let p = client.producer(t).create().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut window = std::collections::VecDeque::new();
            for _ in 0..total / PRODUCERS {
                window.push_back(p.send_async(vec![7u8; 100]).await.unwrap());
                if window.len() >= 1_000 {
                    window.pop_front().unwrap().await.unwrap();
                }
            }
            for f in window {
                f.await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let published = started.elapsed();
    let started = Instant::now();
    for _ in 0..total / PRODUCERS * PRODUCERS {
        let m = consumer.receive().await.unwrap();
        consumer.ack(&m).await.unwrap();
    }
    let drained = started.elapsed();
    let rate = |d: Duration| (total / PRODUCERS * PRODUCERS) as f64 / d.as_secs_f64();
    println!(
        "{n} broker(s), 8 partitions, {total} x 100 B: publish {:>8.0} msg/s ({} producers, 1 000 in flight each), drain {:>8.0} msg/s (one Shared consumer)",
        rate(published),
        PRODUCERS,
        rate(drained)
    );
}

async fn drain_time() {
    let Some(etcd) = etcd_or_skip("cluster bench (drain)").await else {
        return;
    };
    let per: usize = std::env::var("CLUSTER_DRAIN_PER_PARTITION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    const PARTITIONS: u32 = 300;
    let t = "drained";
    let (_root, _brokers, client) = partitioned(&etcd, 3, 1, t, PARTITIONS).await;
    // The subscription exists on every partition, so its (unconsumed)
    // state moves too.
    let consumer = client
        .consumer(t)
        .subscription("s")
        .subscription_type(ricochet_client::SubscriptionType::Shared)
        .receiver_queue_size(1)
        .subscribe()
        .await
        .unwrap();
    let producer = client.producer(t).create().await.unwrap();
    let mut window = std::collections::VecDeque::new();
    for i in 0..per * PARTITIONS as usize {
        window.push_back(
            producer
                .send_async(
                    ricochet_client::OutgoingMessage::builder(vec![7u8; 100]).key(format!("k{i}")),
                )
                .await
                .unwrap(),
        );
        if window.len() >= 1_000 {
            window.pop_front().unwrap().await.unwrap();
        }
    }
    for f in window {
        f.await.unwrap();
    }
    drop(consumer);
    let victim = "b0";
    let started = Instant::now();
    let report = client.admin().drain_broker(victim).await.unwrap();
    let took = started.elapsed();
    let mut unavailable = Histogram::<u64>::new(3).unwrap();
    let mut entries = 0;
    for m in &report.moved {
        unavailable.record(m.millis.max(1)).unwrap();
        entries += m.entries;
    }
    println!(
        "drain of {victim} (3 brokers, {PARTITIONS} partitions, {} on it, {per} x 100 B each, unconsumed): {} moved, {} not moved, {entries} entries, {} (broker's own count {} ms)",
        report.moved.len() + report.not_moved.len(),
        report.moved.len(),
        report.not_moved.len(),
        ms(took),
        report.millis
    );
    println!(
        "  each partition unavailable: p50 {} ms  p99 {} ms  max {} ms (4 moved at a time)",
        unavailable.value_at_quantile(0.5),
        unavailable.value_at_quantile(0.99),
        unavailable.max()
    );
    for n in report.not_moved.iter().take(5) {
        println!("  not moved: {}: {}", n.topic, n.reason);
    }
}
