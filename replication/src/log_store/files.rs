//! One group's Raft log in append-only segment files: the bytes, the
//! in-memory record index, and what a crash can leave behind.
//!
//! A group's directory holds segment files named by the first log index
//! they may hold (`00000000000000000042.rlog`). Each starts with the
//! storage crate's segment file header and holds records in its format
//! (`ricochet_storage::segments::record`: magic, length, first index,
//! count, CRC-32C, then the entries): one record per appended batch, each
//! entry the CBOR of an openraft entry. A record of one empty entry is a
//! truncation mark: "entries from this index on are gone" (written when a
//! truncation cuts inside a record, so no byte of a kept entry is ever
//! rewritten). The last segment is the active one; a segment rolls once it
//! holds [`FileLog::segment_bytes`].
//!
//! Open scans every record and checks its CRC. Bytes of the last segment
//! that are no whole record, with no whole record after them, are a torn
//! tail (an append the crash interrupted, never reported flushed): cut off
//! with a WARN. A bad record anywhere else, or one followed by a whole
//! record, is damage: the open fails.

use ricochet_storage::segments::record::{
    self, FILE_HEADER_LEN, FileHeader, RECORD_HEADER_LEN, RecordHeader, RecordWriter,
};
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Default size at which a segment rolls.
pub const SEGMENT_BYTES: u64 = 64 << 20;

const SUFFIX: &str = ".rlog";

fn file_name(first: u64) -> String {
    format!("{first:020}{SUFFIX}")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Fsyncs a directory (a file created, renamed or removed in it).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn corrupt(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[derive(Debug)]
struct Seg {
    path: PathBuf,
    file: Arc<File>,
    /// Valid length (header and whole records).
    len: u64,
    seq: u64,
    /// One past the last index stored (the segment's first when empty).
    next: u64,
}

/// Where a record's live entries are.
#[derive(Debug, Clone, Copy)]
struct Rec {
    seg: u64,
    offset: u64,
    len: u64,
    /// One past the last live entry (below the record's own end once a
    /// truncation cut inside it).
    end: u64,
}

/// A record to read: its file, place, and the indexes wanted from it.
#[derive(Debug)]
pub struct ReadPlan {
    file: Arc<File>,
    offset: u64,
    len: u64,
    from: u64,
    to: u64,
}

impl ReadPlan {
    /// Reads the record and returns its entries' bytes in `from..to`.
    pub fn read(&self) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let mut buf = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut buf, self.offset)?;
        let (head, body) = buf.split_at(RECORD_HEADER_LEN);
        let head: &[u8; RECORD_HEADER_LEN] =
            head.try_into().map_err(|_| corrupt("short".into()))?;
        let h = RecordHeader::decode(head)
            .filter(|h| h.matches(body))
            .ok_or_else(|| corrupt(format!("raft log record at {} does not check", self.offset)))?;
        let entries = record::entries(h.first_id, body).map_err(corrupt)?;
        Ok(entries
            .into_iter()
            .filter(|(i, _)| *i >= self.from && *i < self.to)
            .map(|(i, b)| (i, b.to_vec()))
            .collect())
    }
}

/// One group's segment files and record index.
#[derive(Debug)]
pub struct FileLog {
    dir: PathBuf,
    /// A segment rolls once it holds this many bytes.
    pub segment_bytes: u64,
    segments: BTreeMap<u64, Seg>,
    /// Live records by their first index.
    records: BTreeMap<u64, Rec>,
    /// Entries up to this index are purged: never served.
    purged: Option<u64>,
    /// Why an `fsync` of the log failed, once one has: every later write
    /// is refused (after a failed `fsync` the kernel may have dropped the
    /// dirty pages; a later one succeeding proves nothing about them).
    failed: Option<String>,
}

/// What an open found and did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Bytes cut off the last segment's torn tail.
    pub torn_bytes: u64,
}

impl FileLog {
    /// Records that an `fsync` of the log failed: later writes are refused.
    pub fn fail(&mut self, why: &io::Error) {
        if self.failed.is_none() {
            self.failed = Some(why.to_string());
        }
    }

