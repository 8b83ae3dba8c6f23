//! Retry-tier figures for the broker (a bench binary; prints them):
//!
//! 1. **Redelivery lateness** of N concurrent scheduled retries (10 000 and
//!    100 000 by default), due times spread over `RS_SPREAD_MS`:
//!    * at the scheduler alone: `Scheduler` + `SledStorage` in this process,
//!      entries written through `Storage::put_schedule` then handed to the
//!      scheduler (as a tier move does); lateness = wall-clock time the fire
//!      callback (the subscription's channel) receives an entry − its due time;
//!    * end to end: an in-process `TestBroker`, a raw gRPC consumer on a
//!      delay-level policy nacks every message in paced frames (so the due
//!      times spread over `RS_SPREAD_MS`), the level's delay being long enough
//!      that the broker has confirmed every move before the first is due;
//!      lateness = wall-clock receive time of the retry copy − its
//!      `deliver_at_ms` (the due time the broker stored).
//!
//!    "early" counts deliveries before their due time (must be 0).
//! 2. **Throughput of the fail → retry tier → redeliver loop**: a consumer
//!    keeps `RS_LOOP_WORKING_SET` messages cycling; every delivery is failed
//!    at once (per-message `reconsume_later` with a 0 ms delay, or one nack
//!    frame per received frame on a 1 ms delay-level policy), and comes back
//!    from the retry tier. Messages per second = redeliveries per second.
//! 3. **Memory and restart with 1 000 000 scheduled retries due in 1–2 h**:
//!    the data directory is written by the broker's own tier move
//!    (`Storage::move_messages`: per message a retry-tier entry and a schedule
//!    entry holding its failure record); then the real `ricochet-broker` binary is started on it
//!    (and on a directory with no retries, the baseline). Restart time = spawn
//!    → listening, and spawn → a consumer receives a freshly published
//!    message; memory = the broker process's VmRSS (from /proc) once idle.
//!    Needs the release binary: `cargo build --release -p ricochet-broker`
//!    (or `RS_BROKER_BIN=path`, or `RICOCHET_BROKER_BIN=path`); skipped with
//!    a note otherwise.
//!
//! `cargo bench -p ricochet-benches --bench retry_scheduler`. Environment:
//! * sizes: `RS_QUICK=1` (10 000 only, 100 000 retries for part 3, 2 s
//!   loops), `RS_SIZES=10000,100000`, `RS_SPREAD_MS=3000`, `RS_LOOP_SECS=5`,
//!   `RS_LOOP_WORKING_SET=2000`, `RS_MEM_RETRIES=1000000`;
//! * `RS_ONLY=scheduler|e2e|short|loop|memory` runs one part;
//! * part 1: `RS_SCHED_GROUP=k` gives k entries the same due time (as one
//!   tier move's batch has), `RS_E2E_FRAMES=k` nack frames (default: frames
//!   of 100 ids),
//!   `RS_E2E_CHILD=1` runs the broker binary in a child process instead,
//!   `RS_DEBUG=1` shows the latest deliveries;
//! * part 3: `RS_BROKER_BIN=path`, `RS_MEM_DIR=dir` keeps (and reuses) the
//!   data directories, `RS_MEM_MOVE=k` moves k retries per transaction
//!   (default 1 000), `RS_MEM_CONFIG=file.toml` is passed to the broker as
//!   `--config`.

use hdrhistogram::Histogram;
use prost::Message as _;
use ricochet_broker::clock::SystemClock;
use ricochet_broker::storage::{
    Arrival, AttemptRecord, FailureRecord, MoveItem, ScheduleKey, SledStorage, Storage, SubMessage,
    SubscriptionRecord, TierId, TierMove, TopicKind, TopicRecord,
};
use ricochet_broker::{Durability, Scheduler};
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use ricochet_testkit::{
    BrokerBinNotFound, BrokerProcess, InProcessBroker, SpawnOptions, find_broker_bin, now_ms,
    now_us,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;
use tonic::transport::Channel;

// The same allocator as the broker binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn debug() -> bool {
    std::env::var_os("RS_DEBUG").is_some()
}

fn quick() -> bool {
    std::env::var_os("RS_QUICK").is_some()
}

/// Lateness in microseconds, with the count of early (negative) ones.
struct Lateness {
    hist: Histogram<u64>,
    early: u64,
    worst_early_us: u64,
}

