//! A group's Raft log and vote: the log in append-only segment files
//! ([`files`]), the vote and small marks in sled.
//!
//! Each group's log is a directory of segment files under
//! `<data dir>/raft-log/` ([`crate::RaftDb::log_dir`]): one CRC-checked
//! record per batch openraft appends, each entry's bytes written once
//! (the sled tree this replaced rewrote large entries as it reorganised
//! its pages: ~500 MB written by three R3 brokers for 20 MB of payload).
//! The vote, the committed mark and the purge point stay in the group's
//! sled tree `meta/<group>`, next to the state machine's applied mark:
//! they are a few bytes, written rarely (an election, a snapshot), and
//! the applied mark and the snapshot records must change in one sled
//! batch anyway; with the log gone from sled, its flush writes only them.
//!
//! Durability ([`Durability`]): the vote is flushed (sled's flush, then
//! an `fsync` of sled's file: sled 0.34's own flush is `sync_file_range`,
//! which does not flush the device's cache) before `save_vote` returns,
//! in every mode — a node must never vote twice in a
//! term. In `Sync` mode an append is reported to openraft as persisted
//! (so it counts toward the majority a commit needs) only after
//! `fdatasync` of the segment file returned: one fsync per appended batch
//! (on a follower, the entries of one `AppendEntries`; on the leader,
//! each proposal alone: openraft 0.9 appends every `client_write` as its
//! own batch and waits for its flush before the next: see the note on
//! `append` below), and a new
//! segment file is fsynced with its directory before anything is written
//! to it. In `Interval` mode an append is reported once written (page
//! cache) and the active segment is fsynced every `flush_interval`: a
//! committed entry then survives the crash of any minority of the group,
//! but not a crash of a majority within one interval (a power cut of the
//! machine): Raft's guarantees assume the log is on disk. Truncations and
//! purges are durable in both modes (the purge point is flushed before a
//! segment is deleted, so a crash never leaves a gap unexplained).
//!
//! Reads: the entries appended last are also kept in memory, as appended
//! ([`Recent`], at most [`RECENT_BYTES`] per group), because openraft
//! reads each entry back right after appending it (the leader once per
//! follower and once to apply, a follower once to apply); older entries
//! are read from the segment files.
//!
//! Upgrade ([`upgrade`]): a group whose log is still a sled tree
//! (`log/<group>`, written by earlier brokers) is converted when opened.

// openraft's traits fix these error types (StorageError, RPCError), large as they are.
#![allow(clippy::result_large_err)]

pub mod files;
mod upgrade;

use crate::state_machine::storage_io;
use crate::{Durability, NodeId, NodeSettings, RaftDb, TypeConfig, decode, encode, encode_into};
use files::FileLog;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogId, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use ricochet_storage::segments::record::RecordWriter;
use ricochet_storage::sled_sync::SledSync;
use ricochet_storage::util::lock;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

type StoreResult<T> = Result<T, StorageError<NodeId>>;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// The directory of `group`'s log segments under `root`.
pub fn group_log_dir(root: &Path, group: &str) -> PathBuf {
    crate::snapshot::group_dir(root, group)
}

/// One group's log and vote (cheap to clone: the files and the sled tree
/// are shared).
#[derive(Debug, Clone)]
pub struct LogStore {
    files: Arc<Mutex<FileLog>>,
    /// The entries appended last, as appended ([`Recent`]).
    recent: Arc<Mutex<Recent>>,
    meta: sled::Tree,
    /// The database's durable flush, for the vote and marks.
    sync: Arc<SledSync>,
    durability: Durability,
}

fn write_err(e: &std::io::Error) -> StorageError<NodeId> {
    storage_io(StorageIOError::write_logs(e))
}

fn read_err(e: &std::io::Error) -> StorageError<NodeId> {
    storage_io(StorageIOError::read_logs(e))
}

fn joined(e: tokio::task::JoinError) -> std::io::Error {
    std::io::Error::other(format!("raft log task: {e}"))
}

