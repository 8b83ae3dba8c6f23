//! The compact form of a log value whose entries are retry-tier references
//! ([`crate::refs::RetryRef`]): a parked `reconsume_later` is one such
//! entry, and millions of them sit in sled's pages, so each reference is
//! stored in a few bytes instead of its ~60-byte record.
//!
//! Layout (after the seal): [`MARKER`], the source topic once (varint
//! length and bytes), the slot count (varint), then per slot a varint
//! head: `0` a removed entry; `1` a reference, followed by four zigzag
//! varints, the differences of its source entry, `RECONSUMETIMES`,
//! `DELAY_TIME` and due time from those of the frame's previous reference
//! (from 0 for the first); `n ≥ 2` an entry stored whole, `n - 2` bytes.
//!
//! A reference is written compactly only when reading it back gives its
//! stored form byte for byte: its source topic is the frame's, its two
//! properties are canonical decimal numbers, and re-encoding it yields the
//! bytes it came as; any other entry (a copy, a reference to another
//! topic) is stored whole beside them. Readers get every entry in the
//! plain form ([`crate::refs::MAGIC`] and the record), so nothing above
//! this module sees the difference. A plain value never starts with the
//! marker: read as the plain layout's `u32` slot count it would be over
//! four billion slots of at least four bytes each.

use super::codec::{put_delta, take_delta};
use crate::refs::{RetryRef, is_ref};
use crate::{StorageError, StorageResult as Result};
use prost::encoding::{decode_varint, encode_varint};
use std::borrow::Cow;

/// The first bytes of a compact value.
pub const MARKER: [u8; 4] = [0xFF, b'R', b'F', b'2'];

const GONE: u64 = 0;
const REF: u64 = 1;
const WHOLE: u64 = 2;

fn corrupt(what: &str) -> StorageError {
    StorageError::Corrupt(format!("compact reference frame: {what}"))
}

/// A reference's numbers, when it can be stored compactly under `topic`.
fn numbers(entry: &[u8], topic: &str) -> Option<[u64; 4]> {
    let r = RetryRef::parse(entry).ok()??;
    let canonical = |s: &str| s.parse::<u64>().ok().filter(|n| n.to_string() == s);
    let n = [
        r.source_entry,
        canonical(&r.reconsume_times)?,
        canonical(&r.delay_time)?,
        r.deliver_at_ms,
    ];
    (r.source_topic == topic && r.to_bytes() == entry).then_some(n)
}

/// `slots` in the compact form, or `None` when none of them is a
/// reference that can be stored compactly.
pub fn encode(slots: &[Option<&[u8]>]) -> Option<Vec<u8>> {
    let topic = slots
        .iter()
        .flatten()
        .find(|e| is_ref(e))
        .and_then(|e| RetryRef::parse(e).ok().flatten())?
        .source_topic;
    let mut out = Vec::with_capacity(16 + topic.len() + 6 * slots.len());
    out.extend_from_slice(&MARKER);
    encode_varint(topic.len() as u64, &mut out);
    out.extend_from_slice(topic.as_bytes());
    encode_varint(slots.len() as u64, &mut out);
    let mut prev = [0u64; 4];
    let mut any = false;
    for slot in slots {
        let Some(e) = slot else {
            encode_varint(GONE, &mut out);
            continue;
        };
        match is_ref(e).then(|| numbers(e, &topic)).flatten() {
            Some(n) => {
                encode_varint(REF, &mut out);
                for (v, p) in n.iter().zip(prev.iter_mut()) {
                    put_delta(&mut out, *v, p);
                }
                any = true;
            }
            None => {
                encode_varint(WHOLE + e.len() as u64, &mut out);
                out.extend_from_slice(e);
            }
        }
    }
    any.then_some(out)
}

fn varint(b: &mut &[u8]) -> Result<u64> {
    decode_varint(b).map_err(|_| corrupt("truncated varint"))
}

/// The topic and slot count of a compact value (`b` starts with
/// [`MARKER`]), and the rest of it.
fn header(b: &[u8]) -> Result<(&str, u64, &[u8])> {
    let mut rest = &b[MARKER.len()..];
    let len = varint(&mut rest)?;
    let topic = rest
        .get(..usize::try_from(len).unwrap_or(usize::MAX))
        .ok_or_else(|| corrupt("truncated topic"))?;
    let topic = std::str::from_utf8(topic).map_err(|_| corrupt("topic is not UTF-8"))?;
    rest = &rest[topic.len()..];
    let n = varint(&mut rest)?;
    Ok((topic, n, rest))
}