impl Lateness {
    fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"),
            early: 0,
            worst_early_us: 0,
        }
    }

    /// Records a delivery at `at_us` of something due at `due_ms`.
    fn record(&mut self, at_us: u64, due_ms: u64) {
        let due_us = due_ms * 1000;
        if at_us < due_us {
            self.early += 1;
            self.worst_early_us = self.worst_early_us.max(due_us - at_us);
        } else {
            self.hist.saturating_record((at_us - due_us).max(1));
        }
    }

    fn print(&self, label: &str) {
        let ms = |q: f64| self.hist.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "  {label}: n={} p50={:.2} ms p99={:.2} ms p99.9={:.2} ms max={:.2} ms early={}{}",
            self.hist.len() + self.early,
            ms(0.5),
            ms(0.99),
            ms(0.999),
            self.hist.max() as f64 / 1000.0,
            self.early,
            if self.early > 0 {
                format!(" (worst {} us early)", self.worst_early_us)
            } else {
                String::new()
            }
        );
    }
}

fn main() -> Result<(), BoxError> {
    // Criterion-style filters may be passed by `cargo bench`; ignore them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "retry_scheduler: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let only = std::env::var("RS_ONLY").unwrap_or_default();
    let part = |p: &str| only.is_empty() || only == p;
    let sizes: Vec<usize> = match std::env::var("RS_SIZES") {
        Ok(s) => s.split(',').filter_map(|v| v.trim().parse().ok()).collect(),
        Err(_) if quick() => vec![10_000],
        Err(_) => vec![10_000, 100_000],
    };
    let spread_ms: u64 = env_or("RS_SPREAD_MS", 3_000);
    rt.block_on(async {
        if part("scheduler") {
            println!("\n1a. lateness at the scheduler (Scheduler + SledStorage, fire callback − due), due times over {spread_ms} ms");
            for &n in &sizes {
                scheduler_lateness(n, spread_ms).await?;
            }
        }
        if part("e2e") {
            println!("\n1b. lateness end to end (in-process broker, nack → retry tier → consumer receive − deliver_at_ms), due times over {spread_ms} ms");
            for durability in [Durability::Sync, Durability::Interval] {
                for &n in &sizes {
                    e2e_lateness(durability, n, spread_ms).await?;
                }
            }
        }
        if part("short") {
            println!("\n1c. short delays end to end: 2 000 messages nacked 10 per frame every 5 ms, one delay level; lateness = receive − deliver_at_ms");
            for durability in [Durability::Sync, Durability::Interval] {
                for delay_ms in [10, 50] {
                    short_delay_lateness(durability, delay_ms).await?;
                }
            }
        }
        if part("loop") {
            let secs: u64 = env_or("RS_LOOP_SECS", if quick() { 2 } else { 5 });
            let working_set: usize = env_or("RS_LOOP_WORKING_SET", 2_000);
            println!("\n2. fail → retry tier → redeliver loop, {working_set} messages cycling, {secs} s per case");
            for durability in [Durability::Sync, Durability::Interval] {
                for how in [Fail::ReconsumeLater, Fail::NackFrame] {
                    redeliver_loop(durability, how, working_set, secs).await?;
                }
            }
        }
        Ok::<_, BoxError>(())
    })?;
    if part("memory") {
        let n: usize = env_or("RS_MEM_RETRIES", if quick() { 100_000 } else { 1_000_000 });
        rt.block_on(memory_and_restart(n))?;
    }
    Ok(())
}

// ---------------------------------------------------------------- part 1a

async fn scheduler_lateness(n: usize, spread_ms: u64) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let storage: Arc<dyn Storage> =
        Arc::new(SledStorage::open(dir.path(), 16_384, 256 * 1024 * 1024)?);
    let stop = CancellationToken::new();
    let scheduler = Scheduler::start(
        storage.clone(),
        Duration::from_secs(60),
        Arc::new(SystemClock),
        stop.clone(),
    );
    let (tx, mut fired) = mpsc::unbounded_channel();
    scheduler.register(1, tx);
    // Let the first refill run (an empty index).
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Every entry is persisted and handed over before the first is due.
    let lead_ms = 1_000 + n as u64 / 20;
    // Entries due at the same instant, as one tier move's batch is.
    let group: usize = env_or("RS_SCHED_GROUP", 1).max(1);
    let first_due = now_ms() + lead_ms;
    let keys: Vec<ScheduleKey> = (0..n)
        .map(|i| ScheduleKey {
            due_ms: first_due + spread_ms * (i - i % group) as u64 / n as u64,
            message: SubMessage {
                sub_id: 1,
                tier: TierId::Retry,
                entry_id: i as u64,
            },
        })
        .collect();
    let t = Instant::now();
    for chunk in keys.chunks(10_000) {
        let writes: Vec<(ScheduleKey, bool)> = chunk.iter().map(|k| (*k, true)).collect();
        storage.put_schedule(&writes)?;
        scheduler.add(chunk.to_vec());
    }
    let handed_over = t.elapsed();
    let spare = first_due as i64 - now_ms() as i64;

    let mut late = Lateness::new();
    let mut got = 0;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(lead_ms + spread_ms + 30_000);
    while got < n {
        let Ok(Some(batch)) = tokio::time::timeout_at(deadline, fired.recv()).await else {
            break;
        };
        let at = now_us();
        for k in batch {
            late.record(at, k.due_ms);
            got += 1;
        }
    }
    let stats = &scheduler.stats;
    let fired_total = stats.fired.load(std::sync::atomic::Ordering::Relaxed);
    let mean_ms = stats
        .lateness_us_total
        .load(std::sync::atomic::Ordering::Relaxed) as f64
        / fired_total.max(1) as f64
        / 1000.0;
    stop.cancel();
    println!(
        "  {n} retries: written and handed over in {handed_over:.0?} ({spare} ms before the first was due); {got} fired"
    );
    late.print(&format!("{n} at the scheduler"));
    println!("  (the scheduler's own counter, ms resolution: mean {mean_ms:.2} ms late)");
    if got < n {
        println!("  MISSING: {} entries never fired", n - got);
    }
    Ok(())
}