impl LogStore {
    /// The log of `group` on `db` (converted from sled first if an earlier
    /// broker wrote it there). In `Interval` mode a task fsyncs the active
    /// segment every `settings.flush_interval` while the log is open.
    pub fn open(db: &RaftDb, group: &str, settings: &NodeSettings) -> crate::Result<Self> {
        Self::open_with(db, group, settings, files::SEGMENT_BYTES)
    }

    /// [`LogStore::open`] with segments rolled at `segment_bytes` (tests).
    pub fn open_with(
        db: &RaftDb,
        group: &str,
        settings: &NodeSettings,
        segment_bytes: u64,
    ) -> crate::Result<Self> {
        let meta = db.open_tree(format!("meta/{group}"))?;
        let dir = group_log_dir(db.log_dir(), group);
        upgrade::convert(db, group, &dir)?;
        let purged = match meta.get(PURGED)? {
            Some(v) => Some(decode::<LogId<NodeId>>(&v)?.index),
            None => None,
        };
        let (mut log, report) = FileLog::open(&dir, purged)?;
        log.segment_bytes = segment_bytes;
        if report.torn_bytes > 0 {
            tracing::warn!(
                group,
                bytes = report.torn_bytes,
                "raft log opened after dropping a torn tail"
            );
        }
        let files = Arc::new(Mutex::new(log));
        if settings.durability == Durability::Interval {
            // Without its flusher an interval log would never be fsynced.
            let rt = tokio::runtime::Handle::try_current().map_err(|_| {
                crate::ReplicationError::Raft("an interval log needs a tokio runtime".into())
            })?;
            rt.spawn(flush_every(Arc::downgrade(&files), settings.flush_interval));
        }
        Ok(Self {
            files,
            recent: Arc::default(),
            meta,
            sync: db.sync().clone(),
            durability: settings.durability,
        })
    }

    fn lock(&self) -> MutexGuard<'_, FileLog> {
        lock(&self.files)
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StoreResult<Option<T>> {
        match self
            .meta
            .get(key)
            .map_err(|e| storage_io(StorageIOError::read(&e)))?
        {
            Some(v) => Ok(Some(
                decode(&v).map_err(|e| storage_io(StorageIOError::read(&e)))?,
            )),
            None => Ok(None),
        }
    }

    fn put_meta<T: serde::Serialize>(&self, key: &[u8], value: &T) -> StoreResult<()> {
        let bytes = encode(value).map_err(|e| storage_io(StorageIOError::write(&e)))?;
        self.meta
            .insert(key, bytes)
            .map_err(|e| storage_io(StorageIOError::write(&e)))?;
        Ok(())
    }

    /// Makes the vote and marks durable: sled's flush, then an
    /// `fdatasync` of its file (sled's own flush is `sync_file_range`,
    /// which leaves them in the device's write cache).
    async fn flush_meta(&self) -> StoreResult<()> {
        self.sync
            .flush(&self.meta)
            .await
            .map_err(|e| storage_io(StorageIOError::write(&e)))
    }

