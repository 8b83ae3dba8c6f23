//! `perf produce|consume|redeliver`: load generators in the manner of
//! `pulsar-perf`. Each mode runs until `--duration` elapses (or Ctrl-C),
//! prints a progress line on stderr every second (rate, MB/s and latency
//! percentiles of that second), and ends with a summary on stdout:
//! throughput (msg/s, MB/s with MB = 10^6 bytes) and latency p50/p99/p999/max
//! from an HDR histogram (microsecond resolution, 3 significant digits).
//!
//! * `produce` measures **publish latency**: from handing a message to the
//!   producer to its receipt (the broker stored it, durably in `sync` mode).
//! * `consume` measures **end-to-end latency**: from the send time `perf
//!   produce` writes into each payload's header to the moment the consumer
//!   takes the message (falls back to the broker's publish time, at
//!   millisecond resolution, for other payloads).
//! * `redeliver` feeds a topic, nacks every message once under a policy and
//!   acks its redelivery: it measures the nack → redelivery loop, whose
//!   latency includes the policy's first delay (the summary also gives the
//!   lateness beyond that delay).
//!
//! Payload header (24 bytes, the rest is filler): `RCP1`, 4 zero bytes, the
//! send time in microseconds since the Unix epoch (u64 LE), a sequence
//! number (u64 LE).

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use ricochet_client::{Client, InitialPosition, Producer, SubscriptionType};
use ricochet_policy::{Decision, FailureContext, FailureReason};
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::Ctx;
use crate::args::{PerfCommand, PerfConsumeArgs, PerfProduceArgs, PerfRedeliverArgs};
use crate::error::{CliError, Result};
use crate::output::write_json;

const MAGIC: &[u8; 4] = b"RCP1";
/// Bytes of the payload header.
pub const HEADER: usize = 24;

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A perf payload of `size` bytes (at least [`HEADER`]) stamped now.
pub fn make_payload(size: usize, seq: u64) -> Vec<u8> {
    let mut p = vec![b'.'; size.max(HEADER)];
    p[..4].copy_from_slice(MAGIC);
    p[4..8].fill(0);
    p[8..16].copy_from_slice(&now_micros().to_le_bytes());
    p[16..24].copy_from_slice(&seq.to_le_bytes());
    p
}

/// (send time in µs since the epoch, sequence number) of a perf payload.
pub fn read_header(p: &[u8]) -> Option<(u64, u64)> {
    if p.len() < HEADER || &p[..4] != MAGIC {
        return None;
    }
    let t = u64::from_le_bytes(p[8..16].try_into().ok()?);
    let seq = u64::from_le_bytes(p[16..24].try_into().ok()?);
    Some((t, seq))
}

fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 1 h, 3 significant digits: well-formed bounds, cannot fail.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Counters and latency histograms shared by the workers of one run.
#[derive(Debug)]
struct Recorder {
    count: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    hist: Mutex<(Histogram<u64>, Histogram<u64>)>,
}

