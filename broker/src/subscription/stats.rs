//! What a subscription reports: its stats (for the admin API) and its
//! Prometheus gauges. The actor knows everything but the schedule; the
//! schedule part is a scan of the storage index, run off the actor on a
//! blocking thread so a stats call never stalls dispatch.

use super::SubscriptionActor;
use crate::error::{BrokerError, Result};
use crate::storage::{Storage, TierEntry};
use std::collections::HashSet;
use std::sync::Arc;

/// One consumer in the stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Its name.
    pub name: String,
    /// Messages it holds unacked.
    pub unacked: u64,
    /// Permits left.
    pub permits: u64,
    /// Whether it receives messages (Failover standbys do not).
    pub active: bool,
    /// Whether it holds `max_unacked_per_consumer` unacked messages, so
    /// nothing more is sent to it until it acks.
    pub blocked_on_unacked: bool,
}

/// Scheduled messages due before `until_ms` (0: later than every other bucket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueBucket {
    /// `overdue`, `1m`, `10m`, `1h`, `2h` or `later`.
    pub label: String,
    /// Upper bound of the bucket, ms since the epoch (0 for `later`).
    pub until_ms: u64,
    /// Messages in it.
    pub count: u64,
}

/// A subscription's stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionStats {
    /// Full topic name.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Its type.
    pub subscription_type: ricochet_proto::SubscriptionType,
    /// Messages not yet acked: main-topic backlog plus scheduled messages.
    pub backlog: u64,
    /// Delivered and not yet acked.
    pub unacked: u64,
    /// Connected consumers.
    pub consumers: Vec<ConsumerStats>,
    /// Every main-topic entry below this is acked.
    pub mark_delete_position: u64,
    /// Scheduled retries and delayed messages.
    pub scheduled_retries: u64,
    /// Messages in the dead-letter tier.
    pub dead_lettered: u64,
    /// Due time of the next scheduled message, ms since the epoch.
    pub next_retry_due_ms: Option<u64>,
    /// Retry tier topic.
    pub retry_topic: String,
    /// Dead-letter tier topic.
    pub dead_letter_topic: String,
    /// Scheduled messages by due time.
    pub scheduled_by_due: Vec<DueBucket>,
    /// Key order's blocked keys, when it is on.
    pub key_order: Option<KeyOrderStats>,
    /// The outage breaker, if the subscription has one.
    pub breaker: Option<super::BreakerStats>,
    /// Messages read ahead of their schedule entries' due times and held
    /// in memory until they fire (see `subscription/prefetch.rs`), staged
    /// ones included.
    pub read_ahead_of_due: u64,
    /// Of those, built for their consumer just before their due time, to be
    /// sent when they fire (see `subscription/stage.rs`).
    pub staged_for_due: u64,
    /// Times the actor counted the messages read ahead due within the
    /// staging lead (tests of the stage wake's cost).
    #[cfg(test)]
    pub stage_counts: u64,
    /// Messages sent as they were staged (tests of a fire that holds
    /// messages staged and not).
    #[cfg(test)]
    pub sent_staged: u64,
    /// The most commands (consumer requests, admin calls, durable-write
    /// notices) seen waiting in the actor's queue at once since it started.
    pub queued_commands_peak: u64,
}

/// Key order in a subscription's stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOrderStats {
    /// Keys blocked now.
    pub blocked_keys: u64,
    /// How long the oldest has been blocked, ms.
    pub oldest_blocked_ms: u64,
    /// Messages held behind blocked keys.
    pub held_messages: u64,
    /// The longest-blocked keys, oldest first.
    pub top: Vec<BlockedKeyStats>,
}

/// One blocked key in the stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedKeyStats {
    /// The key.
    pub key: String,
    /// Blocked since, ms since the epoch.
    pub blocked_since_ms: u64,
    /// The failed message it waits for (`topic:entry`).
    pub failed_id: String,
    /// Messages held behind it.
    pub held: u64,
}