    /// Runs `f` on the files off the async threads (file writes and fsyncs
    /// block).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut FileLog) -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let files = self.files.clone();
        tokio::task::spawn_blocking(move || f(&mut lock(&files)))
            .await
            .map_err(joined)?
    }

    /// Appends `entries` (consecutive indexes) as one record; returns once
    /// they are durable in `Sync` mode (one `fdatasync`), written in
    /// `Interval` mode. What `append` reports flushed to openraft.
    pub async fn append_entries(&self, entries: Vec<Entry<TypeConfig>>) -> StoreResult<()> {
        let Some(first) = entries.first().map(|e| e.log_id.index) else {
            return Ok(());
        };
        // Each entry encoded straight into the record's buffer (not into
        // one of its own, copied into the record after).
        let size = entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(c) => c.encoded_size() + 68,
                _ => 260,
            })
            .sum();
        let mut record = RecordWriter::new(first, size);
        for (k, entry) in entries.iter().enumerate() {
            if entry.log_id.index != first + k as u64 {
                let e = std::io::Error::other("raft log: an appended batch is not consecutive");
                return Err(storage_io(StorageIOError::write_log_entry(
                    entry.log_id,
                    &e,
                )));
            }
            record
                .push_with(|buf| encode_into(entry, buf))
                .map_err(|e| storage_io(StorageIOError::write_log_entry(entry.log_id, &e)))?;
        }
        let sync = self.durability == Durability::Sync;
        let files = self.files.clone();
        let recent = self.recent.clone();
        let started = std::time::Instant::now();
        tokio::task::spawn_blocking(move || {
            let file = {
                let mut log = lock(&files);
                // The entries' encoded bytes, without their lengths.
                let bytes = record.byte_len() - 4 * record.count() as usize;
                let file = log.append_record(first, record)?;
                // Under the files' lock, so a truncate or purge sees the
                // cache and the files agree.
                lock(&recent).push(first, entries, bytes);
                file
            };
            if sync {
                // Outside the lock: readers go on meanwhile.
                if let Err(e) = file.sync_data() {
                    lock(&files).fail(&e);
                    return Err(e);
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(joined)
        .and_then(|r| r)
        .map_err(|e| write_err(&e))?;
        crate::latency::record(crate::latency::LOG_APPEND, started);
        Ok(())
    }

    /// The stored bytes (an entry's CBOR) of the entries held in
    /// `from..to`, with their indexes: what a record holds, for tools and
    /// tests.
    pub fn raw_entries(&self, from: u64, to: u64) -> crate::Result<Vec<(u64, Vec<u8>)>> {
        let plan = self.lock().plan(from, to);
        let mut out = Vec::new();
        for p in plan {
            out.extend(p.read()?);
        }
        Ok(out)
    }

    fn last_entry_id(&self) -> StoreResult<Option<LogId<NodeId>>> {
        let plan = {
            let log = self.lock();
            match log.next_index() {
                Some(next) => log.plan(next - 1, next),
                None => return Ok(None),
            }
        };
        let mut last = None;
        for p in plan {
            for (_, bytes) in p.read().map_err(|e| read_err(&e))? {
                last = Some(*decode_entry(&bytes)?.get_log_id());
            }
        }
        Ok(last)
    }
}

/// The most bytes of entries [`Recent`] keeps per group: about ten
/// appends of full producer batches, more than openraft reads back
/// behind the last append when replicas keep up; small, because it stays
/// resident per group while the group is idle (a broker may hold
/// hundreds of groups).
pub const RECENT_BYTES: usize = 1 << 20;

/// The last entries appended (consecutive, at most [`RECENT_BYTES`] of
/// them as encoded), kept as appended: openraft reads each entry back
/// soon after appending it, on the leader once for each follower it
/// replicates to and once to apply it, on a follower once to apply it.
/// Served from here, such a read clones the entries (their commands are
/// [`bytes::Bytes`], shared) instead of reading the record back,
/// checking its CRC and decoding it. Anything older, or after a reopen,
/// is read from the files. Changed only under the files' lock, and
/// truncated or purged before they are.
#[derive(Debug, Default)]
pub struct Recent {
    /// The index of `entries[0]`.
    first: u64,
    entries: std::collections::VecDeque<(Entry<TypeConfig>, usize)>,
    bytes: usize,
}

impl Recent {
    /// Adds `entries` appended at `first` on (`size` bytes encoded). An
    /// append that does not follow the entries held (after a truncation,
    /// a purge or a snapshot) starts over from it.
    pub fn push(&mut self, first: u64, entries: Vec<Entry<TypeConfig>>, size: usize) {
        let end = self.first + self.entries.len() as u64;
        if first != end {
            if first > self.first && first < end {
                // Over a tail the store truncated first.
                self.truncate(first);
            } else {
                // A gap before `first`, or nothing kept before it.
                self.clear();
                self.first = first;
            }
        }
        let each = size / entries.len().max(1);
        for e in entries {
            self.bytes += each;
            self.entries.push_back((e, each));
        }
        while self.bytes > RECENT_BYTES && self.entries.len() > 1 {
            if let Some((_, n)) = self.entries.pop_front() {
                self.bytes -= n;
                self.first += 1;
            }
        }
    }

    /// The entries `from..to` if all of them are held (clones).
    pub fn get(&self, from: u64, to: u64) -> Option<Vec<Entry<TypeConfig>>> {
        let end = self.first + self.entries.len() as u64;
        if from < self.first || to > end || from >= to {
            return None;
        }
        let (a, b) = ((from - self.first) as usize, (to - self.first) as usize);
        Some(self.entries.range(a..b).map(|(e, _)| e.clone()).collect())
    }

    /// Drops the entries from `index` on.
    pub fn truncate(&mut self, index: u64) {
        if index <= self.first {
            self.clear();
            self.first = index;
            return;
        }
        let keep = (index - self.first) as usize;
        while self.entries.len() > keep {
            if let Some((_, n)) = self.entries.pop_back() {
                self.bytes -= n;
            }
        }
    }

    /// Drops the entries up to `index`.
    pub fn purge(&mut self, index: u64) {
        while self.first <= index {
            let Some((_, n)) = self.entries.pop_front() else {
                self.first = index + 1;
                return;
            };
            self.bytes -= n;
            self.first += 1;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

/// Fsyncs the active segment of the log every `every` until it is closed.
async fn flush_every(log: std::sync::Weak<Mutex<FileLog>>, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(files) = log.upgrade() else { return };
        let active = lock(&files).active_file();
        drop(files);
        if let Some(file) = active {
            match tokio::task::spawn_blocking(move || file.sync_data()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "raft log interval flush failed; the log refuses further writes");
                    let Some(files) = log.upgrade() else { return };
                    lock(&files).fail(&e);
                }
                Err(e) => tracing::error!(error = %e, "raft log interval flush task failed"),
            }
        }
    }
}

fn decode_entry(bytes: &[u8]) -> StoreResult<Entry<TypeConfig>> {
    decode(bytes).map_err(|e| storage_io(StorageIOError::read_logs(&e)))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let from = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let to = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        };
        if let Some(hit) = lock(&self.recent).get(from, to) {
            return Ok(hit);
        }
        let plan = self.lock().plan(from, to);
        let mut out = Vec::new();
        for p in plan {
            for (_, bytes) in p.read().map_err(|e| read_err(&e))? {
                out.push(decode_entry(&bytes)?);
            }
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.get_meta(PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        self.put_meta(VOTE, vote)?;
        // Always durable: a vote forgotten in a crash could be cast twice.
        self.flush_meta().await
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        // Not flushed: a lost value only means re-applying from the
        // state machine's last applied entry once a leader says so.
        self.put_meta(COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    // The callback is fired here, after the `fdatasync` (in `Sync`), and
    // not later from a flusher that would let `append` return at once and
    // group the syncs of several appends: openraft 0.9.25's core awaits
    // the callback itself before it runs its next command
    // (`RaftCore::append_to_log`, core/raft_core.rs:707-731, "a temp
    // wrapper to make non-blocking append_to_log a blocking"), so it never
    // has two appends outstanding and there is nothing to group. Measured
    // in session 11 with `append` returning before its sync and a task
    // firing the callback after it (docs/src/replication-history-throughput.md,
    // "Session 11"): never more than one append outstanding on any log, the same
    // rates.
    // Firing it before the sync would count the leader's unflushed copy
    // toward the commit (`update_local_progress` follows the append,
    // core/raft_core.rs:1640-1646).
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self.append_entries(entries.into_iter().collect()).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // Entries from `log_id.index` on conflict with the leader's log.
        let index = log_id.index;
        let recent = self.recent.clone();
        self.blocking(move |log| {
            // Before the files change: a read meanwhile goes to the files.
            lock(&recent).truncate(index);
            log.truncate(index)
        })
        .await
        .map_err(|e| write_err(&e))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // The purge point first (durable in both modes), so a crash never
        // leaves a gap unexplained.
        self.put_meta(PURGED, &log_id)?;
        self.flush_meta().await?;
        let index = log_id.index;
        let recent = self.recent.clone();
        self.blocking(move |log| {
            lock(&recent).purge(index);
            log.purge(index)
        })
        .await
        .map_err(|e| write_err(&e))
    }
}

#[cfg(test)]
mod tests;