impl Recorder {
    fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            hist: Mutex::new((new_histogram(), new_histogram())),
        }
    }

    fn record(&self, bytes: usize, latency: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        h.0.saturating_record(us);
        h.1.saturating_record(us);
    }

    fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The interval histogram since the last call (and resets it).
    fn take_interval(&self) -> Histogram<u64> {
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        let snap = h.0.clone();
        h.0.reset();
        snap
    }

    fn total(&self) -> Histogram<u64> {
        self.hist
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Samples recorded.
    pub samples: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        if h.is_empty() {
            return Self {
                samples: 0,
                mean: 0.0,
                p50: 0.0,
                p99: 0.0,
                p999: 0.0,
                max: 0.0,
            };
        }
        Self {
            samples: h.len(),
            mean: (h.mean() / 1000.0 * 1000.0).round() / 1000.0,
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// The end-of-run summary (`--output json` prints exactly this).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `produce`, `consume` or `redeliver`.
    pub mode: &'static str,
    /// Topic.
    pub topic: String,
    /// Seconds from start to the last recorded message.
    pub elapsed_s: f64,
    /// Messages measured (receipts, receives, or redeliveries).
    pub messages: u64,
    /// Failed operations.
    pub errors: u64,
    /// Payload bytes of the measured messages.
    pub bytes: u64,
    /// Messages per second.
    pub msg_per_s: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// What the latency measures.
    pub latency_of: &'static str,
    /// Latency percentiles, in milliseconds.
    pub latency_ms: Latency,
    /// `redeliver`: the latency beyond the policy's delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lateness_ms: Option<Latency>,
    /// The run's settings and mode-specific counts.
    pub settings: BTreeMap<&'static str, serde_json::Value>,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Summary {
    fn new(
        mode: &'static str,
        topic: &str,
        rec: &Recorder,
        elapsed: Duration,
        latency_of: &'static str,
    ) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let messages = rec.count.load(Ordering::Relaxed);
        let bytes = rec.bytes.load(Ordering::Relaxed);
        Self {
            mode,
            topic: topic.to_owned(),
            elapsed_s: round2(elapsed.as_secs_f64()),
            messages,
            errors: rec.errors.load(Ordering::Relaxed),
            bytes,
            msg_per_s: round2(messages as f64 / secs),
            mb_per_s: round2(bytes as f64 / secs / 1e6),
            latency_of,
            latency_ms: Latency::of(&rec.total()),
            lateness_ms: None,
            settings: BTreeMap::new(),
        }
    }

    fn set(&mut self, k: &'static str, v: impl Into<serde_json::Value>) -> &mut Self {
        self.settings.insert(k, v.into());
        self
    }

    fn write(&self, ctx: &mut Ctx<'_>) -> Result<()> {
        if ctx.json() {
            return write_json(ctx.out, self);
        }
        let out = &mut *ctx.out;
        let settings: Vec<String> = self
            .settings
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect();
        writeln!(out, "perf {} on {}", self.mode, self.topic)?;
        writeln!(out, "  settings    {}", settings.join(" "))?;
        writeln!(
            out,
            "  messages    {} in {:.2}s ({} errors)",
            self.messages, self.elapsed_s, self.errors
        )?;
        writeln!(
            out,
            "  throughput  {:.1} msg/s  {:.2} MB/s",
            self.msg_per_s, self.mb_per_s
        )?;
        let l = &self.latency_ms;
        writeln!(
            out,
            "  latency ms  p50 {:.3}  p99 {:.3}  p999 {:.3}  max {:.3}  mean {:.3}  ({})",
            l.p50, l.p99, l.p999, l.max, l.mean, self.latency_of
        )?;
        if let Some(l) = &self.lateness_ms {
            writeln!(
                out,
                "  lateness ms p50 {:.3}  p99 {:.3}  p999 {:.3}  max {:.3}  mean {:.3}  (beyond the policy delay)",
                l.p50, l.p99, l.p999, l.max, l.mean
            )?;
        }
        Ok(())
    }
}

/// Prints one progress line per second until `stop` turns true.
fn spawn_progress(
    label: &'static str,
    rec: Arc<Recorder>,
    extra: Option<Arc<Recorder>>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let tty = std::io::stderr().is_terminal();
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let (mut last_n, mut last_b, mut last_x) = (0u64, 0u64, 0u64);
        let mut last_t = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let now = Instant::now();
            let dt = (now - last_t).as_secs_f64().max(1e-9);
            last_t = now;
            let n = rec.count.load(Ordering::Relaxed);
            let b = rec.bytes.load(Ordering::Relaxed);
            let h = Latency::of(&rec.take_interval());
            let mut line = format!(
                "[{:>4}s] {label} {:>9.1} msg/s {:>7.2} MB/s | latency ms p50 {:.2} p99 {:.2} p999 {:.2} max {:.2} | total {n} errors {}",
                (now - start).as_secs(),
                (n - last_n) as f64 / dt,
                (b - last_b) as f64 / dt / 1e6,
                h.p50,
                h.p99,
                h.p999,
                h.max,
                rec.errors.load(Ordering::Relaxed),
            );
            if let Some(x) = &extra {
                let xn = x.count.load(Ordering::Relaxed);
                line.push_str(&format!(
                    " | published {:.1} msg/s",
                    (xn - last_x) as f64 / dt
                ));
                last_x = xn;
            }
            (last_n, last_b) = (n, b);
            let mut err = std::io::stderr();
            let _ = if tty {
                write!(err, "\r\x1b[K{line}")
            } else {
                writeln!(err, "{line}")
            };
            let _ = err.flush();
        }
        if tty {
            let _ = writeln!(std::io::stderr());
        }
    })
}

