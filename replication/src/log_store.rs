//! A group's Raft log and vote, durable in sled.
//!
//! One sled database per node (`<data dir>/raft`) holds every group the
//! node belongs to: the log of group `g` in tree `log/g` (key: the entry's
//! index, big-endian; value: the CBOR-encoded openraft entry) and its
//! small state in tree `meta/g` (`vote`, `committed`, `purged`).
//!
//! Durability ([`Durability`]): the vote is flushed (fsync) before
//! `save_vote` returns, in every mode — a node must never vote twice in a
//! term. In `Sync` mode an append is reported to openraft as persisted
//! (so it counts toward the majority a commit needs) only after sled's
//! flush returned, and truncations and purges are flushed too. In
//! `Interval` mode an append is reported persisted once it is in sled's
//! page cache; sled's own flusher writes it out every `flush_interval`.
//! A committed entry then survives the crash of any minority of the group,
//! but not a crash of a majority within one interval (a power cut of the
//! machine): Raft's guarantees assume the log is on disk.

// openraft's traits fix these error types (StorageError, RPCError), large as they are.
#![allow(clippy::result_large_err)]

use crate::state_machine::storage_io;
use crate::{Durability, NodeId, TypeConfig, decode, encode, encode_sized};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogId, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use ricochet_storage::sled_blobs::BlobSync;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

type StoreResult<T> = Result<T, StorageError<NodeId>>;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// One group's log and vote (cheap to clone: sled trees are shared).
#[derive(Debug, Clone)]
pub struct LogStore {
    log: sled::Tree,
    meta: sled::Tree,
    /// The database's blob files: synced before each flush.
    blobs: Arc<BlobSync>,
    durability: Durability,
}

impl LogStore {
    /// The log of `group` in `db`, whose blob files `blobs` keeps track of.
    pub fn open(
        db: &sled::Db,
        blobs: Arc<BlobSync>,
        group: &str,
        durability: Durability,
    ) -> crate::Result<Self> {
        Ok(Self {
            log: db.open_tree(format!("log/{group}"))?,
            meta: db.open_tree(format!("meta/{group}"))?,
            blobs,
            durability,
        })
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

    async fn flush(&self) -> StoreResult<()> {
        // An entry sled wrote as a blob file first: its flush makes only
        // the pointer durable.
        self.blobs
            .sync_new()
            .map_err(|e| storage_io(StorageIOError::write_logs(&e)))?;
        self.log
            .flush_async()
            .await
            .map_err(|e| storage_io(StorageIOError::write_logs(&e)))?;
        Ok(())
    }

    async fn flush_if_sync(&self) -> StoreResult<()> {
        match self.durability {
            Durability::Sync => self.flush().await,
            Durability::Interval => Ok(()),
        }
    }

    /// Removes the entries of `range` in one batch.
    fn remove(&self, range: sled::Iter) -> StoreResult<()> {
        let mut batch = sled::Batch::default();
        for kv in range {
            let (k, _) = kv.map_err(|e| storage_io(StorageIOError::write_logs(&e)))?;
            batch.remove(k);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| storage_io(StorageIOError::write_logs(&e)))
    }

    fn decode_entry(bytes: &[u8]) -> StoreResult<Entry<TypeConfig>> {
        decode(bytes).map_err(|e| storage_io(StorageIOError::read_logs(&e)))
    }

    fn last_entry_id(&self) -> StoreResult<Option<LogId<NodeId>>> {
        match self
            .log
            .last()
            .map_err(|e| storage_io(StorageIOError::read_logs(&e)))?
        {
            Some((_, v)) => Ok(Some(*Self::decode_entry(&v)?.get_log_id())),
            None => Ok(None),
        }
    }
}

fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => Bound::Included(key(i)),
            Bound::Excluded(&i) => Bound::Excluded(key(i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => Bound::Included(key(i)),
            Bound::Excluded(&i) => Bound::Excluded(key(i)),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for kv in self.log.range::<[u8; 8], _>((start, end)) {
            let (_, v) = kv.map_err(|e| storage_io(StorageIOError::read_logs(&e)))?;
            out.push(Self::decode_entry(&v)?);
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
        self.flush().await
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

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let size = match &entry.payload {
                EntryPayload::Normal(c) => c.encoded_size() + 64,
                _ => 0,
            };
            let bytes = encode_sized(&entry, size)
                .map_err(|e| storage_io(StorageIOError::write_log_entry(entry.log_id, &e)))?;
            batch.insert(&key(entry.log_id.index), bytes);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| storage_io(StorageIOError::write_logs(&e)))?;
        match self.flush_if_sync().await {
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
        self.remove(self.log.range(key(log_id.index)..))?;
        self.flush_if_sync().await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // The purge point first, so a crash never leaves a gap unexplained.
        self.put_meta(PURGED, &log_id)?;
        self.flush_if_sync().await?;
        self.remove(self.log.range(..=key(log_id.index)))?;
        self.flush_if_sync().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeSettings;

    /// An entry over a quarter of the 4 MiB segment is a sled blob file:
    /// the log's flush syncs it before sled's flush, so nothing is left
    /// for a later pass to sync.
    #[tokio::test]
    async fn the_logs_flush_syncs_entries_sled_wrote_as_blob_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = crate::open_db(dir.path(), &NodeSettings::default()).expect("db");
        let mut log = LogStore::open(&db, db.blobs().clone(), "g", Durability::Sync).expect("log");
        log.log.insert(key(1), vec![7u8; 2 << 20]).expect("insert");
        let blobs = std::fs::read_dir(dir.path().join("raft/blobs")).map_or(0, |d| d.count());
        assert!(blobs >= 1, "sled wrote no blob file: the test needs one");
        log.save_vote(&Vote::new(1, 1)).await.expect("vote");
        assert_eq!(db.blobs().sync_new().expect("sync"), 0);
    }
}
