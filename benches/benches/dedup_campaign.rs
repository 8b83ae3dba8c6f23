//! The de-duplication crash campaign (issue #28): a `sync` broker (the
//! release `ricochet-broker` binary, a child process) is SIGKILLed hundreds
//! of times under a publishing producer, and what it stored is counted.
//!
//! Each round starts the broker on the same data directory, opens the
//! producer `campaign` on topic `campaign`, first resends the batch it has
//! no receipt for (same sequence ids, as the client does on reconnect),
//! then publishes batches of 1 to 40 messages (100-byte payloads) back to
//! back, one in flight at a time; a random 10 to 400 ms after the producer
//! opened, the broker gets SIGKILL. Small segments (`segment_entries`, 64 by
//! default) make many batches span two segment trees. At the end one more
//! broker resends the last unreceipted batch, and a subscription created
//! before the first publish reads everything back.
//!
//! Counted: messages stored more than once (duplicates), receipted or
//! resent messages missing (losses), batches not stored at consecutive ids
//! (a half batch kept, the rest stored again), resends recognised as
//! already stored. A correct broker prints 0, 0, 0.
//!
//! `cargo build --release -p ricochet-broker && cargo bench -p
//! ricochet-benches --bench dedup_campaign`. Environment: `DEDUP_KILLS`
//! (default 300), `DEDUP_SEGMENT_ENTRIES` (64), `DEDUP_SEED`,
//! `RICOCHET_BROKER_BIN` (by default next to this bench in `target/release`).

use ricochet_proto::*;
use ricochet_testkit::raw::{RawConsumer, RawProducer};
use ricochet_testkit::{BrokerProcess, SpawnOptions, find_broker_bin};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TOPIC: &str = "campaign";
const PRODUCER: &str = "campaign";
const PAYLOAD: usize = 100;

/// xorshift64*: enough randomness for batch sizes and kill times.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What the producer knows, across rounds.
#[derive(Default)]
struct Producer {
    next_seq: u64,
    /// The batch sent without a receipt yet (resent first in the next round).
    pending: Option<Vec<OutboundMessage>>,
    /// Every batch ever built: first sequence id and length.
    batches: Vec<(u64, u64)>,
    receipted: u64,
    /// Resent messages the broker answered as duplicates.
    recognised: u64,
    resends: u64,
}

fn message(seq: u64) -> OutboundMessage {
    let mut payload = format!("seq {seq} ").into_bytes();
    payload.resize(PAYLOAD, b'.');
    OutboundMessage {
        payload,
        sequence_id: seq,
        ..Default::default()
    }
}

/// Sends `batch`; true once receipted (the counts updated).
async fn send(p: &mut RawProducer, state: &Mutex<Producer>, batch: Vec<OutboundMessage>) -> bool {
    let resend = lock(state).pending.as_ref() == Some(&batch);
    if !resend {
        lock(state).pending = Some(batch.clone());
    }
    match p.send_batch_result(batch).await {
        Ok(produce_response::Response::Receipts(r)) => {
            let mut s = lock(state);
            s.pending = None;
            s.receipted += r.receipts.len() as u64;
            if resend {
                s.resends += 1;
                s.recognised += r.receipts.iter().filter(|r| r.duplicate).count() as u64;
            }
            true
        }
        _ => false,
    }
}

