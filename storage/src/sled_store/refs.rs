//! The sled side of retry-tier references ([`crate::refs`]): the
//! index of the references a subscription's retry tier holds, in `meta`,
//! one key per tier move (not per reference: sled keeps some 45 bytes of
//! page metadata in memory per stored key, and parked retries are what
//! piles up): `x:<sub id><lowest source entry><its tier entry>`
//! (big-endian) and a layout byte [`COMPACT`], whose sealed value lists the
//! move's `(source entry, tier entry)` pairs as zigzag varints of their
//! differences from the previous pair (from `(0, 0)`): some 2 bytes a pair
//! for a move of consecutive entries. Keys without the layout byte are the
//! layouts before, still read: their value lists the pairs 16 bytes each
//! (big-endian), or is empty for a group of the one pair the key names. The
//! index is written in the tier move's transaction; replacing references
//! with copies removes their pairs (a group losing its lowest pair is
//! stored again under its new lowest, so the first key always names the
//! lowest reference) in the same transaction.

use super::codec::{be, put_delta, read_be, seal, take_delta, unseal};
use super::*;
use crate::refs::{Indexed, RetryRef, Settle, is_ref};

/// Where the index lives in `meta`.
pub(super) const INDEX_PREFIX: &[u8] = b"x:";
/// Prefix, subscription id, source entry, tier entry.
pub(super) const INDEX_KEY_LEN: usize = 2 + 24;
/// The layout byte ending the key of a group whose pairs are varints.
const COMPACT: u8 = 2;
/// Bytes per listed pair in the fixed layout.
const PAIR_LEN: usize = 16;

fn index_key(sub_id: u64, source: u64, target: u64) -> [u8; INDEX_KEY_LEN] {
    let mut k = [0u8; INDEX_KEY_LEN];
    k[..2].copy_from_slice(INDEX_PREFIX);
    k[2..10].copy_from_slice(&be(sub_id));
    k[10..18].copy_from_slice(&be(source));
    k[18..].copy_from_slice(&be(target));
    k
}

/// A key past every index key of subscription `sub_id`, either layout.
fn index_end(sub_id: u64) -> [u8; INDEX_KEY_LEN + 1] {
    let mut k = [0xFF; INDEX_KEY_LEN + 1];
    k[..INDEX_KEY_LEN].copy_from_slice(&index_key(sub_id, u64::MAX, u64::MAX));
    k
}

/// The pairs an index value lists (`key`'s own pair for an empty one).
fn pairs_of(key: &[u8], body: &[u8]) -> Result<Vec<(u64, u64)>> {
    let bad = || StorageError::Corrupt("bad retry reference index entry".into());
    if key.len() == INDEX_KEY_LEN + 1 && key[INDEX_KEY_LEN] == COMPACT {
        let mut rest = body;
        let (mut source, mut target) = (0u64, 0u64);
        let mut out = Vec::new();
        while !rest.is_empty() {
            let s = take_delta(&mut rest, &mut source).ok_or_else(bad)?;
            let t = take_delta(&mut rest, &mut target).ok_or_else(bad)?;
            out.push((s, t));
        }
        return if out.is_empty() { Err(bad()) } else { Ok(out) };
    }
    if key.len() != INDEX_KEY_LEN || !body.len().is_multiple_of(PAIR_LEN) {
        return Err(bad());
    }
    if body.is_empty() {
        return Ok(vec![(read_be(&key[10..18])?, read_be(&key[18..])?)]);
    }
    body.chunks(PAIR_LEN)
        .map(|p| Ok((read_be(&p[..8])?, read_be(&p[8..])?)))
        .collect()
}

/// Checks an index entry (the verify pass).
pub(super) fn check_index(key: &[u8], body: &[u8]) -> Result<()> {
    pairs_of(key, body).map(|_| ())
}

/// The key and value of a group of `pairs` (at least one), compact.
fn group_entry(sub_id: u64, pairs: &[(u64, u64)]) -> (GroupKey, Vec<u8>) {
    let (source, target) = pairs.iter().min().copied().unwrap_or_default();
    let mut key = [COMPACT; INDEX_KEY_LEN + 1];
    key[..INDEX_KEY_LEN].copy_from_slice(&index_key(sub_id, source, target));
    let mut body = Vec::with_capacity(pairs.len() * 2 + 16);
    let (mut prev_source, mut prev_target) = (0u64, 0u64);
    for &(s, t) in pairs {
        put_delta(&mut body, s, &mut prev_source);
        put_delta(&mut body, t, &mut prev_target);
    }
    let sealed = seal(&key, &body);
    (key, sealed)
}

/// The key of an index group (compact layout).
type GroupKey = [u8; INDEX_KEY_LEN + 1];

