//! One broker's member of one group: opens the group's log and state
//! machine, starts openraft, registers the group with the broker's
//! `Replication` service, and turns openraft's answers into this crate's
//! errors.

use crate::log_store::LogStore;
use crate::network::{GroupRegistry, NetworkFactory, PeerTransport};
use crate::state_machine::StateMachine;
use crate::{Apply, Command, NodeId, Raft, ReplicationError, Result};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, SnapshotPolicy};
use ricochet_storage::sled_sync::SledSync;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// When a write counts as stored on a node (the broker's `durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Log appends and applied state are flushed (fsync) before they are
    /// reported: a commit is on the disks of a majority.
    Sync,
    /// Flushed every [`NodeSettings::flush_interval`]: a commit is in the
    /// memory of a majority and on their disks within one interval.
    Interval,
}

/// How a node runs its groups.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// When a write counts as stored.
    pub durability: Durability,
    /// How often the applied state is flushed and its mark written (both
    /// modes), and in `Interval` mode how often the log is flushed.
    pub flush_interval: Duration,
    /// How often a leader sends heartbeats.
    pub heartbeat: Duration,
    /// A follower that heard no leader for a random time in this range
    /// stands for election.
    pub election_timeout: (Duration, Duration),
    /// Addresses to reach these peers at instead of the ones in the
    /// group's membership (a test routes each pair of nodes through its
    /// own fault proxy this way).
    pub peer_addrs: BTreeMap<NodeId, String>,
    /// How peers are reached: TLS for `https://` peers, the token calls
    /// carry (default: plain, no credentials).
    pub transport: PeerTransport,
    /// Where the groups' snapshot files are kept (a directory per group);
    /// `None`: no snapshots: the log is kept whole and a snapshot offered
    /// by a leader is refused.
    pub snapshot_dir: Option<PathBuf>,
    /// A snapshot is built once this many entries were applied since the
    /// last one (0: never built here; one sent by a leader is still
    /// installed), and the log purged up to it.
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot, so a follower a little
    /// behind catches up from the log rather than a whole snapshot.
    pub snapshot_keep: u64,
    /// How long a leader waits for a follower to take the last chunk of a
    /// snapshot and install it.
    pub install_timeout: Duration,
    /// Test fault: every snapshot install on this node stops with an error
    /// after reading this many bytes (as a crash part-way would stop it).
    #[doc(hidden)]
    pub cut_installs_after: Option<u64>,
}

impl Default for NodeSettings {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            flush_interval: Duration::from_millis(500),
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(500), Duration::from_millis(1000)),
            peer_addrs: BTreeMap::new(),
            transport: PeerTransport::default(),
            snapshot_dir: None,
            snapshot_every: 10_000,
            snapshot_keep: 1_000,
            install_timeout: Duration::from_secs(60),
            cut_installs_after: None,
        }
    }
}

impl NodeSettings {
    fn raft_config(&self, group: &str) -> Result<Arc<Config>> {
        let ms = |d: Duration| d.as_millis() as u64;
        let config = Config {
            cluster_name: group.to_owned(),
            heartbeat_interval: ms(self.heartbeat),
            election_timeout_min: ms(self.election_timeout.0),
            election_timeout_max: ms(self.election_timeout.1),
            snapshot_policy: match (&self.snapshot_dir, self.snapshot_every) {
                (Some(_), every) if every > 0 => SnapshotPolicy::LogsSinceLast(every),
                _ => SnapshotPolicy::Never,
            },
            max_in_snapshot_log_to_keep: self.snapshot_keep,
            install_snapshot_timeout: ms(self.install_timeout),
            ..Config::default()
        };
        Ok(Arc::new(
            config
                .validate()
                .map_err(|e| ReplicationError::Raft(e.to_string()))?,
        ))
    }
}

/// The sled segment size of a new Raft database. sled writes a value
/// above a quarter of it to a file of its own (a blob: a file created,
/// written, and deleted later, per entry); with sled's default (512 KiB)
/// every entry above 128 KiB, as a producer's batch of 1 000 messages of
/// 100 B is, became a file, and creating them took about a fifth of the
/// Raft threads' time (`perf`, ext4 inode allocation). At 4 MiB entries up
/// to 1 MiB stay in sled's log.
const SEGMENT_SIZE: usize = 4 << 20;

