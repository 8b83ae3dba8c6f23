//! Tier moves ([`SubscriptionStore::move_messages`]) as one sled
//! transaction over `meta`, `failures`, the schedule's chunks
//! ([`super::sched`]), `deadletters` and the target tier's segment trees.
//!
//! Stored keys per moved message are kept to one where it can be: a retry
//! keeps its failure record in its schedule entry (in its chunk); the moved
//! entries are stored as frames of consecutive entries (one per run of
//! ids in one segment, cut at [`frame::MAX_VALUE`]), not one frame each;
//! and the retry-reference index gets one entry per move listing its
//! references ([`super::refs`]). sled keeps some 45 bytes of page metadata
//! in memory per stored key, and millions of parked retries are the case
//! to size for.

use super::codec::{encode_failures, json, seal};
use super::*;

/// Where an item's record goes: with its schedule entry (a retry) or
/// under its dead-letter key.
enum Landing {
    Schedule(ScheduleKey, Vec<u8>),
    DeadLetter([u8; 16], Vec<u8>),
}

/// A frame of moved entries: its tree (index into the transaction's
/// segment trees), key (the first entry's id) and sealed value.
struct Frame {
    segment: usize,
    key: [u8; 8],
    value: Vec<u8>,
}

/// The moved items as frames: runs of consecutive ids within one segment,
/// each cut so a stored value stays within [`frame::MAX_VALUE`].
fn frames_of(items: &[MoveItem], segment_entries: u64, seg_numbers: &[u64]) -> Vec<Frame> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < items.len() {
        let seg = items[start].target_entry_id / segment_entries;
        let mut end = start + 1;
        while end < items.len()
            && items[end].target_entry_id == items[end - 1].target_entry_id + 1
            && items[end].target_entry_id / segment_entries == seg
        {
            end += 1;
        }
        let payloads: Vec<Vec<u8>> = items[start..end]
            .iter()
            .map(|i| i.payload.clone())
            .collect();
        let mut first = items[start].target_entry_id;
        for run in frame::runs(&payloads) {
            let key = be(first);
            out.push(Frame {
                segment: seg_numbers.binary_search(&seg).unwrap_or(0),
                key,
                value: seal(&key, &frame::encode(run)),
            });
            first += run.len() as u64;
        }
        start = end;
    }
    out
}

impl SledStorage {
    pub(super) fn move_messages_tx(&self, mv: &TierMove) -> Result<()> {
        // Everything is encoded before the transaction: its closure may re-run.
        let sub_key = sub_key(&mv.subscription.topic, &mv.subscription.name);
        let sub_val = seal(&sub_key, &json(&mv.subscription));
        let mut seg_numbers: Vec<u64> = mv
            .items
            .iter()
            .map(|i| i.target_entry_id / self.segment_entries)
            .collect();
        seg_numbers.sort_unstable();
        seg_numbers.dedup();
        let mut trees = vec![
            self.meta.clone(),
            self.failures.clone(),
            self.sched.clone(),
            self.deadletters.clone(),
            self.sched_big.clone(),
        ];
        const SHARED_TREES: usize = 5;
        for seg in &seg_numbers {
            trees.push(self.segment(&mv.target_topic, *seg)?);
        }
        struct Encoded {
            from_key: [u8; 17],
            from_schedule: Option<ScheduleKey>,
            landing: Landing,
        }
        let encoded: Vec<Encoded> = mv
            .items
            .iter()
            .map(|item| {
                let landing = match &item.arrival {
                    Arrival::Retry { due_ms } => {
                        let key = ScheduleKey {
                            due_ms: *due_ms,
                            message: TierEntry::retry(item.target_entry_id).of(mv.subscription.id),
                        };
                        Landing::Schedule(key, encode_failures(&item.failures))
                    }
                    Arrival::DeadLetter(d) => {
                        let k = dl_key(mv.subscription.id, item.target_entry_id);
                        Landing::DeadLetter(k, seal(&k, &json(d)))
                    }
                };
                Encoded {
                    from_key: item.from.key(),
                    from_schedule: item.from_schedule,
                    landing,
                }
            })
            .collect();
        let frames = frames_of(&mv.items, self.segment_entries, &seg_numbers);
        let index = refs::index_of_move(mv.subscription.id, &mv.items);
        let result = trees.as_slice().transaction(|t| {
            let (meta, failures, deadletters) = (&t[0], &t[1], &t[3]);
            let mut schedule = sched::SchedWrites::new(&t[2], &t[4]);
            let segments = &t[SHARED_TREES..];
            meta.insert(sub_key.as_slice(), sub_val.as_slice())?;
            for e in &encoded {
                failures.remove(&e.from_key)?;
                if let Some(s) = &e.from_schedule {
                    schedule.remove(s)?;
                }
                match &e.landing {
                    Landing::Schedule(k, body) => schedule.insert(k, body)?,
                    Landing::DeadLetter(k, v) => {
                        deadletters.insert(k, v.as_slice())?;
                    }
                };
            }
            let written = schedule.finish()?;
            for f in &frames {
                segments[f.segment].insert(&f.key, f.value.as_slice())?;
            }
            if let Some((k, v)) = &index {
                meta.insert(k, v.as_slice())?;
            }
            Ok::<_, ConflictableTransactionError<StorageError>>(written)
        });
        match result {
            Ok(written) => {
                self.chunks_written(written);
                Ok(())
            }
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(target: u64, payload: Vec<u8>) -> MoveItem {
        MoveItem {
            from: TierEntry::main(target).of(1),
            from_schedule: None,
            payload,
            target_entry_id: target,
            failures: FailureRecord::default(),
            arrival: Arrival::Retry { due_ms: 1 },
            source: None,
        }
    }

    #[test]
    fn moved_entries_are_framed_per_run_of_ids_within_a_segment() {
        // Ids 6..12 cross a segment boundary at 8; 20 starts a new run.
        let items: Vec<MoveItem> = (6..12)
            .chain([20])
            .map(|i| item(i, vec![i as u8; 10]))
            .collect();
        let frames = frames_of(&items, 8, &[0, 1, 2]);
        let keys: Vec<(usize, u64)> = frames
            .iter()
            .map(|f| (f.segment, u64::from_be_bytes(f.key)))
            .collect();
        assert_eq!(keys, vec![(0, 6), (1, 8), (2, 20)]);
        // Big entries are cut at the value limit.
        let big: Vec<MoveItem> = (0..4)
            .map(|i| item(i, vec![0; frame::MAX_VALUE / 2]))
            .collect();
        assert_eq!(frames_of(&big, 1_000, &[0]).len(), 4);
    }
}
