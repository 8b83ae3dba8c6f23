//! What the log says about failed messages without a line per message.
//!
//! Each retry decision (`retry scheduled`) and each dead-lettering
//! (`message dead-lettered`) is a DEBUG event with the message id, so
//! `RUST_LOG=ricochet_broker=debug` still follows one message. At the
//! default level a poison storm would otherwise write a line per message and
//! attempt; instead every subscription counts its retries and dead letters
//! by reason (atomic counters, one relaxed add per message moved), and a
//! broker task writes one INFO `failures since the last summary` line per
//! subscription that had any, every `failure_summary_interval`, then resets
//! the counts. An interval with no failures writes nothing.

use crate::util::lock;
use ricochet_policy::FailureReason;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const REASONS: usize = FailureReason::ALL.len();

fn slot(reason: FailureReason) -> usize {
    FailureReason::ALL
        .iter()
        .position(|r| *r == reason)
        .unwrap_or(0)
}

/// One subscription's counts since the last summary.
#[derive(Debug)]
pub struct FailureTally {
    topic: String,
    subscription: String,
    retries: [AtomicU64; REASONS],
    dead_lettered: [AtomicU64; REASONS],
}

impl FailureTally {
    /// Counts `n` messages moved to the retry tier after a failure of `reason`.
    pub fn retried(&self, reason: FailureReason, n: u64) {
        self.retries[slot(reason)].fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` messages dead-lettered after a failure of `reason`.
    pub fn dead_lettered(&self, reason: FailureReason, n: u64) {
        self.dead_lettered[slot(reason)].fetch_add(n, Ordering::Relaxed);
    }

    /// Takes the counts (resetting them): totals and a `reason: counts` text.
    fn take(&self) -> Option<(u64, u64, String)> {
        let (mut retried, mut dead, mut text) = (0, 0, String::new());
        for (i, reason) in FailureReason::ALL.iter().enumerate() {
            let r = self.retries[i].swap(0, Ordering::Relaxed);
            let d = self.dead_lettered[i].swap(0, Ordering::Relaxed);
            if r + d == 0 {
                continue;
            }
            retried += r;
            dead += d;
            if !text.is_empty() {
                text.push_str(", ");
            }
            let _ = write!(text, "{}: {r} retried, {d} dead-lettered", reason.as_str());
        }
        (retried + dead > 0).then_some((retried, dead, text))
    }
}

/// Every subscription's tally, and the periodic summary.
#[derive(Debug, Default)]
pub struct FailureLog {
    tallies: Mutex<Vec<Weak<FailureTally>>>,
}

impl FailureLog {
    /// A new tally for a subscription; it is summarised while it lives.
    pub fn register(&self, topic: &str, subscription: &str) -> Arc<FailureTally> {
        let tally = Arc::new(FailureTally {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            retries: Default::default(),
            dead_lettered: Default::default(),
        });
        lock(&self.tallies).push(Arc::downgrade(&tally));
        tally
    }

    /// Writes one INFO line per subscription with failures since the last
    /// call, resets their counts, and returns how many lines it wrote.
    pub fn summarise(&self, interval: Duration) -> usize {
        let live: Vec<Arc<FailureTally>> = {
            let mut tallies = lock(&self.tallies);
            tallies.retain(|t| t.strong_count() > 0);
            tallies.iter().filter_map(Weak::upgrade).collect()
        };
        let mut lines = 0;
        for t in live {
            if let Some((retried, dead_lettered, by_reason)) = t.take() {
                tracing::info!(
                    topic = %t.topic,
                    sub = %t.subscription,
                    retried,
                    dead_lettered,
                    by_reason = %by_reason,
                    interval = ?interval,
                    "failures since the last summary"
                );
                lines += 1;
            }
        }
        lines
    }

    /// Summarises every `interval` until `stop` (and once more then, so a
    /// clean shutdown loses no counts).
    pub fn spawn(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => {
                        self.summarise(interval);
                        return;
                    }
                    _ = tick.tick() => {
                        self.summarise(interval);
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_summarised_once_and_reset() {
        let log = FailureLog::default();
        let a = log.register("t", "a");
        let idle = log.register("t", "idle");
        for _ in 0..1000 {
            a.retried(FailureReason::Nack, 1);
        }
        a.dead_lettered(FailureReason::Terminate, 3);
        let (r, d, text) = a.take().unwrap();
        assert_eq!((r, d), (1000, 3));
        assert_eq!(
            text,
            "nack: 1000 retried, 0 dead-lettered, terminate: 0 retried, 3 dead-lettered"
        );
        assert!(a.take().is_none(), "reset");
        a.retried(FailureReason::AckTimeout, 1);
        assert_eq!(
            log.summarise(Duration::from_secs(10)),
            1,
            "only `a` had any"
        );
        assert_eq!(log.summarise(Duration::from_secs(10)), 0);
        drop((a, idle));
        log.summarise(Duration::from_secs(10));
        assert!(
            lock(&log.tallies).is_empty(),
            "dropped tallies are forgotten"
        );
    }
}
