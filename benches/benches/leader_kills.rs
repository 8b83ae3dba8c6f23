//! Takeover figures for a replicated topic (issue 22; a bench binary that
//! prints its figures and exits non-zero when a guarantee broke).
//!
//! Three `ricochet-broker` child processes in cluster mode against one
//! `etcd` on loopback, one topic created with `--replicas 3`. Through the
//! client (its service URL one broker's, the two others its fallbacks;
//! following the topic through `Lookup`):
//!
//! * a producer publishing `RATE` messages a second (default 200), at
//!   most `IN_FLIGHT` receipts outstanding;
//! * a Shared consumer with ack receipts whose policy holds a nack 200 ms
//!   on the broker: every fifth message is nacked on its first two
//!   deliveries, every seventh sent to the retry tier (`reconsume_later`,
//!   300 ms) on its first, the rest acked; `SETTLING` of these answers
//!   awaited at once;
//! * a probe producer: right after each kill it publishes one message and
//!   waits for its receipt.
//!
//! `KILLS` times (default 20) the topic's leader (as `Lookup` names it) is
//! killed with SIGKILL; **takeover** is the time from the kill to the
//! probe's receipt (a publish sent after the kill, receipted by the new
//! leader). Also timed per kill: until `Lookup` (asked of a survivor every
//! 20 ms) names another live member, which splits the takeover into the
//! group's part (election, the new leader opening the topic and taking the
//! placement) and the client's (its stream failing, looking the topic up
//! again, reconnecting). Each kill's wall time is printed (unix ms), to
//! line it up with the brokers' logs (`BROKER_LOG`, see
//! `docs/src/replication-history-failover.md`, "Session 9", for the phases they show). The victim is restarted after each takeover, and
//! the next kill waits until the three brokers are live and the restarted
//! one had `SETTLE_MS` (default 2 000) to catch up.
//!
//! Every publish receipt, ack receipt and confirmed failure goes into the
//! testkit `History`; at the end an auditor consumer acks whatever is
//! still deliverable and the checker prints its counts: receipted,
//! delivered, acked, violations by kind (each must be 0). A violation, or
//! a takeover that did not finish within a minute, exits with status 1.
//!
//! ```text
//! cargo build --release -p ricochet-broker --bin ricochet-broker
//! RICOCHET_BROKER_BIN=target/release/ricochet-broker \
//!   cargo bench -p ricochet-benches --bench leader_kills --profile dev
//! ```
//!
//! Without `RICOCHET_BROKER_BIN` the broker next to the bench executable is
//! used (the same profile's). `BROKER_LOG` is the brokers' `RUST_LOG`
//! (default `warn`; their logs go to stderr), `RUST_LOG` the bench's own
//! (the client's). `LEASE_TTL` (seconds, default 10: the
//! broker's default) sets the brokers' etcd lease. Without etcd it prints
//! that it is skipped.