/// What the actor knows for its stats; [`StatsSnapshot::complete`] adds the
/// schedule outside it.
#[derive(Debug)]
pub(super) struct StatsSnapshot {
    stats: SubscriptionStats,
    /// Messages out with consumers: their schedule entries are not waiting.
    in_flight: HashSet<TierEntry>,
    now_ms: u64,
}

impl StatsSnapshot {
    pub(super) async fn complete(
        self,
        storage: Arc<dyn Storage>,
        sub_id: u64,
    ) -> Result<SubscriptionStats> {
        let StatsSnapshot {
            mut stats,
            in_flight,
            now_ms,
        } = self;
        let s = tokio::task::spawn_blocking(move || {
            schedule_stats(storage.as_ref(), sub_id, &in_flight, now_ms)
        })
        .await
        .map_err(|_| BrokerError::ShuttingDown)??;
        // Scheduled main-topic messages (delayed, or a held nack) are in the
        // main backlog already; retry-tier ones are not.
        stats.backlog += s.retry_tier;
        stats.scheduled_retries = s.count;
        let (next_due, by_due) = (s.next_due, s.by_due);
        stats.next_retry_due_ms = next_due;
        stats.scheduled_by_due = by_due;
        Ok(stats)
    }
}

/// Counters the actor keeps since it started (and the retry queue and DLQ
/// sizes, rebuilt at start from storage).
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Messages in the retry tier not yet acked.
    pub retry_queue: u64,
    /// Messages in the dead-letter tier.
    pub dlq_size: u64,
    /// Moves into the retry tier since start.
    pub retries_scheduled: u64,
    /// Retry-tier messages acked since start.
    pub retries_succeeded: u64,
}

impl SubscriptionActor {
    /// Main-topic messages not yet acked.
    pub(super) fn main_backlog(&self) -> u64 {
        // Ids below the first entry were dropped by retention: not backlog.
        let (first, end) = self.topic.entry_range();
        let start = self.rec.main.mark_delete.max(first).min(end);
        (end - start) - self.rec.main.acked_between(start, end)
    }

    /// Notices consumers that reached, or left, the unacked cap: a consumer
    /// at the cap receives nothing, which would otherwise look like an idle
    /// subscription. Each change is logged once; the count is a gauge.
    pub(super) fn watch_blocked(&mut self) {
        let max = self.deps.max_unacked_per_consumer;
        let (topic, sub) = (&self.rec.topic, &self.rec.name);
        let mut blocked = 0usize;
        for c in self.consumers.as_mut_slice() {
            let now = c.unacked >= max;
            blocked += usize::from(now);
            if now == c.blocked {
                continue;
            }
            c.blocked = now;
            if now {
                tracing::warn!(%topic, subscription = %sub, consumer = %c.name, unacked = c.unacked, max_unacked_per_consumer = max,
                    "consumer blocked: it holds max_unacked_per_consumer unacked messages and receives nothing until it acks");
            } else {
                tracing::info!(%topic, subscription = %sub, consumer = %c.name, unacked = c.unacked, "consumer unblocked");
            }
        }
        self.metrics.blocked_consumers.set(blocked as f64);
        self.metrics
            .blocked_keys
            .set(self.rec.blocked_keys.len() as f64);
        self.metrics
            .held_messages
            .set(self.held_behind_blocked() as f64);
    }

    pub(super) fn update_gauges(&self) {
        let m = &self.metrics;
        let c = &self.counters;
        m.backlog.set(self.main_backlog() as f64);
        m.unacked.set(self.deliveries.in_flight.len() as f64);
        m.retry_queue.set(c.retry_queue as f64);
        m.dlq_size.set(c.dlq_size as f64);
        if c.retries_scheduled > 0 {
            m.retry_success_ratio
                .set(c.retries_succeeded as f64 / c.retries_scheduled as f64);
        }
    }

