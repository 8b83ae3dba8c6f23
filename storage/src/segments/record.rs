//! The bytes of a segment file: its header and its records.
//!
//! A segment file starts with a [`FileHeader`] (magic, first entry id, the
//! id the previous segment ended at, creation time, its number in the
//! topic's log, CRC-32C), then holds
//! records back to back. A record is one producer batch, stored whole:
//!
//! ```text
//! magic u32 | body_len u32 | first_id u64 | count u32 | crc32c u32 | body
//! body = count × (len u32 | entry bytes)
//! ```
//!
//! all little-endian, the CRC over the first four header fields and the
//! body. A record either decodes whole with a matching CRC or not at all,
//! which is what makes a batch all-or-nothing on disk and lets a torn tail
//! be told apart from the records before it.

/// First bytes of every segment file.
pub const FILE_MAGIC: &[u8; 8] = b"RCSEG001";
/// Length of the file header.
pub const FILE_HEADER_LEN: u64 = 48;
/// First word of every record.
pub const RECORD_MAGIC: u32 = 0x5243_5242; // "RCRB"
/// Length of a record's header.
pub const RECORD_HEADER_LEN: usize = 24;
/// The longest record body accepted when decoding (a batch is far smaller:
/// the broker caps messages at a few MiB and batches at their sum).
const MAX_BODY: u32 = 1 << 30;

/// A segment file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// The first entry id the segment may hold (its file name).
    pub first: u64,
    /// The id the previous segment of the topic ended at when this one was
    /// created (0 for a topic's first): a deleted segment in the middle
    /// of a log breaks this chain.
    pub prev_next: u64,
    /// When the segment was created, ms since the epoch (for the age roll).
    pub created_ms: u64,
    /// The segment's number in its topic's log, above the previous one's:
    /// its plus one, from 0, or for a log converted from sled trees the
    /// tree's number (what the manifest records).
    pub seq: u64,
}

impl FileHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; FILE_HEADER_LEN as usize] {
        let mut out = [0u8; FILE_HEADER_LEN as usize];
        out[..8].copy_from_slice(FILE_MAGIC);
        out[8..16].copy_from_slice(&self.first.to_le_bytes());
        out[16..24].copy_from_slice(&self.prev_next.to_le_bytes());
        out[24..32].copy_from_slice(&self.created_ms.to_le_bytes());
        out[32..40].copy_from_slice(&self.seq.to_le_bytes());
        let crc = crc32c::crc32c(&out[..40]);
        out[40..44].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses a header; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() < FILE_HEADER_LEN as usize {
            return Err(format!("header of {} bytes (short)", bytes.len()));
        }
        if &bytes[..8] != FILE_MAGIC {
            return Err("not a ricochet segment file".into());
        }
        let crc = u32::from_le_bytes(word(&bytes[40..44]));
        if crc32c::crc32c(&bytes[..40]) != crc {
            return Err("header checksum mismatch".into());
        }
        Ok(Self {
            first: u64::from_le_bytes(long(&bytes[8..16])),
            prev_next: u64::from_le_bytes(long(&bytes[16..24])),
            created_ms: u64::from_le_bytes(long(&bytes[24..32])),
            seq: u64::from_le_bytes(long(&bytes[32..40])),
        })
    }
}

fn word(b: &[u8]) -> [u8; 4] {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[..4]);
    w
}

fn long(b: &[u8]) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    w
}

/// One batch's record, encoded.
pub fn encode<E: AsRef<[u8]>>(first_id: u64, entries: &[E]) -> Vec<u8> {
    let body_len: usize = entries.iter().map(|e| 4 + e.as_ref().len()).sum();
    let mut out = RecordWriter::new(first_id, body_len);
    for e in entries {
        out.push_with(|buf| buf.extend_from_slice(e.as_ref()));
    }
    out.finish()
}

/// A record built entry by entry in one buffer: each entry is written in
/// place (its length patched in after it), so an entry encoded by the
/// caller (the Raft log store's CBOR) is not first built in a buffer of
/// its own and copied. The same bytes as [`encode`] of those entries.
#[derive(Debug)]
pub struct RecordWriter {
    out: Vec<u8>,
    count: u32,
    empty_entry: bool,
}

impl RecordWriter {
    /// A record of the batch at `first_id`, its buffer made for a body of
    /// about `body_len` bytes.
    pub fn new(first_id: u64, body_len: usize) -> Self {
        let mut out = Vec::with_capacity(RECORD_HEADER_LEN + body_len);
        out.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&first_id.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&[0u8; 4]);
        Self {
            out,
            count: 0,
            empty_entry: false,
        }
    }

    /// Adds the entry `write` appends to the buffer it is given.
    pub fn push_with<T>(&mut self, write: impl FnOnce(&mut Vec<u8>) -> T) -> T {
        let at = self.out.len();
        self.out.extend_from_slice(&[0u8; 4]);
        let r = write(&mut self.out);
        let len = self.out.len() - at - 4;
        self.empty_entry |= len == 0;
        self.out[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.count += 1;
        r
    }

    /// Entries added so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The body's bytes so far (entries with their lengths).
    pub fn byte_len(&self) -> usize {
        self.out.len() - RECORD_HEADER_LEN
    }

    /// Whether an entry added was empty.
    pub fn has_empty_entry(&self) -> bool {
        self.empty_entry
    }

    /// The record's bytes (header completed, CRC computed).
    pub fn finish(mut self) -> Vec<u8> {
        let body_len = (self.out.len() - RECORD_HEADER_LEN) as u32;
        self.out[4..8].copy_from_slice(&body_len.to_le_bytes());
        self.out[16..20].copy_from_slice(&self.count.to_le_bytes());
        let crc = checksum(&self.out[..20], &self.out[RECORD_HEADER_LEN..]);
        self.out[20..24].copy_from_slice(&crc.to_le_bytes());
        self.out
    }
}