// ---------------------------------------------------------------- raw gRPC

async fn channel(url: &str) -> Result<Channel, BoxError> {
    Ok(Channel::from_shared(url.to_owned())?.connect().await?)
}

/// Publishes `n` 100-byte messages in batches of 1000, awaiting each receipt.
async fn publish(url: &str, topic: &str, n: usize) -> Result<(), BoxError> {
    let mut client = BrokerClient::new(channel(url).await?);
    let (tx, rx) = mpsc::channel(4);
    tx.send(ProduceRequest {
        request: Some(produce_request::Request::Open(ProducerOpen {
            topic: topic.into(),
            producer_name: "bench".into(),
        })),
    })
    .await?;
    let mut inbound = client.produce(ReceiverStream::new(rx)).await?.into_inner();
    // Sequence ids continue from the producer's last stored one (de-duplication).
    let mut seq = match inbound.message().await?.and_then(|r| r.response) {
        Some(produce_response::Response::Opened(o)) => o.last_sequence_id.unwrap_or(0),
        other => return Err(format!("expected ProducerOpened, got {other:?}").into()),
    };
    let mut left = n;
    while left > 0 {
        let k = left.min(1_000);
        left -= k;
        let messages = (0..k)
            .map(|_| {
                seq += 1;
                OutboundMessage {
                    payload: vec![7u8; 100],
                    sequence_id: seq,
                    ..Default::default()
                }
            })
            .collect();
        tx.send(ProduceRequest {
            request: Some(produce_request::Request::Send(SendBatch {
                request_id: seq,
                messages,
            })),
        })
        .await?;
        match inbound.message().await?.and_then(|r| r.response) {
            Some(produce_response::Response::Receipts(_)) => {}
            other => return Err(format!("publish failed: {other:?}").into()),
        }
    }
    Ok(())
}

struct RawConsumer {
    tx: mpsc::Sender<ConsumeRequest>,
    rx: Streaming<ConsumeResponse>,
    /// Requests the broker confirmed (code OK), and when the last one came.
    confirmed: usize,
    last_confirmed_ms: u64,
}

