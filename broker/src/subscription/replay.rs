//! Dead-letter replay, an operator's decision: dead letters are published
//! again on the subscription's topic (keeping their failure history and
//! delivery count, or starting afresh) and removed from the dead-letter tier.
//!
//! Known limits, to be lifted: every subscription of the topic sees the
//! replayed message, and publish-then-remove is two steps, so a crash in
//! between duplicates (never loses) it.

use super::SubscriptionActor;
use super::requests::MessageRef;
use crate::error::Result;
use crate::storage::{DeadLetterRecord, StorageError, TierEntry};
use prost::Message as _;
use ricochet_proto::{Message, OutboundMessage, props};

impl SubscriptionActor {
    pub(super) async fn replay(
        &mut self,
        letters: Vec<(u64, DeadLetterRecord)>,
        reset: bool,
    ) -> Result<Vec<MessageRef>> {
        let mut out = Vec::with_capacity(letters.len());
        let mut records = Vec::with_capacity(letters.len());
        let mut dlq_ids = Vec::with_capacity(letters.len());
        for (i, (dlq_id, record)) in letters.into_iter().enumerate() {
            let Some(bytes) = self
                .deps
                .storage
                .read_one(&self.tiers.dead_letter_name, dlq_id)?
            else {
                continue;
            };
            let m = Message::decode(bytes.as_slice()).map_err(StorageError::from)?;
            dlq_ids.push(dlq_id);
            let mut properties = m.properties;
            properties.remove(props::DEAD_LETTER_REASON);
            if reset {
                // A fresh start: no reconsume history on the message either.
                // ORIGIN_MESSAGE_ID and REAL_TOPIC stay, as provenance.
                properties.remove(props::RECONSUME_TIMES);
                properties.remove(props::DELAY_TIME);
            }
            out.push(OutboundMessage {
                payload: m.payload,
                key: m.key,
                properties,
                event_time_ms: m.event_time_ms,
                deliver_at_ms: 0,
                sequence_id: i as u64,
            });
            records.push(record.failures);
        }
        if out.is_empty() {
            return Ok(Vec::new());
        }
        let receipts = self.topic.publish("", out).await?;
        self.counters.dlq_size = self.counters.dlq_size.saturating_sub(dlq_ids.len() as u64);
        let ids: Vec<u64> = receipts
            .into_iter()
            .filter_map(|r| r.message_id.map(|id| id.entry_id))
            .collect();
        if !reset {
            let mut writes = Vec::with_capacity(ids.len());
            for (id, rec) in ids.iter().zip(records) {
                let entry = TierEntry::main(*id);
                writes.push((entry.of(self.rec.id), Some(rec.clone())));
                self.deliveries.failures.insert(entry, rec);
            }
            self.deps.storage.put_failures(&writes)?;
        }
        let storage = &self.deps.storage;
        storage.remove_dead_letters(self.rec.id, &dlq_ids)?;
        storage.remove_entries(&self.tiers.dead_letter_name, &dlq_ids)?;
        // Reported done means durable, in either mode.
        self.deps.flusher.durable().await?;
        tracing::warn!(sub = %self.rec.name, topic = %self.rec.topic, count = ids.len(), reset, "dead letters replayed");
        Ok(ids
            .into_iter()
            .map(|entry_id| MessageRef {
                topic: self.rec.topic.clone(),
                entry_id,
            })
            .collect())
    }
}
