//! A group's state machine: committed commands handed, in log order, to
//! the broker's [`Apply`], the mark of what was applied, and the group's
//! snapshots.
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
//! Snapshots ([`crate::snapshot`] for the files): building one captures
//! the applier's state between two applies ([`Apply::snapshot`], quick),
//! then streams it to a file while applies go on; the mark is made durable
//! first, so the log openraft purges behind the snapshot is never needed
//! again by this node. Installing one (a follower too far behind, or a new
//! member) is crash-safe by rolling forward: the received file is made
//! durable under its final name, an `installing` record is written, the
//! applier replaces its copy ([`Apply::install`]), and only then are the
//! mark and the current snapshot recorded and `installing` removed, in
//! one sled batch. A node that starts with `installing` recorded (it died
//! mid-install) installs the same file again before its Raft starts
//! ([`StateMachine::recover`]).

// openraft's traits fix these error types (StorageError, RPCError), large as they are.
#![allow(clippy::result_large_err)]

use crate::snapshot::{CutAfter, group_dir, remove_others, snap_path, sync_dir};
use crate::{Durability, NodeId, ReplicationError, Reply, TypeConfig, decode, encode};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use ricochet_storage::sled_sync::SledSync;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

type StoreResult<T> = Result<T, StorageError<NodeId>>;

const APPLIED: &[u8] = b"applied";
const SNAPSHOT: &[u8] = b"snapshot";
const INSTALLING: &[u8] = b"installing";

type Meta = SnapshotMeta<NodeId, BasicNode>;

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
    /// Captures the applied state for a snapshot. Called between two
    /// applies (nothing is applied meanwhile), so it should only take
    /// what is small and changes in place; the writer it returns streams
    /// the rest (entries that never change once written) while applies
    /// go on.
    fn snapshot(&self) -> crate::Result<Box<dyn SnapshotWriter>>;
    /// Replaces this replica's state with a snapshot another replica's
    /// [`SnapshotWriter`] wrote, read from `from` (not durable until
    /// [`Apply::flush`]). Must be repeatable: a node that died part-way
    /// installs the same snapshot again when it starts.
    fn install(&self, from: &mut dyn std::io::Read) -> crate::Result<()>;
}

/// Streams a captured snapshot ([`Apply::snapshot`]).
pub trait SnapshotWriter: Send {
    /// Writes the snapshot to `out` ([`crate::snapshot::FrameWriter`]
    /// frames, by convention).
    fn write_to(self: Box<Self>, out: &mut dyn std::io::Write) -> crate::Result<()>;
}

pub(crate) fn storage_io(e: StorageIOError<NodeId>) -> StorageError<NodeId> {
    StorageError::IO { source: e }
}

fn snapshot_err(
    meta: Option<&Meta>,
    verb: ErrorVerb,
    e: &ReplicationError,
) -> StorageError<NodeId> {
    storage_io(StorageIOError::new(
        ErrorSubject::Snapshot(meta.map(|m| m.signature())),
        verb,
        openraft::AnyError::new(e),
    ))
}

type Mark = (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>);

/// A group's state machine on one node.
#[derive(Debug, Clone)]
pub struct StateMachine {
    apply: Arc<dyn Apply>,
    meta: sled::Tree,
    /// The database's durable flush (sled's own is not, see
    /// `ricochet_storage::sled_sync`).
    sync: Arc<SledSync>,
    /// What has been applied (in memory; the stored mark may be behind).
    current: Arc<Mutex<Mark>>,
    /// Held while a batch is applied and while a snapshot is captured.
    applying: Arc<tokio::sync::Mutex<()>>,
    /// This group's snapshot directory; `None`: no snapshots.
    dir: Option<PathBuf>,
    /// The file a snapshot being received is written to.
    receiving: Arc<Mutex<Option<PathBuf>>>,
    /// Test fault: an install reads at most this many bytes, then fails.
    cut_install_after: Option<u64>,
}

impl StateMachine {
    /// The state machine of `group` on `db`, applying through `apply`,
    /// keeping its snapshots under `snapshot_root` (none when `None`).
    pub fn open(
        db: &crate::RaftDb,
        group: &str,
        _durability: Durability,
        apply: Arc<dyn Apply>,
        snapshot_root: Option<&Path>,
    ) -> crate::Result<Self> {
        let meta = db.open_tree(format!("meta/{group}"))?;
        let current = match meta.get(APPLIED)? {
            Some(v) => decode(&v)?,
            None => (None, StoredMembership::default()),
        };
        let dir = match snapshot_root {
            Some(root) => {
                let d = group_dir(root, group);
                std::fs::create_dir_all(&d)?;
                Some(d)
            }
            None => None,
        };
        Ok(Self {
            apply,
            meta,
            sync: db.sync().clone(),
            current: Arc::new(Mutex::new(current)),
            applying: Default::default(),
            dir,
            receiving: Default::default(),
            cut_install_after: None,
        })
    }

    /// Makes every install stop with an error after reading `bytes` of the
    /// snapshot (a crash test's fault).
    pub fn cut_installs_after(&mut self, bytes: Option<u64>) {
        self.cut_install_after = bytes;
    }