impl RawConsumer {
    async fn subscribe(
        url: &str,
        topic: &str,
        policy: Option<DeadLetterPolicyConfig>,
    ) -> Result<Self, BoxError> {
        let mut client = BrokerClient::new(channel(url).await?);
        let (tx, rx) = mpsc::channel(8_192);
        tx.send(ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(Subscribe {
                topic: topic.into(),
                subscription: "s".into(),
                subscription_type: SubscriptionType::Shared as i32,
                initial_position: InitialPosition::Earliest as i32,
                consumer_name: "bench".into(),
                dead_letter_policy: policy,
                retry_enabled: None,
                dead_letter_reader: false,
            })),
        })
        .await?;
        let mut rx = client.consume(ReceiverStream::new(rx)).await?.into_inner();
        match rx.message().await?.and_then(|r| r.response) {
            Some(consume_response::Response::Subscribed(_)) => Ok(Self {
                tx,
                rx,
                confirmed: 0,
                last_confirmed_ms: 0,
            }),
            other => Err(format!("expected Subscribed, got {other:?}").into()),
        }
    }

    async fn send(&self, r: consume_request::Request) -> Result<(), BoxError> {
        self.tx
            .send(ConsumeRequest { request: Some(r) })
            .await
            .map_err(|_| "consumer stream closed".into())
    }

    async fn flow(&self, permits: usize) -> Result<(), BoxError> {
        self.send(consume_request::Request::Flow(Flow {
            permits: permits as u32,
        }))
        .await
    }

    /// Nacks `ids` in one frame; a non-zero `request_id` asks for a confirmation.
    async fn nack(&self, ids: Vec<MessageId>, request_id: u64) -> Result<(), BoxError> {
        let messages = ids
            .into_iter()
            .map(|id| FailedDelivery {
                id: Some(id),
                reason: FailureReason::Nack as i32,
                detail: String::new(),
                delay_ms: 0,
            })
            .collect();
        self.send(consume_request::Request::Redeliver(Redeliver {
            request_id,
            messages,
        }))
        .await
    }

    async fn reconsume_now(&self, id: MessageId) -> Result<(), BoxError> {
        self.send(consume_request::Request::ReconsumeLater(ReconsumeLater {
            request_id: 0,
            id: Some(id),
            delay: Some(reconsume_later::Delay::DelayMs(0)),
            properties: Default::default(),
            detail: String::new(),
        }))
        .await
    }

    /// Acks `ids` individually; a non-zero `request_id` asks for a confirmation.
    async fn ack(&self, ids: Vec<MessageId>, request_id: u64) -> Result<(), BoxError> {
        self.send(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Individual as i32,
            ids,
        }))
        .await
    }

    /// Reads frames until `n` requests in all have been confirmed.
    async fn confirmed(&mut self, n: usize, wait: Duration) -> Result<(), BoxError> {
        let deadline = tokio::time::Instant::now() + wait;
        while self.confirmed < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(format!("{} of {n} requests confirmed", self.confirmed).into());
            }
            self.messages(left).await?;
        }
        Ok(())
    }

    /// The next frame of messages (skipping results and other frames).
    async fn messages(&mut self, wait: Duration) -> Result<Option<Vec<Message>>, BoxError> {
        loop {
            match tokio::time::timeout(wait, self.rx.message()).await {
                Err(_) => return Ok(None),
                Ok(r) => match r?.and_then(|r| r.response) {
                    Some(consume_response::Response::Messages(b)) => return Ok(Some(b.messages)),
                    Some(consume_response::Response::Result(r)) if r.code != 0 => {
                        return Err(format!("request failed: {r:?}").into());
                    }
                    Some(consume_response::Response::Result(_)) => {
                        self.confirmed += 1;
                        self.last_confirmed_ms = now_ms();
                    }
                    Some(_) => {}
                    None => return Err("consumer stream ended".into()),
                },
            }
        }
    }
}

/// A consumer on a one-level delay policy, with `n` freshly published
/// messages delivered to it once (their ids returned, ready to fail).
async fn failing_consumer(
    url: &str,
    topic: &str,
    delay_ms: u64,
    n: usize,
) -> Result<(RawConsumer, Vec<MessageId>), BoxError> {
    let mut c = RawConsumer::subscribe(url, topic, Some(delay_levels(vec![delay_ms], 16))).await?;
    c.flow(2 * n).await?;
    publish(url, topic, n).await?;
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let Some(msgs) = c.messages(Duration::from_secs(30)).await? else {
            return Err(format!("only {} of {n} first deliveries", ids.len()).into());
        };
        ids.extend(msgs.into_iter().filter_map(|m| m.id));
    }
    Ok((c, ids))
}

fn delay_levels(levels_ms: Vec<u64>, max_reconsume_times: u32) -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(
            DelayLevelPolicyConfig {
                levels_ms,
                start_level: 1,
                max_reconsume_times,
            },
        )),
        ..Default::default()
    }
}

// ---------------------------------------------------------------- part 1b

