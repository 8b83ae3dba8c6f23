//! A log value: a run of consecutive entries of one producer batch (or one
//! moved message), keyed by the first entry's id. Layout: `u32 count`, then
//! per entry `u32 len` and its bytes; a removed entry (dead-letter purge)
//! keeps its slot with the length `u32::MAX`. A value holding retry-tier
//! references is written in a compact form instead when that is shorter
//! ([`super::ref_frame`]); every reader here gives entries back in their
//! plain form whichever layout a value has, so stores written before the
//! compact form read as they did.
//!
//! A batch is cut into runs of at most [`MAX_VALUE`] stored bytes
//! ([`runs`]), so that a sled leaf of such values stays under sled's blob
//! threshold (see [`MAX_VALUE`]); an entry larger than that is a run of its
//! own. Stores written when a batch was always one value read the same way:
//! every reader finds an entry in the value with the greatest first id at or
//! below it, whatever the runs' lengths.

use super::ref_frame;
use crate::refs::is_ref;
use crate::{StorageError, StorageResult as Result};
use std::borrow::Cow;

const GONE: u32 = u32::MAX;

/// The most bytes a stored log value (sealed: 5 bytes of format byte and
/// checksum, then the frame) is given when a batch is cut into runs.
///
/// sled 0.34 writes a page as a separate file under `blobs/` when its
/// logged form (the serialized page plus a message header of up to 32
/// bytes) is over a quarter of its 512 KiB log segment less the 20-byte
/// segment header, 131 052 bytes (`reserve_inner` in
/// `pagecache/logger.rs`). A leaf is split once it holds more than 16
/// items (`Node::should_split`), so it is written whole with at most 17;
/// each item costs its value, its key (8 bytes at most, prefix-encoded)
/// and up to 5 bytes of length varints, the node some 50 bytes of header.
/// At 7 KiB a full leaf is at most 17 × (7 168 + 13) + 50 = 122 127 bytes,
/// under the threshold with room for an 18th value. Such a page is also
/// charged to sled's cache at its real size, where a blob page counts only
/// its pointer. A single entry larger than this is still one value, and a
/// leaf holding it may still be a blob.
pub const MAX_VALUE: usize = 7 * 1024;

/// Bytes [`super::codec::seal`] adds to a frame.
const SEAL_LEN: usize = 5;

/// `entries` cut into consecutive runs whose stored values (sealed frames)
/// are each at most [`MAX_VALUE`] bytes; an entry too large for that is a
/// run by itself. No runs for no entries.
pub fn runs(entries: &[Vec<u8>]) -> Vec<&[Vec<u8>]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut size = SEAL_LEN + 4;
    for (i, e) in entries.iter().enumerate() {
        let cost = 4 + e.len();
        if i > start && size + cost > MAX_VALUE {
            out.push(&entries[start..i]);
            start = i;
            size = SEAL_LEN + 4;
        }
        size += cost;
    }
    if start < entries.len() {
        out.push(&entries[start..]);
    }
    out
}

fn corrupt() -> StorageError {
    StorageError::Corrupt("truncated log frame".into())
}

/// The value of `entries`: compact ([`ref_frame`]) when they hold retry
/// references that can be, else plain. Never longer than
/// [`encode_plain`]'s, so [`runs`]' bound holds for both.
pub fn encode(entries: &[Vec<u8>]) -> Vec<u8> {
    let slots: Vec<Option<&[u8]>> = entries.iter().map(|e| Some(e.as_slice())).collect();
    encode_borrowed(&slots)
}

/// A frame of `slots`, each an entry or `None` for a removed one (compact
/// when it can be, as [`encode`]).
pub fn encode_slots(slots: &[Option<Vec<u8>>]) -> Vec<u8> {
    let slots: Vec<Option<&[u8]>> = slots.iter().map(Option::as_deref).collect();
    encode_borrowed(&slots)
}

