//! One segment file: opening it (a scan that checks every record and
//! rebuilds the sparse index), appending a record, and reading records from
//! an offset.
//!
//! The sparse index maps the first entry id of a record to its file offset,
//! one point every [`INDEX_EVERY`] bytes, so a read from any id starts at
//! most that far before the record that holds it. It lives in memory and is
//! rebuilt by the scan at open, which also verifies every record's CRC.

use super::record::{self, FILE_HEADER_LEN, FileHeader, RECORD_HEADER_LEN, RecordHeader};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of records between two points of the sparse index.
pub const INDEX_EVERY: u64 = 4096;

/// A segment file's name for its first entry id.
pub fn file_name(first: u64) -> String {
    format!("{first:020}.seg")
}

/// The first entry id a segment file's name stands for.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// One open segment.
#[derive(Debug)]
pub struct Segment {
    pub header: FileHeader,
    pub path: PathBuf,
    pub file: Arc<File>,
    /// Bytes of the header and the whole records (the file's valid length).
    pub len: u64,
    /// One past the last entry id stored (`header.first` when empty).
    pub next: u64,
    /// The first record's first entry id, if any.
    pub first_entry: Option<u64>,
    /// (first entry id of a record, its offset), ascending.
    index: Vec<(u64, u64)>,
    /// Entries stored.
    pub entries: u64,
    /// The file holds a torn tail past `len`, cut before the next append.
    pub cut_pending: bool,
    /// CRC-32C of the file's first `len` bytes (kept while appending: what
    /// a seal records in the segment's sum file).
    pub crc: u32,
    /// Records whose own CRC the open computed (none when the file was
    /// checked whole against its seal).
    pub records_checked: u64,
}

/// What a walk over a segment's record headers found: its sparse index,
/// first entry, next id and entry count.
pub type Walked = (Vec<(u64, u64)>, Option<u64>, u64, u64);

/// What an open found at the end of a file.
#[derive(Debug)]
pub enum Tail {
    /// Every byte belongs to a whole record.
    Whole,
    /// From `at` on the bytes are no whole record (`file_len` in all): why.
    Torn { at: u64, file_len: u64, why: String },
}

/// A reader at an offset of a shared file (positioned reads: appends and
/// other readers do not move it).
struct At<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = self.end.saturating_sub(self.pos).min(buf.len() as u64) as usize;
        if room == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..room], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl io::Seek for At<'_> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let pos = match to {
            io::SeekFrom::Start(p) => Some(p),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            io::SeekFrom::End(d) => self.end.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::other("seek before the start of a segment"))?;
        Ok(self.pos)
    }
}

/// Reads records from `offset` up to `end` of `file`, in order.
pub struct Records<'a> {
    reader: io::BufReader<At<'a>>,
    pos: u64,
    end: u64,
}

/// The next record, or why there is none.
pub enum Next {
    /// A whole record with a matching checksum, at `offset`.
    Record {
        header: RecordHeader,
        body: Vec<u8>,
        offset: u64,
    },
    /// The end.
    End,
    /// Bytes at `at` that are no whole record.
    Bad { at: u64, why: String },
}

impl<'a> Records<'a> {
    /// For reading records in order (a 64 KiB buffer).
    pub fn new(file: &'a File, offset: u64, end: u64) -> Self {
        Self::with_buffer(file, offset, end, 64 * 1024)
    }

    /// For finding one record ([`Records::next_holding`]): the index
    /// points every [`INDEX_EVERY`] bytes, so a small buffer reads little
    /// more than the record asked for.
    pub fn for_lookup(file: &'a File, offset: u64, end: u64) -> Self {
        Self::with_buffer(file, offset, end, 2 * INDEX_EVERY as usize)
    }

    fn with_buffer(file: &'a File, offset: u64, end: u64, capacity: usize) -> Self {
        Self {
            reader: io::BufReader::with_capacity(
                capacity,
                At {
                    file,
                    pos: offset,
                    end,
                },
            ),
            pos: offset,
            end,
        }
    }

    /// Reads the next record; an I/O error is passed up as such.
    pub fn next_record(&mut self) -> io::Result<Next> {
        if self.pos >= self.end {
            return Ok(Next::End);
        }
        let at = self.pos;
        let mut head = [0u8; RECORD_HEADER_LEN];
        if let Err(e) = self.reader.read_exact(&mut head) {
            return short(e, at, "a record header");
        }
        let Some(header) = RecordHeader::decode(&head) else {
            return Ok(Next::Bad {
                at,
                why: "no record header".into(),
            });
        };
        let mut body = vec![0u8; header.body_len as usize];
        if let Err(e) = self.reader.read_exact(&mut body) {
            return short(e, at, "a record body");
        }
        if !header.matches(&body) {
            return Ok(Next::Bad {
                at,
                why: "record checksum mismatch".into(),
            });
        }
        self.pos += header.len();
        Ok(Next::Record {
            header,
            body,
            offset: at,
        })
    }