async fn e2e_lateness(durability: Durability, n: usize, spread_ms: u64) -> Result<(), BoxError> {
    let broker = Broker::start(durability, n + 1_000).await?;
    let url = broker.url.clone();
    let topic = "late";
    // Every nack waits the one level: the spread plus a lead long enough for
    // the broker to have moved all n into the retry tier before the first one
    // is due (it moves about 20 000 messages a second here).
    let lead_ms = 1_000 + n as u64 / 15;
    let delay_ms = spread_ms + lead_ms;
    let (mut c, ids) = failing_consumer(&url, topic, delay_ms, n).await?;
    // Nack in paced frames over the spread.
    // Frames of 100 ids by default, as a client's grouped nacks; all ids of a
    // frame share one due time, so a frame is a burst due at one instant.
    let frames = env_or("RS_E2E_FRAMES", n.div_ceil(100)).clamp(1, n);
    let per_frame = n.div_ceil(frames);
    let pace = Duration::from_millis(spread_ms) / frames as u32;
    let t0 = tokio::time::Instant::now();
    let mut nacked_until = 0;
    for (i, chunk) in ids.chunks(per_frame).enumerate() {
        tokio::time::sleep_until(t0 + pace * i as u32).await;
        c.nack(chunk.to_vec(), i as u64 + 1).await?;
        nacked_until = now_ms();
    }
    let frames_sent = ids.chunks(per_frame).count();
    let mut late = Lateness::new();
    let mut first_due = u64::MAX;
    let mut got = 0;
    let mut wrong_delay = 0;
    let mut worst = Vec::new();
    let mut redelivered = Vec::with_capacity(n);
    while got < n {
        let Some(msgs) = c.messages(Duration::from_millis(delay_ms + 30_000)).await? else {
            break;
        };
        let at = now_us();
        for m in msgs {
            if !m.id.as_ref().is_some_and(|id| id.topic.ends_with("-RETRY")) {
                continue;
            }
            if m.properties.get(props::DELAY_TIME) != Some(&delay_ms.to_string()) {
                wrong_delay += 1;
            }
            first_due = first_due.min(m.deliver_at_ms);
            late.record(at, m.deliver_at_ms);
            if let Some(id) = m.id {
                redelivered.push(id);
            }
            if debug() {
                worst.push((at.saturating_sub(m.deliver_at_ms * 1000), m.deliver_at_ms));
            }
            got += 1;
        }
    }
    let sent_ahead = first_due as i64 - nacked_until as i64;
    let moved_ahead = first_due as i64 - c.last_confirmed_ms as i64;
    if c.confirmed < frames_sent {
        println!(
            "  NOTE: {} of {frames_sent} nack frames confirmed",
            c.confirmed
        );
    }
    println!(
        "  {durability:?}, {n} retries: last nack sent {sent_ahead} ms and moved (confirmed) {moved_ahead} ms before the first was due; {got} redelivered{}",
        if wrong_delay > 0 {
            format!(", {wrong_delay} with a wrong DELAY_TIME")
        } else {
            String::new()
        }
    );
    late.print(&format!("{n} end to end ({durability:?}, {})", broker.kind));
    if debug() {
        worst.sort_unstable();
        let from = worst.len().saturating_sub(5);
        for (us, due) in &worst[from..] {
            println!(
                "    {us} us late, due {} ms after the first",
                due - first_due
            );
        }
        let mut per_100ms = std::collections::BTreeMap::new();
        for (us, due) in &worst {
            if *us > 20_000 {
                *per_100ms.entry((due - first_due) / 100 * 100).or_insert(0) += 1;
            }
        }
        println!("    > 20 ms late, by due offset (ms): {per_100ms:?}");
    }
    // Ack everything, so closing the consumer leaves nothing to redeliver.
    let before = c.confirmed;
    let chunks = redelivered.chunks(1_000).count();
    for (i, chunk) in redelivered.chunks(1_000).enumerate() {
        c.ack(chunk.to_vec(), 1_000_000 + i as u64).await?;
    }
    c.confirmed(before + chunks, Duration::from_secs(60))
        .await?;
    drop(c);
    broker.stop().await?;
    Ok(())
}

// ---------------------------------------------------------------- part 1c

/// Retries due sooner than a flush takes: the timer must not wait for the
/// move's fsync before it starts counting.
async fn short_delay_lateness(durability: Durability, delay_ms: u64) -> Result<(), BoxError> {
    const N: usize = 2_000;
    let broker = Broker::start(durability, N + 1_000).await?;
    let url = broker.url.clone();
    let topic = "short";
    let (mut c, ids) = failing_consumer(&url, topic, delay_ms, N).await?;
    let mut late = Lateness::new();
    let mut redelivered = Vec::with_capacity(N);
    let mut very_late = Vec::new();
    let mut chunks = ids.chunks(10);
    let mut next_nack = tokio::time::Instant::now();
    let mut nacking = true;
    while redelivered.len() < N {
        // Interleave: nack the next frame when its time comes, read meanwhile.
        if nacking && tokio::time::Instant::now() >= next_nack {
            match chunks.next() {
                Some(chunk) => c.nack(chunk.to_vec(), 0).await?,
                None => nacking = false,
            }
            next_nack += Duration::from_millis(5);
            continue;
        }
        let wait = if nacking {
            next_nack.saturating_duration_since(tokio::time::Instant::now())
        } else {
            Duration::from_secs(30)
        };
        let Some(msgs) = c.messages(wait).await? else {
            if nacking {
                continue;
            }
            break;
        };
        let at = now_us();
        for m in msgs {
            if m.id.as_ref().is_some_and(|id| id.topic.ends_with("-RETRY")) {
                late.record(at, m.deliver_at_ms);
                if debug() && at > m.deliver_at_ms * 1000 + 20_000 {
                    very_late.push((redelivered.len(), (at - m.deliver_at_ms * 1000) / 1000));
                }
                redelivered.extend(m.id);
            }
        }
    }
    late.print(&format!("{durability:?}, {delay_ms} ms delay"));
    if !very_late.is_empty() {
        println!(
            "    {} more than 20 ms late (redelivery index, ms late): first {:?}, last {:?}",
            very_late.len(),
            very_late.first(),
            very_late.last()
        );
    }
    for chunk in redelivered.chunks(1_000) {
        c.ack(chunk.to_vec(), 0).await?;
    }
    drop(c);
    broker.stop().await?;
    Ok(())
}

