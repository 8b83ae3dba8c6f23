//! The sled side of retry-tier references ([`crate::refs`]): the
//! index of the references a subscription's retry tier holds, in `meta`
//! under `x:<sub id><source entry><tier entry>` (big-endian, an empty
//! sealed value), written in the tier move's transaction; and replacing
//! references with copies, each with its index entry removed, in one
//! transaction.

use super::codec::{be, read_be, seal, unseal};
use super::*;
use crate::refs::{RetryRef, Settle, is_ref};

/// Where the index lives in `meta`.
pub(super) const INDEX_PREFIX: &[u8] = b"x:";
/// Prefix, subscription id, source entry, tier entry.
pub(super) const INDEX_KEY_LEN: usize = 2 + 24;

fn index_key(sub_id: u64, source: u64, target: u64) -> [u8; INDEX_KEY_LEN] {
    let mut k = [0u8; INDEX_KEY_LEN];
    k[..2].copy_from_slice(INDEX_PREFIX);
    k[2..10].copy_from_slice(&be(sub_id));
    k[10..18].copy_from_slice(&be(source));
    k[18..].copy_from_slice(&be(target));
    k
}

/// The index entry a tier move writes for `item`, when it stores a
/// reference.
pub(super) fn index_key_of(sub_id: u64, item: &MoveItem) -> Option<[u8; INDEX_KEY_LEN]> {
    if !matches!(item.arrival, Arrival::Retry { .. }) {
        return None;
    }
    let r = RetryRef::parse(&item.payload).ok()??;
    Some(index_key(sub_id, r.source_entry, item.target_entry_id))
}

impl SledStorage {
    /// `(source, tier entry)` of subscription `sub_id`'s indexed
    /// references with a source entry `< below`, by source entry.
    pub fn references_below(&self, sub_id: u64, below: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for kv in self
            .meta
            .range(index_key(sub_id, 0, 0)..index_key(sub_id, below, 0))
        {
            let (k, v) = kv?;
            unseal(&k, &v)?;
            out.push((read_be(&k[10..18])?, read_be(&k[18..])?));
        }
        Ok(out)
    }

    /// The lowest indexed `(source, tier entry)` of subscription `sub_id`.
    pub fn lowest_reference_of(&self, sub_id: u64) -> Result<Option<(u64, u64)>> {
        let first = self
            .meta
            .range(index_key(sub_id, 0, 0)..=index_key(sub_id, u64::MAX, u64::MAX))
            .next();
        match first {
            None => Ok(None),
            Some(kv) => {
                let (k, v) = kv?;
                unseal(&k, &v)?;
                Ok(Some((read_be(&k[10..18])?, read_be(&k[18..])?)))
            }
        }
    }

    /// In one transaction: stores each [`Settle::copy`] in place of the
    /// reference at its tier entry of `retry_topic` (only where a
    /// reference still is), and drops the index entries of `items`.
    pub fn settle_references(
        &self,
        retry_topic: &str,
        sub_id: u64,
        items: &[Settle],
    ) -> Result<()> {
        let mut trees = vec![self.meta.clone()];
        let mut slots = Vec::with_capacity(items.len());
        let mut segs: Vec<u64> = Vec::new();
        for item in items {
            let seg = item.target / self.segment_entries;
            let slot = match (&item.copy, self.segment_if_open(retry_topic, seg)?) {
                (Some(copy), Some(tree)) => {
                    let at = match segs.iter().position(|s| *s == seg) {
                        Some(at) => at,
                        None => {
                            segs.push(seg);
                            trees.push(tree);
                            segs.len() - 1
                        }
                    };
                    let key = be(item.target);
                    Some((
                        at + 1,
                        key,
                        seal(&key, &frame::encode(std::slice::from_ref(copy))),
                    ))
                }
                _ => None,
            };
            slots.push((index_key(sub_id, item.source, item.target), slot));
        }
        let result = trees.as_slice().transaction(|t| {
            for (index, slot) in &slots {
                t[0].remove(index.as_slice())?;
                let Some((tree, key, value)) = slot else {
                    continue;
                };
                // Only a reference is replaced: an entry that went (a
                // trimmed tier segment) stays gone.
                let still_ref = match t[*tree].get(key)? {
                    Some(v) => single_entry(key, &v).is_some_and(is_ref),
                    None => false,
                };
                if still_ref {
                    t[*tree].insert(key.as_slice(), value.as_slice())?;
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

    /// Drops every index entry of subscription `sub_id` (deleted).
    pub fn forget_references_of(&self, sub_id: u64) -> Result<()> {
        let mut batch = Batch::default();
        for k in self
            .meta
            .range(index_key(sub_id, 0, 0)..=index_key(sub_id, u64::MAX, u64::MAX))
            .keys()
        {
            batch.remove(k?);
        }
        self.meta.apply_batch(batch)?;
        Ok(())
    }
}

/// The entry of a one-entry frame stored under `key`.
fn single_entry<'a>(key: &[u8; 8], value: &'a [u8]) -> Option<&'a [u8]> {
    let body = unseal(key, value).ok()?;
    let mut entries = frame::entries(u64::from_be_bytes(*key), body).ok()?;
    let (_, entry) = entries.next()?;
    entries.next().is_none().then_some(entry)
}