    fn mark(&self) -> Mark {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Flushes the applier, then stores the mark of what it holds (every
    /// flush interval in both modes, and before a snapshot is built).
    pub async fn checkpoint(&self) -> crate::Result<()> {
        let mark = self.mark();
        self.apply.flush().await?;
        self.meta.insert(APPLIED, encode(&mark)?)?;
        Ok(())
    }

    fn dir(&self) -> crate::Result<&Path> {
        self.dir.as_deref().ok_or_else(|| {
            ReplicationError::Raft("snapshots are not configured on this node".into())
        })
    }

    /// Finishes an install this node began and did not finish (it died
    /// part-way): installs the same snapshot file again. Called before the
    /// group's Raft starts.
    pub async fn recover(&self) -> crate::Result<()> {
        let Some(v) = self.meta.get(INSTALLING)? else {
            return Ok(());
        };
        let meta: Meta = decode(&v)?;
        let path = snap_path(self.dir()?, &meta.snapshot_id);
        tracing::warn!(snapshot = %meta.snapshot_id, "finishing a snapshot install cut short");
        self.install_file(&meta, &path).await
    }

    /// Installs the snapshot file at `path` (durable under that name, and
    /// recorded as `installing`), then records it as the applied state.
    async fn install_file(&self, meta: &Meta, path: &Path) -> crate::Result<()> {
        let _applying = self.applying.lock().await;
        let apply = self.apply.clone();
        let (file, cut) = (path.to_owned(), self.cut_install_after);
        tokio::task::spawn_blocking(move || -> crate::Result<()> {
            let mut f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&file)?);
            match cut {
                Some(left) => apply.install(&mut CutAfter { inner: f, left }),
                None => apply.install(&mut f),
            }
        })
        .await
        .map_err(|e| ReplicationError::Apply(format!("snapshot install task: {e}")))??;
        self.apply.flush().await?;
        let mark: Mark = (meta.last_log_id, meta.last_membership.clone());
        let mut batch = sled::Batch::default();
        batch.insert(APPLIED, encode(&mark)?);
        batch.insert(SNAPSHOT, encode(meta)?);
        batch.remove(INSTALLING);
        self.meta.apply_batch(batch)?;
        self.sync.flush(&self.meta).await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = mark;
        if let Some(dir) = path.parent() {
            remove_others(dir, path);
        }
        tracing::info!(snapshot = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }

    async fn build(&self) -> crate::Result<Snapshot<TypeConfig>> {
        let dir = self.dir()?.to_owned();
        let (mark, writer) = {
            let _applying = self.applying.lock().await;
            (self.mark(), self.apply.snapshot()?)
        };
        // The mark durable at or past the snapshot before openraft may
        // purge the log behind it (a restart re-applies from the mark).
        self.checkpoint().await?;
        let Some(last) = mark.0 else {
            return Err(ReplicationError::Raft(
                "nothing applied yet: no snapshot to build".into(),
            ));
        };
        let id = format!(
            "{}-{}-{}",
            last.leader_id.term,
            last.index,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let path = snap_path(&dir, &id);
        let tmp = dir.join(format!("{id}.building"));
        let (t, p, d) = (tmp.clone(), path.clone(), dir.clone());
        let started = std::time::Instant::now();
        let bytes = tokio::task::spawn_blocking(move || -> crate::Result<u64> {
            let file = std::fs::File::create(&t)?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            writer.write_to(&mut out)?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            let len = file.metadata()?.len();
            std::fs::rename(&t, &p)?;
            sync_dir(&d)?;
            Ok(len)
        })
        .await
        .map_err(|e| ReplicationError::Apply(format!("snapshot build task: {e}")))?;
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let meta = Meta {
            last_log_id: Some(last),
            last_membership: mark.1,
            snapshot_id: id,
        };
        self.meta.insert(SNAPSHOT, encode(&meta)?)?;
        self.sync.flush(&self.meta).await?;
        remove_others(&dir, &path);
        tracing::info!(
            snapshot = %meta.snapshot_id,
            bytes,
            ms = started.elapsed().as_millis() as u64,
            "snapshot built"
        );
        let file = tokio::fs::File::open(&path).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }

    async fn current_snapshot(&self) -> crate::Result<Option<Snapshot<TypeConfig>>> {
        let Some(v) = self.meta.get(SNAPSHOT)? else {
            return Ok(None);
        };
        let meta: Meta = decode(&v)?;
        let file = tokio::fs::File::open(snap_path(self.dir()?, &meta.snapshot_id)).await?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }

    async fn begin_receiving(&self) -> crate::Result<tokio::fs::File> {
        let dir = self.dir()?;
        let path = dir.join(format!(
            "receiving-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        let previous = self
            .receiving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(path);
        if let Some(p) = previous {
            let _ = std::fs::remove_file(p);
        }
        Ok(file)
    }

    async fn install_received(&self, meta: &Meta, file: tokio::fs::File) -> crate::Result<()> {
        file.sync_all().await?;
        drop(file);
        let received = self
            .receiving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| ReplicationError::Raft("no snapshot was being received".into()))?;
        let dir = self.dir()?;
        let path = snap_path(dir, &meta.snapshot_id);
        std::fs::rename(&received, &path)?;
        sync_dir(dir)?;
        self.meta.insert(INSTALLING, encode(meta)?)?;
        self.sync.flush(&self.meta).await?;
        self.install_file(meta, &path).await
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        self.build()
            .await
            .map_err(|e| snapshot_err(None, ErrorVerb::Write, &e))
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
        let applying = self.applying.clone();
        let _applying = applying.lock().await;
        let started = std::time::Instant::now();
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
        crate::latency::record(crate::latency::APPLY, started);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<tokio::fs::File>> {
        self.begin_receiving()
            .await
            .map(Box::new)
            .map_err(|e| snapshot_err(None, ErrorVerb::Write, &e))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<tokio::fs::File>,
    ) -> StoreResult<()> {
        self.install_received(meta, *snapshot)
            .await
            .map_err(|e| snapshot_err(Some(meta), ErrorVerb::Write, &e))
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        self.current_snapshot()
            .await
            .map_err(|e| snapshot_err(None, ErrorVerb::Read, &e))
    }
}