/// The broker under test, on a temporary directory: in this process, or
/// (`RS_E2E_CHILD=1`) the release binary in a child process.
struct Broker {
    url: String,
    kind: &'static str,
    in_process: Option<InProcessBroker>,
    _child: Option<(BrokerProcess, tempfile::TempDir)>,
}

impl Broker {
    async fn start(durability: Durability, max_unacked: usize) -> Result<Self, BoxError> {
        if std::env::var_os("RS_E2E_CHILD").is_some() {
            let bin = broker_bin().map_err(|e| format!("RS_E2E_CHILD: {e}"))?;
            let dir = tempfile::tempdir()?;
            let config = dir.path().join("broker.toml");
            let mode = match durability {
                Durability::Sync => "sync",
                Durability::Interval => "interval",
            };
            std::fs::write(
                &config,
                format!("durability = \"{mode}\"\nmax_unacked_per_consumer = {max_unacked}\n"),
            )?;
            let child = spawn_broker(&bin, &dir.path().join("data"), Some(&config)).await;
            return Ok(Self {
                url: child.url().to_owned(),
                kind: "child process",
                in_process: None,
                _child: Some((child, dir)),
            });
        }
        let broker = InProcessBroker::start_with(|c| {
            c.durability = durability;
            c.max_unacked_per_consumer = max_unacked;
        })
        .await;
        Ok(Self {
            url: broker.url(),
            kind: "in process",
            in_process: Some(broker),
            _child: None,
        })
    }

