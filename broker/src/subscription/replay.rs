//! Dead-letter replay, an operator's decision, in two modes.
//!
//! * Into the retry tier (the default): the dead letters move into this
//!   subscription's own retry tier, due now or at a given time, in one
//!   storage transaction ([`crate::storage::DeadLetterReturn`]). Only this
//!   subscription sees them again, and a crash at any point leaves each in
//!   exactly one place: still a dead letter, or scheduled in the retry tier.
//! * Onto the topic (explicit): they are published again on the topic, so
//!   every subscription sees them. Crash safety comes from a durable intent
//!   ([`ReplayIntent`]) written into each dead-letter record before the
//!   publish: it fixes the message and a sequence id of the subscription's
//!   replay producer. An intent left by a crash is finished when the actor
//!   starts: published again under the same sequence id (the topic's
//!   producer de-duplication drops it if the first publish was stored), then
//!   the dead letter is removed. So the message is on the topic once.
//!
//! Either mode may first edit the message (fix and resend: payload,
//! properties, key); the change is recorded in its failure record's edit
//! history (who, when, sizes, properties).
//!
//! For tests, `RICOCHET_FAILPOINT` names a step at which the broker aborts
//! (see [`crate::util::failpoint`]); it does nothing unless set.

use super::SubscriptionActor;
use super::requests::MessageRef;
use crate::error::Result;
use crate::storage::{
    DeadLetterRecord, DeadLetterReturn, FailureRecord, ReplayIntent, ReplayOrder, ReplayTarget,
    ReturnItem, ScheduleKey, StorageError, TierEntry, TopicKind, replay_producer,
};
use crate::util::failpoint;
use prost::Message as _;
use ricochet_proto::{Message, OutboundMessage, props};

/// A dead letter ready to go: its DLQ entry id, the message to send (edits
/// applied), and the failure record it carries on.
struct Prepared {
    dlq_id: u64,
    record: DeadLetterRecord,
    message: Message,
    failures: FailureRecord,
}

impl SubscriptionActor {
    /// Replays `letters` (DLQ entry id and record) as `order` says; returns
    /// the new message ids (retry tier or topic).
    pub(super) async fn replay(
        &mut self,
        letters: Vec<(u64, DeadLetterRecord)>,
        order: ReplayOrder,
    ) -> Result<Vec<MessageRef>> {
        let now = self.deps.clock.now_ms();
        let mut prepared = Vec::with_capacity(letters.len());
        for (dlq_id, record) in letters {
            let Some(bytes) = self
                .deps
                .storage
                .read_one(&self.tiers.dead_letter_name, dlq_id)?
            else {
                continue;
            };
            let mut m = Message::decode(bytes.as_slice()).map_err(StorageError::from)?;
            m.id = None;
            m.properties.remove(props::DEAD_LETTER_REASON);
            let mut failures = record.failures.clone();
            if order.reset_count {
                // A fresh start: no reconsume history on the message either.
                // ORIGIN_MESSAGE_ID and REAL_TOPIC stay, as provenance, and so
                // does the record of operators' edits.
                m.properties.remove(props::RECONSUME_TIMES);
                m.properties.remove(props::DELAY_TIME);
                failures = FailureRecord {
                    edits: failures.edits,
                    ..FailureRecord::default()
                };
            }
            if let Some(edit) = order.edit.as_ref().filter(|e| !e.is_empty()) {
                let change = edit.apply(&mut m, now, &order.by);
                tracing::warn!(
                    sub = %self.rec.name, topic = %self.rec.topic, dead_letter = dlq_id,
                    by = %change.by, payload_before = change.payload_size_before,
                    payload_after = change.payload_size_after,
                    set = ?change.properties_set, removed = ?change.properties_removed,
                    key_changed = change.key_changed, "dead letter edited for replay"
                );
                failures.push_edit(change);
            }
            prepared.push(Prepared {
                dlq_id,
                record,
                message: m,
                failures,
            });
        }
        if prepared.is_empty() {
            return Ok(Vec::new());
        }
        // A dead letter still holding an intent (a republish the broker could
        // not finish at start) may already be on the topic: it is finished as
        // that republish, whatever this order says, so it is never doubled.
        let (unfinished, prepared): (Vec<Prepared>, Vec<Prepared>) = prepared
            .into_iter()
            .partition(|p| p.record.replay.is_some());
        let mut out = Vec::new();
        if !unfinished.is_empty() {
            let letters = unfinished
                .into_iter()
                .map(|p| (p.dlq_id, p.record))
                .collect();
            out = self.finish_topic_replays(letters).await?;
        }
        if prepared.is_empty() {
            return Ok(out);
        }
        let more = match order.target {
            ReplayTarget::RetryTier { due_ms } => {
                self.replay_into_retry(prepared, due_ms.max(now)).await
            }
            ReplayTarget::Topic => self.replay_onto_topic(prepared, order.reset_count).await,
        }?;
        out.extend(more);
        Ok(out)
    }