fn encode_borrowed(slots: &[Option<&[u8]>]) -> Vec<u8> {
    let plain_len = 4 + slots
        .iter()
        .map(|e| 4 + e.map_or(0, <[u8]>::len))
        .sum::<usize>();
    if slots.iter().flatten().any(|e| is_ref(e))
        && let Some(compact) = ref_frame::encode(slots).filter(|c| c.len() < plain_len)
    {
        return compact;
    }
    plain(slots, plain_len)
}

/// The plain layout of `slots` (`u32` count, then `u32` length and bytes
/// per entry, `u32::MAX` for a removed one), whatever they hold: what every
/// frame was before the compact form, kept for tests of stores written
/// then.
#[cfg(test)]
pub fn encode_plain(slots: &[Option<&[u8]>]) -> Vec<u8> {
    plain(slots, 0)
}

/// The plain layout of `slots`, in a buffer of `capacity` bytes.
fn plain(slots: &[Option<&[u8]>], capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(&(slots.len() as u32).to_be_bytes());
    for e in slots {
        match e {
            Some(e) => {
                out.extend_from_slice(&(e.len() as u32).to_be_bytes());
                out.extend_from_slice(e);
            }
            None => out.extend_from_slice(&GONE.to_be_bytes()),
        }
    }
    out
}

fn is_compact(b: &[u8]) -> bool {
    b.starts_with(&ref_frame::MARKER)
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    let bytes: [u8; 4] = b
        .get(at..at + 4)
        .ok_or_else(corrupt)?
        .try_into()
        .map_err(|_| corrupt())?;
    Ok(u32::from_be_bytes(bytes))
}

pub use super::ref_frame::Slot;

/// Walks every slot of a plain value in order, giving `visit` the slot's
/// index and its bytes (`None` once removed); the whole value is checked.
/// Returns the slot count.
fn walk_plain<'a>(b: &'a [u8], mut visit: impl FnMut(u64, Option<&'a [u8]>)) -> Result<u32> {
    let n = u32_at(b, 0)?;
    let mut at = 4;
    for i in 0..n {
        let len = u32_at(b, at)?;
        at += 4;
        if len == GONE {
            visit(i.into(), None);
        } else {
            let e = b
                .get(at..at.saturating_add(len as usize))
                .ok_or_else(corrupt)?;
            at += len as usize;
            visit(i.into(), Some(e));
        }
    }
    Ok(n)
}

/// Entries in the frame (ids from `first`), as `(id, Some(bytes))`, or
/// `None` for a removed slot.
pub fn slots(first: u64, b: &[u8]) -> Result<Vec<Slot<'_>>> {
    if is_compact(b) {
        return ref_frame::slots(first, b);
    }
    // Each slot takes at least 4 bytes: a damaged count cannot over-allocate.
    let mut out = Vec::with_capacity((u32_at(b, 0)? as usize).min(b.len() / 4));
    walk_plain(b, |i, e| {
        out.push((first.wrapping_add(i), e.map(Cow::Borrowed)))
    })?;
    Ok(out)
}

/// Entry `id` of the frame whose first id is `first` (`None` when removed
/// or not in the frame). Only that entry is rebuilt when the frame is
/// compact; the whole frame is still checked.
pub fn entry(first: u64, b: &[u8], id: u64) -> Result<Option<Cow<'_, [u8]>>> {
    if is_compact(b) {
        return ref_frame::entry(first, b, id);
    }
    let Some(want) = id.checked_sub(first) else {
        return Ok(None);
    };
    let mut found = None;
    walk_plain(b, |i, e| {
        if i == want {
            found = e.map(Cow::Borrowed);
        }
    })?;
    Ok(found)
}

/// The live entries of a frame whose first id is `first`.
pub fn entries(first: u64, b: &[u8]) -> Result<impl Iterator<Item = (u64, Cow<'_, [u8]>)>> {
    Ok(slots(first, b)?
        .into_iter()
        .filter_map(|(id, e)| e.map(|e| (id, e))))
}

/// Number of slots (live or removed): the ids the frame covers.
pub fn count(b: &[u8]) -> Result<u32> {
    if is_compact(b) {
        return u32::try_from(ref_frame::count(b)?).map_err(|_| corrupt());
    }
    u32_at(b, 0)
}

