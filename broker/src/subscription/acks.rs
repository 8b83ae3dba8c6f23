//! Settling messages: individual and cumulative acks, and the bookkeeping
//! every way out of flight shares — [`release`](SubscriptionActor::release)
//! (given back, record and schedule entry kept) and
//! [`settle`](SubscriptionActor::settle) (done with in this tier).

use super::SubscriptionActor;
use super::requests::{ConsumerEvent, ConsumerId, MessageRef};
use crate::error::BrokerError;
use crate::storage::{ScheduleKey, SubMessage, TierEntry, TierId};
use ricochet_proto::SubscriptionType;

/// Storage clean-up gathered while settling messages.
#[derive(Debug, Default)]
pub(super) struct Cleanup {
    /// Failure records to delete.
    pub records: Vec<SubMessage>,
    /// Schedule entries to delete.
    pub unschedule: Vec<ScheduleKey>,
}

/// Acks applied in this round whose clean-up write and reply wait for the
/// round's end ([`SubscriptionActor::write_acked`]): the acks of a round
/// are one write (group commit), not one each.
#[derive(Debug, Default)]
pub(super) struct AckedInRound {
    cleanup: Cleanup,
    /// Who to answer once written: consumer and request id.
    replies: Vec<(ConsumerId, u64)>,
}

impl SubscriptionActor {
    /// Takes `entry` out of flight, keeping its failure record and schedule
    /// entry: the holder's unacked count and key bucket are released. Returns
    /// the schedule due time it was delivered with, if any.
    pub(super) fn release(&mut self, entry: TierEntry) -> Option<Option<u64>> {
        let f = self.deliveries.in_flight.remove(&entry)?;
        self.key_lanes.left_flight(entry);
        if let Some(c) = self.consumers.get_mut(f.consumer) {
            c.unacked = c.unacked.saturating_sub(1);
        }
        if let Some(b) = f.bucket {
            self.dispatcher.release(b);
        }
        Some(f.due_ms)
    }

    /// Done with `entry` in its tier (acked, or moved to another tier):
    /// out of flight, and its failure record and schedule entry go.
    pub(super) fn settle(&mut self, entry: TierEntry, cleanup: &mut Cleanup) {
        self.key_order_settled(entry);
        let msg = entry.of(self.rec.id);
        if let Some(Some(due_ms)) = self.release(entry) {
            cleanup.unschedule.push(ScheduleKey {
                due_ms,
                message: msg,
            });
        }
        let held = self.deliveries.held.remove(&entry);
        let counted = self.deliveries.counted.remove(&entry).is_some();
        if self.deliveries.failures.remove(&entry).is_some()
            || held
            || counted
            || entry.tier == TierId::Retry
        {
            cleanup.records.push(msg);
        }
    }

    /// Applies an ack request. Every id must have been delivered on this
    /// subscription; otherwise nothing is acked and the consumer is told.
    pub(super) fn ack(
        &mut self,
        consumer: ConsumerId,
        request_id: u64,
        ids: &[MessageRef],
        cumulative: bool,
    ) {
        let entries = match self.ack_targets(consumer, ids, cumulative) {
            Ok(e) => e,
            Err(e) => return self.reply(consumer, request_id, Err(e.into())),
        };
        self.breaker_acked(&entries, cumulative);
        let mut cleanup = Cleanup::default();
        for entry in entries {
            if cumulative {
                self.ack_through(entry.entry_id, &mut cleanup);
            } else {
                self.ack_one(entry, &mut cleanup);
            }
            self.dirty = true;
        }
        // Written and answered with the round's other acks.
        let acked = &mut self.acked_in_round;
        acked.cleanup.records.extend(cleanup.records);
        acked.cleanup.unschedule.extend(cleanup.unschedule);
        acked.replies.push((consumer, request_id));
    }