/// An entry id and its bytes (`None` once removed): borrowed from the
/// value, or rebuilt from a compact reference (the slot of every frame
/// layout; [`super::frame`] uses it).
pub type Slot<'a> = (u64, Option<Cow<'a, [u8]>>);

/// One slot of a compact value as stored, before a reference is rebuilt.
enum Stored<'a> {
    Gone,
    /// A reference's source entry, `RECONSUMETIMES`, `DELAY_TIME` and due
    /// time.
    Ref([u64; 4]),
    Whole(&'a [u8]),
}

impl<'a> Stored<'a> {
    /// The slot in its plain form: a reference rebuilt under `topic`.
    fn plain(self, topic: &str) -> Option<Cow<'a, [u8]>> {
        match self {
            Stored::Gone => None,
            Stored::Ref([entry, times, delay, at]) => Some(Cow::Owned(
                RetryRef {
                    source_topic: topic.to_owned(),
                    source_entry: entry,
                    reconsume_times: times.to_string(),
                    delay_time: delay.to_string(),
                    deliver_at_ms: at,
                }
                .to_bytes(),
            )),
            Stored::Whole(e) => Some(Cow::Borrowed(e)),
        }
    }
}

/// Walks every slot of a compact value in order, giving `visit` the
/// frame's topic, the slot's index and the slot as stored; the whole value
/// is checked (a damaged one is corrupt whichever slot is wanted). Returns
/// the slot count.
fn walk<'a>(b: &'a [u8], mut visit: impl FnMut(&'a str, u64, Stored<'a>)) -> Result<u64> {
    let (topic, n, mut rest) = header(b)?;
    let mut prev = [0u64; 4];
    for i in 0..n {
        let slot = match varint(&mut rest)? {
            GONE => Stored::Gone,
            REF => {
                for p in prev.iter_mut() {
                    take_delta(&mut rest, p).ok_or_else(|| corrupt("truncated varint"))?;
                }
                Stored::Ref(prev)
            }
            h => {
                let len = usize::try_from(h - WHOLE).unwrap_or(usize::MAX);
                let e = rest.get(..len).ok_or_else(|| corrupt("truncated entry"))?;
                rest = &rest[len..];
                Stored::Whole(e)
            }
        };
        visit(topic, i, slot);
    }
    if !rest.is_empty() {
        return Err(corrupt("bytes after the last slot"));
    }
    Ok(n)
}

/// Slots of a compact value: each entry in its plain form (a reference
/// rebuilt, an entry stored whole borrowed).
pub fn slots(first: u64, b: &[u8]) -> Result<Vec<Slot<'_>>> {
    let (_, n, rest) = header(b)?;
    // Each slot takes at least one byte: a damaged count cannot over-allocate.
    let mut out = Vec::with_capacity((n as usize).min(rest.len()));
    walk(b, |topic, i, slot| {
        out.push((first.wrapping_add(i), slot.plain(topic)))
    })?;
    Ok(out)
}

/// Entry `id` of a compact value whose first id is `first`, in its plain
/// form (`None` when removed or not in the value). Only that entry is
/// rebuilt: reading one reference of a frame costs one, not the frame's.
pub fn entry(first: u64, b: &[u8], id: u64) -> Result<Option<Cow<'_, [u8]>>> {
    let Some(want) = id.checked_sub(first) else {
        return Ok(None);
    };
    let mut found = None;
    walk(b, |topic, i, slot| {
        if i == want {
            found = slot.plain(topic);
        }
    })?;
    Ok(found)
}

