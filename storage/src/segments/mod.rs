//! The segment-file log: ordinary topics' entries in append-only files.
//!
//! Layout: `<data_dir>/log/<topic>/` (the name percent-encoded) holds the
//! topic's segment files, each named by the first entry id it may hold
//! (`00000000000000000042.seg`), and a `start` file naming the first
//! segment kept (written durably before retention deletes older ones, so a
//! deleted first segment is told apart from a trimmed one). A record is one
//! producer batch with a CRC-32C ([`record`]); the last segment is the
//! active one, every other one is sealed: fsynced when the next is created
//! and never written again, so it can be read (shipped, offloaded) as a
//! whole file. A segment rolls when a batch starts in the next block of
//! `segment_entries` ids, when it holds `segment_max_bytes`, or when it is
//! `segment_max_age` old.
//!
//! Durability: writes go to the page cache; [`SegmentLog::sync`] fsyncs
//! every file written since the last sync (the broker's flusher calls it
//! with sled's flush, one round for all writers). Creating a segment
//! fsyncs the sealed one, the new file and the directory at once.
//!
//! Open scans every file: a torn or CRC-failing tail of a topic's last
//! segment is reported and never served, and cut off before the next
//! append (a write the crash interrupted, never acknowledged; bytes that
//! are no record followed by a whole record are damage, refused); any other bad record, a broken chain of segments or a
//! missing first segment refuses the store ([`StorageError::Corrupt`]).

/// The record and file-header format (public: the Raft log of
/// `ricochet-replication` writes the same frames).
pub mod record;
mod seal;
pub(crate) mod sealed;
pub(crate) mod segment;
mod trims;
pub(crate) mod upgrade;

pub use seal::SegmentInfo;
use trims::PendingTrim;
pub use trims::TrimMark;

use super::{StorageError, StorageResult as Result};
use record::FileHeader;
use segment::{Next, Records, Segment, Tail};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The log's directory under the data directory.
pub const DIR_NAME: &str = "log";
/// The file naming a topic's first kept segment.
const START_FILE: &str = "start";
/// Suffix of a topic directory being deleted.
const DELETED: &str = "~deleted";

/// When segments roll.
#[derive(Debug, Clone, Copy)]
pub struct LogSettings {
    /// A batch starting in a later block of this many ids opens a segment.
    pub segment_entries: u64,
    /// A segment holding this many bytes is sealed.
    pub max_bytes: u64,
    /// A segment this old is sealed at the next append.
    pub max_age: Duration,
}

/// Every ordinary topic's log.
#[derive(Debug)]
pub struct SegmentLog {
    root: PathBuf,
    settings: LogSettings,
    topics: Mutex<HashMap<String, Arc<Mutex<TopicLog>>>>,
    /// Files written since the last sync.
    dirty: Mutex<Vec<Arc<File>>>,
    /// Why a sync failed, once one has: every later sync and append is
    /// refused (after a failed `fsync` the kernel may have dropped the
    /// dirty pages, so a later one succeeding proves nothing about them).
    failed: Mutex<Option<String>>,
    /// Test hook: the next sync fails as an `fsync` error would.
    #[cfg(test)]
    pub(crate) fail_next_sync: std::sync::atomic::AtomicBool,
    /// Torn tails found at open (cut off, or left alone when read-only).
    pub torn: Vec<String>,
    /// Trims whose files are still to be deleted, in the order made.
    trims: Mutex<Vec<PendingTrim>>,
    /// The number the next trim gets ([`TrimMark`]).
    trim_seq: std::sync::atomic::AtomicU64,
    /// Held while trims' files are deleted, so two callers never write
    /// `start` files out of order.
    finishing: Mutex<()>,
}

/// One topic's segments.
#[derive(Debug)]
struct TopicLog {
    dir: PathBuf,
    segments: BTreeMap<u64, Segment>,
    /// Segments created are numbered by their block of `segment_entries`
    /// ids, as sled numbered its trees (the upgrade's copy, so the
    /// manifest's record of segments still holds).
    numbered_by_block: bool,
}

impl TopicLog {
    fn next(&self) -> Option<u64> {
        self.segments.values().next_back().map(|s| s.next)
    }

    fn first(&self) -> Option<u64> {
        let mut first = None;
        for s in self.segments.values() {
            if let Some(f) = s.first_entry {
                first = Some(f);
                break;
            }
        }
        first.or(self.next())
    }
}

