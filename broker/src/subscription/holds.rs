//! Broker-held nacks in the actor's memory: which holds it keeps loaded
//! (those ending within a window and a quarter of now, the rest in the far
//! set with only their ids), when the window moves on, and the read of a
//! far hold's record when it fires before its window was loaded.

use super::{SubscriptionActor, SubscriptionDeps, delivery};
use crate::storage::{ScheduleKey, TierEntry};

/// How far ahead of now a subscription keeps its held nacks' counts and
/// holds in memory: the scheduler's window and a quarter more, so they are
/// loaded at least a window before they are due, before the timer (which
/// loads one window ahead) takes them.
pub(super) fn holds_ahead_ms(deps: &SubscriptionDeps) -> u64 {
    holds_ahead(deps.scheduler.window())
}

/// How far ahead of now held nacks are kept with their counts and holds,
/// for retry window `window`: a window and a quarter (ms).
pub(crate) fn holds_ahead(window: std::time::Duration) -> u64 {
    let w = window.as_millis() as u64;
    w.saturating_add(w / 4)
}

impl SubscriptionActor {
    /// When the window load hook ([`Self::advance_holds`]) is next due: a
    /// window before the horizon (a quarter window after it last moved),
    /// if any hold waits in the far set.
    pub(super) fn holds_wake_ms(&self) -> Option<u64> {
        let h = &self.deliveries.held;
        h.has_far().then(|| {
            h.horizon_ms()
                .saturating_sub(holds_ahead_ms(&self.deps) * 4 / 5)
        })
    }

    /// The window load hook: once the horizon is less than a window ahead,
    /// loads the counts and holds of the held nacks ending up to a window
    /// and a quarter ahead from the schedule (one read of those buckets)
    /// and moves the horizon there. A read that fails is logged and the
    /// horizon moves all the same: those held nacks stay in the far set and
    /// each is loaded when it fires ([`Self::load_far_hold`]).
    pub(super) fn advance_holds(&mut self) {
        let ahead = holds_ahead_ms(&self.deps);
        let now = self.deps.clock.now_ms();
        let horizon = self.deliveries.held.horizon_ms();
        if horizon.saturating_sub(now) > ahead * 4 / 5 {
            return;
        }
        let to = now.saturating_add(ahead);
        if self.deliveries.held.has_far() {
            match self.deps.storage.held_heads_due(self.rec.id, horizon, to) {
                Ok(heads) => {
                    for (entry_id, head) in heads {
                        self.deliveries.held.promote(
                            entry_id,
                            delivery::Held {
                                count: head.count,
                                until_ms: head.hold_until_ms,
                            },
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, topic = %self.rec.topic, subscription = %self.rec.name, "cannot load the held nacks coming into the retry window");
                }
            }
        }
        self.deliveries.held.set_horizon(to);
    }

    /// Makes sure fired schedule entry `k` of a held nack kept only in the
    /// far set has its count and hold in memory before it can be
    /// dispatched, reading its record; false when it cannot be (it then
    /// stays held and is not dispatched: its schedule entry stays stored,
    /// so a restart fires it again).
    pub(super) fn load_far_hold(&mut self, k: ScheduleKey) -> bool {
        let entry = k.message.entry();
        if !self.deliveries.held.is_far(&entry) {
            return true;
        }
        match self.deps.storage.failure(k.message, Some(k.due_ms)) {
            Ok(Some(r)) => {
                self.deliveries.held.promote(
                    entry.entry_id,
                    delivery::Held {
                        count: r.count,
                        until_ms: r.hold_until_ms,
                    },
                );
                true
            }
            Ok(None) => {
                tracing::warn!(topic = %self.rec.topic, subscription = %self.rec.name, entry = entry.entry_id, "a held nack fired without its failure record; kept held");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, topic = %self.rec.topic, subscription = %self.rec.name, entry = entry.entry_id, "cannot read a held nack's failure record; kept held");
                false
            }
        }
    }

    /// The stored hold end of held nack `entry` kept in the far set (an
    /// operator's question: it reads the subscription's whole schedule).
    pub(super) fn far_hold_until(&self, entry: TierEntry) -> Option<u64> {
        match self
            .deps
            .storage
            .held_heads_due(self.rec.id, 0, u64::MAX - 1)
        {
            Ok(heads) => heads
                .into_iter()
                .find(|(id, _)| *id == entry.entry_id)
                .map(|(_, h)| h.hold_until_ms),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a held nack's hold");
                None
            }
        }
    }
}