/// The slot count of a compact value.
pub fn count(b: &[u8]) -> Result<u64> {
    header(b).map(|(_, n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(topic: &str, entry: u64, times: &str, delay: &str, at: u64) -> Vec<u8> {
        RetryRef {
            source_topic: topic.into(),
            source_entry: entry,
            reconsume_times: times.into(),
            delay_time: delay.into(),
            deliver_at_ms: at,
        }
        .to_bytes()
    }

    fn round_trip(slots: &[Option<Vec<u8>>]) -> Vec<u8> {
        let borrowed: Vec<Option<&[u8]>> = slots.iter().map(|s| s.as_deref()).collect();
        let compact = encode(&borrowed).expect("a compact reference in the slots");
        let back: Vec<Option<Vec<u8>>> = self::slots(100, &compact)
            .unwrap()
            .into_iter()
            .enumerate()
            .map(|(i, (id, e))| {
                assert_eq!(id, 100 + i as u64);
                e.map(Cow::into_owned)
            })
            .collect();
        assert_eq!(back, slots, "every slot reads back byte for byte");
        // One entry at a time reads the same, and nothing outside the frame.
        let one = |id| entry(100, &compact, id).unwrap().map(Cow::into_owned);
        let each: Vec<Option<Vec<u8>>> = (0..slots.len() as u64).map(|i| one(100 + i)).collect();
        assert_eq!(each, slots, "each slot read alone reads back byte for byte");
        assert_eq!(one(99), None);
        assert_eq!(one(100 + slots.len() as u64), None);
        assert_eq!(count(&compact).unwrap(), slots.len() as u64);
        compact
    }

    #[test]
    fn references_read_back_byte_for_byte_beside_whatever_cannot_be_compact() {
        let t = "persistent://public/default/live";
        let slots = vec![
            Some(reference(t, 5, "1", "3600000", 1_765_000_000_000)),
            None,
            // Not a reference: a copy, and an empty entry.
            Some(b"\x0a\x03abc".to_vec()),
            Some(Vec::new()),
            // Numbers going down as well as up.
            Some(reference(t, 3, "2", "1000", 1_764_000_000_000)),
            Some(reference(t, u64::MAX, "18446744073709551615", "0", 0)),
            // Another topic, a property that is not a canonical number,
            // an empty property: stored whole.
            Some(reference("other", 4, "1", "3600000", 9)),
            Some(reference(t, 4, "01", "3600000", 9)),
            Some(reference(t, 4, "", "3600000", 9)),
            Some(reference(t, 4, "1", "-5", 9)),
            // A reference with a byte after it (not its own encoding).
            Some([reference(t, 4, "1", "2", 9), vec![0]].concat()),
        ];
        round_trip(&slots);
    }

    /// What a parked `reconsume_later` costs in a frame: the bench's
    /// move of 1 024 consecutive entries, a 1 h delay, due times a few ms
    /// apart.
    #[test]
    fn a_move_of_consecutive_references_takes_a_few_bytes_each() {
        let t = "persistent://public/default/live";
        let slots: Vec<Option<Vec<u8>>> = (0..100u64)
            .map(|i| {
                let at = 1_765_000_000_000 + i / 3;
                Some(reference(t, 40_000 + i, "1", "3600000", at))
            })
            .collect();
        // The plain layout: a u32 count, then a u32 length and the bytes
        // of each entry.
        let plain_len = 4 + slots
            .iter()
            .map(|s| 4 + s.as_ref().map_or(0, Vec::len))
            .sum::<usize>();
        let compact = round_trip(&slots);
        let per = |len: usize| len as f64 / slots.len() as f64;
        println!(
            "per reference: plain {:.1} B, compact {:.1} B",
            per(plain_len),
            per(compact.len())
        );
        assert!(compact.len() <= 60 + 5 * slots.len(), "{} B", compact.len());
    }

    #[test]
    fn damage_is_corrupt_never_a_panic() {
        let t = "persistent://public/default/live";
        let slots = [Some(reference(t, 5, "1", "3600000", 77)), None];
        let borrowed: Vec<Option<&[u8]>> = slots.iter().map(|s| s.as_deref()).collect();
        let compact = encode(&borrowed).unwrap();
        for cut in MARKER.len()..compact.len() {
            assert!(self::slots(0, &compact[..cut]).is_err(), "cut at {cut}");
            // Even when the slot asked for is whole before the cut.
            assert!(entry(0, &compact[..cut], 0).is_err(), "cut at {cut}");
        }
        let mut longer = compact.clone();
        longer.push(0);
        assert!(self::slots(0, &longer).is_err());
        assert!(entry(0, &longer, 0).is_err());
        // A count far beyond the bytes.
        let mut huge = MARKER.to_vec();
        encode_varint(1, &mut huge);
        huge.push(b't');
        encode_varint(u64::MAX, &mut huge);
        assert!(self::slots(0, &huge).is_err());
        // An entry length beyond the bytes.
        let mut long = MARKER.to_vec();
        encode_varint(0, &mut long);
        encode_varint(1, &mut long);
        encode_varint(u64::MAX, &mut long);
        assert!(self::slots(0, &long).is_err());
        // No compact form without a reference to store compactly.
        assert_eq!(encode(&[Some(b"\x0a\x01x".as_slice()), None]), None);
    }
}