    async fn stop(self) -> Result<(), BoxError> {
        if let Some(b) = self.in_process {
            let storage = Arc::downgrade(&b.core.storage);
            b.shutdown().await;
            // The next broker in this process must not start while this one's
            // sled database is still closing: sled 0.34's transaction lock is
            // process-wide (a hang was seen otherwise).
            let t = Instant::now();
            while storage.upgrade().is_some() {
                if t.elapsed() > Duration::from_secs(120) {
                    return Err("the broker's storage is still open 120 s after shutdown".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- part 2

#[derive(Debug, Clone, Copy)]
enum Fail {
    /// One `ReconsumeLater` (0 ms delay) per message.
    ReconsumeLater,
    /// One `Redeliver` (nack) frame per received frame, 1 ms delay level.
    NackFrame,
}

async fn redeliver_loop(
    durability: Durability,
    how: Fail,
    working_set: usize,
    secs: u64,
) -> Result<(), BoxError> {
    let broker = Broker::start(durability, 50_000).await?;
    let url = broker.url.clone();
    let topic = "loop";
    let mut c = RawConsumer::subscribe(&url, topic, Some(delay_levels(vec![1], 1_000_000))).await?;
    c.flow(working_set).await?;
    publish(&url, topic, working_set).await?;
    let warmup = Duration::from_millis(500);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + Duration::from_secs(secs);
    let mut counted = 0u64;
    let mut total = 0u64;
    let mut from_retry = 0u64;
    while Instant::now() < end {
        let Some(msgs) = c.messages(Duration::from_secs(10)).await? else {
            return Err(format!("{how:?}: the loop stalled after {total} deliveries").into());
        };
        let now = Instant::now();
        let k = msgs.len();
        total += k as u64;
        from_retry += msgs
            .iter()
            .filter(|m| m.id.as_ref().is_some_and(|id| id.topic.ends_with("-RETRY")))
            .count() as u64;
        if now >= measure_from {
            counted += k as u64;
        }
        let ids: Vec<MessageId> = msgs.into_iter().filter_map(|m| m.id).collect();
        match how {
            Fail::ReconsumeLater => {
                for id in ids {
                    c.reconsume_now(id).await?;
                }
            }
            Fail::NackFrame => c.nack(ids, 0).await?,
        }
        c.flow(k).await?;
    }
    let elapsed = Instant::now().saturating_duration_since(measure_from);
    println!(
        "  {durability:?}, {how:?}: {:.0} msg/s redelivered ({counted} in {elapsed:.2?}; {from_retry} of {total} deliveries from the retry tier)",
        counted as f64 / elapsed.as_secs_f64()
    );
    drop(c);
    broker.stop().await?;
    Ok(())
}

// ---------------------------------------------------------------- part 3

const MEM_TOPIC: &str = "persistent://public/default/mem";
const MEM_RETRY: &str = "persistent://public/default/mem-s-RETRY";

/// Writes a data directory as a broker holding `n` scheduled retries due in
/// 1–2 h leaves it: topic and retry-tier records, one subscription, and the
/// retries themselves written by `Storage::move_messages` (the broker's own
/// tier move) from main-tier entries that failed once, 1 000 per move
/// (`RS_MEM_MOVE`); the
/// main-tier segments are then trimmed as consumed.
async fn write_scheduled(dir: &Path, n: usize) -> Result<(u64, Duration), BoxError> {
    let t = Instant::now();
    let storage = SledStorage::open(dir, 16_384, 256 * 1024 * 1024)?;
    let now = now_ms();
    for (name, kind) in [
        (MEM_TOPIC, TopicKind::Normal),
        (MEM_RETRY, TopicKind::Retry),
    ] {
        storage.put_topic(&TopicRecord {
            name: name.into(),
            created_ms: now,
            kind,
        })?;
    }
    let mut sub = SubscriptionRecord::new(
        storage.next_id()?,
        MEM_TOPIC,
        "s",
        SubscriptionType::Shared,
        0,
    );
    sub.created_ms = now;
    storage.put_subscription(&sub)?;
    let hour = 3_600_000u64;
    // RS_MEM_MOVE=k: messages per tier move (1 = every retry moved alone).
    let move_size: usize = env_or("RS_MEM_MOVE", 1_000usize).clamp(1, 1_000);
    for start in (0..n).step_by(1_000) {
        let end = (start + 1_000).min(n);
        let mut items = Vec::with_capacity(end - start);
        for i in start..end {
            let due = now + hour + hour * i as u64 / n as u64;
            let delay = due - now;
            let mut m = ricochet_proto::Message {
                payload: vec![7u8; 100],
                publish_time_ms: now,
                producer_name: "bench".into(),
                sequence_id: i as u64,
                deliver_at_ms: due,
                delivery_count: 1,
                ..Default::default()
            };
            for (k, v) in [
                (props::REAL_TOPIC, MEM_TOPIC.to_owned()),
                (props::ORIGIN_MESSAGE_ID, format!("{MEM_TOPIC}:{i}")),
                (props::RECONSUME_TIMES, "1".to_owned()),
                (props::DELAY_TIME, delay.to_string()),
            ] {
                m.properties.insert(k.into(), v);
            }
            sub.main.ack(i as u64);
            items.push(MoveItem {
                from: SubMessage {
                    sub_id: sub.id,
                    tier: TierId::Main,
                    entry_id: i as u64,
                },
                from_schedule: None,
                payload: m.encode_to_vec(),
                target_entry_id: i as u64,
                failures: FailureRecord {
                    count: 1,
                    first_failure_ms: now,
                    attempts: vec![AttemptRecord {
                        time_ms: now,
                        delivery_count: 1,
                        consumer: "bench".into(),
                        reason: ricochet_policy::FailureReason::ReconsumeLater,
                        detail: String::new(),
                    }],
                    hold_until_ms: 0,
                },
                arrival: Arrival::Retry { due_ms: due },
            });
        }
        // The failed originals, published as one batch (one stored frame).
        let originals: Vec<Vec<u8>> = (start..end)
            .map(|i| {
                ricochet_proto::Message {
                    payload: vec![7u8; 100],
                    publish_time_ms: now,
                    producer_name: "bench".into(),
                    sequence_id: i as u64,
                    ..Default::default()
                }
                .encode_to_vec()
            })
            .collect();
        storage.append(MEM_TOPIC, start as u64, &originals, None)?;
        for part in items.chunks(move_size) {
            storage.move_messages(&TierMove {
                target_topic: MEM_RETRY.into(),
                subscription: sub.clone(),
                items: part.to_vec(),
            })?;
        }
    }
    // Every original was acked by its move: its segments go, as the broker's
    // retention does once all subscriptions are past them.
    storage.trim(MEM_TOPIC, n as u64)?;
    storage.flush().await?;
    let size = storage.size_on_disk()?;
    drop(storage);
    Ok((size, t.elapsed()))
}

/// `RS_BROKER_BIN`, else the testkit's search: `RICOCHET_BROKER_BIN`, then
/// `target/release/ricochet-broker` next to this bench.
fn broker_bin() -> Result<PathBuf, BrokerBinNotFound> {
    find_broker_bin(
        std::env::var_os("RS_BROKER_BIN")
            .map(PathBuf::from)
            .as_deref(),
    )
}

/// `VmRSS` and `VmHWM` of a process, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Run {
    listening: Duration,
    dispatched: Duration,
    rss: u64,
    hwm: u64,
}

/// The broker binary `bin` on `dir`, with `--config` when given; returns
/// once it listens (on a port of its own choosing).
async fn spawn_broker(bin: &Path, dir: &Path, config: Option<&Path>) -> BrokerProcess {
    let mut options = SpawnOptions::new()
        .bin(bin)
        .rust_log("error")
        .start_timeout(Duration::from_secs(60));
    if let Some(c) = config {
        options = options.args([Path::new("--config"), c]);
    }
    BrokerProcess::spawn(dir, &options).await
}

/// Starts the broker on `dir`, then publishes and receives one fresh message.
async fn start_and_dispatch(
    bin: &Path,
    dir: &Path,
    config: Option<&Path>,
) -> Result<Run, BoxError> {
    let t = Instant::now();
    let child = spawn_broker(bin, dir, config).await;
    let listening = t.elapsed();
    let url = child.url();
    let mut c = RawConsumer::subscribe(url, "mem", None).await?;
    c.flow(10).await?;
    publish(url, "mem", 1).await?;
    let got = c.messages(Duration::from_secs(30)).await?;
    let dispatched = t.elapsed();
    let Some(ids) = got.map(|m| m.into_iter().filter_map(|m| m.id).collect::<Vec<_>>()) else {
        return Err("the fresh message was not dispatched".into());
    };
    // Acked, so the next start begins from the same state.
    c.send(consume_request::Request::Ack(Ack {
        request_id: 0,
        ack_type: AckType::Individual as i32,
        ids,
    }))
    .await?;
    // Idle for a while: the scheduler's refills and sled's flusher settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss, hwm) = rss(child.pid());
    drop(c);
    drop(child);
    Ok(Run {
        listening,
        dispatched,
        rss,
        hwm,
    })
}

async fn memory_and_restart(n: usize) -> Result<(), BoxError> {
    println!(
        "\n3. memory and restart with {n} scheduled retries due in 1-2 h (data written by Storage::move_messages; the release ricochet-broker binary started on it)"
    );
    let bin = match broker_bin() {
        Ok(bin) => bin,
        Err(e) => {
            println!("  skipped: {e}");
            return Ok(());
        }
    };
    println!("  broker binary: {}", bin.display());
    // RS_MEM_DIR keeps the data directories (and reuses them when present).
    let tmp = tempfile::tempdir()?;
    let root = std::env::var_os("RS_MEM_DIR").map_or_else(|| tmp.path().to_owned(), PathBuf::from);
    let base_dir = root.join("base");
    let full_dir = root.join(format!(
        "full-{n}-move-{}",
        env_or("RS_MEM_MOVE", 1_000usize)
    ));
    for (dir, count) in [(&base_dir, 0), (&full_dir, n)] {
        if dir.exists() {
            println!("  setup: reusing {}", dir.display());
            continue;
        }
        let (size, took) = write_scheduled(dir, count).await?;
        println!(
            "  setup: {count} retries written in {took:.1?}; sled size on disk {:.1} MB",
            size as f64 / 1e6
        );
    }
    let config = std::env::var_os("RS_MEM_CONFIG").map(PathBuf::from);
    if let Some(c) = &config {
        println!(
            "  broker config: {}",
            std::fs::read_to_string(c)?.trim().replace('\n', "; ")
        );
    }
    // sled takes a moment to release its files after the last handle drops.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut base = Vec::new();
    let mut full = Vec::new();
    for round in 0..3 {
        base.push(start_and_dispatch(&bin, &base_dir, config.as_deref()).await?);
        full.push(start_and_dispatch(&bin, &full_dir, config.as_deref()).await?);
        let (b, f) = (&base[round], &full[round]);
        println!(
            "  restart {}: baseline listening {:.2?}, dispatching {:.2?}, RSS {:.1} MB (peak {:.1} MB) | with {n}: listening {:.2?}, dispatching {:.2?}, RSS {:.1} MB (peak {:.1} MB)",
            round + 1,
            b.listening,
            b.dispatched,
            b.rss as f64 / 1e6,
            b.hwm as f64 / 1e6,
            f.listening,
            f.dispatched,
            f.rss as f64 / 1e6,
            f.hwm as f64 / 1e6,
        );
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let base_rss = median(&mut base.iter().map(|r| r.rss).collect());
    let full_rss = median(&mut full.iter().map(|r| r.rss).collect());
    let base_hwm = median(&mut base.iter().map(|r| r.hwm).collect());
    let full_hwm = median(&mut full.iter().map(|r| r.hwm).collect());
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n.max(1) as f64;
    let dispatch = full.iter().map(|r| r.dispatched).max().unwrap_or_default();
    println!(
        "  resident memory per scheduled retry (median of 3, idle): {:.1} B above the baseline ({:.1} MB vs {:.1} MB); peak {:.1} B",
        per(full_rss, base_rss),
        full_rss as f64 / 1e6,
        base_rss as f64 / 1e6,
        per(full_hwm, base_hwm),
    );
    println!(
        "  restart with {n} scheduled: dispatching within {dispatch:.2?} (worst of 3; target 3 s)"
    );
    Ok(())
}