    pub(super) fn stats_snapshot(&self) -> StatsSnapshot {
        let sub_type = self.rec.sub_type;
        let stats = SubscriptionStats {
            topic: self.rec.topic.clone(),
            subscription: self.rec.name.clone(),
            subscription_type: sub_type,
            // Scheduled messages are added by `StatsSnapshot::complete`.
            backlog: self.main_backlog(),
            unacked: self.deliveries.in_flight.len() as u64,
            consumers: self
                .consumers
                .iter()
                .map(|c| ConsumerStats {
                    name: c.name.clone(),
                    unacked: c.unacked as u64,
                    permits: u64::from(c.permits),
                    active: self.consumers.is_active(sub_type, c),
                    blocked_on_unacked: c.blocked,
                })
                .collect(),
            mark_delete_position: self.rec.main.mark_delete,
            scheduled_retries: 0,
            dead_lettered: self.counters.dlq_size,
            next_retry_due_ms: None,
            retry_topic: self.tiers.retry_name.clone(),
            dead_letter_topic: self.tiers.dead_letter_name.clone(),
            scheduled_by_due: Vec::new(),
            key_order: self.key_order_stats(),
            breaker: self.breaker_stats(),
            read_ahead_of_due: (self.deliveries.prefetched.len() + self.deliveries.staged.len())
                as u64,
            staged_for_due: self.deliveries.staged.len() as u64,
            #[cfg(test)]
            stage_counts: self.deliveries.staged.counts,
            #[cfg(test)]
            sent_staged: self.deliveries.staged.sent_staged,
            queued_commands_peak: self.queue_peak as u64,
        };
        StatsSnapshot {
            stats,
            in_flight: self.deliveries.in_flight.keys().copied().collect(),
            now_ms: self.deps.clock.now_ms(),
        }
    }
}

/// What the schedule index holds for one subscription.
struct ScheduleStats {
    /// Scheduled messages, in either tier.
    count: u64,
    /// Of those, in the retry tier.
    retry_tier: u64,
    next_due: Option<u64>,
    by_due: Vec<DueBucket>,
}

/// Scheduled (not yet acked, not in flight) retry-tier and delayed
/// messages of this subscription: counts, earliest due time, and counts by
/// due-time bucket. Scans the schedule index: O(all scheduled messages).
fn schedule_stats(
    storage: &dyn Storage,
    sub_id: u64,
    in_flight: &HashSet<TierEntry>,
    now: u64,
) -> Result<ScheduleStats> {
    const BUCKETS: [(&str, u64); 5] = [
        ("overdue", 0),
        ("1m", 60_000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("2h", 7_200_000),
    ];
    let mut buckets: Vec<DueBucket> = BUCKETS
        .iter()
        .map(|(label, ahead)| DueBucket {
            label: (*label).to_owned(),
            until_ms: now + ahead,
            count: 0,
        })
        .chain(std::iter::once(DueBucket {
            label: "later".into(),
            until_ms: 0,
            count: 0,
        }))
        .collect();
    let mut count = 0;
    let mut retry_tier = 0;
    let mut next = None;
    let mut after = None;
    const PAGE: usize = 10_000;
    loop {
        let batch = storage.scheduled(after, u64::MAX, PAGE)?;
        for k in &batch {
            if k.message.sub_id == sub_id && !in_flight.contains(&k.message.entry()) {
                count += 1;
                if k.message.tier == crate::storage::TierId::Retry {
                    retry_tier += 1;
                }
                next = Some(next.map_or(k.due_ms, |n: u64| n.min(k.due_ms)));
                let i = buckets
                    .iter()
                    .position(|b| b.until_ms == 0 || k.due_ms < b.until_ms)
                    .unwrap_or(buckets.len() - 1);
                buckets[i].count += 1;
            }
        }
        if batch.len() < PAGE {
            break;
        }
        after = batch.last().copied();
    }
    Ok(ScheduleStats {
        count,
        retry_tier,
        next_due: next,
        by_due: buckets,
    })
}
