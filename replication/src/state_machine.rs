//! A group's state machine: committed commands handed, in log order, to
//! the broker's [`Apply`], and the mark of what was applied.
//!
//! The mark (`applied`, with the last membership) is kept in the group's
//! `meta/<group>` tree and is only ever written after the applier's state
//! up to it is durable, so on restart it is at or behind the store:
//! openraft re-applies the committed entries after it, and the applier
//! must make re-applying an entry harmless (the broker's commands are
//! idempotent by construction). In both durability modes
//! [`StateMachine::checkpoint`] flushes the applier and writes the mark
//! every flush interval, not after each batch: what a writer is answered
//! for is committed, durable in the logs of a majority in `Sync` mode, and
//! a node that crashed re-applies it from its log.
//!
//! Snapshots are not built yet (the group's log is never purged, so a
//! replica always catches up from the log); `docs/src/replication.md`
//! describes the design (sealed segments plus a state snapshot).

// openraft's traits fix these error types (StorageError, RPCError), large as they are.
#![allow(clippy::result_large_err)]

use crate::{Durability, NodeId, Reply, TypeConfig, decode, encode};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use std::io::Cursor;
use std::sync::{Arc, Mutex};

type StoreResult<T> = Result<T, StorageError<NodeId>>;

const APPLIED: &[u8] = b"applied";

/// What the broker does with a committed command.
#[async_trait::async_trait]
pub trait Apply: Send + Sync + std::fmt::Debug + 'static {
    /// Applies the command committed at log `index` and answers the writer.
    /// Must be deterministic (every replica computes the same state and
    /// answer) and harmless when repeated for the same index (a restart
    /// re-applies what the last mark did not cover). A command that is
    /// refused is an `Ok` answer saying so; an `Err` means the store
    /// failed, and stops the group on this node.
    fn apply(&self, index: u64, command: &[u8]) -> crate::Result<Vec<u8>>;
    /// Makes everything applied so far durable.
    async fn flush(&self) -> crate::Result<()>;
}

pub(crate) fn storage_io(e: StorageIOError<NodeId>) -> StorageError<NodeId> {
    StorageError::IO { source: e }
}

type Mark = (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>);

/// A group's state machine on one node.
#[derive(Debug, Clone)]
pub struct StateMachine {
    apply: Arc<dyn Apply>,
    meta: sled::Tree,
    /// What has been applied (in memory; the stored mark may be behind).
    current: Arc<Mutex<Mark>>,
}

impl StateMachine {
    /// The state machine of `group` on `db`, applying through `apply`.
    pub fn open(
        db: &sled::Db,
        group: &str,
        _durability: Durability,
        apply: Arc<dyn Apply>,
    ) -> crate::Result<Self> {
        let meta = db.open_tree(format!("meta/{group}"))?;
        let current = match meta.get(APPLIED)? {
            Some(v) => decode(&v)?,
            None => (None, StoredMembership::default()),
        };
        Ok(Self {
            apply,
            meta,
            current: Arc::new(Mutex::new(current)),
        })
    }

    fn mark(&self) -> Mark {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Flushes the applier, then stores the mark of what it holds (the
    /// `Interval` mode's periodic step; `Sync` does it after each batch).
    pub async fn checkpoint(&self) -> crate::Result<()> {
        let mark = self.mark();
        self.apply.flush().await?;
        self.meta.insert(APPLIED, encode(&mark)?)?;
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        Err(storage_io(StorageIOError::write_snapshot(
            None,
            &std::io::Error::other("snapshots of replicated partitions are not built yet"),
        )))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> StoreResult<Mark> {
        Ok(self.mark())
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<Reply>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let mut last = None;
        let mut membership = None;
        for entry in entries {
            let log_id = entry.log_id;
            let reply = match entry.payload {
                EntryPayload::Blank => Reply::default(),
                EntryPayload::Normal(command) => Reply(
                    self.apply
                        .apply(log_id.index, &command.0)
                        .map_err(|e| storage_io(StorageIOError::apply(log_id, &e)))?,
                ),
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(log_id), m));
                    Reply::default()
                }
            };
            last = Some(log_id);
            replies.push(reply);
        }
        {
            let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some() {
                current.0 = last;
            }
            if let Some(m) = membership {
                current.1 = m;
            }
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        Err(storage_io(StorageIOError::write_snapshot(
            Some(meta.signature()),
            &std::io::Error::other("snapshots of replicated partitions are not installed yet"),
        )))
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        Ok(None)
    }
}