/// Number of live entries.
pub fn live(b: &[u8]) -> Result<u32> {
    Ok(slots(0, b)?.iter().filter(|(_, e)| e.is_some()).count() as u32)
}

/// The frame with entry `id` removed, or `None` if it does not hold it.
pub fn without(first: u64, b: &[u8], id: u64) -> Result<Option<Vec<u8>>> {
    let slots = slots(first, b)?;
    if !slots.iter().any(|(i, e)| *i == id && e.is_some()) {
        return Ok(None);
    }
    let kept: Vec<Option<&[u8]>> = slots
        .iter()
        .map(|(i, e)| e.as_deref().filter(|_| *i != id))
        .collect();
    Ok(Some(encode_borrowed(&kept)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn frames_round_trip_and_remove() {
        let f = super::encode(&[b"a".to_vec(), b"".to_vec(), b"ccc".to_vec()]);
        let got: Vec<_> = super::entries(10, &f)
            .unwrap()
            .map(|(i, e)| (i, e.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![(10, b"a".to_vec()), (11, vec![]), (12, b"ccc".to_vec())]
        );
        let one = |b: &[u8], id| super::entry(10, b, id).unwrap().map(|e| e.to_vec());
        assert_eq!(one(&f, 12), Some(b"ccc".to_vec()));
        assert_eq!(one(&f, 11), Some(vec![]));
        assert_eq!((one(&f, 9), one(&f, 13)), (None, None));
        let g = super::without(10, &f, 11).unwrap().unwrap();
        assert_eq!(super::count(&g).unwrap(), 3);
        assert_eq!(super::live(&g).unwrap(), 2);
        assert!(super::without(10, &g, 11).unwrap().is_none());
        assert_eq!(one(&g, 11), None, "a removed entry reads as none");
        assert_eq!(one(&g, 12), Some(b"ccc".to_vec()));
        assert!(super::entries(0, &f[..5]).is_err());
        // A damaged frame is corrupt even when the entry asked for is whole.
        assert!(super::entry(10, &f[..f.len() - 1], 10).is_err());
    }

    /// Runs keep the entries in order, each sealed frame within the limit
    /// unless it is one oversized entry, and pack as many as fit.
    #[test]
    fn runs_cut_a_batch_into_values_within_the_limit() {
        use super::{MAX_VALUE, SEAL_LEN, encode, runs};
        assert!(runs(&[]).is_empty());
        let kib: Vec<Vec<u8>> = (0..1000u32).map(|i| vec![i as u8; 1024]).collect();
        let cut = runs(&kib);
        // 6 entries of 1 KiB fit in 7 KiB with their headers, 7 do not.
        assert!(cut.iter().all(|r| r.len() == 6 || r.len() == 4));
        assert_eq!(cut.len(), 167);
        assert_eq!(cut.concat(), kib);
        for r in &cut {
            assert!(SEAL_LEN + encode(r).len() <= MAX_VALUE);
        }
        // Exactly at the limit: one run; one byte over: two.
        let exact = vec![vec![0u8; MAX_VALUE - SEAL_LEN - 8]];
        assert_eq!(runs(&exact).len(), 1);
        assert_eq!(SEAL_LEN + encode(&exact).len(), MAX_VALUE);
        let two = vec![vec![0u8; MAX_VALUE - SEAL_LEN - 12], vec![1u8]];
        assert_eq!(runs(&two).len(), 2);
        // An oversized entry is a run of its own, between its neighbours' runs.
        let mixed = vec![vec![1u8; 10], vec![2u8; 3 * MAX_VALUE], vec![3u8; 10]];
        let cut = runs(&mixed);
        assert_eq!(cut.iter().map(|r| r.len()).collect::<Vec<_>>(), [1, 1, 1]);
        // Empty entries still take their length slots.
        let empties = vec![Vec::new(); 3000];
        let cut = runs(&empties);
        assert_eq!(cut.concat(), empties);
        assert!(cut.iter().all(|r| SEAL_LEN + encode(r).len() <= MAX_VALUE));
    }
}