use hdrhistogram::Histogram;
use ricochet_client::{Client, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::etcd::live_brokers;
use ricochet_testkit::{
    ClusterBroker, History, Place, SpawnOptions, Violation, etcd_or_skip, spawn_cluster,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

const TOPIC: &str = "kills";
const IN_FLIGHT: usize = 16;
/// Deliveries being settled (acked, nacked, retried) at once.
const SETTLING: usize = 64;
/// How long one takeover may take before the run counts it as failed.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(60);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect")
}

/// A client given every broker: the first as its service URL, the others
/// as fallbacks for lookups while the first is down.
async fn cluster_client(brokers: &[ClusterBroker]) -> Client {
    let mut b = Client::builder(brokers[0].url()).request_timeout(Duration::from_secs(5));
    for other in &brokers[1..] {
        b = b.fallback_url(other.url());
    }
    b.connect().await.expect("connect")
}

/// The live member `Lookup` (asked of `url`) names for the topic, once it
/// is one of `among`.
async fn leader(c: &Client, among: &[String]) -> Option<String> {
    match c.lookup(TOPIC).await {
        Ok(o) if o.live && among.contains(&o.broker_id) => Some(o.broker_id),
        _ => None,
    }
}

/// The leader once two reads 200 ms apart agree (a minute at most).
async fn stable_leader(c: &Client, among: &[String]) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    while Instant::now() < deadline {
        let now = leader(c, among).await;
        if now.is_some() && now == last {
            return now.unwrap_or_default();
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no stable leader of {TOPIC} within a minute");
}

/// Every fifth message is nacked on its first two deliveries.
fn nacked(n: u64, count: u32) -> bool {
    n.is_multiple_of(5) && count < 2
}

/// Every seventh (not fifth) goes to the retry tier on its first delivery.
fn retried(n: u64, count: u32) -> bool {
    n.is_multiple_of(7) && !n.is_multiple_of(5) && count == 0
}

async fn subscribe(c: &Client, receipts: bool) -> ricochet_client::Consumer {
    c.consumer(TOPIC)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(receipts)
        .policy("backoff:fixed=200ms,max=50".parse::<PolicySpec>().unwrap())
        .subscribe()
        .await
        .expect("subscribe")
}

/// The load: a pipelined producer and a consumer recording into `h`
/// until `stop`.
struct Load {
    stop: Arc<AtomicBool>,
    receipted: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn start_load(c: &Client, h: &Arc<History>, rate: u32) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let receipted = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let producing = {
        let (c, h, stop, receipted) = (c.clone(), h.clone(), stop.clone(), receipted.clone());
        tokio::spawn(async move {
            let p = c
                .producer(TOPIC)
                .name("load")
                .send_timeout(Duration::from_secs(120))
                .max_pending_messages(IN_FLIGHT)
                .create()
                .await
                .expect("producer");
            let (tx, mut rx) =
                tokio::sync::mpsc::channel::<(String, ricochet_client::Receipt)>(IN_FLIGHT);
            let waiting = {
                let h = h.clone();
                tokio::spawn(async move {
                    while let Some((id, receipt)) = rx.recv().await {
                        if receipt.await.is_ok() {
                            h.receipted(&id);
                            receipted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            };
            let mut n = 0u64;
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Acquire) {
                tick.tick().await;
                let id = n.to_string();
                n += 1;
                h.sent(&id);
                match p.send_async(id.clone()).await {
                    Ok(r) => {
                        if tx.send((id, r)).await.is_err() {
                            break;
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            drop(tx);
            let _ = waiting.await;
        })
    };
    let consuming = {
        let (c, h, stop, acked) = (c.clone(), h.clone(), stop.clone(), acked.clone());
        tokio::spawn(async move {
            let mut consumer = subscribe(&c, true).await;
            // Settled concurrently (each answer is a commit of the group).
            let settling = Arc::new(tokio::sync::Semaphore::new(SETTLING));
            while !stop.load(Ordering::Acquire) {
                let Ok(Ok(m)) =
                    tokio::time::timeout(Duration::from_secs(1), consumer.receive()).await
                else {
                    continue;
                };
                let id = String::from_utf8_lossy(m.payload()).into_owned();
                let count = m.delivery_count();
                h.delivered(&id, count);
                let Ok(permit) = settling.clone().acquire_owned().await else {
                    break;
                };
                let (acker, h, acked) = (consumer.acker(), h.clone(), acked.clone());
                tokio::spawn(async move {
                    let n = id.parse::<u64>().unwrap_or(1);
                    if nacked(n, count) {
                        if acker.nack(&m).await.is_ok() {
                            h.failure_confirmed(&id);
                        }
                    } else if retried(n, count) {
                        if acker
                            .reconsume_later(&m, Duration::from_millis(300))
                            .await
                            .is_ok()
                        {
                            h.failure_confirmed(&id);
                        }
                    } else {
                        h.ack_sent(&id);
                        if acker.ack(&m).await.is_ok() {
                            h.ack_confirmed(&id);
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    drop(permit);
                });
            }
            // The last answers, before the consumer goes.
            let _ = tokio::time::timeout(
                Duration::from_secs(30),
                settling.acquire_many(SETTLING as u32),
            )
            .await;
        })
    };
    Load {
        stop,
        receipted,
        acked,
        tasks: vec![producing, consuming],
    }
}

/// One kill's times.
#[derive(Debug, Clone, Copy)]
struct Takeover {
    /// Kill → `Lookup` names another live member.
    placed: Option<Duration>,
    /// Kill → the probe's receipt.
    receipt: Duration,
    /// When the kill was sent (wall clock, to line the brokers' logs up
    /// with it).
    at: std::time::SystemTime,
}

/// Kills the leader `victim`, publishes a probe through `probe` and times
/// the takeover; `None` when no receipt came within [`TAKEOVER_LIMIT`].
async fn kill_and_time(
    brokers: &mut [ClusterBroker],
    victim: usize,
    probe: &ricochet_client::Producer,
    h: &History,
    k: usize,
) -> Option<Takeover> {
    let survivor = brokers[(victim + 1) % brokers.len()].url();
    let others: Vec<String> = brokers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, b)| b.id.clone())
        .collect();
    let watcher = client(&survivor).await;
    let placed: Arc<Mutex<Option<Duration>>> = Arc::default();
    let killed = Instant::now();
    let at = std::time::SystemTime::now();
    brokers[victim].kill9();
    let watching = {
        let placed = placed.clone();
        tokio::spawn(async move {
            while killed.elapsed() < TAKEOVER_LIMIT {
                if leader(&watcher, &others).await.is_some() {
                    *placed.lock().unwrap() = Some(killed.elapsed());
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let id = format!("probe-{k}");
    h.sent(&id);
    let sent = tokio::time::timeout(TAKEOVER_LIMIT, probe.send(id.clone())).await;
    let receipt = killed.elapsed();
    let _ = tokio::time::timeout(Duration::from_secs(5), watching).await;
    let placed = *placed.lock().unwrap();
    match sent {
        Ok(Ok(_)) => {
            h.receipted(&id);
            Some(Takeover {
                placed,
                receipt,
                at,
            })
        }
        _ => None,
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

fn line(what: &str, h: &Histogram<u64>) {
    if h.is_empty() {
        println!("{what:<40} (no samples)");
        return;
    }
    println!(
        "{what:<40} p50 {:>6} ms  p99 {:>6} ms  max {:>6} ms  ({} kills)",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max(),
        h.len()
    );
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
    let Some(etcd) = etcd_or_skip("leader_kills bench").await else {
        return;
    };
    let kills = env_u64("KILLS", 20) as usize;
    let ttl = env_u64("LEASE_TTL", 10);
    let settle = Duration::from_millis(env_u64("SETTLE_MS", 2_000));
    let rate = env_u64("RATE", 200).clamp(1, 100_000) as u32;
    let bin = ricochet_testkit::broker_bin(None);
    println!(
        "leader_kills: 3 brokers ({}) + etcd on loopback, lease TTL {ttl} s, {kills} kills, load {rate} msg/s",
        bin.display()
    );
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "kills",
        3,
        root.path(),
        Duration::from_secs(ttl),
        &SpawnOptions::new()
            .bin(&bin)
            .rust_log(std::env::var("BROKER_LOG").unwrap_or_else(|_| "warn".to_owned()))
            .echo_log(std::env::var_os("BROKER_LOG").is_some()),
    )
    .await;
    let ids: Vec<String> = brokers.iter().map(|b| b.id.clone()).collect();
    client(&brokers[0].url())
        .await
        .admin()
        .create_replicated_topic(TOPIC, 3)
        .await
        .expect("create the R3 topic");
    // The clients know every broker: the first as their service URL, the
    // others as fallbacks, asked while the first is down.
    let c = cluster_client(&brokers).await;
    let h = Arc::new(History::new());
    let load = start_load(&c, &h, rate);
    let probe = c
        .producer(TOPIC)
        .name("probe")
        .send_timeout(TAKEOVER_LIMIT)
        .create()
        .await
        .expect("probe producer");

    let mut receipt_ms = Histogram::<u64>::new(3).unwrap();
    let mut placed_ms = Histogram::<u64>::new(3).unwrap();
    let mut failed = 0usize;
    let started = Instant::now();
    for k in 0..kills {
        // All three up, the load moving.
        let deadline = Instant::now() + Duration::from_secs(60);
        while live_brokers(&brokers[0].url()).await < 3 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(settle).await;
        let before = load.receipted.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while load.receipted.load(Ordering::Relaxed) < before + 20 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lead = stable_leader(&c, &ids).await;
        let victim = ids.iter().position(|i| *i == lead).unwrap_or(0);
        match kill_and_time(&mut brokers, victim, &probe, &h, k).await {
            Some(t) => {
                receipt_ms.record(ms(t.receipt)).unwrap();
                if let Some(p) = t.placed {
                    placed_ms.record(ms(p)).unwrap();
                }
                println!(
                    "kill {:>3}: leader {lead} killed at {} (unix ms); Lookup names another after {} ms, probe receipted after {} ms",
                    k + 1,
                    t.at.duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis()),
                    t.placed.map_or("-".to_owned(), |p| ms(p).to_string()),
                    ms(t.receipt)
                );
            }
            None => {
                failed += 1;
                println!(
                    "kill {:>3}: leader {lead} killed; no receipt within {TAKEOVER_LIMIT:?}",
                    k + 1
                );
            }
        }
        brokers[victim].restart().await;
    }
    let run = started.elapsed();

    // Stop the load, then audit what is still deliverable.
    println!("stopping the load; then the audit");
    load.stop.store(true, Ordering::Release);
    for t in load.tasks {
        let _ = tokio::time::timeout(Duration::from_secs(150), t).await;
    }
    let audit = cluster_client(&brokers).await;
    let mut auditor = subscribe(&audit, true).await;
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), auditor.receive()).await {
        let id = String::from_utf8_lossy(m.payload()).into_owned();
        h.delivered(&id, m.delivery_count());
        h.found(&id, Place::Pending);
        auditor.ack(&m).await.expect("the auditor's ack");
    }

    println!(
        "run: {kills} kills in {} s; {} publishes receipted and {} acks confirmed by the load",
        run.as_secs(),
        load.receipted.load(Ordering::Relaxed),
        load.acked.load(Ordering::Relaxed)
    );
    line("takeover (kill -> probe receipt)", &receipt_ms);
    line("kill -> Lookup names the new leader", &placed_ms);
    if failed > 0 {
        println!("takeovers without a receipt within {TAKEOVER_LIMIT:?}: {failed}");
    }
    let (s, violations) = h.report();
    println!(
        "history: receipted {}, read once {}, unreceipted {}, deliveries {}, acks confirmed {}, failures confirmed {}, at the end {:?}",
        s.receipted,
        s.exactly_once,
        s.unreceipted,
        s.deliveries,
        s.acks_confirmed,
        s.failures_confirmed,
        s.places
    );
    let count = |f: fn(&Violation) -> bool| violations.iter().filter(|v| f(v)).count();
    println!(
        "violations: lost {}, doubled {}, delivered after ack {}, count went back {}, unknown {}",
        count(|v| matches!(v, Violation::Lost { .. })),
        count(|v| matches!(v, Violation::Doubled { .. })),
        count(|v| matches!(v, Violation::DeliveredAfterAck { .. })),
        count(|v| matches!(v, Violation::CountWentBack { .. })),
        count(|v| matches!(v, Violation::Unknown { .. })),
    );
    for v in violations.iter().take(20) {
        println!("  {v}");
    }
    if !violations.is_empty() || failed > 0 {
        std::process::exit(1);
    }
}
