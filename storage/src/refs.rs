//! Retry-tier references: the compact record a retry-tier entry holds
//! instead of a copy of the message, when the message still lives in its
//! topic's segment-file log.
//!
//! A reference names the source entry (topic and entry id) and carries
//! what a retry adds to the message (`RECONSUMETIMES`, `DELAY_TIME`, the
//! due time); `REAL_TOPIC` and `ORIGIN_MESSAGE_ID` follow from the source,
//! so reading it gives back, byte for byte after decoding, the copy the
//! tier would otherwise hold ([`resolve`]). An entry is a reference when
//! it starts with [`MAGIC`]: a leading zero byte is never the start of an
//! encoded message (protobuf field 0 does not exist), so full copies
//! written before references existed, or when a retry carries properties
//! of its own, read as before beside them.
//!
//! [`super::LogStorage`] decides between a reference and a copy at each
//! tier move, resolves references on every read of a tier, keeps an index
//! (subscription, source entry → tier entry) in sled, and replaces
//! references with copies before a trim drops the segment they point into.

use super::{Arrival, StorageError, StorageResult as Result, TierMove};
use crate::prelude::*;
use prost::Message as _;
use ricochet_proto::{Message, props};
use std::collections::BTreeMap;

/// The bytes every reference record starts with.
pub const MAGIC: &[u8] = b"\x00RREF";

/// What a retry-tier entry stores instead of the message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryRef {
    /// The topic holding the message.
    #[prost(string, tag = "1")]
    pub source_topic: String,
    /// Its entry id there.
    #[prost(uint64, tag = "2")]
    pub source_entry: u64,
    /// The `RECONSUMETIMES` property of the copy.
    #[prost(string, tag = "3")]
    pub reconsume_times: String,
    /// The `DELAY_TIME` property of the copy.
    #[prost(string, tag = "4")]
    pub delay_time: String,
    /// The copy's `deliver_at_ms`.
    #[prost(uint64, tag = "5")]
    pub deliver_at_ms: u64,
}

impl RetryRef {
    /// The reference that stands for `copy`, a retry-tier copy of entry
    /// `source_entry` of `source_topic`; `None` when the copy lacks the
    /// retry's properties. Whether it resolves to the same message is for
    /// the caller to check ([`resolve`]).
    pub fn for_copy(copy: &Message, source_topic: &str, source_entry: u64) -> Option<Self> {
        Some(Self {
            source_topic: source_topic.to_owned(),
            source_entry,
            reconsume_times: copy.properties.get(props::RECONSUME_TIMES)?.clone(),
            delay_time: copy.properties.get(props::DELAY_TIME)?.clone(),
            deliver_at_ms: copy.deliver_at_ms,
        })
    }

    /// The stored form: [`MAGIC`] and the record.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAGIC.len() + self.encoded_len());
        out.extend_from_slice(MAGIC);
        self.encode(&mut out)
            .expect("a Vec grows to fit what is encoded");
        out
    }

    /// The reference a stored entry holds, `None` for a message (a copy).
    pub fn parse(entry: &[u8]) -> Result<Option<Self>> {
        match entry.strip_prefix(MAGIC) {
            None => Ok(None),
            Some(body) => Self::decode(body).map(Some).map_err(|e| {
                StorageError::Corrupt(format!("retry reference does not decode: {e}"))
            }),
        }
    }
}

/// Whether a stored entry is a reference.
pub fn is_ref(entry: &[u8]) -> bool {
    entry.starts_with(MAGIC)
}

/// The message `r` stands for, built from its source entry's message.
pub fn resolve_message(r: &RetryRef, source: &[u8]) -> Result<Message> {
    let mut m = Message::decode(source).map_err(StorageError::from)?;
    m.properties
        .entry(props::REAL_TOPIC.into())
        .or_insert_with(|| r.source_topic.clone());
    m.properties
        .entry(props::ORIGIN_MESSAGE_ID.into())
        .or_insert_with(|| format!("{}:{}", r.source_topic, r.source_entry));
    m.properties
        .insert(props::RECONSUME_TIMES.into(), r.reconsume_times.clone());
    m.properties
        .insert(props::DELAY_TIME.into(), r.delay_time.clone());
    m.deliver_at_ms = r.deliver_at_ms;
    Ok(m)
}

/// The encoded message `r` stands for (what a copy would have stored).
pub fn resolve(r: &RetryRef, source: &[u8]) -> Result<Vec<u8>> {
    Ok(resolve_message(r, source)?.encode_to_vec())
}

