//! The whole-file checksum of a sealed segment, and the check at open that
//! uses it.
//!
//! When a segment is sealed (the roll that creates the next one), a sidecar
//! file beside it (`<first>.sum`) records the segment's length and the
//! CRC-32C of every byte of it, header and records alike (kept up to date
//! while appending, so sealing reads nothing back). At open a sealed
//! segment with a sidecar is checked by one pass over the file in large
//! reads: the CRC of the whole file against the recorded one, while the
//! record headers are walked for the sparse index (record bodies are not
//! decoded, nor their own CRCs computed). Any byte changed since the seal
//! changes the file's CRC, so the guarantee is the per-record check's and
//! more (the file header's padding is covered too).
//!
//! Whatever this pass does not accept goes to the per-record check
//! ([`Segment::open`]): so a damaged record is refused with the error it
//! always was (its offset found by that check), a file whose records all
//! check but whose CRC differs is refused as not the file that was sealed,
//! and a segment without a sidecar (sealed by an older broker), or with a
//! sidecar that does not check itself, is checked record by record as
//! before — and gets its sum recorded once that check passed, so the next
//! start checks it whole. The active segment's sidecar, if a crash left
//! one, is never used (the segment may have grown since).

use super::record::{FILE_HEADER_LEN, FileHeader, RECORD_HEADER_LEN, RecordHeader};
use super::segment::{INDEX_EVERY, Segment, Walked};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// First bytes of a sidecar.
const MAGIC: &[u8; 8] = b"RCSUM001";
/// A sidecar's length: magic, segment length u64, file CRC u32, the
/// sidecar's own CRC u32 (over the bytes before it).
const LEN: usize = 24;
/// Bytes read at once by the whole-file pass.
const READ_AT_ONCE: usize = 4 << 20;

#[cfg(test)]
thread_local! {
    /// Tests: the whole-file pass's read size on this thread (small ones
    /// cut record headers across reads).
    pub static READ_SIZE: std::cell::Cell<usize> = const { std::cell::Cell::new(READ_AT_ONCE) };
}