/// A group in the fixed layout (16 bytes a pair), as the index was stored
/// before the compact one (for tests of stores written then).
#[cfg(test)]
pub(super) fn group_entry_fixed(sub_id: u64, pairs: &[(u64, u64)]) -> (Vec<u8>, Vec<u8>) {
    let (source, target) = pairs.iter().min().copied().unwrap_or_default();
    let key = index_key(sub_id, source, target);
    let mut body = Vec::new();
    for (s, t) in pairs {
        body.extend_from_slice(&be(*s));
        body.extend_from_slice(&be(*t));
    }
    let sealed = seal(&key, &body);
    (key.to_vec(), sealed)
}

/// The index entry a tier move writes for the references among `items`
/// (one for the whole move), if any.
pub(super) fn index_of_move(sub_id: u64, items: &[MoveItem]) -> Option<(GroupKey, Vec<u8>)> {
    let pairs: Vec<(u64, u64)> = items
        .iter()
        .filter(|i| matches!(i.arrival, Arrival::Retry { .. }))
        .filter_map(|i| {
            let r = RetryRef::parse(&i.payload).ok()??;
            Some((r.source_entry, i.target_entry_id))
        })
        .collect();
    (!pairs.is_empty()).then(|| group_entry(sub_id, &pairs))
}

impl SledStorage {
    /// Subscription `sub_id`'s indexed references with a source entry
    /// `< below`, by source entry.
    pub fn references_below(&self, sub_id: u64, below: u64) -> Result<Vec<Indexed>> {
        let mut out = Vec::new();
        for kv in self
            .meta
            .range(index_key(sub_id, 0, 0)..index_key(sub_id, below, 0))
        {
            let (k, v) = kv?;
            for (source, target) in pairs_of(&k, unseal(&k, &v)?)? {
                if source < below {
                    out.push(Indexed {
                        source,
                        target,
                        index_key: k.to_vec(),
                    });
                }
            }
        }
        out.sort_by_key(|i| (i.source, i.target));
        Ok(out)
    }

    /// The lowest indexed reference of subscription `sub_id` (the first
    /// index key names it).
    pub fn lowest_reference_of(&self, sub_id: u64) -> Result<Option<Indexed>> {
        let first = self
            .meta
            .range(index_key(sub_id, 0, 0).to_vec()..=index_end(sub_id).to_vec())
            .next();
        match first {
            None => Ok(None),
            Some(kv) => {
                let (k, v) = kv?;
                let lowest = pairs_of(&k, unseal(&k, &v)?)?.into_iter().min();
                Ok(lowest.map(|(source, target)| Indexed {
                    source,
                    target,
                    index_key: k.to_vec(),
                }))
            }
        }
    }

    /// In one transaction: stores each [`Settle::copy`] in place of the
    /// reference at its tier entry of `retry_topic` (only where a
    /// reference still is), and drops the index pairs of `items` (a group
    /// left without pairs goes; one that lost its lowest is stored again
    /// under its new lowest).
    pub fn settle_references(
        &self,
        retry_topic: &str,
        sub_id: u64,
        items: &[Settle],
    ) -> Result<()> {
        let mut trees = vec![self.meta.clone()];
        // The frames holding the tier entries to copy into, by tree and
        // frame key; found before the transaction (it cannot range).
        let mut frames: BTreeMap<(usize, [u8; 8]), Copies> = BTreeMap::new();
        let mut segs: Vec<u64> = Vec::new();
        for item in items {
            let Some(copy) = &item.copy else { continue };
            let target = item.indexed.target;
            let seg = target / self.segment_entries;
            let Some(tree) = self.segment_if_open(retry_topic, seg)? else {
                continue;
            };
            let Some(kv) = tree.range(..=be(target)).next_back() else {
                continue;
            };
            let (k, _) = kv?;
            let Ok(frame_key) = <[u8; 8]>::try_from(k.as_ref()) else {
                continue;
            };
            let at = match segs.iter().position(|s| *s == seg) {
                Some(at) => at,
                None => {
                    segs.push(seg);
                    trees.push(tree);
                    segs.len() - 1
                }
            };
            frames
                .entry((at + 1, frame_key))
                .or_default()
                .push((target, copy.as_slice()));
        }
        let mut groups: BTreeMap<&[u8], Vec<(u64, u64)>> = BTreeMap::new();
        for item in items {
            groups
                .entry(item.indexed.index_key.as_slice())
                .or_default()
                .push((item.indexed.source, item.indexed.target));
        }
        let result = trees.as_slice().transaction(|t| {
            for (group, settled) in &groups {
                let Some(v) = t[0].get(*group)? else { continue };
                let pairs = unseal(group, &v)
                    .and_then(|body| pairs_of(group, body))
                    .map_err(ConflictableTransactionError::Abort)?;
                let rest: Vec<(u64, u64)> =
                    pairs.into_iter().filter(|p| !settled.contains(p)).collect();
                t[0].remove(*group)?;
                if !rest.is_empty() {
                    let (k, v) = group_entry(sub_id, &rest);
                    t[0].insert(k.as_slice(), v)?;
                }
            }
            for ((tree, key), copies) in &frames {
                let Some(v) = t[*tree].get(key)? else {
                    continue;
                };
                // Only a reference is replaced: an entry that went (a
                // trimmed tier segment) stays gone.
                if let Some(value) = with_copies(key, &v, copies) {
                    t[*tree].insert(key.as_slice(), value)?;
                }
            }
            Ok::<_, ConflictableTransactionError<StorageError>>(())
        });
        match result {
            Ok(()) => Ok(()),
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(e.into()),
        }
    }