impl super::LogStorage {
    /// `entries` of a tier topic with every reference replaced by the
    /// message it stands for (sources read together, per topic).
    pub(super) fn resolve_entries(&self, entries: &mut [&mut Vec<u8>]) -> Result<()> {
        let mut refs: Vec<(usize, RetryRef)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if let Some(r) = RetryRef::parse(e)? {
                refs.push((i, r));
            }
        }
        if refs.is_empty() {
            return Ok(());
        }
        refs.sort_by(|a, b| a.1.source_topic.cmp(&b.1.source_topic));
        for group in refs.chunk_by(|a, b| a.1.source_topic == b.1.source_topic) {
            let topic = &group[0].1.source_topic;
            let ids: Vec<u64> = group.iter().map(|(_, r)| r.source_entry).collect();
            let sources = self.read_many(topic, &ids)?;
            for ((i, r), source) in group.iter().zip(sources) {
                let source = source.ok_or_else(|| gone(r))?;
                *entries[*i] = resolve(r, &source)?;
            }
        }
        Ok(())
    }

    /// `mv` with a reference in place of each retry copy that can be one
    /// (`None` when none can): the copy's message came from an entry of
    /// the subscription's own topic (directly, or through a reference the
    /// retry tier held) that the log still holds, and the reference
    /// resolves to exactly the copy. The caller holds the trim lock.
    pub(super) fn with_references(&self, mv: &TierMove) -> Result<Option<TierMove>> {
        let topic = &mv.subscription.topic;
        if !self.logged(topic) {
            return Ok(None);
        }
        let mut candidates: Vec<(usize, u64)> = Vec::new();
        // Retries of retries, by the tier topic they came from: (item, entry).
        let mut through: BTreeMap<&str, Vec<(usize, u64)>> = BTreeMap::new();
        for (i, item) in mv.items.iter().enumerate() {
            let (Arrival::Retry { .. }, Some((from, entry))) = (&item.arrival, &item.source) else {
                continue;
            };
            if from == topic {
                candidates.push((i, *entry));
            } else if !self.logged(from) {
                through.entry(from.as_str()).or_default().push((i, *entry));
            }
        }
        // A retry of a retry: the reference it came through names the
        // entry (a copy there stays a copy). Read per tier topic together,
        // so each stored frame is read and split once, not once per item.
        for (from, items) in through {
            let ids: Vec<u64> = items.iter().map(|(_, e)| *e).collect();
            for ((i, _), raw) in items.into_iter().zip(self.sled.read_many(from, &ids)?) {
                let source = raw
                    .as_deref()
                    .map(RetryRef::parse)
                    .transpose()?
                    .flatten()
                    .filter(|r| &r.source_topic == topic)
                    .map(|r| r.source_entry);
                if let Some(s) = source {
                    candidates.push((i, s));
                }
            }
        }
        if candidates.is_empty() {
            return Ok(None);
        }
        let (first, _) = self.entry_range(topic)?;
        let ids: Vec<u64> = candidates.iter().map(|(_, s)| *s).collect();
        let sources = self.read_many(topic, &ids)?;
        let mut out = mv.clone();
        for ((i, entry), source) in candidates.into_iter().zip(sources) {
            let Some(source) = source.filter(|_| entry >= first) else {
                continue;
            };
            let item = &mut out.items[i];
            let copy = Message::decode(item.payload.as_slice()).map_err(StorageError::from)?;
            let Some(r) = RetryRef::for_copy(&copy, topic, entry) else {
                continue;
            };
            if resolve_message(&r, &source)? == copy {
                item.payload = r.to_bytes();
            }
        }
        Ok(Some(out))
    }

    /// Copy-on-trim: before entries of `topic` below `below` go, every
    /// retry-tier reference to one of them is replaced by the full copy,
    /// and its index entry dropped, durably before the segment files are
    /// deleted (the log deletes them after the next flush). The caller
    /// holds the trim lock.
    pub(super) fn copy_references_below(&self, topic: &str, below: u64) -> Result<()> {
        let mut copied = false;
        for sub in self.sled.list_subscriptions(topic)? {
            let index = self.sled.references_below(sub.id, below)?;
            if index.is_empty() {
                continue;
            }
            let retry = sub.retry_tier();
            for chunk in index.chunks(1024) {
                let settle = self.settle(topic, &retry, chunk, true)?;
                self.sled.settle_references(&retry, sub.id, &settle)?;
                copied = true;
            }
        }
        if copied && crate::util::failpoint_armed("refs.trim.after_copy") {
            self.sled.flush_blocking();
            crate::util::failpoint("refs.trim.after_copy");
        }
        Ok(())
    }

    /// What to do with the indexed references `chunk` of `retry`: those
    /// still references to `topic` get their copy (`copy`) or are kept out
    /// (`!copy`, left alone); the others only lose their index entry.
    fn settle(
        &self,
        topic: &str,
        retry: &str,
        chunk: &[Indexed],
        copy: bool,
    ) -> Result<Vec<Settle>> {
        let targets: Vec<u64> = chunk.iter().map(|i| i.target).collect();
        let raw = self.sled.read_many(retry, &targets)?;
        let mut live = Vec::new();
        let mut out = Vec::new();
        for (indexed, raw) in chunk.iter().zip(raw) {
            let source = indexed.source;
            let r = raw
                .as_deref()
                .map(RetryRef::parse)
                .transpose()?
                .flatten()
                .filter(|r| r.source_topic == topic && r.source_entry == source);
            match r {
                Some(r) if copy => live.push((out.len(), r)),
                Some(_) => continue,
                None => {}
            }
            out.push(Settle {
                indexed: indexed.clone(),
                copy: None,
            });
        }
        let ids: Vec<u64> = live.iter().map(|(_, r)| r.source_entry).collect();
        let sources = self.read_many(topic, &ids)?;
        for ((at, r), source) in live.into_iter().zip(sources) {
            let source = source.ok_or_else(|| gone(&r))?;
            out[at].copy = Some(resolve(&r, &source)?);
        }
        Ok(out)
    }

    /// The lowest entry of `topic` a live reference points to; index
    /// entries whose reference went (its tier entry trimmed or moved on)
    /// are dropped on the way.
    pub(super) fn lowest_live_reference(&self, topic: &str) -> Result<Option<u64>> {
        let mut lowest: Option<u64> = None;
        for sub in self.sled.list_subscriptions(topic)? {
            let mut retry = None;
            while let Some(indexed) = self.sled.lowest_reference_of(sub.id)? {
                let retry = match &retry {
                    Some(r) => r,
                    None => retry.insert(sub.retry_tier()),
                };
                let source = indexed.source;
                let stale = self.settle(topic, retry, &[indexed], false)?;
                if stale.is_empty() {
                    lowest = Some(lowest.map_or(source, |l| l.min(source)));
                    break;
                }
                self.sled.settle_references(retry, sub.id, &stale)?;
            }
        }
        Ok(lowest)
    }
}

