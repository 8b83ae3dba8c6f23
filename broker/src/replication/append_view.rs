//! A replicated `Append` command read in place: [`AppendView::parse`]
//! walks the CBOR of a [`PartitionCommand::Append`] and returns its
//! fields with the entries as slices of the command's bytes, where the
//! derived decoding copies each entry into a buffer of its own (through
//! ciborium's scratch buffer) only for the applier to copy it again into
//! the segment record. Every replica applies every publish batch, so that
//! per-entry allocation and copy was a tenth of a follower's CPU in the R3
//! publish bench (`docs/src/replication-history-throughput.md`, "Session
//! 19").
//!
//! Nothing about the format changes: the view reads exactly what
//! `AppendRef` and the derived `AppendBatch` write (a one-entry map
//! `{"Append": {"topic", "first_id", "entries", "producer"}}` with
//! definite lengths), in any field order. Anything else — another
//! command, indefinite lengths, tags, an unknown, missing or repeated
//! field, bytes left over — is not a view (`None`), and the caller decodes
//! the command as before, so the view never reads a command differently
//! from the derived decoding.
//!
//! [`sequence`] reads a `PartitionCommand::Sequence` (commands the
//! leader coalesced into one entry) the same way: each command as a slice,
//! which is then applied as if it were an entry of its own (an `Append`
//! inside through [`AppendView::parse`] again).
//!
//! [`PartitionCommand::Append`]: super::PartitionCommand::Append

/// An `Append` command's fields, borrowed from its encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AppendView<'a> {
    /// The topic (the partition or one of its tiers).
    pub topic: &'a str,
    /// The id of the first entry.
    pub first_id: u64,
    /// The encoded entries.
    pub entries: Vec<&'a [u8]>,
    /// The producer and its last sequence id in the batch, if any.
    pub producer: Option<(&'a str, u64)>,
}