    /// Fails once an `fsync` of the log has failed.
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(io::Error::other(format!(
                "an fsync of the raft log failed earlier ({why}): the log refuses writes \
                 until the broker restarts and recovers it from disk"
            ))),
        }
    }

    /// Opens (creating) the log in `dir`; entries up to `purged` are not
    /// served, and segments holding only such entries are deleted.
    pub fn open(dir: &Path, purged: Option<u64>) -> io::Result<(Self, OpenReport)> {
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            // The group's directory, and `raft-log` if it was new too.
            for d in dir.ancestors().skip(1).take(2) {
                sync_dir(d)?;
            }
        }
        let mut firsts: Vec<(u64, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if let Some(first) = e.file_name().to_str().and_then(parse_name) {
                firsts.push((first, e.path()));
            }
        }
        firsts.sort();
        let mut log = Self {
            dir: dir.to_owned(),
            segment_bytes: SEGMENT_BYTES,
            segments: BTreeMap::new(),
            records: BTreeMap::new(),
            purged: None,
            failed: None,
        };
        let mut report = OpenReport::default();
        let n = firsts.len();
        for (k, (first, path)) in firsts.into_iter().enumerate() {
            report.torn_bytes += log.scan(first, path, k + 1 == n)?;
        }
        if let Some(p) = purged {
            log.purge(p)?;
        }
        Ok((log, report))
    }

    /// Scans one segment into the index; returns the torn bytes cut off.
    fn scan(&mut self, first: u64, path: PathBuf, last: bool) -> io::Result<u64> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let file_len = file.metadata()?.len();
        let mut head = [0u8; FILE_HEADER_LEN as usize];
        let header = match file.read_exact_at(&mut head, 0) {
            Ok(()) => FileHeader::decode(&head),
            Err(e) => Err(e.to_string()),
        };
        let header = match header {
            Ok(h) if h.first == first => h,
            Ok(h) => {
                return Err(corrupt(format!(
                    "{}: header says first index {}, name {first}",
                    path.display(),
                    h.first
                )));
            }
            Err(why) if last => {
                // Created, never written whole: nothing in it was reported.
                tracing::warn!(file = %path.display(), %why, "raft log: removing a segment torn at creation");
                std::fs::remove_file(&path)?;
                sync_dir(&self.dir)?;
                return Ok(file_len);
            }
            Err(why) => return Err(corrupt(format!("{}: {why}", path.display()))),
        };
        let mut seg = Seg {
            path,
            file: Arc::new(file),
            len: FILE_HEADER_LEN,
            seq: header.seq,
            next: first,
        };
        let mut pos = FILE_HEADER_LEN;
        while pos < file_len {
            match read_record(&seg.file, pos, file_len) {
                Ok((h, body)) => {
                    let entries = record::entries(h.first_id, &body).map_err(corrupt)?;
                    if entries.len() == 1 && entries[0].1.is_empty() {
                        self.cut_index(h.first_id);
                        seg.next = seg.next.min(h.first_id).max(first);
                    } else {
                        self.records.insert(
                            h.first_id,
                            Rec {
                                seg: first,
                                offset: pos,
                                len: h.len(),
                                end: h.next_id(),
                            },
                        );
                        seg.next = h.next_id();
                    }
                    pos += h.len();
                }
                Err(why) => {
                    let whole_after = next_whole_record(&seg.file, pos, file_len);
                    if !last || whole_after {
                        return Err(corrupt(format!(
                            "{} at byte {pos}: {why}{}",
                            seg.path.display(),
                            if whole_after {
                                " (a whole record follows)"
                            } else {
                                ""
                            }
                        )));
                    }
                    let torn = file_len - pos;
                    tracing::warn!(
                        file = %seg.path.display(), at = pos, bytes = torn, %why,
                        "raft log: torn tail dropped (an append the crash interrupted; never reported flushed)"
                    );
                    seg.file.set_len(pos)?;
                    seg.file.sync_data()?;
                    seg.len = pos;
                    self.segments.insert(first, seg);
                    return Ok(torn);
                }
            }
            seg.len = pos;
        }
        self.segments.insert(first, seg);
        Ok(0)
    }

    /// Drops index entries from `index` on (in memory).
    fn cut_index(&mut self, index: u64) {
        let _ = self.records.split_off(&index);
        if let Some((_, r)) = self.records.iter_mut().next_back() {
            r.end = r.end.min(index);
        }
    }

    /// One past the last entry held (above the purge point), if any.
    pub fn next_index(&self) -> Option<u64> {
        let end = self.records.values().next_back()?.end;
        match self.purged {
            Some(p) if end <= p + 1 => None,
            _ => Some(end),
        }
    }

    /// Appends one batch (`first`, then consecutive indexes) as one record;
    /// returns the file to fsync for it to be durable (the segment, new or
    /// not, is durable in its directory already).
    pub fn append(&mut self, first: u64, entries: &[Vec<u8>]) -> io::Result<Arc<File>> {
        let mut record = RecordWriter::new(first, entries.iter().map(|e| 4 + e.len()).sum());
        for e in entries {
            record.push_with(|buf| buf.extend_from_slice(e));
        }
        self.append_record(first, record)
    }

    /// [`FileLog::append`] of a record the caller built (the entries
    /// encoded into it in place).
    pub fn append_record(&mut self, first: u64, record: RecordWriter) -> io::Result<Arc<File>> {
        self.check()?;
        if record.count() == 0 || record.has_empty_entry() {
            return Err(io::Error::other("raft log: empty batch or entry"));
        }
        let count = u64::from(record.count());
        let bytes = record.finish();
        let roll = match self.segments.values().next_back() {
            None => true,
            Some(s) if s.next > first => {
                return Err(io::Error::other(format!(
                    "raft log: an append at {first} overlaps entries up to {} (not truncated)",
                    s.next - 1
                )));
            }
            Some(s) => s.len >= self.segment_bytes,
        };
        if roll {
            self.create_segment(first)?;
        }
        let Some((&seg_first, seg)) = self.segments.iter_mut().next_back() else {
            return Err(io::Error::other("raft log: no segment"));
        };
        if let Err(e) = seg.file.write_all_at(&bytes, seg.len) {
            let _ = seg.file.set_len(seg.len);
            return Err(e);
        }
        self.records.insert(
            first,
            Rec {
                seg: seg_first,
                offset: seg.len,
                len: bytes.len() as u64,
                end: first + count,
            },
        );
        seg.len += bytes.len() as u64;
        seg.next = first + count;
        Ok(seg.file.clone())
    }

    /// Creates the segment starting at `first`, durably (the sealed one,
    /// the new file and the directory are fsynced).
    fn create_segment(&mut self, first: u64) -> io::Result<()> {
        let (prev_next, seq) = match self.segments.values().next_back() {
            Some(s) => {
                s.file.sync_data()?;
                (s.next, s.seq + 1)
            }
            None => (0, 0),
        };
        if self.segments.contains_key(&first) {
            // Only an empty segment can start where a new batch does.
            self.remove_segment(first)?;
        }
        let path = self.dir.join(file_name(first));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let header = FileHeader {
            first,
            prev_next,
            created_ms,
            seq,
        };
        file.write_all_at(&header.encode(), 0)?;
        file.sync_all()?;
        sync_dir(&self.dir)?;
        self.segments.insert(
            first,
            Seg {
                path,
                file: Arc::new(file),
                len: FILE_HEADER_LEN,
                seq,
                next: first,
            },
        );
        Ok(())
    }

    fn remove_segment(&mut self, first: u64) -> io::Result<()> {
        if let Some(s) = self.segments.remove(&first) {
            std::fs::remove_file(&s.path)?;
            self.records.retain(|_, r| r.seg != first);
        }
        Ok(())
    }

    /// The active segment's file (what an interval flush syncs).
    pub fn active_file(&self) -> Option<Arc<File>> {
        self.segments.values().next_back().map(|s| s.file.clone())
    }

    /// Removes entries from `index` on, durably: later segments are
    /// deleted (last first, so a crash leaves a prefix), then a truncation
    /// mark is appended and fsynced if the remaining tail still holds
    /// entries at or past `index`.
    pub fn truncate(&mut self, index: u64) -> io::Result<()> {
        self.check()?;
        let later: Vec<u64> = self
            .segments
            .range(index..)
            .map(|(f, _)| *f)
            .rev()
            .collect();
        for first in &later {
            self.remove_segment(*first)?;
        }
        if !later.is_empty() {
            sync_dir(&self.dir)?;
        }
        let Some((&seg_first, seg)) = self.segments.iter_mut().next_back() else {
            self.records.clear();
            return Ok(());
        };
        if seg.next > index {
            let mark = record::encode(index, &[Vec::new()]);
            seg.file.write_all_at(&mark, seg.len)?;
            seg.file.sync_data()?;
            seg.len += mark.len() as u64;
            seg.next = index.max(seg_first);
        }
        self.cut_index(index);
        Ok(())
    }

    /// Forgets entries up to `index` (the caller made the purge point
    /// durable first) and deletes every segment holding only such entries.
    pub fn purge(&mut self, index: u64) -> io::Result<()> {
        self.check()?;
        self.purged = Some(self.purged.map_or(index, |p| p.max(index)));
        let gone: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.next <= index + 1)
            .map(|(f, _)| *f)
            .collect();
        for first in &gone {
            self.remove_segment(*first)?;
        }
        if !gone.is_empty() {
            sync_dir(&self.dir)?;
        }
        self.records.retain(|_, r| r.end > index + 1);
        Ok(())
    }

    /// The records to read for indexes `from..to` (above the purge point).
    pub fn plan(&self, from: u64, to: u64) -> Vec<ReadPlan> {
        let from = match self.purged {
            Some(p) => from.max(p + 1),
            None => from,
        };
        if from >= to {
            return Vec::new();
        }
        let start = self
            .records
            .range(..=from)
            .next_back()
            .map_or(from, |(f, _)| *f);
        self.records
            .range(start..to)
            .filter(|(_, r)| r.end > from)
            .filter_map(|(_, r)| {
                let seg = self.segments.get(&r.seg)?;
                Some(ReadPlan {
                    file: seg.file.clone(),
                    offset: r.offset,
                    len: r.len,
                    from,
                    to: to.min(r.end),
                })
            })
            .collect()
    }

    /// The segment files' count (tests, reports).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// The whole record at `pos`, or why there is none.