/// Turns `stop` true after `duration` (if not zero) or on Ctrl-C.
fn spawn_stopper(duration: Duration, stop: watch::Sender<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let timer = async {
            if duration.is_zero() {
                std::future::pending::<()>().await;
            } else {
                tokio::time::sleep(duration).await;
            }
        };
        tokio::select! {
            _ = timer => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = stop.closed() => {}
        }
        let _ = stop.send(true);
    })
}

fn check_size(size: usize) -> Result<()> {
    if size < HEADER {
        return Err(CliError::Usage(format!(
            "--size must be at least {HEADER} bytes (the timestamp header)"
        )));
    }
    Ok(())
}

fn check_count(what: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(CliError::Usage(format!("--{what} must be at least 1")));
    }
    Ok(())
}

pub(crate) async fn run(ctx: &mut Ctx<'_>, c: PerfCommand) -> Result<()> {
    let summary = match c {
        PerfCommand::Produce(a) => produce(ctx, a).await?,
        PerfCommand::Consume(a) => consume(ctx, a).await?,
        PerfCommand::Redeliver(a) => redeliver(ctx, a).await?,
    };
    summary.write(ctx)
}

/// What one producer task needs.
#[derive(Debug, Clone)]
struct Feed {
    rate_per_producer: f64,
    size: usize,
    max_pending: usize,
    /// Messages left over all producers; `None` means no limit.
    budget: Option<Arc<AtomicU64>>,
    next_seq: Arc<AtomicU64>,
}

/// Sends until `stop` or the budget runs out, pacing to the rate; a second
/// task awaits the receipts in order and records publish latency.
async fn producer_loop(
    producer: Producer,
    feed: Feed,
    rec: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) {
    let window = Arc::new(Semaphore::new(feed.max_pending.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel::<(
        std::pin::Pin<
            Box<dyn Future<Output = ricochet_client::Result<ricochet_client::MessageId>> + Send>,
        >,
        Instant,
        tokio::sync::OwnedSemaphorePermit,
    )>();
    let size = feed.size;
    let rec2 = rec.clone();
    let receipts = tokio::spawn(async move {
        while let Some((fut, t0, permit)) = rx.recv().await {
            match fut.await {
                Ok(_) => rec2.record(size, t0.elapsed()),
                Err(_) => rec2.error(),
            }
            drop(permit);
        }
    });
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        if *stop.borrow() {
            break;
        }
        if let Some(b) = &feed.budget
            && b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_err()
        {
            break;
        }
        if feed.rate_per_producer > 0.0 {
            let due = start + Duration::from_secs_f64(sent as f64 / feed.rate_per_producer);
            if due > Instant::now() {
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
        let permit = tokio::select! {
            p = window.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let seq = feed.next_seq.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let fut = producer.send_async(make_payload(feed.size, seq));
        if tx.send((Box::pin(fut), t0, permit)).is_err() {
            break;
        }
        sent += 1;
    }
    drop(tx);
    let _ = receipts.await;
    let _ = producer.close().await;
}

/// Starts `n` producers on `topic`; returns their tasks.
async fn start_producers(
    client: &Client,
    topic: &str,
    n: usize,
    feed: &Feed,
    rec: &Arc<Recorder>,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let producer = client
            .producer(topic)
            .name(format!("perf-{}-{i}", std::process::id()))
            .create()
            .await?;
        tasks.push(tokio::spawn(producer_loop(
            producer,
            feed.clone(),
            rec.clone(),
            stop.clone(),
        )));
    }
    Ok(tasks)
}

async fn produce(ctx: &mut Ctx<'_>, a: PerfProduceArgs) -> Result<Summary> {
    check_size(a.size)?;
    check_count("producers", a.producers)?;
    check_count("max-pending", a.max_pending)?;
    let client = ctx.client().await?;
    let rec = Arc::new(Recorder::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let feed = Feed {
        rate_per_producer: a.rate as f64 / a.producers as f64,
        size: a.size,
        max_pending: a.max_pending,
        budget: (a.messages > 0).then(|| Arc::new(AtomicU64::new(a.messages))),
        next_seq: Arc::new(AtomicU64::new(0)),
    };
    let tasks =
        start_producers(&client, &a.common.topic, a.producers, &feed, &rec, &stop_rx).await?;
    let start = Instant::now();
    let stopper = spawn_stopper(a.common.duration, stop_tx);
    let progress = spawn_progress("published", rec.clone(), None, stop_rx.clone());
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed();
    stopper.abort();
    let _ = progress.await;
    let mut s = Summary::new(
        "produce",
        &a.common.topic,
        &rec,
        elapsed,
        "publish (send -> receipt)",
    );
    s.set("producers", a.producers)
        .set("size", a.size)
        .set(
            "rate",
            if a.rate == 0 {
                serde_json::Value::from("max")
            } else {
                a.rate.into()
            },
        )
        .set("max_pending", a.max_pending);
    Ok(s)
}

async fn consume(ctx: &mut Ctx<'_>, a: PerfConsumeArgs) -> Result<Summary> {
    check_count("consumers", a.consumers)?;
    let client = ctx.client().await?;
    let rec = Arc::new(Recorder::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..a.consumers {
        let mut consumer = client
            .consumer(&a.common.topic)
            .subscription(&a.subscription)
            .subscription_type(a.sub_type)
            .initial_position(InitialPosition::Latest)
            .consumer_name(format!("perf-{}-{i}", std::process::id()))
            .receiver_queue_size(a.receiver_queue_size)
            .subscribe()
            .await?;
        let rec = rec.clone();
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = consumer.receive() => m,
                    _ = stop.wait_for(|s| *s) => break,
                };
                let Ok(msg) = msg else {
                    rec.error();
                    break;
                };
                let latency = match read_header(msg.payload()) {
                    Some((sent_us, _)) => {
                        Duration::from_micros(now_micros().saturating_sub(sent_us))
                    }
                    None => SystemTime::now()
                        .duration_since(msg.publish_time())
                        .unwrap_or_default(),
                };
                rec.record(msg.payload().len(), latency);
                if consumer.ack(&msg).await.is_err() {
                    rec.error();
                }
            }
            let _ = consumer.close().await;
        }));
    }
    let start = Instant::now();
    let stopper = spawn_stopper(a.common.duration, stop_tx);
    let progress = spawn_progress("received", rec.clone(), None, stop_rx.clone());
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed();
    stopper.abort();
    let _ = progress.await;
    let mut s = Summary::new(
        "consume",
        &a.common.topic,
        &rec,
        elapsed,
        "end to end (send -> receive)",
    );
    s.set("consumers", a.consumers)
        .set("subscription", a.subscription.clone())
        .set("type", a.sub_type.to_string())
        .set("receiver_queue_size", a.receiver_queue_size);
    Ok(s)
}