    /// Stored frames of `topic` and index keys of every subscription (for
    /// tests of the layout).
    #[cfg(test)]
    pub(crate) fn stored_keys(&self, topic: &str) -> (usize, usize) {
        let frames = self
            .segments_of(topic)
            .unwrap()
            .iter()
            .map(|(_, t)| t.len())
            .sum();
        let index = self.meta.scan_prefix(INDEX_PREFIX).count();
        (frames, index)
    }

    /// Bytes of the stored values (sealed) of `topic`'s frames, of the
    /// index entries and of the schedule's chunks (for tests of what a
    /// parked retry costs).
    #[cfg(test)]
    pub(crate) fn stored_bytes(&self, topic: &str) -> (usize, usize, usize) {
        let sum = |it: &mut dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>| {
            it.map(|kv| kv.unwrap().1.len()).sum::<usize>()
        };
        let frames = self
            .segments_of(topic)
            .unwrap()
            .iter()
            .map(|(_, t)| sum(&mut t.iter()))
            .sum();
        let index = sum(&mut self.meta.scan_prefix(INDEX_PREFIX));
        let chunks = sum(&mut self.sched.iter());
        (frames, index, chunks)
    }

    /// Stores `topic`'s frames, every index group and every schedule chunk
    /// again in the layouts written before the compact ones (plain frames,
    /// 16-byte index pairs, fixed chunk headers): the store as an older
    /// broker left it, for tests of the upgrade.
    #[cfg(test)]
    pub(crate) fn rewrite_in_old_layouts(&self, topic: &str) {
        for (_, tree) in self.segments_of(topic).unwrap() {
            for kv in tree.iter() {
                let (k, v) = kv.unwrap();
                let slots = frame::slots(read_be(&k).unwrap(), unseal(&k, &v).unwrap()).unwrap();
                let slots: Vec<Option<&[u8]>> = slots.iter().map(|(_, e)| e.as_deref()).collect();
                tree.insert(&k, seal(&k, &frame::encode_plain(&slots)))
                    .unwrap();
            }
        }
        for kv in self.meta.scan_prefix(INDEX_PREFIX) {
            let (k, v) = kv.unwrap();
            let pairs = pairs_of(&k, unseal(&k, &v).unwrap()).unwrap();
            let sub_id = read_be(&k[2..10]).unwrap();
            let (fixed, value) = group_entry_fixed(sub_id, &pairs);
            self.meta.remove(&k).unwrap();
            self.meta.insert(fixed, value).unwrap();
        }
        for kv in self.sched.iter() {
            let (k, v) = kv.unwrap();
            let chunk = sched::read_chunk(&k, &v).unwrap();
            self.sched.insert(&k, seal(&k, &chunk.encode_v1())).unwrap();
        }
    }

    /// Drops every index entry of subscription `sub_id` (deleted).
    pub fn forget_references_of(&self, sub_id: u64) -> Result<()> {
        let mut batch = Batch::default();
        for k in self
            .meta
            .range(index_key(sub_id, 0, 0).to_vec()..=index_end(sub_id).to_vec())
            .keys()
        {
            batch.remove(k?);
        }
        self.meta.apply_batch(batch)?;
        Ok(())
    }
}

/// `(tier entry, copy)` pairs to store in one frame.
type Copies<'a> = Vec<(u64, &'a [u8])>;

/// The frame stored under `key` (value `value`) with each of `copies`
/// `(entry, copy)` in place of its entry where that entry is still a
/// reference; `None` when nothing changes (or the frame does not read:
/// left for the verify pass to report).
fn with_copies(key: &[u8; 8], value: &[u8], copies: &[(u64, &[u8])]) -> Option<Vec<u8>> {
    let body = unseal(key, value).ok()?;
    let slots = frame::slots(u64::from_be_bytes(*key), body).ok()?;
    let mut changed = false;
    let entries: Vec<Option<Vec<u8>>> = slots
        .into_iter()
        .map(|(id, e)| match (e, copies.iter().find(|(t, _)| *t == id)) {
            (Some(e), Some((_, copy))) if is_ref(&e) => {
                changed = true;
                Some(copy.to_vec())
            }
            (e, _) => e.map(std::borrow::Cow::into_owned),
        })
        .collect();
    changed.then(|| seal(key, &frame::encode_slots(&entries)))
}