    /// The next record holding entry `id` or a later one: records wholly
    /// before `id` are skipped by their headers, their bodies neither read
    /// nor checked (nothing of them is served). The record returned is
    /// checked as [`Records::next_record`] checks it.
    pub fn next_holding(&mut self, id: u64) -> io::Result<Next> {
        loop {
            if self.pos >= self.end {
                return Ok(Next::End);
            }
            let at = self.pos;
            let mut head = [0u8; RECORD_HEADER_LEN];
            if let Err(e) = self.reader.read_exact(&mut head) {
                return short(e, at, "a record header");
            }
            let Some(header) = RecordHeader::decode(&head) else {
                return Ok(Next::Bad {
                    at,
                    why: "no record header".into(),
                });
            };
            if header.next_id() > id {
                // Back to the header: read and checked as a whole.
                self.reader.seek_relative(-(RECORD_HEADER_LEN as i64))?;
                return self.next_record();
            }
            if at + header.len() > self.end {
                return Ok(Next::Bad {
                    at,
                    why: "the file ends inside a record body".into(),
                });
            }
            self.reader.seek_relative(i64::from(header.body_len))?;
            self.pos += header.len();
        }
    }
}

fn short(e: io::Error, at: u64, what: &str) -> io::Result<Next> {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Ok(Next::Bad {
            at,
            why: format!("the file ends inside {what}"),
        })
    } else {
        Err(e)
    }
}

