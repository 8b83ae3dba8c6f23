//! What a perf run reports: the shared [`Recorder`] (counters and HDR
//! latency histograms), the per-second progress line on stderr, and the
//! end-of-run [`Summary`] printed as a table or as JSON.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::watch;

use crate::Ctx;
use crate::error::Result;
use crate::output::write_json;

pub(super) fn new_histogram() -> Histogram<u64> {
    // 1 µs .. 1 h, 3 significant digits: well-formed bounds, cannot fail.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Counters and latency histograms shared by the workers of one run.
#[derive(Debug)]
pub(super) struct Recorder {
    pub(super) count: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    hist: Mutex<(Histogram<u64>, Histogram<u64>)>,
}

impl Recorder {
    pub(super) fn new() -> Self {
        Self {
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            hist: Mutex::new((new_histogram(), new_histogram())),
        }
    }

    pub(super) fn record(&self, bytes: usize, latency: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        h.0.saturating_record(us);
        h.1.saturating_record(us);
    }

    pub(super) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The interval histogram since the last call (and resets it).
    fn take_interval(&self) -> Histogram<u64> {
        let mut h = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        let snap = h.0.clone();
        h.0.reset();
        snap
    }

    pub(super) fn total(&self) -> Histogram<u64> {
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
    pub(super) fn of(h: &Histogram<u64>) -> Self {
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
    pub(super) fn new(
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

    pub(super) fn set(&mut self, k: &'static str, v: impl Into<serde_json::Value>) -> &mut Self {
        self.settings.insert(k, v.into());
        self
    }

    pub(super) fn write(&self, ctx: &mut Ctx<'_>) -> Result<()> {
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
pub(super) fn spawn_progress(
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

#[cfg(test)]
mod tests {
    use super::*;

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
