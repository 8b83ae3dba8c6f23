//! Dead letters going back into their subscription's retry tier, as one
//! sled transaction (see [`DeadLetterReturn`]): the dead-letter records and
//! dead-letter tier entries go, the retry tier copies and their schedule
//! entries come, and the subscription record is stored with them.

use super::codec::{be, encode_failures, json, read_be, seal, unseal};
use super::frame;
use super::*;

/// A dead-letter tier frame losing entries: sealed as it is now (checked
/// again inside the transaction), and its contents after (`None` once no
/// live entry is left, and the frame goes).
struct FrameChange {
    before: Vec<u8>,
    after: Option<Vec<u8>>,
}

/// A [`FrameChange`] as the transaction applies it.
struct FrameWrite {
    tree: usize,
    key: [u8; 8],
    before: Vec<u8>,
    after: Option<Vec<u8>>,
}

impl SledStorage {
    pub(super) fn return_dead_letters_tx(&self, mv: &DeadLetterReturn) -> Result<()> {
        let sub_id = mv.subscription.id;
        // The dead-letter tier keeps the id floor past what it held, so a
        // removed last entry's id is never handed out again.
        let (_, next) = self.entry_range(&mv.dead_letter_topic)?;
        self.raise_id_floor(&mv.dead_letter_topic, next)?;
        // Everything is read and encoded before the transaction (its closure
        // may re-run): the frames of the dead-letter tier that lose entries,
        // as they are now (checked again inside) and as they will be.
        // By `(segment, first id)`.
        let mut dl_frames: BTreeMap<(u64, u64), FrameChange> = BTreeMap::new();
        for item in &mv.items {
            let id = item.dead_letter_id;
            let seg = id / self.segment_entries;
            let Some(tree) = self.segment_if_open(&mv.dead_letter_topic, seg)? else {
                continue;
            };
            let Some(kv) = tree.range(..=be(id)).next_back() else {
                continue;
            };
            let (k, v) = kv?;
            let first = read_be(&k)?;
            let slot = match dl_frames.entry((seg, first)) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let contents = unseal(&k, &v)?.to_vec();
                    e.insert(FrameChange {
                        before: v.to_vec(),
                        after: Some(contents),
                    })
                }
            };
            let Some(current) = &slot.after else {
                continue;
            };
            match frame::without(first, current, id)? {
                Some(rest) if frame::live(&rest)? == 0 => slot.after = None,
                Some(rest) => slot.after = Some(rest),
                None => {}
            }
        }
        let dl_segs: Vec<u64> = {
            let mut s: Vec<u64> = dl_frames.keys().map(|(seg, _)| *seg).collect();
            s.dedup();
            s
        };
        let mut retry_segs: Vec<u64> = mv
            .items
            .iter()
            .map(|i| i.target_entry_id / self.segment_entries)
            .collect();
        retry_segs.sort_unstable();
        retry_segs.dedup();
        let mut trees = vec![
            self.meta.clone(),
            self.sched.clone(),
            self.deadletters.clone(),
            self.sched_big.clone(),
        ];
        const SHARED: usize = 4;
        for seg in &retry_segs {
            trees.push(self.segment(&mv.retry_topic, *seg)?);
        }
        for seg in &dl_segs {
            trees.push(self.segment(&mv.dead_letter_topic, *seg)?);
        }
        let sub_key = sub_key(&mv.subscription.topic, &mv.subscription.name);
        let sub_val = seal(&sub_key, &json(&mv.subscription));
        struct Encoded {
            dl_key: [u8; 16],
            retry_tree: usize,
            entry_key: [u8; 8],
            frame: Vec<u8>,
            schedule_key: ScheduleKey,
            schedule_val: Vec<u8>,
        }
        let encoded: Vec<Encoded> = mv
            .items
            .iter()
            .map(|item| {
                let seg = item.target_entry_id / self.segment_entries;
                let key = ScheduleKey {
                    due_ms: item.due_ms,
                    message: TierEntry::retry(item.target_entry_id).of(sub_id),
                };
                Encoded {
                    dl_key: dl_key(sub_id, item.dead_letter_id),
                    retry_tree: SHARED + retry_segs.binary_search(&seg).unwrap_or(0),
                    entry_key: be(item.target_entry_id),
                    frame: seal(
                        &be(item.target_entry_id),
                        &frame::encode(std::slice::from_ref(&item.payload)),
                    ),
                    schedule_key: key,
                    schedule_val: encode_failures(&item.failures),
                }
            })
            .collect();
        let frames: Vec<FrameWrite> = dl_frames
            .into_iter()
            .map(|((seg, first), change)| {
                let key = be(first);
                FrameWrite {
                    tree: SHARED + retry_segs.len() + dl_segs.binary_search(&seg).unwrap_or(0),
                    key,
                    before: change.before,
                    after: change.after.map(|a| seal(&key, &a)),
                }
            })
            .collect();
        let result = trees.as_slice().transaction(|t| {
            let (meta, deadletters) = (&t[0], &t[2]);
            let mut schedule = super::sched::SchedWrites::new(&t[1], &t[3]);
            for e in &encoded {
                if deadletters.remove(&e.dl_key)?.is_none() {
                    return Err(ConflictableTransactionError::Abort(StorageError::Missing(
                        format!(
                            "dead letter {} (purged meanwhile?)",
                            read_be(&e.dl_key[8..]).unwrap_or(0)
                        ),
                    )));
                }
                t[e.retry_tree].insert(&e.entry_key, e.frame.as_slice())?;
                schedule.insert(&e.schedule_key, &e.schedule_val)?;
            }
            for f in &frames {
                let now = t[f.tree].get(f.key)?;
                if now.as_deref() != Some(f.before.as_slice()) {
                    return Err(ConflictableTransactionError::Abort(StorageError::Missing(
                        "a dead-letter tier frame changed during the move".into(),
                    )));
                }
                match &f.after {
                    Some(v) => t[f.tree].insert(&f.key, v.as_slice())?,
                    None => t[f.tree].remove(&f.key)?,
                };
            }
            let written = schedule.finish()?;
            meta.insert(sub_key.as_slice(), sub_val.as_slice())?;
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

/// Replay jobs live in the meta tree: the job (without its ids) under
/// this prefix and its id, rewritten as it progresses...
pub(super) const JOB_PREFIX: &[u8] = b"replayjob/";
/// ...and its dead-letter ids, written once, big-endian, under this one.
pub(super) const JOB_IDS_PREFIX: &[u8] = b"replayjobids/";

fn job_key(prefix: &[u8], id: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&be(id));
    k
}

impl SledStorage {
    pub(super) fn replay_jobs_stored(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>> {
        let mut out = Vec::new();
        for kv in self.meta.scan_prefix(JOB_PREFIX) {
            let (k, v) = kv?;
            let mut job: ReplayJobRecord = super::codec::from_json(unseal(&k, &v)?)?;
            if with_ids {
                let ik = job_key(JOB_IDS_PREFIX, job.id);
                if let Some(v) = self.meta.get(&ik)? {
                    job.dead_letter_ids = unseal(&ik, &v)?
                        .chunks_exact(8)
                        .map(read_be)
                        .collect::<Result<_>>()?;
                }
            }
            out.push(job);
        }
        Ok(out)
    }

    pub(super) fn put_replay_job_stored(&self, job: &ReplayJobRecord) -> Result<()> {
        let ik = job_key(JOB_IDS_PREFIX, job.id);
        let mut batch = Batch::default();
        if !self.meta.contains_key(&ik)? {
            if job.cursor > 0 {
                // Cancelled meanwhile: not brought back.
                return Ok(());
            }
            let ids: Vec<u8> = job.dead_letter_ids.iter().flat_map(|i| be(*i)).collect();
            batch.insert(ik.as_slice(), seal(&ik, &ids));
        }
        let k = job_key(JOB_PREFIX, job.id);
        let header = ReplayJobRecord {
            dead_letter_ids: Vec::new(),
            ..job.clone()
        };
        batch.insert(k.as_slice(), seal(&k, &json(&header)));
        self.meta.apply_batch(batch)?;
        Ok(())
    }

    pub(super) fn remove_replay_job_stored(&self, id: u64) -> Result<()> {
        let mut batch = Batch::default();
        batch.remove(job_key(JOB_PREFIX, id));
        batch.remove(job_key(JOB_IDS_PREFIX, id));
        self.meta.apply_batch(batch)?;
        Ok(())
    }
}
