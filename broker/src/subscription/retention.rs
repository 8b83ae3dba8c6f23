//! A subscription behind its topic's first entry: retention dropped
//! segments it had not consumed. The dropped ids count as acknowledged
//! (backlog drops with them), the read position jumps to the first kept
//! entry, and messages held in flight, ready or waiting for a redelivery
//! that point below it are let go, with a warning.

use super::SubscriptionActor;
use super::acks::Cleanup;
use crate::storage::TierId;

impl SubscriptionActor {
    /// Skips ahead to the topic's first entry if retention dropped entries
    /// this subscription had not acknowledged. Cheap when it did not.
    pub(super) fn skip_trimmed(&mut self) {
        let (first, _) = self.topic.entry_range();
        let mark = self.rec.main.mark_delete;
        if mark >= first {
            return;
        }
        let unacked = (first - mark) - self.rec.main.acked_between(mark, first);
        let mut cleanup = Cleanup::default();
        let held = self.deliveries.in_flight_through(first - 1);
        for e in &held {
            self.settle(*e, &mut cleanup);
        }
        let below = |e: &crate::storage::TierEntry| e.tier == TierId::Main && e.entry_id < first;
        let waiting: Vec<_> = self
            .deliveries
            .ready
            .keys()
            .chain(self.deliveries.due.keys())
            .filter(|e| below(e))
            .copied()
            .collect();
        for e in &waiting {
            self.settle(*e, &mut cleanup);
            if let Some(due_ms) = self.deliveries.unqueue(*e) {
                cleanup.unschedule.push(crate::storage::ScheduleKey {
                    due_ms,
                    message: e.of(self.rec.id),
                });
            }
        }
        let failed: Vec<_> = self
            .deliveries
            .failures
            .keys()
            .copied()
            .chain(self.deliveries.held.keys())
            .filter(|e| below(e))
            .collect();
        for e in failed {
            self.deliveries.failures.remove(&e);
            self.deliveries.held.remove(&e);
            cleanup.records.push(e.of(self.rec.id));
        }
        self.rec.main.ack_through(first - 1);
        self.read_pos = self.read_pos.max(first);
        self.dirty = true;
        let (topic, sub) = (self.rec.topic.clone(), self.rec.name.clone());
        if unacked == 0 && held.is_empty() && waiting.is_empty() {
            // Ids never stored (a crash's gap) or already acked: nothing lost.
            tracing::debug!(%topic, subscription = %sub, first, "cursor moved to the first entry");
        } else if held.is_empty() && waiting.is_empty() {
            tracing::info!(%topic, subscription = %sub, unacked, first, "retention dropped unconsumed messages; the subscription continues from the first kept one");
        } else {
            tracing::warn!(
                %topic, subscription = %sub, unacked, first,
                in_flight = held.len(), waiting = waiting.len(),
                "retention dropped messages this subscription held or was about to redeliver; they are let go"
            );
        }
        self.persist();
        let storage = &self.deps.storage;
        let records: Vec<_> = cleanup.records.iter().map(|m| (*m, None)).collect();
        let unschedule: Vec<_> = cleanup.unschedule.iter().map(|k| (*k, false)).collect();
        if let Err(e) = storage
            .put_failures(&records)
            .and_then(|()| storage.put_schedule(&unschedule))
        {
            tracing::warn!(error = %e, %topic, subscription = %sub, "cannot drop the records of messages retention removed; they are dropped when met");
        }
    }
}