fn lock(m: &Mutex<Producer>) -> std::sync::MutexGuard<'_, Producer> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One round's producer: resend, then publish until the broker dies (or
/// `stop_after` batches, in the last round).
async fn produce(
    url: String,
    state: Arc<Mutex<Producer>>,
    seed: u64,
    opened: tokio::sync::oneshot::Sender<()>,
    stop_after: Option<usize>,
) {
    let Ok(mut p) = RawProducer::open(&url, TOPIC, PRODUCER).await else {
        return;
    };
    let _ = opened.send(());
    let pending = lock(&state).pending.clone();
    if let Some(b) = pending
        && !send(&mut p, &state, b).await
    {
        return;
    }
    let mut rng = Rng(seed | 1);
    let mut sent = 0;
    while stop_after.is_none_or(|n| sent < n) {
        let batch: Vec<OutboundMessage> = {
            let mut s = lock(&state);
            let n = 1 + rng.below(40);
            let first = s.next_seq;
            s.next_seq += n;
            s.batches.push((first, n));
            (first..first + n).map(message).collect()
        };
        if !send(&mut p, &state, batch).await {
            return;
        }
        sent += 1;
    }
}

/// Sequence id -> entry ids, of everything subscription `check` holds.
async fn read_back(url: &str) -> BTreeMap<u64, Vec<u64>> {
    let mut c = RawConsumer::simple(url, TOPIC, "check", SubscriptionType::Exclusive).await;
    c.flow(20_000).await;
    let mut out: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut ids = Vec::new();
    let mut req = 1;
    while let Some(m) = c.next(Duration::from_secs(2)).await {
        let id = m.id.clone().expect("a delivered message has an id");
        out.entry(m.sequence_id).or_default().push(id.entry_id);
        ids.push(id);
        if ids.len() == 5_000 {
            c.ack(std::mem::take(&mut ids), req).await;
            req += 1;
            c.flow(5_000).await;
        }
    }
    out
}

fn spawn_options(bin: &Path, config: &Path) -> SpawnOptions {
    SpawnOptions::new()
        .bin(bin)
        .rust_log("error")
        .start_timeout(Duration::from_secs(60))
        .args([Path::new("--config"), config])
}

fn main() -> Result<(), BoxError> {
    let kills: u64 = std::env::var("DEDUP_KILLS").map_or(Ok(300), |v| v.parse())?;
    let segment: u64 = std::env::var("DEDUP_SEGMENT_ENTRIES").map_or(Ok(64), |v| v.parse())?;
    let seed: u64 = std::env::var("DEDUP_SEED")
        .map_or_else(|_| Ok(ricochet_testkit::now_us()), |v| v.parse::<u64>())?;
    let bin = find_broker_bin(None)?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        format!("durability = \"sync\"\nsegment_entries = {segment}\n"),
    )?;
    println!(
        "dedup campaign: {kills} SIGKILLs of a sync broker ({}), segment_entries {segment}, batches of 1-40 x {PAYLOAD} B, one in flight, kill 10-400 ms after the producer opens; seed {seed}",
        bin.display()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let options = spawn_options(&bin, &config);
    let state = Arc::new(Mutex::new(Producer::default()));
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    rt.block_on(async {
        let b = BrokerProcess::spawn(&data, &options).await;
        drop(RawConsumer::simple(b.url(), TOPIC, "check", SubscriptionType::Exclusive).await);
        b.kill9();
        for round in 0..kills {
            let b = BrokerProcess::spawn(&data, &options).await;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(produce(
                b.url().to_owned(),
                state.clone(),
                rng.below(u64::MAX),
                tx,
                None,
            ));
            let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
            tokio::time::sleep(Duration::from_millis(10 + rng.below(390))).await;
            b.kill9();
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
            if (round + 1) % 50 == 0 {
                let s = lock(&state);
                println!(
                    "  {} kills, {:.0} s: {} messages sent, {} receipted",
                    round + 1,
                    started.elapsed().as_secs_f64(),
                    s.next_seq,
                    s.receipted
                );
            }
        }
        let b = BrokerProcess::spawn(&data, &options).await;
        let (tx, _rx) = tokio::sync::oneshot::channel();
        produce(b.url().to_owned(), state.clone(), 1, tx, Some(1)).await;
        assert!(lock(&state).pending.is_none(), "the last resend failed");
        let held = read_back(b.url()).await;
        b.kill9();
        report(&lock(&state), &held, started.elapsed());
    });
    Ok(())
}

fn report(s: &Producer, held: &BTreeMap<u64, Vec<u64>>, took: Duration) {
    let duplicates: Vec<(&u64, &Vec<u64>)> = held.iter().filter(|(_, v)| v.len() > 1).collect();
    let lost: Vec<u64> = (0..s.next_seq).filter(|q| !held.contains_key(q)).collect();
    let unknown = held.keys().filter(|q| **q >= s.next_seq).count();
    let split = s
        .batches
        .iter()
        .filter(|(first, n)| {
            let ids: Vec<u64> = (*first..first + n)
                .filter_map(|q| held.get(&q).map(|v| v[0]))
                .collect();
            ids.windows(2).any(|w| w[1] != w[0] + 1)
        })
        .count();
    println!(
        "after {:.0} s: {} messages in {} batches sent, {} receipted ({} resent batches, {} resent messages recognised as stored)",
        took.as_secs_f64(),
        s.next_seq,
        s.batches.len(),
        s.receipted,
        s.resends,
        s.recognised
    );
    println!(
        "stored: {} distinct messages; duplicates {}, lost {}, batches in pieces {}, unknown {}",
        held.len(),
        duplicates.len(),
        lost.len(),
        split,
        unknown
    );
    for (q, ids) in duplicates.iter().take(10) {
        println!("  duplicate: sequence {q} at entry ids {ids:?}");
    }
    if !lost.is_empty() {
        println!("  lost (first 10): {:?}", &lost[..lost.len().min(10)]);
    }
}