    /// Moves dead letters into the retry tier, due at `due_ms`, in one
    /// transaction; answers once it is durable.
    async fn replay_into_retry(
        &mut self,
        prepared: Vec<Prepared>,
        due_ms: u64,
    ) -> Result<Vec<MessageRef>> {
        let topic = self.tier_topic(TopicKind::Retry).await?;
        let n = prepared.len() as u64;
        let first_id = topic.reserve_ids(n).await?;
        let mut items = Vec::with_capacity(prepared.len());
        let mut keys = Vec::with_capacity(prepared.len());
        for (i, mut p) in prepared.into_iter().enumerate() {
            let target = first_id + i as u64;
            p.message.deliver_at_ms = due_ms;
            keys.push(ScheduleKey {
                due_ms,
                message: TierEntry::retry(target).of(self.rec.id),
            });
            items.push(ReturnItem {
                dead_letter_id: p.dlq_id,
                payload: p.message.encode_to_vec(),
                target_entry_id: target,
                due_ms,
                failures: p.failures,
            });
        }
        failpoint("replay.retry.before_move");
        let mv = DeadLetterReturn {
            dead_letter_topic: self.tiers.dead_letter_name.clone(),
            retry_topic: topic.name().to_string(),
            subscription: self.rec.clone(),
            items,
        };
        if let Err(e) = self.deps.storage.return_dead_letters(&mv) {
            // The reserved ids stay empty: count them as acked, so the
            // retry cursor moves past them.
            for id in first_id..first_id + n {
                self.rec.retry.ack(id);
            }
            self.dirty = true;
            return Err(e.into());
        }
        failpoint("replay.retry.after_move");
        self.counters.dlq_size = self.counters.dlq_size.saturating_sub(n);
        self.counters.retry_queue += n;
        let scheduler = self.deps.scheduler.clone();
        self.when_durable(topic.clone(), first_id + n, move || scheduler.add(keys));
        // Reported done means durable, in either mode.
        self.deps.flusher.durable().await?;
        failpoint("replay.retry.after_flush");
        tracing::warn!(sub = %self.rec.name, topic = %self.rec.topic, count = n, due_ms, "dead letters replayed into the retry tier");
        Ok((first_id..first_id + n)
            .map(|entry_id| MessageRef {
                topic: topic.name().to_string(),
                entry_id,
            })
            .collect())
    }

    /// Publishes dead letters again on the topic: intents first (durable),
    /// then the publish, then the removal.
    async fn replay_onto_topic(
        &mut self,
        prepared: Vec<Prepared>,
        reset: bool,
    ) -> Result<Vec<MessageRef>> {
        let mut with_intent = Vec::with_capacity(prepared.len());
        for p in prepared {
            let mut record = p.record;
            record.replay = Some(Box::new(ReplayIntent {
                sequence_id: self.deps.storage.next_id()?,
                message: p.message.encode_to_vec(),
                failures: (!reset || !p.failures.edits.is_empty()).then_some(p.failures),
            }));
            with_intent.push((p.dlq_id, record));
        }
        self.deps
            .storage
            .put_dead_letters(self.rec.id, &with_intent)?;
        self.deps.flusher.durable().await?;
        failpoint("replay.topic.after_intent");
        self.finish_topic_replays(with_intent).await
    }