/// The segment size of the database at `path`: the one it was created
/// with (sled refuses to open it with another), else [`SEGMENT_SIZE`].
fn segment_size(path: &Path) -> usize {
    std::fs::read(path.join("conf"))
        .ok()
        .and_then(|conf| {
            String::from_utf8_lossy(&conf).lines().find_map(|l| {
                l.strip_prefix("segment_size:")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(SEGMENT_SIZE)
}

/// A node's Raft database, shared by its groups (derefs to the sled
/// database), with its durable flush: sled's own flush is not (see
/// `ricochet_storage::sled_sync`).
#[derive(Debug, Clone)]
pub struct RaftDb {
    db: sled::Db,
    sync: Arc<SledSync>,
    log_dir: PathBuf,
}

impl std::ops::Deref for RaftDb {
    type Target = sled::Db;
    fn deref(&self) -> &sled::Db {
        &self.db
    }
}

impl RaftDb {
    /// The database's durable flush (blob files, sled's flush, an
    /// `fdatasync` of its data file), for what must survive a power cut:
    /// the vote, the purge point, the applied mark.
    pub fn sync(&self) -> &Arc<SledSync> {
        &self.sync
    }

    /// Where the groups' logs are: a directory of segment files per group
    /// (`<dir>/raft-log`, next to the database; see [`crate::log_store`]).
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
}

/// Opens the node's Raft database (`<dir>/raft`), shared by its groups.
pub fn open_db(dir: &Path, settings: &NodeSettings) -> Result<RaftDb> {
    let flush_every = match settings.durability {
        Durability::Sync => None,
        Durability::Interval => Some(settings.flush_interval.as_millis().max(1) as u64),
    };
    let path = dir.join("raft");
    let db = sled::Config::new()
        .segment_size(segment_size(&path))
        .path(&path)
        .flush_every_ms(flush_every)
        .open()?;
    Ok(RaftDb {
        sync: Arc::new(SledSync::open(&path)?),
        db,
        log_dir: dir.join("raft-log"),
    })
}

/// Removes `group`'s Raft log, vote, applied mark and snapshots (its
/// member on this node stopped: the group was deleted, or this node left
/// it), so a group of the same name starts afresh.
pub fn remove_group(db: &RaftDb, settings: &NodeSettings, group: &str) -> Result<()> {
    db.drop_tree(format!("log/{group}"))?;
    db.drop_tree(format!("meta/{group}"))?;
    let log = crate::log_store::group_log_dir(db.log_dir(), group);
    let converting = log.with_file_name(format!(
        "{}.converting",
        log.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    ));
    for d in [log, converting] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
    }
    if let Some(root) = &settings.snapshot_dir {
        let dir = crate::snapshot::group_dir(root, group);
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
    }
    Ok(())
}

/// The error a write's refusal by openraft becomes.
fn write_error(group: &str, e: ClientWriteError<NodeId, BasicNode>) -> ReplicationError {
    match e {
        ClientWriteError::ForwardToLeader(f) => ReplicationError::NotLeader {
            group: group.to_owned(),
            leader: f.leader_id,
            leader_addr: f.leader_node.map(|n| n.addr),
        },
        e => ReplicationError::Raft(e.to_string()),
    }
}

/// How long a leader handing its leadership over waits, with the target
/// holding its whole log, for no new entry before it asks the target to
/// stand ([`ReplicaNode::transfer_leadership`]).
const TRANSFER_QUIET: Duration = Duration::from_millis(100);

/// A leader's view of its group's replication ([`ReplicaNode::progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The leader's last log index.
    pub last_index: u64,
    /// Each other member's matched index (what the leader knows it holds).
    pub matched: BTreeMap<NodeId, Option<u64>>,
}

/// This node's member of one group.
pub struct ReplicaNode {
    id: NodeId,
    group: String,
    raft: Raft,
    registry: GroupRegistry,
    checkpoints: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// How peers are reached ([`NodeSettings::peer_addrs`],
    /// [`NodeSettings::transport`]), for the calls made outside openraft.
    peer_addrs: BTreeMap<NodeId, String>,
    transport: PeerTransport,
}

impl std::fmt::Debug for ReplicaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaNode")
            .field("id", &self.id)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl ReplicaNode {
    /// Starts node `id` of `group` on `db`, applying committed commands
    /// through `apply`, and routes the group's requests to it. A node
    /// restarted on the same `db` resumes from its log and vote.
    pub async fn start(
        id: NodeId,
        group: &str,
        db: &RaftDb,
        settings: &NodeSettings,
        apply: Arc<dyn Apply>,
        registry: &GroupRegistry,
    ) -> Result<Self> {
        let log = LogStore::open(db, group, settings)?;
        let mut sm = StateMachine::open(
            db,
            group,
            settings.durability,
            apply,
            settings.snapshot_dir.as_deref(),
        )?;
        sm.cut_installs_after(settings.cut_installs_after);
        sm.recover().await?;
        // Both modes: the log is what makes a commit durable (see
        // `state_machine`); the applied state is flushed every interval.
        let checkpoints = Some({
            let sm = sm.clone();
            let every = settings.flush_interval;
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    if let Err(e) = sm.checkpoint().await {
                        tracing::error!(error = %e, "raft state machine checkpoint failed");
                    }
                }
            })
        });
        let raft = Raft::new(
            id,
            settings.raft_config(group)?,
            NetworkFactory::new(
                group,
                id,
                settings.peer_addrs.clone(),
                settings.transport.clone(),
            ),
            log,
            sm,
        )
        .await
        .map_err(|e| ReplicationError::Raft(e.to_string()))?;
        registry.insert(group, raft.clone());
        Ok(Self {
            id,
            group: group.to_owned(),
            raft,
            registry: registry.clone(),
            checkpoints: std::sync::Mutex::new(checkpoints),
            peer_addrs: settings.peer_addrs.clone(),
            transport: settings.transport.clone(),
        })
    }

    /// Makes this node's group `members` (id → `http://host:port` of its
    /// broker's Replication service). Done once, on one node, for a new
    /// group; a group that already has a membership refuses it.
    pub async fn initialize(&self, members: BTreeMap<NodeId, String>) -> Result<()> {
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .into_iter()
            .map(|(id, addr)| (id, BasicNode { addr }))
            .collect();
        self.raft
            .initialize(nodes)
            .await
            .map_err(|e| ReplicationError::Raft(e.to_string()))
    }

    /// Proposes `command`; answers the applier's reply once the command is
    /// committed (stored by a majority) and applied here. Only the leader
    /// accepts: elsewhere [`ReplicationError::NotLeader`] names it. A leader
    /// cut off from its majority never answers (the caller's deadline
    /// decides how long to wait), and never answers `Ok` for a command the
    /// group did not commit.
    pub async fn write(&self, command: Vec<u8>) -> Result<Vec<u8>> {
        let started = std::time::Instant::now();
        match self.raft.client_write(Command(command.into())).await {
            Ok(r) => {
                crate::latency::record(crate::latency::COMMIT, started);
                Ok(r.data.0)
            }
            Err(RaftError::APIError(e)) => Err(write_error(&self.group, e)),
            Err(RaftError::Fatal(f)) => Err(ReplicationError::Stopped {
                group: self.group.clone(),
                message: f.to_string(),
            }),
        }
    }

    /// [`ReplicaNode::write`] in two steps: hands `command` to the Raft
    /// core and returns at once with the future of its reply. Commands
    /// submitted one after another (each submit awaited before the next)
    /// take log entries in that order, and several may be in flight. The
    /// leader's core (openraft 0.9) appends each entry as its own log write
    /// (one flush each, in `sync`) before it replicates it; the followers
    /// receive the entries appended meanwhile in one message. The reply
    /// comes under the same conditions as [`ReplicaNode::write`]'s.
    pub async fn submit(
        &self,
        command: Vec<u8>,
    ) -> Result<impl std::future::Future<Output = Result<Vec<u8>>> + Send + 'static> {
        let started = std::time::Instant::now();
        let rx = self
            .raft
            .client_write_ff(Command(command.into()))
            .await
            .map_err(|f| ReplicationError::Stopped {
                group: self.group.clone(),
                message: f.to_string(),
            })?;
        let group = self.group.clone();
        Ok(async move {
            match rx.await {
                Ok(Ok(r)) => {
                    crate::latency::record(crate::latency::COMMIT, started);
                    Ok(r.data.0)
                }
                Ok(Err(e)) => Err(write_error(&group, e)),
                Err(_) => Err(ReplicationError::Stopped {
                    group,
                    message: "the Raft core ended before it answered the write".to_owned(),
                }),
            }
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The group's leader as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// The index of the last entry applied here.
    pub fn applied_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().last_applied.map(|l| l.index)
    }

    /// The last log index covered by this node's current snapshot (built
    /// here or installed from a leader), if any.
    pub fn snapshot_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().snapshot.map(|l| l.index)
    }

    /// The last log index purged from this node's log, if any.
    pub fn purged_index(&self) -> Option<u64> {
        self.raft.metrics().borrow().purged.map(|l| l.index)
    }

    /// The group's replication as this node sees it when it leads: its
    /// last log index and each other member's matched index (`None` while
    /// the leader knows nothing it holds); `None` when it does not lead.
    pub fn progress(&self) -> Option<Progress> {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader != Some(self.id) {
            return None;
        }
        let matched = m
            .replication
            .unwrap_or_default()
            .into_iter()
            .filter(|(id, _)| *id != self.id)
            .map(|(id, log)| (id, log.map(|l| l.index)))
            .collect();
        Some(Progress {
            last_index: m.last_log_index.unwrap_or(0),
            matched,
        })
    }

    /// The group's voters as this node knows them (the last membership
    /// it holds, joint or not: every voter of either side).
    pub fn voters(&self) -> std::collections::BTreeSet<NodeId> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Makes the group's voters exactly `wanted` (id → address of its
    /// broker's Replication service), on the leader: each new one is added
    /// as a learner and caught up (a snapshot and the log after it) before
    /// the membership switches (openraft's joint consensus); voters not in
    /// `wanted` are removed with the switch. `within` bounds the whole.
    pub async fn change_voters(
        &self,
        wanted: BTreeMap<NodeId, String>,
        within: Duration,
    ) -> Result<()> {
        let work = async {
            let have = self.voters();
            for (id, addr) in &wanted {
                if !have.contains(id) {
                    tracing::info!(group = %self.group, node = id, %addr, "adding a learner");
                    self.raft
                        .add_learner(*id, BasicNode { addr: addr.clone() }, true)
                        .await
                        .map_err(|e| self.write_error(e))?;
                    // openraft's "caught up" allows a lag of
                    // `replication_lag_threshold` (5 000 entries): a learner
                    // that holds nothing yet passes on a short log. Wait
                    // until it holds the log as it is now.
                    let end = self.raft.metrics().borrow().last_log_index;
                    let mut metrics = self.raft.metrics();
                    metrics
                        .wait_for(|m| {
                            let held = m
                                .replication
                                .as_ref()
                                .and_then(|r| r.get(id).copied().flatten())
                                .map(|l| l.index);
                            held >= end
                        })
                        .await
                        .map_err(|_| ReplicationError::Stopped {
                            group: self.group.clone(),
                            message: "the node stopped while a learner caught up".into(),
                        })?;
                    tracing::info!(group = %self.group, node = id, "learner caught up");
                }
            }
            let ids: std::collections::BTreeSet<NodeId> = wanted.keys().copied().collect();
            self.raft
                .change_membership(ids, false)
                .await
                .map_err(|e| self.write_error(e))?;
            Ok(())
        };
        tokio::time::timeout(within, work).await.map_err(|_| {
            ReplicationError::Raft(format!(
                "group {}: the membership change did not finish within {within:?}",
                self.group
            ))
        })?
    }

    /// Hands the leadership to voter `to`, on the leader, once the caller
    /// stopped proposing (a transfer in a log that still grows fails):
    /// waits until `to` holds the whole log, asks it to stand for election
    /// (the `Elect` call), and answers once this node knows `to` leads.
    /// `to` wins at once when this node has led for longer than its lease
    /// (`election_timeout_max`; a younger leader refuses the vote and the
    /// group elects after an election timeout instead) and the third
    /// member's vote is not needed. `within` bounds the whole; on an error
    /// this node may still lead (the caller resumes), or not.
    pub async fn transfer_leadership(&self, to: NodeId, within: Duration) -> Result<()> {
        let not_leader = |leader| ReplicationError::NotLeader {
            group: self.group.clone(),
            leader,
            leader_addr: None,
        };
        let work = async {
            let addr = {
                let m = self.raft.metrics().borrow().clone();
                if m.current_leader != Some(self.id) {
                    return Err(not_leader(m.current_leader));
                }
                let membership = m.membership_config.membership();
                if to == self.id || !membership.voter_ids().any(|v| v == to) {
                    return Err(ReplicationError::Raft(format!(
                        "group {}: node {to} is not another voter",
                        self.group
                    )));
                }
                match self.peer_addrs.get(&to) {
                    Some(a) => a.clone(),
                    None => membership
                        .get_node(&to)
                        .map(|n| n.addr.clone())
                        .unwrap_or_default(),
                }
            };
            let stopped = || ReplicationError::Stopped {
                group: self.group.clone(),
                message: "the node stopped during a leadership transfer".into(),
            };
            let held = |m: &openraft::RaftMetrics<NodeId, BasicNode>| {
                m.replication
                    .as_ref()
                    .and_then(|r| r.get(&to).copied().flatten())
                    .map(|l| l.index)
            };
            let mut metrics = self.raft.metrics();
            loop {
                // `to` holds the whole log, and it stayed whole for
                // `TRANSFER_QUIET` (writes still in flight when the caller
                // stopped proposing land meanwhile: a candidate missing
                // them would be refused).
                let last = loop {
                    let m = metrics
                        .wait_for(|m| {
                            m.current_leader != Some(self.id) || held(m) >= m.last_log_index
                        })
                        .await
                        .map_err(|_| stopped())?
                        .clone();
                    if m.current_leader != Some(self.id) {
                        return Err(not_leader(m.current_leader));
                    }
                    tokio::time::sleep(TRANSFER_QUIET).await;
                    let now = self.raft.metrics().borrow().clone();
                    if now.current_leader == Some(self.id)
                        && now.last_log_index == m.last_log_index
                        && held(&now) >= now.last_log_index
                    {
                        break now.last_log_index;
                    }
                };
                tracing::info!(group = %self.group, node = to, ?last, "handing the leadership over");
                crate::network::ask_to_elect(&self.transport, &addr, &self.group, self.id, last)
                    .await?;
                // This node steps down once `to` stands (a higher term);
                // then `to` leads, or this node leads again (`to`'s
                // candidacy failed and this node won the next election):
                // then once more.
                match tokio::time::timeout(
                    TRANSFER_QUIET * 20,
                    metrics.wait_for(|m| m.current_leader != Some(self.id)),
                )
                .await
                {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => return Err(stopped()),
                    Err(_) => {
                        tracing::info!(group = %self.group, node = to, "still leading after asking; trying again");
                        continue;
                    }
                }
                let m = metrics
                    .wait_for(|m| m.current_leader == Some(to) || m.current_leader == Some(self.id))
                    .await
                    .map_err(|_| stopped())?
                    .clone();
                if m.current_leader == Some(to) {
                    return Ok(());
                }
                tracing::info!(group = %self.group, node = to, "the leadership did not move; trying again");
            }
        };
        tokio::time::timeout(within, work).await.map_err(|_| {
            ReplicationError::Raft(format!(
                "group {}: node {to} did not take the leadership within {within:?}",
                self.group
            ))
        })?
    }

    fn write_error(
        &self,
        e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
    ) -> ReplicationError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                ReplicationError::NotLeader {
                    group: self.group.clone(),
                    leader: f.leader_id,
                    leader_addr: f.leader_node.map(|n| n.addr),
                }
            }
            RaftError::APIError(e) => ReplicationError::Raft(e.to_string()),
            RaftError::Fatal(f) => ReplicationError::Stopped {
                group: self.group.clone(),
                message: f.to_string(),
            },
        }
    }

    /// The openraft handle (metrics, membership changes).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Stops the group on this node (clean: the Raft core ends, the
    /// service stops routing to it).
    pub async fn shutdown(self) {
        self.stop().await;
    }

    /// [`ReplicaNode::shutdown`] through a shared handle: later writes
    /// fail with [`ReplicationError::Stopped`].
    pub async fn stop(&self) {
        self.stop_local();
        let _ = self.raft.shutdown().await;
    }

    fn stop_local(&self) {
        self.registry.remove(&self.group);
        let task = self
            .checkpoints
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = task {
            t.abort();
        }
    }
}

impl Drop for ReplicaNode {
    fn drop(&mut self) {
        self.stop_local();
    }
}

#[cfg(test)]
mod tests {
    use super::{NodeSettings, SEGMENT_SIZE, open_db, segment_size};

    #[test]
    fn a_raft_database_keeps_the_segment_size_it_was_created_with() {
        // One made by an earlier broker, with sled's default: still opens.
        let old = tempfile::tempdir().expect("temp dir");
        drop(sled::Config::new().path(old.path().join("raft")).open());
        let reopened = open_db(old.path(), &NodeSettings::default());
        assert!(reopened.is_ok(), "{:?}", reopened.err());
        drop(reopened);
        assert_eq!(segment_size(&old.path().join("raft")), 512 * 1024);
        // A new one gets the larger segments.
        let fresh = tempfile::tempdir().expect("temp dir");
        drop(open_db(fresh.path(), &NodeSettings::default()).expect("new database"));
        assert_eq!(segment_size(&fresh.path().join("raft")), SEGMENT_SIZE);
    }
}