fn checksum(head: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), body)
}

/// A record's header, parsed but not yet checked against its body.
#[derive(Debug, Clone, Copy)]
pub struct RecordHeader {
    /// First entry id of the batch.
    pub first_id: u64,
    /// Entries in the batch.
    pub count: u32,
    /// Length of the body that follows the header.
    pub body_len: u32,
    crc: u32,
    head: [u8; 20],
}

impl RecordHeader {
    /// Parses a header; `None` when it is not one (zeros, garbage, a torn
    /// write).
    pub fn decode(bytes: &[u8; RECORD_HEADER_LEN]) -> Option<Self> {
        if u32::from_le_bytes(word(&bytes[..4])) != RECORD_MAGIC {
            return None;
        }
        let body_len = u32::from_le_bytes(word(&bytes[4..8]));
        let count = u32::from_le_bytes(word(&bytes[16..20]));
        if body_len > MAX_BODY || count == 0 || (count as u64) * 4 > body_len as u64 {
            return None;
        }
        let mut head = [0u8; 20];
        head.copy_from_slice(&bytes[..20]);
        Some(Self {
            first_id: u64::from_le_bytes(long(&bytes[8..16])),
            count,
            body_len,
            crc: u32::from_le_bytes(word(&bytes[20..24])),
            head,
        })
    }

    /// One past the batch's last entry id.
    pub fn next_id(&self) -> u64 {
        self.first_id.saturating_add(self.count as u64)
    }

    /// The record's length on disk.
    // Never empty (a header at least): an `is_empty` would always be false.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + self.body_len as u64
    }

    /// The header's bytes as stored.
    pub fn raw(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut out = [0u8; RECORD_HEADER_LEN];
        out[..20].copy_from_slice(&self.head);
        out[20..].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    /// Whether `body` is this record's body, whole.
    pub fn matches(&self, body: &[u8]) -> bool {
        body.len() == self.body_len as usize && checksum(&self.head, body) == self.crc
    }
}

/// The entries of a checked record body, with their ids; `Err` when the
/// lengths inside do not add up (which a matching CRC makes a bug or a
/// forged file).
pub fn entries(first_id: u64, body: &[u8]) -> Result<Vec<(u64, &[u8])>, String> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut id = first_id;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err("record body ends inside an entry length".into());
        }
        let len = u32::from_le_bytes(word(rest)) as usize;
        let Some(entry) = rest.get(4..4 + len) else {
            return Err("record body ends inside an entry".into());
        };
        out.push((id, entry));
        id += 1;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_decodes_whole_or_not_at_all() {
        let entries_in = vec![b"one".to_vec(), Vec::new(), vec![7u8; 300]];
        let rec = encode(42, &entries_in);
        let head: [u8; RECORD_HEADER_LEN] = rec[..RECORD_HEADER_LEN].try_into().unwrap();
        let h = RecordHeader::decode(&head).unwrap();
        assert_eq!((h.first_id, h.count, h.next_id()), (42, 3, 45));
        assert_eq!(h.len(), rec.len() as u64);
        let body = &rec[RECORD_HEADER_LEN..];
        assert!(h.matches(body));
        let got = entries(42, body).unwrap();
        assert_eq!(got[2], (44, &entries_in[2][..]));
        // A flipped bit anywhere in the body, or a short body, fails.
        let mut bad = body.to_vec();
        bad[10] ^= 1;
        assert!(!h.matches(&bad));
        assert!(!h.matches(&body[..body.len() - 1]));
        // Zeros are no record.
        assert!(RecordHeader::decode(&[0u8; RECORD_HEADER_LEN]).is_none());
    }

    /// A record built entry by entry, each written in pieces into the
    /// writer's buffer, is the bytes `encode` writes for those entries,
    /// whatever size it was made for.
    #[test]
    fn a_record_written_in_place_is_the_encoded_one() {
        let entries_in = vec![vec![1u8; 5], Vec::new(), vec![9u8; 70_000], b"x".to_vec()];
        for size in [0, 10, 100_000] {
            let mut w = RecordWriter::new(7, size);
            for e in &entries_in {
                let (a, b) = e.split_at(e.len() / 2);
                w.push_with(|buf| {
                    buf.extend_from_slice(a);
                    buf.extend_from_slice(b);
                });
            }
            assert_eq!((w.count(), w.has_empty_entry()), (4, true));
            assert_eq!(w.finish(), encode(7, &entries_in));
        }
        // The layout of the module's doc, built here by hand.
        let mut body = Vec::new();
        for e in &entries_in {
            body.extend_from_slice(&(e.len() as u32).to_le_bytes());
            body.extend_from_slice(e);
        }
        let mut head = Vec::new();
        head.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        head.extend_from_slice(&(body.len() as u32).to_le_bytes());
        head.extend_from_slice(&7u64.to_le_bytes());
        head.extend_from_slice(&4u32.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head), &body);
        head.extend_from_slice(&crc.to_le_bytes());
        head.extend_from_slice(&body);
        assert_eq!(encode(7, &entries_in), head);
        let mut w = RecordWriter::new(0, 0);
        w.push_with(|buf| buf.push(1));
        assert!(!w.has_empty_entry());
    }

    #[test]
    fn a_file_header_checks_itself() {
        let h = FileHeader {
            first: 5,
            prev_next: 3,
            created_ms: 99,
            seq: 2,
        };
        let mut bytes = h.encode();
        assert_eq!(FileHeader::decode(&bytes).unwrap(), h);
        bytes[9] ^= 4;
        assert!(FileHeader::decode(&bytes).is_err());
        assert!(FileHeader::decode(&bytes[..10]).is_err());
    }
}