/// A topic's directory name: bytes outside `[A-Za-z0-9._-]` as `%XX`.
pub fn dir_name(topic: &str) -> String {
    let mut out = String::with_capacity(topic.len() + 16);
    for b in topic.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The topic a directory name stands for.
fn topic_of(dir: &str) -> Option<String> {
    let bytes = dir.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn corrupt(topic: &str, what: String) -> StorageError {
    StorageError::Corrupt(format!("log of {topic}: {what}"))
}

/// Removes a file, if it is there.
fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Opens a sealed segment: checked whole against its sidecar when it has
/// one ([`sealed`]), record by record otherwise or when the whole-file
/// pass does not accept it — so damage is refused with the per-record
/// check's error and offset, and a file whose records all check but whose
/// CRC is not the one recorded at its seal is refused as such.
fn open_sealed(
    path: &Path,
    first: u64,
    writable: bool,
) -> Result<std::result::Result<(Segment, Tail), String>> {
    let Some(sum) = sealed::read(path)? else {
        let opened = Segment::open(path, first, writable);
        if writable && let Ok((seg, Tail::Whole)) = &opened {
            // Sealed by an older broker (or its sum damaged): checked record
            // by record just now, its sum is recorded for the next start.
            sealed::record_checked(seg);
        }
        return Ok(opened);
    };
    let refused = match sealed::open(path, first, writable, sum) {
        Ok(seg) => return Ok(Ok((seg, Tail::Whole))),
        Err(r) => r,
    };
    if let sealed::Refused::Walk(why) = &refused {
        tracing::warn!(
            path = %path.display(),
            why,
            "a sealed segment matching its seal's checksum did not walk: checked record by record"
        );
    }
    let by_record = Segment::open(path, first, writable);
    Ok(match (refused, by_record) {
        (sealed::Refused::Mismatch(why), Ok((_, Tail::Whole))) => Err(format!(
            "not the file that was sealed ({why}), though each record checks"
        )),
        (_, by_record) => by_record,
    })
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn read_start(dir: &Path) -> Result<Option<u64>> {
    match std::fs::read(dir.join(START_FILE)) {
        Ok(b) if b.len() == 12 && crc32c::crc32c(&b[..8]).to_le_bytes() == b[8..12] => {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[..8]);
            Ok(Some(u64::from_le_bytes(w)))
        }
        Ok(_) => Err(StorageError::Corrupt(format!(
            "{}: damaged",
            dir.join(START_FILE).display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn write_start(dir: &Path, first: u64) -> std::io::Result<()> {
    let mut b = first.to_le_bytes().to_vec();
    b.extend_from_slice(&crc32c::crc32c(&b).to_le_bytes());
    super::sled_store::write_durably(dir, START_FILE, &b)
}

impl SegmentLog {
    /// Opens the log under `data_dir` (creating it), scanning every segment.
    /// `writable: false` (the `check` command) cuts nothing and deletes
    /// nothing: what open would repair is listed in [`Self::torn`].
    pub fn open(data_dir: &Path, settings: LogSettings, writable: bool) -> Result<Self> {
        Self::open_at(data_dir.join(DIR_NAME), settings, writable)
    }

    /// [`Self::open`] with the log's own directory.
    fn open_at(root: PathBuf, settings: LogSettings, writable: bool) -> Result<Self> {
        if writable {
            std::fs::create_dir_all(&root)?;
        }
        let mut log = Self {
            root: root.clone(),
            settings,
            topics: Mutex::new(HashMap::new()),
            dirty: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
            #[cfg(test)]
            fail_next_sync: std::sync::atomic::AtomicBool::new(false),
            torn: Vec::new(),
            trims: Mutex::new(Vec::new()),
            trim_seq: std::sync::atomic::AtomicU64::new(0),
            finishing: Mutex::new(()),
        };
        let entries = match std::fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !writable => return Ok(log),
            Err(e) => return Err(e.into()),
        };
        let mut topics = HashMap::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(DELETED) || name.ends_with(upgrade::PARTIAL) {
                // A delete or an upgrade a crash interrupted: finish (or
                // undo) it.
                if writable {
                    std::fs::remove_dir_all(entry.path())?;
                }
                continue;
            }
            let Some(topic) = topic_of(&name) else {
                continue;
            };
            let (tl, torn) = open_topic(&topic, &entry.path(), writable)?;
            log.torn.extend(torn);
            topics.insert(topic, Arc::new(Mutex::new(tl)));
        }
        sealed::free_read_buffer();
        if writable {
            sync_dir(&root)?;
        }
        log.topics = Mutex::new(topics);
        Ok(log)
    }

    /// The topics with a directory.
    pub fn topics(&self) -> Vec<String> {
        crate::util::lock(&self.topics).keys().cloned().collect()
    }

    fn topic(&self, topic: &str) -> Option<Arc<Mutex<TopicLog>>> {
        crate::util::lock(&self.topics).get(topic).cloned()
    }

    fn topic_or_create(&self, topic: &str) -> Result<Arc<Mutex<TopicLog>>> {
        let mut map = crate::util::lock(&self.topics);
        if let Some(t) = map.get(topic) {
            return Ok(t.clone());
        }
        let dir = self.root.join(dir_name(topic));
        std::fs::create_dir_all(&dir)?;
        sync_dir(&self.root)?;
        let t = Arc::new(Mutex::new(TopicLog {
            dir,
            segments: BTreeMap::new(),
            numbered_by_block: false,
        }));
        map.insert(topic.to_owned(), t.clone());
        Ok(t)
    }

    /// Numbers `topic`'s new segments by block (see
    /// `TopicLog::numbered_by_block`).
    fn number_by_block(&self, topic: &str) -> Result<()> {
        let t = self.topic_or_create(topic)?;
        crate::util::lock(&t).numbered_by_block = true;
        Ok(())
    }

    /// Appends one batch as one record (durable after [`Self::sync`]).
    pub fn append<E: AsRef<[u8]>>(&self, topic: &str, first_id: u64, entries: &[E]) -> Result<()> {
        self.append_rolling(topic, first_id, entries, true)
    }

    /// [`Self::append`] of a replicated topic's entries, applied from its
    /// group's log: the active segment rolls by id block and size only,
    /// never by this broker's clock (the group's leader seals by age,
    /// [`Self::seal_below`]), so replicas with equal settings roll at the
    /// same ids.
    pub fn append_replicated<E: AsRef<[u8]>>(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[E],
    ) -> Result<()> {
        self.append_rolling(topic, first_id, entries, false)
    }

    fn append_rolling<E: AsRef<[u8]>>(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[E],
        by_age: bool,
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.check_synced()?;
        let t = self.topic_or_create(topic)?;
        let mut tl = crate::util::lock(&t);
        if let Some(next) = tl.next()
            && first_id < next
        {
            return Err(StorageError::Io(std::io::Error::other(format!(
                "log of {topic}: entries from {first_id} below its end {next}"
            ))));
        }
        let bytes = record::encode(first_id, entries);
        if let Some(active) = tl.segments.values_mut().next_back()
            && active.cut_pending
        {
            // A torn tail found at open goes before anything is written
            // after it, or the segment is sealed.
            active.truncate_tail()?;
            active.cut_pending = false;
        }
        if self.must_roll(&tl, first_id, by_age) {
            self.roll(&mut tl, first_id)?;
        }
        let Some(active) = tl.segments.values_mut().next_back() else {
            return Err(StorageError::Io(std::io::Error::other("no active segment")));
        };
        active.append(&bytes, first_id, entries.len() as u32)?;
        let file = active.file.clone();
        let mut dirty = crate::util::lock(&self.dirty);
        if !dirty.iter().any(|f| Arc::ptr_eq(f, &file)) {
            dirty.push(file);
        }
        Ok(())
    }

    /// Whether a batch at `first_id` opens a segment: a later block of
    /// ids, a full segment, or (`by_age`) an old one.
    fn must_roll(&self, tl: &TopicLog, first_id: u64, by_age: bool) -> bool {
        let Some(active) = tl.segments.values().next_back() else {
            return true;
        };
        let s = &self.settings;
        active.first_entry.is_some()
            && (first_id / s.segment_entries != active.header.first / s.segment_entries
                || active.len >= s.max_bytes
                || (by_age
                    && crate::util::wall_ms().saturating_sub(active.header.created_ms)
                        >= s.max_age.as_millis() as u64))
    }

    /// Seals the active segment (fsync) and creates the next one at
    /// `first_id` (file and directory fsynced).
    fn roll(&self, tl: &mut TopicLog, first_id: u64) -> Result<()> {
        let (prev_next, seq) = match tl.segments.values().next_back() {
            Some(active) => {
                active.file.sync_all()?;
                // Its whole-file checksum, durable before a later segment
                // exists (a crash in between leaves it the last segment,
                // whose sidecar open never uses).
                sealed::write(&tl.dir, active)?;
                (active.next, active.header.seq + 1)
            }
            None => {
                // The start file comes first: segments without one are
                // refused as damage.
                write_start(&tl.dir, first_id)?;
                (0, 0)
            }
        };
        let seq = if tl.numbered_by_block {
            first_id / self.settings.segment_entries
        } else {
            seq
        };
        let seg = Segment::create(
            &tl.dir,
            FileHeader {
                first: first_id,
                prev_next,
                created_ms: crate::util::wall_ms(),
                seq,
            },
        )?;
        sync_dir(&tl.dir)?;
        crate::util::failpoint("log.roll.after_create");
        tl.segments.insert(first_id, seg);
        Ok(())
    }

    /// Up to `max` entries with id `>= from`, stopping once `max_bytes` is
    /// reached (as [`super::Storage::read`]).
    pub fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let mut bytes = 0usize;
        // Segments hold a record or more each: `max` of them are enough.
        for (file, offset, end) in self.views(topic, from, max) {
            let mut records = Records::new(&file, offset, end);
            loop {
                let (header, body) = match records.next_record()? {
                    Next::Record { header, body, .. } => (header, body),
                    Next::End => break,
                    Next::Bad { at, why } => {
                        return Err(corrupt(topic, format!("offset {at}: {why}")));
                    }
                };
                if header.next_id() <= from {
                    continue;
                }
                for (id, entry) in segment::entries_of(&header, &body)? {
                    if id < from {
                        continue;
                    }
                    bytes += entry.len();
                    out.push((id, entry.to_vec()));
                    if out.len() >= max || bytes >= max_bytes {
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The files to read for entries `>= from`: (file, start offset, valid
    /// length), taken under the topic's lock so a read never sees a record
    /// being written.
    fn views(&self, topic: &str, from: u64, most: usize) -> Vec<(Arc<File>, u64, u64)> {
        let Some(t) = self.topic(topic) else {
            return Vec::new();
        };
        let tl = crate::util::lock(&t);
        let start = tl
            .segments
            .range(..=from)
            .next_back()
            .map_or(0, |(k, _)| *k);
        tl.segments
            .range(start..)
            .filter(|(_, s)| s.next > from)
            .take(most)
            .map(|(_, s)| (s.file.clone(), s.offset_for(from), s.len))
            .collect()
    }

    /// The entries `ids`, each `None` when missing (one read per record).
    pub fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut sorted: Vec<u64> = ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut found: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut i = 0;
        while i < sorted.len() {
            let id = sorted[i];
            // The record holding `id` (and whichever later ids it holds).
            let mut hit = None;
            for (file, offset, end) in self.views(topic, id, 1) {
                let mut records = Records::for_lookup(&file, offset, end);
                match records.next_holding(id)? {
                    Next::Record { header, body, .. } => {
                        if header.first_id <= id {
                            hit = Some((header, body));
                        }
                    }
                    Next::End => {}
                    Next::Bad { at, why } => {
                        return Err(corrupt(topic, format!("offset {at}: {why}")));
                    }
                }
            }
            match hit {
                Some((header, body)) => {
                    let end = header.next_id();
                    for (eid, e) in segment::entries_of(&header, &body)? {
                        if sorted[i..].binary_search(&eid).is_ok() {
                            found.insert(eid, e.to_vec());
                        }
                    }
                    while i < sorted.len() && sorted[i] < end {
                        i += 1;
                    }
                }
                None => i += 1,
            }
        }
        Ok(ids.iter().map(|id| found.get(id).cloned()).collect())
    }

    /// `(first, next)` of a topic's entries; `None` without any segment.
    pub fn range(&self, topic: &str) -> Option<(u64, u64)> {
        let t = self.topic(topic)?;
        let tl = crate::util::lock(&t);
        Some((tl.first()?, tl.next()?))
    }

    /// The segments' first ids, ascending.
    pub fn segment_starts(&self, topic: &str) -> Vec<u64> {
        self.topic(topic).map_or_else(Vec::new, |t| {
            crate::util::lock(&t).segments.keys().copied().collect()
        })
    }

    /// The segments' numbers, ascending (consecutive unless damaged).
    pub fn segment_numbers(&self, topic: &str) -> Vec<u64> {
        self.topic(topic).map_or_else(Vec::new, |t| {
            crate::util::lock(&t)
                .segments
                .values()
                .map(|s| s.header.seq)
                .collect()
        })
    }

    /// Deletes a topic's log: its directory renamed away (durably), then
    /// removed. A crash in between leaves a `~deleted` directory that the
    /// next open removes.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        let removed = crate::util::lock(&self.topics).remove(topic);
        let dir = match &removed {
            Some(t) => crate::util::lock(t).dir.clone(),
            None => self.root.join(dir_name(topic)),
        };
        if !dir.exists() {
            return Ok(());
        }
        let gone = self.root.join(format!("{}{DELETED}", dir_name(topic)));
        std::fs::rename(&dir, &gone)?;
        sync_dir(&self.root)?;
        std::fs::remove_dir_all(&gone)?;
        Ok(())
    }

    /// Fsyncs every segment file written since the last call. After a
    /// failure every later call fails too, naming the first failure, and
    /// so does every append ([`SegmentLog::failed`]).
    pub fn sync(&self) -> std::io::Result<()> {
        self.check_synced()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let files = std::mem::take(&mut *crate::util::lock(&self.dirty));
        for (i, f) in files.iter().enumerate() {
            if let Err(e) = self.sync_one(f) {
                *crate::util::lock(&self.failed) = Some(e.to_string());
                // Still dirty, and never reported synced.
                crate::util::lock(&self.dirty).extend(files[i..].iter().cloned());
                return Err(e);
            }
        }
        Ok(())
    }

    fn sync_one(&self, f: &File) -> std::io::Result<()> {
        #[cfg(test)]
        if self
            .fail_next_sync
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        f.sync_data()
    }

    /// Fails once a sync has failed: nothing written since can be made
    /// durable by this process.
    fn check_synced(&self) -> Result<()> {
        match &*crate::util::lock(&self.failed) {
            None => Ok(()),
            Some(why) => Err(StorageError::Io(std::io::Error::other(format!(
                "an fsync of the segment log failed earlier ({why}): the log refuses \
                 writes until the broker restarts and recovers it from disk"
            )))),
        }
    }

    /// Why a sync failed, once one has.
    pub fn failed(&self) -> Option<String> {
        crate::util::lock(&self.failed).clone()
    }

    /// Entries stored in every topic's segments.
    pub fn entries(&self) -> u64 {
        self.sum_over_segments(|s| s.entries)
    }

    /// Records whose own CRC the open computed: those of segments checked
    /// record by record (the active ones, those sealed without a
    /// whole-file sum), none of those checked whole against their seal.
    pub fn records_checked_at_open(&self) -> u64 {
        self.sum_over_segments(|s| s.records_checked)
    }

    /// Bytes of every segment file.
    pub fn size(&self) -> u64 {
        self.sum_over_segments(|s| s.len)
    }

    /// The sum of `of` over every segment of every topic.
    fn sum_over_segments(&self, of: impl Fn(&Segment) -> u64) -> u64 {
        let topics: Vec<_> = crate::util::lock(&self.topics).values().cloned().collect();
        topics
            .iter()
            .map(|t| crate::util::lock(t).segments.values().map(&of).sum::<u64>())
            .sum()
    }

    /// Bytes of records per segment (first id → bytes), for size limits.
    pub fn segment_bytes(&self, topic: &str) -> Vec<(u64, u64)> {
        self.topic(topic).map_or_else(Vec::new, |t| {
            crate::util::lock(&t)
                .segments
                .iter()
                .map(|(k, s)| (*k, s.record_bytes()))
                .collect()
        })
    }

    /// Path of a topic's segment file starting at `first` (tests, shipping).
    pub fn segment_path(&self, topic: &str, first: u64) -> PathBuf {
        self.root
            .join(dir_name(topic))
            .join(segment::file_name(first))
    }
}

/// Opens one topic's directory: the `start` file, every segment in order,
/// the chain between them; the last one's torn tail cut when `writable`.
fn open_topic(topic: &str, dir: &Path, writable: bool) -> Result<(TopicLog, Vec<String>)> {
    let mut files = Vec::new();
    let mut sums = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(first) = segment::parse_name(&name) {
            files.push(first);
        } else if let Some(first) = sealed::parse_name(&name) {
            sums.push(first);
        }
    }
    files.sort_unstable();
    if writable {
        // Sidecars of segments gone (a trim's deletion cut short), and the
        // last segment's (it is the active one: it may grow past its sum).
        for s in sums {
            if files.binary_search(&s).is_err() || files.last() == Some(&s) {
                remove_if_there(&dir.join(sealed::file_name(s)))?;
            }
        }
    }
    let start = read_start(dir)?;
    if let Some(start) = start {
        // Segments below `start`: a trim the crash interrupted.
        for f in files.iter().filter(|f| **f < start) {
            tracing::info!(
                topic,
                segment = f,
                "finishing a retention trim: deleting a segment below the log's start"
            );
            if writable {
                let path = dir.join(segment::file_name(*f));
                std::fs::remove_file(&path)?;
                remove_if_there(&sealed::path_of(&path))?;
            }
        }
        files.retain(|f| *f >= start);
        match files.first() {
            Some(f) if *f != start => {
                return Err(corrupt(
                    topic,
                    format!("its first segment ({start}) is missing"),
                ));
            }
            _ => {}
        }
    } else if !files.is_empty() {
        return Err(corrupt(topic, "its start file is missing".into()));
    }
    let mut segments = BTreeMap::new();
    let mut torn = Vec::new();
    let count = files.len();
    // (where the previous segment ends, its number)
    let mut prev_next: Option<(u64, u64)> = None;
    for (i, first) in files.into_iter().enumerate() {
        let path = dir.join(segment::file_name(first));
        let last = i + 1 == count;
        let opened = if last {
            Segment::open(&path, first, writable)
        } else {
            open_sealed(&path, first, writable)?
        };
        let (mut seg, tail) = match opened {
            Ok(o) => o,
            // A file created by a roll the crash interrupted before its
            // header was written: nothing was stored in it.
            Err(why)
                if last
                    && std::fs::metadata(&path)
                        .is_ok_and(|m| m.len() <= record::FILE_HEADER_LEN) =>
            {
                tracing::warn!(
                    topic,
                    segment = first,
                    why,
                    "a segment created by an interrupted roll holds nothing; removed"
                );
                torn.push(format!("{topic}: segment {first} has no header ({why})"));
                if writable {
                    std::fs::remove_file(&path)?;
                }
                continue;
            }
            Err(why) => {
                return Err(corrupt(topic, format!("segment {first}: {why}")));
            }
        };
        if let Some((p, seq)) = prev_next
            && (seg.header.prev_next != p || seg.header.seq <= seq)
        {
            return Err(corrupt(
                topic,
                format!(
                    "segment {first} (number {}, after entry {}) does not follow the one before it (number {seq}, ending at {p}): a segment is missing",
                    seg.header.seq, seg.header.prev_next
                ),
            ));
        }
        if let Tail::Torn { at, file_len, why } = tail {
            if !last {
                return Err(corrupt(
                    topic,
                    format!(
                        "sealed segment {first} is damaged at offset {at} of {file_len}: {why}"
                    ),
                ));
            }
            if let Some(next) = seg.whole_record_after(at, file_len)? {
                return Err(corrupt(
                    topic,
                    format!(
                        "segment {first} is damaged at offset {at} ({why}), before a whole record at offset {next}"
                    ),
                ));
            }
            tracing::warn!(
                topic,
                segment = first,
                offset = at,
                cut = file_len - at,
                why,
                "torn tail of the log (a write a crash interrupted, never acknowledged): not served, cut before the next write"
            );
            torn.push(format!(
                "{topic}: segment {first} has a torn tail of {} bytes at offset {at} ({why})",
                file_len - at
            ));
            // Cut by the first append, not here: a store refused at start
            // (its manifest records more) stays as it was.
            seg.cut_pending = true;
        }
        prev_next = Some((seg.next, seg.header.seq));
        segments.insert(first, seg);
    }
    Ok((
        TopicLog {
            dir: dir.to_owned(),
            segments,
            numbered_by_block: false,
        },
        torn,
    ))
}

#[cfg(test)]
mod sealed_tests;
#[cfg(test)]
mod tests;