/// The delay a policy gives a message's first failure (a nack).
fn first_delay(spec: &ricochet_policy::PolicySpec) -> Result<Duration> {
    let p = spec.build()?;
    Ok(
        match p.decide(&FailureContext::new(1, FailureReason::Nack)) {
            Decision::Redeliver { after, .. } => after,
            Decision::DeadLetter { .. } => Duration::ZERO,
        },
    )
}

async fn redeliver(ctx: &mut Ctx<'_>, a: PerfRedeliverArgs) -> Result<Summary> {
    check_size(a.size)?;
    check_count("producers", a.producers)?;
    check_count("consumers", a.consumers)?;
    let delay = first_delay(&a.policy)?;
    if delay.is_zero() {
        return Err(CliError::Usage(format!(
            "policy {} dead-letters on the first failure: nothing would be redelivered",
            a.policy
        )));
    }
    let client = ctx.client().await?;
    let redelivered = Arc::new(Recorder::new());
    let published = Arc::new(Recorder::new());
    let nacks = Arc::new(AtomicU64::new(0));
    let nacked_at: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    // Producers stop on `stop`; consumers on `drained` (after the redeliveries
    // of what was nacked before the stop have arrived, or a grace period).
    let (stop_tx, stop_rx) = watch::channel(false);
    let (drained_tx, drained_rx) = watch::channel(false);
    let mut consumers = Vec::new();
    for i in 0..a.consumers {
        let mut consumer = client
            .consumer(&a.common.topic)
            .subscription(&a.subscription)
            .subscription_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Latest)
            .consumer_name(format!("perf-redeliver-{}-{i}", std::process::id()))
            .policy_spec(a.policy.clone())
            .subscribe()
            .await?;
        let rec = redelivered.clone();
        let nacks = nacks.clone();
        let nacked_at = nacked_at.clone();
        let mut stop = drained_rx.clone();
        consumers.push(tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = consumer.receive() => m,
                    _ = stop.wait_for(|s| *s) => break,
                };
                let Ok(msg) = msg else {
                    rec.error();
                    break;
                };
                let seq = read_header(msg.payload()).map(|(_, s)| s);
                if msg.delivery_count() == 0 {
                    if let Some(seq) = seq {
                        nacked_at
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(seq, Instant::now());
                    }
                    nacks.fetch_add(1, Ordering::Relaxed);
                    if consumer
                        .nack_with_reason(&msg, "perf redeliver")
                        .await
                        .is_err()
                    {
                        rec.error();
                    }
                } else {
                    let t = seq.and_then(|s| {
                        nacked_at
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&s)
                    });
                    if let Some(t) = t {
                        rec.record(msg.payload().len(), t.elapsed());
                    }
                    if consumer.ack(&msg).await.is_err() {
                        rec.error();
                    }
                }
            }
            let _ = consumer.close().await;
        }));
    }
    let feed = Feed {
        rate_per_producer: a.rate as f64 / a.producers as f64,
        size: a.size,
        max_pending: 1000,
        budget: None,
        next_seq: Arc::new(AtomicU64::new(0)),
    };
    let producers = start_producers(
        &client,
        &a.common.topic,
        a.producers,
        &feed,
        &published,
        &stop_rx,
    )
    .await?;
    let start = Instant::now();
    let stopper = spawn_stopper(a.common.duration, stop_tx);
    let progress = spawn_progress(
        "redelivered",
        redelivered.clone(),
        Some(published.clone()),
        drained_rx.clone(),
    );
    for t in producers {
        let _ = t.await;
    }
    // Drain: wait for every published message to have been nacked and
    // redelivered, up to the policy delay plus 5 s.
    let grace = Instant::now() + delay + Duration::from_secs(5);
    loop {
        let outstanding = nacked_at.lock().unwrap_or_else(|p| p.into_inner()).len();
        let first_seen = nacks.load(Ordering::Relaxed);
        let sent = published.count.load(Ordering::Relaxed);
        if (outstanding == 0 && first_seen >= sent) || Instant::now() >= grace {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = start.elapsed();
    let _ = drained_tx.send(true);
    stopper.abort();
    for t in consumers {
        let _ = t.await;
    }
    let _ = progress.await;
    let outstanding = nacked_at.lock().unwrap_or_else(|p| p.into_inner()).len();
    let mut s = Summary::new(
        "redeliver",
        &a.common.topic,
        &redelivered,
        elapsed,
        "nack -> redelivery (includes the policy delay)",
    );
    let lateness = {
        let total = redelivered.total();
        let d = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        let mut late = new_histogram();
        for v in total.iter_recorded() {
            late.saturating_record_n(
                v.value_iterated_to().saturating_sub(d).max(1),
                v.count_at_value(),
            );
        }
        Latency::of(&late)
    };
    s.set("policy", a.policy.to_string())
        .set(
            "policy_delay_ms",
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        )
        .set("producers", a.producers)
        .set("consumers", a.consumers)
        .set("size", a.size)
        .set(
            "rate",
            if a.rate == 0 {
                serde_json::Value::from("max")
            } else {
                a.rate.into()
            },
        )
        .set("published", published.count.load(Ordering::Relaxed))
        .set("nacked", nacks.load(Ordering::Relaxed))
        .set("not_redelivered", outstanding as u64);
    s.lateness_ms = Some(lateness);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let p = make_payload(100, 42);
        assert_eq!(p.len(), 100);
        let (t, seq) = read_header(&p).expect("header");
        assert_eq!(seq, 42);
        assert!(now_micros() >= t);
        assert!(read_header(b"plain text payload, no header").is_none());
        assert_eq!(make_payload(1, 0).len(), HEADER);
    }

    #[test]
    fn percentiles_in_ms() {
        let rec = Recorder::new();
        for i in 1..=1000u64 {
            rec.record(10, Duration::from_micros(i * 1000));
        }
        let l = Latency::of(&rec.total());
        assert_eq!(l.samples, 1000);
        assert!((l.p50 - 500.0).abs() < 1.0, "{l:?}");
        assert!((l.p99 - 990.0).abs() < 2.0, "{l:?}");
        assert!((l.max - 1000.0).abs() < 1.0, "{l:?}");
        let s = Summary::new("produce", "t", &rec, Duration::from_secs(2), "x");
        assert_eq!(s.msg_per_s, 500.0);
        assert_eq!(s.bytes, 10_000);
    }
}
