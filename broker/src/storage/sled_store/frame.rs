//! A log value: the consecutive entries of one producer batch (or one moved
//! message), keyed by the first entry's id, so a batch costs one sled insert.
//! Layout: `u32 count`, then per entry `u32 len` and its bytes; a removed
//! entry (dead-letter purge) keeps its slot with the length `u32::MAX`.

use crate::storage::{StorageError, StorageResult as Result};

const GONE: u32 = u32::MAX;

fn corrupt() -> StorageError {
    StorageError::Corrupt("truncated log frame".into())
}

pub fn encode(entries: &[Vec<u8>]) -> Vec<u8> {
    let size = 4 + entries.iter().map(|e| 4 + e.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        out.extend_from_slice(&(e.len() as u32).to_be_bytes());
        out.extend_from_slice(e);
    }
    out
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    let bytes: [u8; 4] = b
        .get(at..at + 4)
        .ok_or_else(corrupt)?
        .try_into()
        .map_err(|_| corrupt())?;
    Ok(u32::from_be_bytes(bytes))
}

/// Entries in the frame (ids from `first`), as `(id, Some(bytes))`, or
/// `None` for a removed slot.
/// An entry id and its bytes (`None` once removed).
pub type Slot<'a> = (u64, Option<&'a [u8]>);

pub fn slots(first: u64, b: &[u8]) -> Result<Vec<Slot<'_>>> {
    let n = u32_at(b, 0)? as usize;
    let mut at = 4;
    // Each slot takes at least 4 bytes: a damaged count cannot over-allocate.
    let mut out = Vec::with_capacity(n.min(b.len() / 4));
    for i in 0..n {
        let len = u32_at(b, at)?;
        at += 4;
        if len == GONE {
            out.push((first + i as u64, None));
        } else {
            let e = b
                .get(at..at.saturating_add(len as usize))
                .ok_or_else(corrupt)?;
            at += len as usize;
            out.push((first + i as u64, Some(e)));
        }
    }
    Ok(out)
}

/// The live entries of a frame whose first id is `first`.
pub fn entries(first: u64, b: &[u8]) -> Result<impl Iterator<Item = (u64, &[u8])>> {
    Ok(slots(first, b)?
        .into_iter()
        .filter_map(|(id, e)| e.map(|e| (id, e))))
}

/// Number of slots (live or removed): the ids the frame covers.
pub fn count(b: &[u8]) -> Result<u32> {
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
    let mut out = Vec::with_capacity(b.len());
    out.extend_from_slice(&(slots.len() as u32).to_be_bytes());
    for (i, e) in slots {
        match e {
            Some(e) if i != id => {
                out.extend_from_slice(&(e.len() as u32).to_be_bytes());
                out.extend_from_slice(e);
            }
            _ => out.extend_from_slice(&GONE.to_be_bytes()),
        }
    }
    Ok(Some(out))
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
        let g = super::without(10, &f, 11).unwrap().unwrap();
        assert_eq!(super::count(&g).unwrap(), 3);
        assert_eq!(super::live(&g).unwrap(), 2);
        assert!(super::without(10, &g, 11).unwrap().is_none());
        assert!(super::entries(0, &f[..5]).is_err());
    }
}