/// A CBOR item's head (RFC 8949, section 3), the kinds an `Append` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    Uint(u64),
    Bytes(usize),
    Text(usize),
    Array(usize),
    Map(usize),
    Null,
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.buf.get(self.at..end)?;
        self.at = end;
        Some(out)
    }

    /// The next head; `None` for anything else (indefinite lengths, tags,
    /// negative integers, floats, other simple values) or too few bytes.
    fn head(&mut self) -> Option<Head> {
        let first = *self.take(1)?.first()?;
        let (major, info) = (first >> 5, first & 0x1f);
        if major == 7 {
            return (info == 22).then_some(Head::Null);
        }
        let arg = match info {
            0..=23 => u64::from(info),
            24 => u64::from(self.take(1)?[0]),
            25 => u64::from(u16::from_be_bytes(self.take(2)?.try_into().ok()?)),
            26 => u64::from(u32::from_be_bytes(self.take(4)?.try_into().ok()?)),
            27 => u64::from_be_bytes(self.take(8)?.try_into().ok()?),
            _ => return None,
        };
        let len = || usize::try_from(arg).ok();
        match major {
            0 => Some(Head::Uint(arg)),
            2 => Some(Head::Bytes(len()?)),
            3 => Some(Head::Text(len()?)),
            4 => Some(Head::Array(len()?)),
            5 => Some(Head::Map(len()?)),
            _ => None,
        }
    }

    fn text(&mut self) -> Option<&'a str> {
        match self.head()? {
            Head::Text(n) => std::str::from_utf8(self.take(n)?).ok(),
            _ => None,
        }
    }

    /// A cursor at the start of `buf`, past the head of a one-variant map
    /// whose variant is `name` (serde's encoding of an enum variant);
    /// `None` when `buf` does not start so.
    fn variant(buf: &'a [u8], name: &str) -> Option<Self> {
        let mut c = Cursor { buf, at: 0 };
        (c.head()? == Head::Map(1) && c.text()? == name).then_some(c)
    }

    /// An array of byte strings, as slices of the buffer.
    fn byte_strings(&mut self) -> Option<Vec<&'a [u8]>> {
        let Head::Array(n) = self.head()? else {
            return None;
        };
        // Each one takes at least its head's byte: a count beyond what is
        // left is not believed.
        let mut list = Vec::with_capacity(n.min(self.buf.len() - self.at));
        for _ in 0..n {
            let Head::Bytes(len) = self.head()? else {
                return None;
            };
            list.push(self.take(len)?);
        }
        Some(list)
    }

    fn uint(&mut self) -> Option<u64> {
        match self.head()? {
            Head::Uint(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> AppendView<'a> {
    /// The view of a decoded command's batch.
    pub fn of(batch: &'a super::AppendBatch) -> Self {
        Self {
            topic: &batch.topic,
            first_id: batch.first_id,
            entries: batch.entries.iter().map(|e| e.as_slice()).collect(),
            producer: batch.producer.as_ref().map(|(p, s)| (p.as_str(), *s)),
        }
    }

    /// The `Append` command encoded in `command`, read in place; `None`
    /// when the bytes are not one in the form the broker writes (decode
    /// them as a `PartitionCommand` then).
    pub fn parse(command: &'a [u8]) -> Option<Self> {
        let mut c = Cursor::variant(command, "Append")?;
        let Head::Map(fields) = c.head()? else {
            return None;
        };
        if fields != 4 {
            return None;
        }
        let (mut topic, mut first_id, mut entries, mut producer) = (None, None, None, None);
        for _ in 0..fields {
            match c.text()? {
                "topic" if topic.is_none() => topic = Some(c.text()?),
                "first_id" if first_id.is_none() => first_id = Some(c.uint()?),
                "entries" if entries.is_none() => entries = Some(c.byte_strings()?),
                "producer" if producer.is_none() => {
                    producer = Some(match c.head()? {
                        Head::Null => None,
                        Head::Array(2) => Some((c.text()?, c.uint()?)),
                        _ => return None,
                    });
                }
                _ => return None,
            }
        }
        if c.at != command.len() {
            return None;
        }
        Some(Self {
            topic: topic?,
            first_id: first_id?,
            entries: entries?,
            producer: producer?,
        })
    }
}

/// The commands of a [`PartitionCommand::Sequence`] encoded in `command`
/// (`{"Sequence": [bytes, ...]}` with definite lengths, nothing left
/// over), as slices of its bytes; `None` when it is not one in that form
/// (decode it as a `PartitionCommand` then).
///
/// [`PartitionCommand::Sequence`]: super::PartitionCommand::Sequence
pub(crate) fn sequence(command: &[u8]) -> Option<Vec<&[u8]>> {
    let mut c = Cursor::variant(command, "Sequence")?;
    let list = c.byte_strings()?;
    (c.at == command.len()).then_some(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::{AppendBatch, AppendRef, PartitionCommand};
    use ricochet_replication::{decode, encode};
    use serde::Serialize;

    fn owned(view: &AppendView<'_>) -> AppendBatch {
        AppendBatch {
            topic: view.topic.to_owned(),
            first_id: view.first_id,
            entries: view
                .entries
                .iter()
                .map(|e| serde_bytes::ByteBuf::from(e.to_vec()))
                .collect(),
            producer: view.producer.map(|(p, s)| (p.to_owned(), s)),
        }
    }

    fn decoded(bytes: &[u8]) -> AppendBatch {
        match decode::<PartitionCommand>(bytes).expect("decodes") {
            PartitionCommand::Append(b) => b,
            other => panic!("not an append: {other:?}"),
        }
    }

    fn same(a: &AppendBatch, b: &AppendBatch) {
        assert_eq!(
            (&a.topic, a.first_id, &a.entries, &a.producer),
            (&b.topic, b.first_id, &b.entries, &b.producer)
        );
    }

    /// Entries of every length class of a CBOR head (immediate, 1, 2 and
    /// 4 byte lengths), ids and sequences likewise, with and without a
    /// producer, written both by the owned command (what earlier brokers
    /// wrote) and by `AppendRef`: the view reads what the derived decoding
    /// reads.
    #[test]
    fn the_view_reads_what_the_derived_decoding_reads() {
        let lens = [0usize, 1, 23, 24, 100, 255, 256, 65_535, 65_536, 70_000];
        let entries: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(i, n)| (0..*n).map(|k| (k * 7 + i) as u8).collect())
            .collect();
        for (first_id, producer) in [
            (0u64, None),
            (23, Some(("p", 24u64))),
            (1 << 20, Some(("producer-é", u64::MAX))),
            (u64::MAX - 5, Some(("", 0))),
        ] {
            let topic = "persistent://t/ns/topic-partition-3";
            let batch = AppendBatch {
                topic: topic.to_owned(),
                first_id,
                entries: entries
                    .iter()
                    .map(|e| serde_bytes::ByteBuf::from(e.clone()))
                    .collect(),
                producer: producer.map(|(p, s)| (p.to_owned(), s)),
            };
            let old = encode(&PartitionCommand::Append(batch.clone())).unwrap();
            let new = encode(&AppendRef {
                topic,
                first_id,
                entries: &entries,
                producer,
            })
            .unwrap();
            for bytes in [&old, &new] {
                let view = AppendView::parse(bytes).expect("a view");
                same(&owned(&view), &decoded(bytes));
                same(&owned(&view), &batch);
            }
        }
    }

    /// The fields in another order are read as the derived decoding reads
    /// them.
    #[test]
    fn fields_in_any_order() {
        #[derive(Serialize)]
        enum Shuffled {
            Append {
                producer: Option<(String, u64)>,
                entries: Vec<serde_bytes::ByteBuf>,
                first_id: u64,
                topic: String,
            },
        }
        let bytes = encode(&Shuffled::Append {
            producer: Some(("p".into(), 9)),
            entries: vec![serde_bytes::ByteBuf::from(vec![1, 2, 3])],
            first_id: 40,
            topic: "t".into(),
        })
        .unwrap();
        let view = AppendView::parse(&bytes).expect("a view");
        same(&owned(&view), &decoded(&bytes));
        assert_eq!(view.entries, vec![&[1u8, 2, 3][..]]);
    }

    /// Whatever is not an `Append` in the form written is no view: other
    /// commands, a missing or unknown field, every truncation, bytes left
    /// over, entries in an indefinite-length array.
    #[test]
    fn anything_else_is_no_view() {
        let other = encode(&PartitionCommand::DeleteTopic("t".into())).unwrap();
        assert_eq!(AppendView::parse(&other), None);
        #[derive(Serialize)]
        enum Partial {
            Append { topic: String, first_id: u64 },
        }
        let partial = encode(&Partial::Append {
            topic: "t".into(),
            first_id: 1,
        })
        .unwrap();
        assert_eq!(AppendView::parse(&partial), None);
        #[derive(Serialize)]
        enum Extra {
            Append {
                topic: String,
                first_id: u64,
                entries: Vec<serde_bytes::ByteBuf>,
                later: u8,
            },
        }
        let extra = encode(&Extra::Append {
            topic: "t".into(),
            first_id: 1,
            entries: vec![],
            later: 1,
        })
        .unwrap();
        assert_eq!(AppendView::parse(&extra), None);

        let entries = vec![vec![5u8; 30], vec![6u8; 300]];
        let good = encode(&AppendRef {
            topic: "t",
            first_id: 7,
            entries: &entries,
            producer: Some(("p", 3)),
        })
        .unwrap();
        assert!(AppendView::parse(&good).is_some());
        for cut in 0..good.len() {
            assert_eq!(AppendView::parse(&good[..cut]), None, "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(AppendView::parse(&longer), None);

        // The entries' array as an indefinite-length one (0x9f .. 0xff),
        // which ciborium reads: no view, so the derived decoding reads it.
        let at = good
            .windows(8)
            .position(|w| w == b"entries\x82")
            .expect("the entries' array")
            + 7;
        let mut indefinite = good[..at].to_vec();
        indefinite.push(0x9f);
        let rest = &good[at + 1..];
        let producer_key = rest
            .windows(9)
            .position(|w| w == b"\x68producer")
            .expect("the producer's key");
        indefinite.extend_from_slice(&rest[..producer_key]);
        indefinite.push(0xff);
        indefinite.extend_from_slice(&rest[producer_key..]);
        assert_eq!(AppendView::parse(&indefinite), None);
        same(&decoded(&indefinite), &decoded(&good));
    }
}