/// One indexed reference: its source entry, its tier entry, and the key
/// of the index entry listing it (the engine's own; see
/// `sled_store::refs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexed {
    /// The source entry.
    pub source: u64,
    /// The retry-tier entry.
    pub target: u64,
    /// The index entry listing it.
    pub index_key: Vec<u8>,
}

/// One reference to settle before its source goes.
#[derive(Debug)]
pub struct Settle {
    /// The reference, as the index lists it.
    pub indexed: Indexed,
    /// The full copy to store in place of the reference; `None` when the
    /// tier entry is gone (or no longer a reference) and only the index
    /// entry is left to drop.
    pub copy: Option<Vec<u8>>,
}

fn gone(r: &RetryRef) -> StorageError {
    StorageError::Corrupt(format!(
        "a retry-tier entry refers to {}:{}, which the log no longer holds",
        r.source_topic, r.source_entry
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> Message {
        Message {
            payload: b"hello".to_vec(),
            key: "k".into(),
            properties: [("user".to_owned(), "1".to_owned())].into(),
            publish_time_ms: 7,
            producer_name: "p".into(),
            sequence_id: 3,
            ..Default::default()
        }
    }

    #[test]
    fn a_reference_resolves_to_the_copy_it_stands_for() {
        let mut copy = source();
        copy.properties.insert(props::REAL_TOPIC.into(), "t".into());
        copy.properties
            .insert(props::ORIGIN_MESSAGE_ID.into(), "t:42".into());
        copy.properties
            .insert(props::RECONSUME_TIMES.into(), "2".into());
        copy.properties
            .insert(props::DELAY_TIME.into(), "1000".into());
        copy.deliver_at_ms = 99;
        let r = RetryRef::for_copy(&copy, "t", 42).unwrap();
        let stored = r.to_bytes();
        assert!(is_ref(&stored));
        assert!(stored.len() < copy.encoded_len(), "{stored:?}");
        let back = RetryRef::parse(&stored).unwrap().unwrap();
        assert_eq!(back, r);
        let resolved = resolve(&back, &source().encode_to_vec()).unwrap();
        assert_eq!(Message::decode(resolved.as_slice()).unwrap(), copy);
    }

    #[test]
    fn a_message_is_never_taken_for_a_reference() {
        let bytes = source().encode_to_vec();
        assert!(!is_ref(&bytes));
        assert_eq!(RetryRef::parse(&bytes).unwrap(), None);
        assert!(!is_ref(&Message::default().encode_to_vec()));
        // A damaged reference is corrupt, not a message.
        let mut bad = MAGIC.to_vec();
        bad.push(0xff);
        assert!(matches!(
            RetryRef::parse(&bad),
            Err(StorageError::Corrupt(_))
        ));
    }
}