impl Segment {
    /// Creates segment `header.first` in `dir`: the file with its header,
    /// fsynced (the caller fsyncs the directory).
    pub fn create(dir: &Path, header: FileHeader) -> io::Result<Self> {
        let path = dir.join(file_name(header.first));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&path)?;
        crate::util::failpoint("log.roll.before_header");
        let head = header.encode();
        (&file).write_all_compat(&head)?;
        file.sync_all()?;
        Ok(Self {
            header,
            path,
            file: Arc::new(file),
            len: FILE_HEADER_LEN,
            next: header.first,
            first_entry: None,
            index: Vec::new(),
            entries: 0,
            cut_pending: false,
            crc: crc32c::crc32c(&head),
            records_checked: 0,
        })
    }

    /// A sealed segment checked whole against its sum file, from what the
    /// walk over its record headers found.
    pub fn from_walk(
        header: FileHeader,
        path: PathBuf,
        file: Arc<File>,
        (len, crc): (u64, u32),
        (index, first_entry, next, entries): Walked,
    ) -> Self {
        Self {
            header,
            path,
            file,
            len,
            next,
            first_entry,
            index,
            entries,
            cut_pending: false,
            crc,
            records_checked: 0,
        }
    }

    /// Opens and scans a segment file, checking every record; what lies
    /// past the last whole record is reported as the tail (the caller
    /// decides whether it may be cut). Damage before the tail cannot be
    /// told from a tail: a scan stops at the first bad record.
    pub fn open(path: &Path, first: u64, writable: bool) -> Result<(Self, Tail), String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(writable)
            .open(path)
            .map_err(|e| format!("cannot open: {e}"))?;
        let file_len = file
            .metadata()
            .map_err(|e| format!("cannot stat: {e}"))?
            .len();
        let mut head = vec![0u8; FILE_HEADER_LEN as usize];
        let read = file
            .read_at(&mut head, 0)
            .map_err(|e| format!("cannot read: {e}"))?;
        let header = FileHeader::decode(&head[..read])?;
        if header.first != first {
            return Err(format!(
                "its header says it starts at entry {}",
                header.first
            ));
        }
        let mut seg = Self {
            header,
            path: path.to_owned(),
            file: Arc::new(file),
            len: FILE_HEADER_LEN,
            next: header.first,
            first_entry: None,
            index: Vec::new(),
            entries: 0,
            cut_pending: false,
            crc: crc32c::crc32c(&head[..FILE_HEADER_LEN as usize]),
            records_checked: 0,
        };
        let tail = {
            let file = seg.file.clone();
            let mut records = Records::new(&file, FILE_HEADER_LEN, file_len);
            loop {
                match records
                    .next_record()
                    .map_err(|e| format!("cannot read: {e}"))?
                {
                    Next::Record {
                        header,
                        body,
                        offset,
                    } => {
                        if header.first_id < seg.next {
                            return Err(format!(
                                "a record at offset {offset} starts at entry {}, below {}",
                                header.first_id, seg.next
                            ));
                        }
                        seg.records_checked += 1;
                        seg.crc = crc32c::crc32c_append(seg.crc, &header.raw());
                        seg.crc = crc32c::crc32c_append(seg.crc, &body);
                        seg.added(&header, offset);
                    }
                    Next::End => break Tail::Whole,
                    Next::Bad { at, why } => break Tail::Torn { at, file_len, why },
                }
            }
        };
        Ok((seg, tail))
    }

    /// Notes a record written at `offset`.
    fn added(&mut self, header: &RecordHeader, offset: u64) {
        let indexed = self.index.last().map(|(_, o)| *o);
        if indexed.is_none_or(|o| offset - o >= INDEX_EVERY) {
            self.index.push((header.first_id, offset));
        }
        self.first_entry.get_or_insert(header.first_id);
        self.entries += header.count as u64;
        self.next = header.next_id();
        self.len = offset + header.len();
    }

    /// The offset of a whole record (checksum and all) somewhere after
    /// `at`, if there is one: bytes that are no record *followed* by a
    /// record are damage, not a write a crash interrupted.
    pub fn whole_record_after(&self, at: u64, file_len: u64) -> io::Result<Option<u64>> {
        let mut rest = vec![0u8; file_len.saturating_sub(at) as usize];
        self.file.read_exact_at(&mut rest, at)?;
        let magic = record::RECORD_MAGIC.to_le_bytes();
        for i in 1..rest.len().saturating_sub(RECORD_HEADER_LEN) {
            if rest[i..i + 4] != magic {
                continue;
            }
            let head: [u8; RECORD_HEADER_LEN] = rest[i..i + RECORD_HEADER_LEN]
                .try_into()
                .map_err(io::Error::other)?;
            let Some(h) = RecordHeader::decode(&head) else {
                continue;
            };
            let body = rest.get(i + RECORD_HEADER_LEN..i + h.len() as usize);
            if body.is_some_and(|b| h.matches(b)) {
                return Ok(Some(at + i as u64));
            }
        }
        Ok(None)
    }

    /// Cuts the file back to its whole records and fsyncs it.
    pub fn truncate_tail(&self) -> io::Result<()> {
        self.file.set_len(self.len)?;
        self.file.sync_all()
    }

    /// Appends one record (`first_id`, `count` entries). On a failed
    /// write the file is cut back to its previous length, so no partial
    /// record stays in front of the next one.
    pub fn append(&mut self, bytes: &[u8], first_id: u64, count: u32) -> io::Result<()> {
        let offset = self.len;
        let written = if std::env::var_os("RICOCHET_FAILPOINT")
            .is_some_and(|v| v == "log.append.mid_record")
        {
            (&*self.file).write_all_compat(&bytes[..bytes.len() / 2])?;
            crate::util::failpoint("log.append.mid_record");
            Ok(())
        } else {
            (&*self.file).write_all_compat(bytes)
        };
        if let Err(e) = written {
            let _ = self.file.set_len(offset);
            return Err(e);
        }
        let head: [u8; RECORD_HEADER_LEN] = bytes[..RECORD_HEADER_LEN]
            .try_into()
            .map_err(|_| io::Error::other("short record"))?;
        let header = RecordHeader::decode(&head)
            .ok_or_else(|| io::Error::other("record header does not decode"))?;
        debug_assert_eq!((header.first_id, header.count), (first_id, count));
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.added(&header, offset);
        Ok(())
    }

    /// The offset to read from for entries `>= id` (the indexed record at
    /// or before it).
    pub fn offset_for(&self, id: u64) -> u64 {
        match self.index.partition_point(|(first, _)| *first <= id) {
            0 => FILE_HEADER_LEN,
            i => self.index[i - 1].1,
        }
    }

    /// Bytes of records (the file less its header).
    pub fn record_bytes(&self) -> u64 {
        self.len - FILE_HEADER_LEN
    }
}

/// `write_all` on a shared file handle.
trait WriteAll {
    fn write_all_compat(self, bytes: &[u8]) -> io::Result<()>;
}

impl WriteAll for &File {
    fn write_all_compat(mut self, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write as _;
        self.write_all(bytes)
    }
}

/// Decodes a checked record's entries (for readers), borrowing from
/// `body`: a reader copies only the entries it keeps (a batch record can
/// hold thousands while one is asked for).
pub fn entries_of<'a>(header: &RecordHeader, body: &'a [u8]) -> io::Result<Vec<(u64, &'a [u8])>> {
    record::entries(header.first_id, body).map_err(io::Error::other)
}
