//! A subscription's state read out whole and written back under another
//! numeric id: what moving a topic to another broker needs from the store
//! (see `crate::transfer`). Reading the schedule is a scan of the whole
//! index (it is keyed by due time); a move is rare, so that is accepted.

use super::codec::{be, decode_failures, encode_failures, json, seal, unseal};
use super::{SledStorage, dl_key};
use crate::{Result, ScheduleKey, StorageError, SubMessage, SubscriptionState, TierEntry};
use sled::Batch;

impl SledStorage {
    pub(super) fn read_subscription_state(&self, sub_id: u64) -> Result<SubscriptionState> {
        let mut state = SubscriptionState::default();
        for kv in self.failures.scan_prefix(be(sub_id)) {
            let (k, v) = kv?;
            let m = SubMessage::from_key(&k)
                .ok_or_else(|| StorageError::Corrupt("bad failure key".into()))?;
            state
                .failures
                .push((m.entry(), decode_failures(unseal(&k, &v)?)?));
        }
        for chunk in self.chunks_in(None, None) {
            let (ck, chunk) = chunk?;
            if super::sched::chunk_sub(&ck) != sub_id {
                continue;
            }
            for (key, item) in chunk.keys(&ck) {
                let record = match item.slot {
                    super::sched::Slot::Empty => None,
                    super::sched::Slot::Inline => Some(decode_failures(&item.body)?),
                    super::sched::Slot::Big => Some(decode_failures(&self.big_record(&key)?)?),
                };
                state
                    .schedule
                    .push((key.due_ms, key.message.entry(), record));
            }
        }
        state
            .schedule
            .sort_by_key(|(due, e, _)| (*due, e.of(sub_id).key()));
        state.dead_letters = crate::SubscriptionStore::dead_letters(self, sub_id, None)?;
        Ok(state)
    }

    pub(super) fn write_subscription_state(
        &self,
        sub_id: u64,
        state: &SubscriptionState,
    ) -> Result<()> {
        let key = |e: &TierEntry| e.of(sub_id).key();
        let mut batch = Batch::default();
        for (e, r) in &state.failures {
            let k = key(e);
            batch.insert(&k, seal(&k, &encode_failures(r)));
        }
        self.failures.apply_batch(batch)?;
        let entries: Vec<(ScheduleKey, Vec<u8>)> = state
            .schedule
            .iter()
            .map(|(due_ms, e, r)| {
                let k = ScheduleKey {
                    due_ms: *due_ms,
                    message: e.of(sub_id),
                };
                (k, r.as_ref().map(encode_failures).unwrap_or_default())
            })
            .collect();
        for part in entries.chunks(super::sched::TX_BATCH) {
            self.sched_tx(|w| {
                for (k, body) in part {
                    w.insert(k, body)?;
                }
                Ok(())
            })?;
        }
        let mut batch = Batch::default();
        for (id, r) in &state.dead_letters {
            let k = dl_key(sub_id, *id);
            batch.insert(&k, seal(&k, &json(r)));
        }
        self.deadletters.apply_batch(batch)?;
        Ok(())
    }

    pub(super) fn write_producer_sequences(
        &self,
        topic: &str,
        sequences: &[(String, u64)],
    ) -> Result<()> {
        let mut batch = Batch::default();
        for (name, seq) in sequences {
            let key = format!("{topic}\0{name}");
            batch.insert(key.as_bytes(), seal(key.as_bytes(), &be(*seq)));
        }
        self.prodseq.apply_batch(batch)?;
        Ok(())
    }
}