thread_local! {
    /// The whole-file pass's read buffer, kept between the opens of one
    /// thread (a start opens hundreds of sealed segments: a fresh zeroed
    /// buffer of up to [`READ_AT_ONCE`] each was 2.3–5.3 % of a 5M start's
    /// samples, and its fresh pages faulted in); freed by
    /// [`free_read_buffer`] once a log's open ends.
    static BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

#[cfg(test)]
thread_local! {
    /// Tests: read buffers allocated (or grown) on this thread.
    pub static BUFFERS_MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Frees this thread's read buffer (see [`BUFFER`]).
pub fn free_read_buffer() {
    drop(BUFFER.take());
}

fn read_size() -> usize {
    #[cfg(test)]
    return READ_SIZE.with(|s| s.get());
    #[cfg(not(test))]
    READ_AT_ONCE
}

/// A sealed segment's recorded length and CRC-32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sum {
    pub len: u64,
    pub crc: u32,
}

/// The sidecar's name for segment `first`.
pub fn file_name(first: u64) -> String {
    format!("{first:020}.sum")
}

/// The first entry id a sidecar's name stands for.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".sum")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The sidecar path of the segment at `segment_path`.
pub fn path_of(segment_path: &Path) -> PathBuf {
    segment_path.with_extension("sum")
}

impl Sum {
    fn encode(&self) -> [u8; LEN] {
        let mut out = [0u8; LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..20].copy_from_slice(&self.crc.to_le_bytes());
        let own = crc32c::crc32c(&out[..20]);
        out[20..24].copy_from_slice(&own.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != LEN || &bytes[..8] != MAGIC {
            return None;
        }
        let own = u32::from_le_bytes(bytes[20..24].try_into().ok()?);
        if crc32c::crc32c(&bytes[..20]) != own {
            return None;
        }
        Some(Self {
            len: u64::from_le_bytes(bytes[8..16].try_into().ok()?),
            crc: u32::from_le_bytes(bytes[16..20].try_into().ok()?),
        })
    }
}

/// Writes `seg`'s sidecar durably (the file fsynced, renamed into place,
/// the directory fsynced). The caller has fsynced the segment.
pub fn write(dir: &Path, seg: &Segment) -> std::io::Result<()> {
    let sum = Sum {
        len: seg.len,
        crc: seg.crc,
    };
    crate::sled_store::write_durably(dir, &file_name(seg.header.first), &sum.encode())
}

/// Records the sum of a sealed segment that has none (sealed by an older
/// broker), right after every record of it checked at open: so the next
/// start checks it whole. Not fsynced (a sum lost or torn by a crash does
/// not check itself, and the segment is checked record by record again);
/// a failure is logged and changes nothing else.
pub fn record_checked(seg: &Segment) {
    use std::io::Write as _;
    let path = path_of(&seg.path);
    let tmp = path.with_extension("sum.tmp");
    let sum = Sum {
        len: seg.len,
        crc: seg.crc,
    };
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&sum.encode()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        tracing::warn!(
            path = %path.display(),
            error = %e,
            "could not record a checked sealed segment's sum (checked record by record again at the next start)"
        );
    }
}

/// The sidecar of the segment at `segment_path`: `Ok(None)` when there is
/// none or it does not check itself (the segment is then checked record by
/// record, as one sealed by an older broker).
pub fn read(segment_path: &Path) -> std::io::Result<Option<Sum>> {
    let path = path_of(segment_path);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let sum = Sum::decode(&bytes);
            if sum.is_none() {
                tracing::warn!(
                    path = %path.display(),
                    "a sealed segment's checksum file does not check itself: the segment is checked record by record"
                );
            }
            Ok(sum)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why the whole-file pass did not accept a segment.
#[derive(Debug)]
pub enum Refused {
    /// The file's length or CRC is not the recorded one.
    Mismatch(String),
    /// The CRC matched but the records did not walk (not expected: what
    /// the per-record check says about it stands).
    Walk(String),
}

/// Opens sealed segment `first` at `path` by one pass over the whole file
/// against `sum` (see the module's documentation). A refusal is for the
/// caller to hand to the per-record check.
pub fn open(path: &Path, first: u64, writable: bool, sum: Sum) -> Result<Segment, Refused> {
    let mut buf = BUFFER.take();
    let opened = open_with(path, first, writable, sum, &mut buf);
    BUFFER.set(buf);
    opened
}

/// [`open`] reading through `buf` (grown as needed, never zeroed again).
fn open_with(
    path: &Path,
    first: u64,
    writable: bool,
    sum: Sum,
    buf: &mut Vec<u8>,
) -> Result<Segment, Refused> {
    let io = |e: std::io::Error| Refused::Walk(format!("cannot read: {e}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(writable)
        .open(path)
        .map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    if file_len != sum.len {
        return Err(Refused::Mismatch(format!(
            "{file_len} bytes where {} were sealed",
            sum.len
        )));
    }
    let size = read_size().min(file_len as usize).max(1);
    if buf.len() < size {
        #[cfg(test)]
        BUFFERS_MADE.set(BUFFERS_MADE.get() + 1);
        buf.resize(size, 0);
    }
    let buf = &mut buf[..size];
    let mut crc = 0u32;
    // The file header, once read.
    let mut header: Option<FileHeader> = None;
    let mut head = [0u8; FILE_HEADER_LEN as usize];
    // The offset of the next record header, and the part of it read so far
    // when it straddles two reads.
    let mut next_at = FILE_HEADER_LEN;
    let mut carry: Vec<u8> = Vec::with_capacity(RECORD_HEADER_LEN);
    let mut walk = Walk::new(first);
    let mut pos = 0u64;
    while pos < file_len {
        let want = buf.len().min((file_len - pos) as usize);
        let chunk = &mut buf[..want];
        file.read_exact_at(chunk, pos).map_err(io)?;
        crc = crc32c::crc32c_append(crc, chunk);
        let end = pos + want as u64;
        // The file header, from the first read or the first few.
        if header.is_none() && pos < FILE_HEADER_LEN {
            let upto = (FILE_HEADER_LEN.min(end) - pos) as usize;
            head[pos as usize..pos as usize + upto].copy_from_slice(&chunk[..upto]);
        }
        if header.is_none() && end >= FILE_HEADER_LEN {
            let h = FileHeader::decode(&head).map_err(Refused::Walk)?;
            if h.first != first {
                return Err(Refused::Walk(format!(
                    "its header says it starts at entry {}",
                    h.first
                )));
            }
            header = Some(h);
        }
        // Record headers wholly or partly in this read.
        while next_at < end {
            let from = (next_at.max(pos) - pos) as usize;
            let need = RECORD_HEADER_LEN - carry.len();
            let have = (want - from).min(need);
            carry.extend_from_slice(&chunk[from..from + have]);
            if carry.len() < RECORD_HEADER_LEN {
                break; // the rest is in the next read
            }
            let bytes: [u8; RECORD_HEADER_LEN] = carry[..]
                .try_into()
                .map_err(|_| Refused::Walk("short record header".into()))?;
            carry.clear();
            let h = RecordHeader::decode(&bytes)
                .ok_or_else(|| Refused::Walk(format!("no record header at {next_at}")))?;
            walk.add(&h, next_at)?;
            next_at += h.len();
        }
        pos = end;
    }
    if crc != sum.crc {
        return Err(Refused::Mismatch(format!(
            "CRC-32C {crc:08x} over its {file_len} bytes where {:08x} was recorded",
            sum.crc
        )));
    }
    if next_at != file_len || !carry.is_empty() {
        return Err(Refused::Walk(format!(
            "its records end at {next_at}, not at its end ({file_len})"
        )));
    }
    let header = header.ok_or_else(|| Refused::Walk("no header".into()))?;
    Ok(Segment::from_walk(
        header,
        path.to_owned(),
        Arc::new(file),
        (file_len, crc),
        walk.into_parts(),
    ))
}

/// What the walk over record headers gathers.
#[derive(Debug)]
struct Walk {
    index: Vec<(u64, u64)>,
    first_entry: Option<u64>,
    next: u64,
    entries: u64,
}

impl Walk {
    fn new(first: u64) -> Self {
        Self {
            index: Vec::new(),
            first_entry: None,
            next: first,
            entries: 0,
        }
    }

    fn add(&mut self, h: &RecordHeader, offset: u64) -> Result<(), Refused> {
        if h.first_id < self.next {
            return Err(Refused::Walk(format!(
                "a record at offset {offset} starts at entry {}, below {}",
                h.first_id, self.next
            )));
        }
        let indexed = self.index.last().map(|(_, o)| *o);
        if indexed.is_none_or(|o| offset - o >= INDEX_EVERY) {
            self.index.push((h.first_id, offset));
        }
        self.first_entry.get_or_insert(h.first_id);
        self.entries += h.count as u64;
        self.next = h.next_id();
        Ok(())
    }

    fn into_parts(self) -> Walked {
        (self.index, self.first_entry, self.next, self.entries)
    }
}