fn read_record(file: &File, pos: u64, file_len: u64) -> Result<(RecordHeader, Vec<u8>), String> {
    if file_len - pos < RECORD_HEADER_LEN as u64 {
        return Err("short record header".into());
    }
    let mut head = [0u8; RECORD_HEADER_LEN];
    file.read_exact_at(&mut head, pos)
        .map_err(|e| e.to_string())?;
    let h = RecordHeader::decode(&head).ok_or("no record header")?;
    if pos + h.len() > file_len {
        return Err(format!("record of {} bytes past the end", h.len()));
    }
    let mut body = vec![0u8; h.body_len as usize];
    file.read_exact_at(&mut body, pos + RECORD_HEADER_LEN as u64)
        .map_err(|e| e.to_string())?;
    if !h.matches(&body) {
        return Err("record checksum mismatch".into());
    }
    Ok((h, body))
}

/// Whether a whole record starts somewhere after the bad bytes at `pos`
/// (then they are damage, not a torn tail): every place after `pos`
/// where a record's magic is found is tried.
fn next_whole_record(file: &File, pos: u64, file_len: u64) -> bool {
    let mut rest = vec![0u8; (file_len - pos) as usize];
    if file.read_exact_at(&mut rest, pos).is_err() {
        return false;
    }
    let magic = record::RECORD_MAGIC.to_le_bytes();
    (1..rest.len().saturating_sub(RECORD_HEADER_LEN - 1)).any(|i| {
        if rest[i..i + 4] != magic {
            return false;
        }
        let head: &[u8; RECORD_HEADER_LEN] = match rest[i..i + RECORD_HEADER_LEN].try_into() {
            Ok(h) => h,
            Err(_) => return false,
        };
        RecordHeader::decode(head).is_some_and(|h| {
            rest.get(i + RECORD_HEADER_LEN..i + h.len() as usize)
                .is_some_and(|body| h.matches(body))
        })
    })
}