    /// Writes the clean-up of the acks applied this round, in one write, and
    /// answers them. The cursor is written first; stale failure or schedule
    /// records left by a crash in between are recognised as acked and
    /// dropped later.
    pub(super) fn write_acked(&mut self) {
        if self.acked_in_round.replies.is_empty() {
            return;
        }
        let AckedInRound { cleanup, replies } = std::mem::take(&mut self.acked_in_round);
        let started = std::time::Instant::now();
        self.persist();
        let storage = &self.deps.storage;
        let records: Vec<_> = cleanup.records.iter().map(|m| (*m, None)).collect();
        let unschedule: Vec<_> = cleanup.unschedule.iter().map(|k| (*k, false)).collect();
        let written = storage
            .put_failures(&records)
            .and_then(|()| storage.put_schedule(&unschedule));
        tracing::trace!(
            target: "ricochet::burst",
            records = records.len(),
            unscheduled = unschedule.len(),
            us = started.elapsed().as_micros() as u64,
            "actor: a round's acks written"
        );
        match written {
            Ok(()) => self.finish_requests(replies),
            Err(e) => {
                let e = std::sync::Arc::new(BrokerError::from(e));
                for (consumer, request_id) in replies {
                    self.reply(consumer, request_id, Err(e.clone()));
                }
            }
        }
    }

    /// Answers the successful requests `done` (consumer and request id)
    /// once what they wrote is durable, as
    /// [`finish_request`](SubscriptionActor::finish_request) does one: a
    /// round's acks or a batch of moves wait for the flush together, in one
    /// task, not one task (and one wake per flush) each.
    pub(super) fn finish_requests(&self, done: Vec<(ConsumerId, u64)>) {
        let answers: Vec<_> = done
            .into_iter()
            .filter(|(_, request_id)| *request_id != 0)
            .filter_map(|(c, request_id)| Some((self.consumers.get(c)?.tx.clone(), request_id)))
            .collect();
        if answers.is_empty() {
            return;
        }
        let flusher = self.deps.flusher.clone();
        tokio::spawn(async move {
            let outcome = flusher.durable().await.map_err(std::sync::Arc::new);
            for (tx, request_id) in answers {
                let _ = tx.send(ConsumerEvent::Done {
                    request_id,
                    outcome: outcome.clone(),
                });
            }
        });
    }

    /// The entries an ack names, checked.
    fn ack_targets(
        &self,
        consumer: ConsumerId,
        ids: &[MessageRef],
        cumulative: bool,
    ) -> Result<Vec<TierEntry>, BrokerError> {
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            let entry = self.locate(id)?;
            // Acking an acked message again changes nothing; anything else
            // must be in flight with this consumer.
            if !self.rec.is_acked(entry) {
                self.held_entry(consumer, id).map_err(|e| match e {
                    BrokerError::InvalidArgument(_) => BrokerError::InvalidArgument(format!(
                        "cannot ack {id}: it is not in flight with this consumer (never delivered, given back, or waiting for its redelivery)"
                    )),
                    other => other,
                })?;
            }
            entries.push(entry);
        }
        if cumulative {
            let t = self.rec.sub_type;
            if matches!(t, SubscriptionType::Shared | SubscriptionType::KeyShared) {
                return Err(BrokerError::InvalidArgument(format!(
                    "cumulative ack is not allowed on a {} subscription",
                    t.as_str_name()
                )));
            }
            if entries.iter().any(|e| e.tier != TierId::Main) {
                return Err(BrokerError::InvalidArgument(
                    "cumulative ack applies to the main topic only".into(),
                ));
            }
        }
        Ok(entries)
    }

    fn ack_through(&mut self, through: u64, cleanup: &mut Cleanup) {
        let done = self.deliveries.in_flight_through(through);
        self.metrics.acked.increment(done.len() as u64);
        for e in done {
            self.settle(e, cleanup);
        }
        self.rec.main.ack_through(through);
        self.deliveries
            .ready
            .retain(|e, _| !(e.tier == TierId::Main && e.entry_id <= through));
    }

    fn ack_one(&mut self, entry: TierEntry, cleanup: &mut Cleanup) {
        self.settle(entry, cleanup);
        // Acked while waiting for its redelivery: it will not be sent.
        if let Some(due_ms) = self.deliveries.unqueue(entry) {
            cleanup.unschedule.push(ScheduleKey {
                due_ms,
                message: entry.of(self.rec.id),
            });
        }
        if self.rec.cursor_mut(entry.tier).ack(entry.entry_id) {
            self.metrics.acked.increment(1);
            if entry.tier == TierId::Retry {
                self.counters.retry_queue = self.counters.retry_queue.saturating_sub(1);
                self.counters.retries_succeeded += 1;
                self.metrics.retry_succeeded.increment(1);
            }
        }
    }
}