    /// Publishes dead letters that carry an intent, under the intent's
    /// sequence id, and removes them from the dead-letter tier.
    async fn finish_topic_replays(
        &mut self,
        mut letters: Vec<(u64, DeadLetterRecord)>,
    ) -> Result<Vec<MessageRef>> {
        letters.retain(|(_, r)| r.replay.is_some());
        // Ascending sequence ids: the de-duplication keeps only the last.
        letters.sort_by_key(|(_, r)| r.replay.as_ref().map_or(0, |i| i.sequence_id));
        let mut out = Vec::with_capacity(letters.len());
        let mut failures = Vec::with_capacity(letters.len());
        for (_, r) in &letters {
            let Some(intent) = &r.replay else { continue };
            let m = Message::decode(intent.message.as_slice()).map_err(StorageError::from)?;
            out.push(OutboundMessage {
                payload: m.payload,
                key: m.key,
                properties: m.properties,
                event_time_ms: m.event_time_ms,
                deliver_at_ms: 0,
                sequence_id: intent.sequence_id,
            });
            failures.push(intent.failures.clone());
        }
        let receipts = self
            .topic
            .publish(&replay_producer(&self.rec.name), out)
            .await?;
        failpoint("replay.topic.after_publish");
        let mut writes = Vec::new();
        let mut ids = Vec::new();
        for (receipt, rec) in receipts.into_iter().zip(failures) {
            // A duplicate was published before a crash: it has its id.
            let Some(id) = receipt.message_id else {
                continue;
            };
            ids.push(id.entry_id);
            if let Some(rec) = rec {
                let entry = TierEntry::main(id.entry_id);
                writes.push((entry.of(self.rec.id), Some(rec.clone())));
                self.deliveries.failures.insert(entry, rec);
            }
        }
        if !writes.is_empty() {
            self.deps.storage.put_failures(&writes)?;
        }
        let dlq_ids: Vec<u64> = letters.iter().map(|(id, _)| *id).collect();
        let storage = &self.deps.storage;
        // Removing the record is what takes it out of the dead-letter tier;
        // the entry goes with it.
        storage.remove_dead_letters(self.rec.id, &dlq_ids)?;
        storage.remove_entries(&self.tiers.dead_letter_name, &dlq_ids)?;
        self.counters.dlq_size = self.counters.dlq_size.saturating_sub(dlq_ids.len() as u64);
        // Reported done means durable, in either mode.
        self.deps.flusher.durable().await?;
        tracing::warn!(sub = %self.rec.name, topic = %self.rec.topic, count = dlq_ids.len(), "dead letters replayed onto the topic");
        Ok(ids
            .into_iter()
            .map(|entry_id| MessageRef {
                topic: self.rec.topic.clone(),
                entry_id,
            })
            .collect())
    }

    /// Finishes republishing replays a crash interrupted (dead letters
    /// holding an intent); run when the actor starts.
    pub(super) async fn resume_topic_replays(&mut self) {
        let pending: Vec<(u64, DeadLetterRecord)> = match self
            .deps
            .storage
            .dead_letters(self.rec.id, None)
        {
            Ok(all) => all
                .into_iter()
                .filter(|(_, r)| r.replay.is_some())
                .collect(),
            Err(e) => {
                tracing::error!(sub = %self.rec.name, topic = %self.rec.topic, error = %e, "cannot look for interrupted replays");
                return;
            }
        };
        if pending.is_empty() {
            return;
        }
        let n = pending.len();
        match self.finish_topic_replays(pending).await {
            Ok(_) => {
                tracing::warn!(sub = %self.rec.name, topic = %self.rec.topic, count = n, "interrupted replays finished")
            }
            Err(e) => {
                tracing::error!(sub = %self.rec.name, topic = %self.rec.topic, error = %e, "cannot finish interrupted replays")
            }
        }
    }
}
