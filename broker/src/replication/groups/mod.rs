//! This broker's replication groups in cluster mode: which brokers hold a
//! replicated topic (recorded in etcd), starting this broker's member of
//! each group it belongs to, and following who leads.
//!
//! etcd keys beside the cluster's own (under `/ricochet/<cluster>/`):
//! `groups/<topic>`, a [`GroupRecord`] (JSON, persistent, written once by
//! the broker the create was placed on, which is its first member). A
//! member's Raft node id is its position in the record plus one. Every
//! broker reads the records every [`WATCH_EVERY`] and starts its member of
//! the groups that name it; the first member initializes the membership
//! with the members' advertised URLs (the `Replication` service runs on
//! the broker's gRPC port).
//!
//! Leadership (the Raft leader owns the topic; a change a member sees
//! wakes the reading at once): a member that becomes the group's leader
//! waits until it applied everything committed, then points
//! `placement/<topic>` at itself (a compare-and-set on what it read) and
//! claims the topic as any owner does, so `Lookup` answers it and other
//! brokers redirect to it; a member that stops leading hands the topic to
//! the new leader (its streams end, clients look it up again).

mod forming;
mod leading;
mod members;
mod moves;
mod transfer;

pub use moves::{MOVE_WITHIN, MemberMoved};

use super::{
    NodeSettings, PartitionCommand, PartitionReply, ReplicatedPartition, ReplicatedStorage,
};
use crate::core::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::storage::{Storage, TopicKind, TopicRecord};
use ricochet_cluster::Cluster;
use ricochet_cluster::etcd::Created;
use ricochet_replication::{GroupRegistry, NodeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// How often the group records are read (a new group's other members
/// start within this).
pub const WATCH_EVERY: Duration = Duration::from_millis(500);

/// How long a replicated write waits for the group to commit it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a create waits for the new group to commit its first entry.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

pub use super::record::GroupRecord;

/// What this broker does for a replicated topic it holds a replica of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Another member leads (or none is known and this one never led).
    Follower,
    /// This member leads and the topic is placed and claimed here.
    Serving,
    /// This member led, stopped, and no new leader is known yet: not
    /// served here, still placed here.
    Parked,
    /// This member leads, closed the topic and is handing the leadership
    /// to another member (a move to a member, [`transfer`]): not served
    /// here, still placed here.
    Handing,
}

/// One started member: its Raft node and the group it belongs to.
#[derive(Debug)]
struct Member {
    partition: Arc<ReplicatedPartition>,
    record: GroupRecord,
}

/// This broker's groups.
pub struct Groups {
    cluster: Arc<Cluster>,
    core: Arc<BrokerCore>,
    storage: Arc<dyn Storage>,
    registry: GroupRegistry,
    settings: NodeSettings,
    db: ricochet_replication::RaftDb,
    /// Every replicated topic of the cluster, as last read.
    known: RwLock<HashMap<String, GroupRecord>>,
    /// The members started here.
    started: tokio::sync::Mutex<HashMap<String, Member>>,
    /// What this broker does for each of its groups' topics.
    leaders: Mutex<HashMap<String, Role>>,
    /// The storage of each topic served here (led by this broker).
    serving: Mutex<HashMap<String, ReplicatedStorage>>,
    /// Where the groups' Raft nodes run (see [`RaftRuntime`]).
    runtime: RaftRuntime,
    /// Woken when a member here sees its group's leader change.
    leader_changed: Arc<tokio::sync::Notify>,
    /// What this broker remembers between its reports on the groups it
    /// leads.
    reports: Mutex<HashMap<String, super::status::Tracker>>,
    /// `[cluster] replace_after` (zero: never).
    replace_after: Duration,
    /// Since when this broker, leading, has seen each (topic, member
    /// broker) not live.
    down_since: Mutex<HashMap<(String, String), std::time::Instant>>,
    /// Groups led here with a member down too long and no broker to
    /// replace it.
    unreplaced: Mutex<std::collections::HashSet<String>>,
    /// Groups whose membership change is under way here.
    changing: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Copies of groups that replaced this broker were looked for.
    swept: std::sync::atomic::AtomicBool,
    /// The peer role each broker registered: who may speak Raft for it.
    peers: super::PeerRoles,
    /// Groups whose create (record written, membership not initialized
    /// yet) is under way in this process (see [`forming`]).
    forming: Mutex<std::collections::HashSet<String>>,
    /// Groups led here whose leader holds a command back (a member does
    /// not advertise its level, [`super::gate`]), with the reason last
    /// logged: logged once per change, forgotten when the topic is closed.
    held: Mutex<super::gate::HeldBack>,
}

/// The runtime the Raft nodes of this broker's groups run on, apart from
/// the broker's: a leader's replicated write blocks the thread that makes
/// it until the group commits (`ReplicatedStorage`), some of them holding
/// a lock other tasks then wait for on their worker threads (a topic's
/// writer). On one runtime, enough such waits leave no worker to run the
/// Raft node the commit needs (and no timer to end the wait): the broker
/// stops, its etcd lease with it. Here the commit never needs the
/// broker's workers.
struct RaftRuntime(Option<tokio::runtime::Runtime>);

impl RaftRuntime {
    fn start() -> Result<Self> {
        // RICOCHET_RAFT_WORKERS: a measuring knob (docs/src/replication-history-throughput.md,
        // "Session 12"), 2 by default.
        let workers = std::env::var("RICOCHET_RAFT_WORKERS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(2);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("ricochet-raft")
            .enable_all()
            .build()?;
        Ok(Self(Some(rt)))
    }

    fn handle(&self) -> Option<tokio::runtime::Handle> {
        self.0.as_ref().map(|r| r.handle().clone())
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        // Dropped in async code too, where a runtime may not block.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The check of per-broker identities on every `Replication` request
/// (installed with `[auth]` on; see [`super::peers`]).
impl ricochet_replication::PeerGuard for Groups {
    fn admit(
        &self,
        caller: &tonic::Extensions,
        group: &str,
        call: ricochet_replication::PeerCall,
        node: NodeId,
    ) -> std::result::Result<(), tonic::Status> {
        let known = ricochet_storage::util::read(&self.known);
        let record = super::peers::record_of(&known, group);
        self.peers.check(
            caller.get::<crate::auth::Principal>(),
            (group, call, node),
            record,
        )
    }
}

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Groups {
    /// Opens the groups' Raft database under `data_dir` and starts reading
    /// the group records (until `shutdown`).
    pub fn start(
        cluster: Arc<Cluster>,
        core: Arc<BrokerCore>,
        registry: GroupRegistry,
        settings: NodeSettings,
        data_dir: &std::path::Path,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<Arc<Self>> {
        let db = ricochet_replication::open_db(data_dir, &settings).map_err(replication)?;
        let mut settings = settings;
        if settings.snapshot_dir.is_none() {
            settings.snapshot_dir = Some(data_dir.join("raft-snapshots"));
        }
        let replace_after = core
            .config
            .cluster
            .as_ref()
            .map_or(Duration::ZERO, |c| c.replace_after);
        let groups = Arc::new(Self {
            replace_after,
            down_since: Default::default(),
            unreplaced: Default::default(),
            changing: Default::default(),
            swept: Default::default(),
            peers: Default::default(),
            forming: Default::default(),
            cluster,
            storage: core.storage.clone(),
            core,
            registry,
            settings,
            db,
            known: Default::default(),
            started: Default::default(),
            leaders: Default::default(),
            serving: Default::default(),
            runtime: RaftRuntime::start()?,
            leader_changed: Default::default(),
            reports: Default::default(),
            held: Default::default(),
        });
        let g = groups.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = g.refresh().await {
                    tracing::warn!(error = %e, "cannot read the replication groups");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(WATCH_EVERY) => {}
                    // A member saw its group's leader change: act now, not
                    // at the next read.
                    _ = g.leader_changed.notified() => {}
                }
            }
        });
        Ok(groups)
    }

    fn group_key(&self, topic: &str) -> String {
        self.cluster.key(&format!("groups/{topic}"))
    }

    /// The group of `topic` when it is replicated, as last read (one map
    /// read; a group created a moment ago elsewhere may be missed until
    /// the next read).
    pub fn group_of(&self, topic: &str) -> Option<GroupRecord> {
        ricochet_storage::util::read(&self.known)
            .get(topic)
            .cloned()
    }

    /// Every replicated topic of the cluster with its group, as last read.
    pub fn all(&self) -> Vec<(String, GroupRecord)> {
        let known = ricochet_storage::util::read(&self.known);
        let mut all: Vec<_> = known.iter().map(|(t, r)| (t.clone(), r.clone())).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The group of `topic` from etcd now.
    pub async fn read_group(&self, topic: &str) -> Result<Option<GroupRecord>> {
        let Some(kv) = self.cluster.etcd().get(&self.group_key(topic)).await? else {
            return Ok(None);
        };
        let record: GroupRecord = serde_json::from_str(&kv.value)
            .map_err(|e| BrokerError::Etcd(format!("bad group record of {topic}: {e}")))?;
        ricochet_storage::util::write(&self.known).insert(topic.to_owned(), record.clone());
        Ok(Some(record))
    }

    /// Creates `topic` with factor `replicas` (> 1) as a group led first by
    /// this broker (the one the create was placed on) and `replicas - 1`
    /// other live brokers, fewest placed topics first. Answers once the
    /// group committed the topic's creation; `false` when the group existed
    /// with this factor already.
    pub async fn create(&self, topic: &TopicName, replicas: u32) -> Result<bool> {
        if let Some(existing) = self.read_group(topic.as_str()).await? {
            let created = exists(topic, &existing, replicas)?;
            // A create that timed out may have left the group without its
            // topic: the leader commits it again (creating is idempotent).
            if let Some(p) = self.member(topic.as_str()).await
                && p.node().leader() == Some(p.node().id())
            {
                let command = create_command(topic, replicas);
                tokio::time::timeout(FORM_TIMEOUT, propose_as_leader(&p, &command, None))
                    .await
                    .map_err(|_| {
                        BrokerError::Peer(format!(
                            "the replication group of {topic} did not commit within {FORM_TIMEOUT:?}"
                        ))
                    })??;
            }
            return Ok(created);
        }
        let me = self.cluster.id().to_owned();
        let mut others: Vec<_> = self
            .cluster
            .brokers()
            .await?
            .into_iter()
            .filter(|b| b.live && !b.draining && b.id != me)
            .collect();
        others.sort_by(|a, b| (a.placed, &a.id).cmp(&(b.placed, &b.id)));
        let need = replicas as usize - 1;
        if others.len() < need {
            return Err(BrokerError::Conflict(format!(
                "replication factor {replicas} needs {replicas} live brokers; {} are live (and not draining)",
                others.len() + 1
            )));
        }
        // Only brokers sharing this one's object store (see [`super::tier`]).
        let mine = self.cluster.tier();
        let left_out = super::tier::differing(
            mine,
            others.iter().map(|b| (b.id.as_str(), b.tier.as_deref())),
        );
        others.retain(|b| !left_out.iter().any(|(id, _)| *id == b.id));
        if others.len() < need {
            return Err(super::tier::refusal(replicas, others.len() + 1, &left_out));
        }
        let urls: BTreeMap<NodeId, String> = std::iter::once(self.cluster.url().to_owned())
            .chain(others.iter().take(need).map(|b| b.url.clone()))
            .enumerate()
            .map(|(i, u)| (i as NodeId + 1, u))
            .collect();
        let record = GroupRecord {
            ids: Vec::new(),
            next_id: 0,
            leaving: Vec::new(),
            incarnation: ricochet_storage::util::wall_ms(),
            replicas,
            members: std::iter::once(me)
                .chain(others.into_iter().take(need).map(|b| b.id))
                .collect(),
        };
        let json = serde_json::to_string(&record)
            .map_err(|e| BrokerError::Etcd(format!("cannot encode a group record: {e}")))?;
        let forming = forming::Forming::start(self, topic.as_str());
        match self
            .cluster
            .etcd()
            .create_if_absent(&self.group_key(topic.as_str()), &json, 0)
            .await?
        {
            Created::Created(_) => {}
            Created::Exists(kv) => {
                let existing: GroupRecord = serde_json::from_str(&kv.value)
                    .map_err(|e| BrokerError::Etcd(format!("bad group record of {topic}: {e}")))?;
                return exists(topic, &existing, replicas);
            }
        }
        ricochet_storage::util::write(&self.known).insert(topic.to_string(), record.clone());
        tracing::info!(%topic, replicas, members = ?record.members, "replication group placed");
        ricochet_storage::util::failpoint("groups.create.after_record");
        let partition = self.start_member(topic.as_str(), &record).await?;
        partition
            .node()
            .initialize(urls)
            .await
            .map_err(replication)?;
        drop(forming);
        let command = create_command(topic, replicas);
        match tokio::time::timeout(
            FORM_TIMEOUT,
            self.commit_creation(&partition, &command, topic),
        )
        .await
        {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BrokerError::Peer(format!(
                "the replication group of {topic} did not commit its creation within {FORM_TIMEOUT:?} \
                 (are its members {:?} reachable?)",
                record.members
            ))),
        }
    }

    /// A topic used before it exists (a producer or consumer, with
    /// auto-creation on) whose namespace's default factor, else the
    /// cluster's `cluster_default`, is above 1: created here (the broker it
    /// was placed on) as a group, answering once this broker serves it.
    /// `false`, creating nothing, when the default is 1, or for a name the
    /// default does not apply to (a partition, a system topic, a tier).
    pub async fn create_on_first_use(
        &self,
        topic: &TopicName,
        cluster_default: u32,
    ) -> Result<bool> {
        let name = topic.as_str();
        if crate::name::is_system_topic(name)
            || self.core.is_tier_name(name)
            || self.core.topic(topic).await.is_ok()
        {
            return Ok(false);
        }
        // A partition takes its partitioned topic's factor (1 without one).
        let wanted = match ricochet_proto::partitions::parse_partition(name) {
            Some((base, _)) => super::namespaces::partitioned_factor(&self.cluster, base)
                .await?
                .unwrap_or(1),
            None => {
                super::namespaces::default_factor(&self.cluster, topic.namespace(), cluster_default)
                    .await?
            }
        };
        if wanted <= 1 {
            return Ok(false);
        }
        let live = self
            .cluster
            .brokers()
            .await?
            .iter()
            .filter(|b| b.live && !b.draining)
            .count();
        let replicas = super::factor::check(wanted, Some(live))?;
        super::factor::peers_ready(&self.core.config, replicas)?;
        self.create(topic, replicas).await?;
        let deadline = tokio::time::Instant::now() + FORM_TIMEOUT;
        while !self.is_serving(name) {
            let elsewhere = self
                .member(name)
                .await
                .is_some_and(|p| p.node().leader().is_some_and(|l| l != p.node().id()));
            if elsewhere || tokio::time::Instant::now() >= deadline {
                return Err(BrokerError::Peer(format!(
                    "{topic} was created with replication factor {replicas} and is led by another \
                     member, or not taken by this one yet; look it up again"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(true)
    }

    /// Starts this broker's member of `topic`'s group (once).
    async fn start_member(
        &self,
        topic: &str,
        record: &GroupRecord,
    ) -> Result<Arc<ReplicatedPartition>> {
        let stale = self
            .started
            .lock()
            .await
            .get(topic)
            .is_some_and(|m| m.record.incarnation != record.incarnation);
        if stale {
            // A member of a deleted group of the same name.
            self.stop_member(topic).await;
        }
        let mut started = self.started.lock().await;
        if let Some(m) = started.get(topic)
            && m.record.incarnation == record.incarnation
        {
            return Ok(m.partition.clone());
        }
        let Some(id) = record.holding_id(self.cluster.id()) else {
            return Err(BrokerError::Conflict(format!(
                "broker {} is not a member of the group of {topic}",
                self.cluster.id()
            )));
        };
        let (db, settings, storage, registry, name) = (
            self.db.clone(),
            self.settings.clone(),
            self.storage.clone(),
            self.registry.clone(),
            record.raft_group(topic),
        );
        let start = async move {
            ReplicatedPartition::start_on(id, &name, &db, &settings, storage, &registry).await
        };
        // Started on the Raft runtime: its tasks (Raft core, replication
        // to peers, their connections) are spawned there.
        let opened = match self.runtime.handle() {
            Some(rt) => rt
                .spawn(start)
                .await
                .map_err(|e| BrokerError::Peer(format!("starting a replica: {e}")))?,
            None => start.await,
        };
        let partition = Arc::new(opened.map_err(replication)?);
        let mut metrics = partition.node().raft().metrics();
        let changed = self.leader_changed.clone();
        // Woken by a new leader, and by a membership change (a leader that
        // moved itself out stops serving at once, not at the next read).
        tokio::spawn(async move {
            let mut last = {
                let m = metrics.borrow();
                (m.current_leader, *m.membership_config.log_id())
            };
            // Ends with the node (its metrics' sender goes).
            while metrics.changed().await.is_ok() {
                let now = {
                    let m = metrics.borrow();
                    (m.current_leader, *m.membership_config.log_id())
                };
                if now != last {
                    last = now;
                    changed.notify_one();
                }
            }
        });
        tracing::info!(%topic, node = id, "replica started");
        started.insert(
            topic.to_owned(),
            Member {
                partition: partition.clone(),
                record: record.clone(),
            },
        );
        Ok(partition)
    }

    /// Reads every group record, starts this broker's members of new ones,
    /// and acts on leadership changes.
    async fn refresh(&self) -> Result<()> {
        let prefix = self.cluster.key("groups/");
        let mut known = HashMap::new();
        for kv in self.cluster.etcd().get_prefix(&prefix).await? {
            let Some(topic) = kv.key.strip_prefix(&prefix) else {
                continue;
            };
            match serde_json::from_str::<GroupRecord>(&kv.value) {
                Ok(r) => {
                    known.insert(topic.to_owned(), r);
                }
                Err(e) => tracing::warn!(%topic, error = %e, "bad group record"),
            }
        }
        *ricochet_storage::util::write(&self.known) = known.clone();
        // After the records: a record names only brokers that registered
        // before it was written, so their roles are read here.
        match self.cluster.peer_roles().await {
            Ok(roles) => self.peers.update(roles),
            Err(e) => tracing::warn!(error = %e, "cannot read the brokers' peer roles"),
        }
        self.sweep_replaced(&known).await;
        // Members of groups deleted since (no record, or a record of a
        // new group of the same name), or that no longer name this broker
        // (it was replaced while down); the others follow their record's
        // member changes.
        let me = self.cluster.id();
        let gone: Vec<(String, u64)> = {
            let mut started = self.started.lock().await;
            for (t, m) in started.iter_mut() {
                if let Some(r) = known.get(t)
                    && r.incarnation == m.record.incarnation
                {
                    m.record = r.clone();
                }
            }
            started
                .iter()
                .filter(|(t, m)| {
                    known.get(*t).is_none_or(|r| {
                        r.incarnation != m.record.incarnation || r.holding_id(me).is_none()
                    })
                })
                .map(|(t, m)| (t.clone(), m.record.incarnation))
                .collect()
        };
        for (topic, incarnation) in gone {
            // Read again: a group created since the prefix was read has a
            // record by the time its member started.
            let now = self.read_group(&topic).await?;
            if now
                .as_ref()
                .is_none_or(|r| r.incarnation != incarnation || r.holding_id(me).is_none())
            {
                if now.is_some_and(|r| r.incarnation == incarnation) {
                    tracing::info!(%topic, "this broker was replaced in the group while it was away: dropping its copy");
                }
                self.stop_member(&topic).await;
            }
        }
        for (topic, record) in &known {
            if record.holding_id(self.cluster.id()).is_some()
                && let Err(e) = self.start_member(topic, record).await
            {
                tracing::warn!(%topic, error = %e, "cannot start this broker's replica");
            }
        }
        let members: Vec<(String, Arc<ReplicatedPartition>, GroupRecord)> = {
            let started = self.started.lock().await;
            started
                .iter()
                .map(|(t, m)| (t.clone(), m.partition.clone(), m.record.clone()))
                .collect()
        };
        self.finish_unformed(&members).await;
        for (topic, partition, record) in &members {
            self.follow_leader(topic, partition.clone(), record).await;
        }
        if let Err(e) = self.maintain(&members).await {
            tracing::warn!(error = %e, "cannot check the groups' members");
        }
        self.report(&members).await
    }

    /// Reports the replication of each group this broker leads, when due
    /// (see [`super::status`]).
    async fn report(
        &self,
        members: &[(String, Arc<ReplicatedPartition>, GroupRecord)],
    ) -> Result<()> {
        let now = std::time::Instant::now();
        let mut due = Vec::new();
        {
            let mut reports = crate::util::lock(&self.reports);
            reports.retain(|t, _| members.iter().any(|(m, _, _)| m == t));
            for (topic, partition, record) in members {
                match partition.node().progress() {
                    Some(p) if reports.entry(topic.clone()).or_default().due(now) => {
                        due.push((topic, record, p));
                    }
                    Some(_) => {}
                    None => {
                        reports.remove(topic);
                    }
                }
            }
        }
        if due.is_empty() {
            return Ok(());
        }
        let brokers = self.cluster.brokers().await?;
        let live: std::collections::HashSet<String> = brokers
            .iter()
            .filter(|b| b.live)
            .map(|b| b.id.clone())
            .collect();
        for (topic, record, progress) in due {
            let differs = super::tier::differing(
                self.cluster.tier(),
                brokers
                    .iter()
                    .filter(|b| b.live && record.members.contains(&b.id))
                    .map(|b| (b.id.as_str(), b.tier.as_deref())),
            );
            let mut status = {
                let mut reports = crate::util::lock(&self.reports);
                let tracker = reports.entry(topic.clone()).or_default();
                let mut status = tracker.report(
                    self.cluster.id(),
                    &record.member_ids(),
                    &progress,
                    &live,
                    now,
                );
                tracker.note_tiers(topic, &mut status, differs.into_iter().collect());
                status
            };
            status.unreplaced = crate::util::lock(&self.unreplaced).contains(topic.as_str());
            super::status::write(&self.cluster, topic, &status).await?;
        }
        Ok(())
    }

    /// Deletes `topic`'s group, once its topic was deleted through it
    /// (every replica applied or will apply the delete): the record leaves
    /// etcd, this member stops now, the others at their next read of the
    /// records.
    pub async fn dissolve(&self, topic: &str) -> Result<()> {
        self.cluster.etcd().delete(&self.group_key(topic)).await?;
        ricochet_storage::util::write(&self.known).remove(topic);
        super::status::remove(&self.cluster, topic).await?;
        self.stop_member(topic).await;
        tracing::info!(%topic, "replication group deleted");
        Ok(())
    }

    /// Stops this broker's member of `topic`'s group (the group is gone:
    /// deleted through the group, which committed the topic's delete
    /// first): the topic is no longer served nor written through it, the
    /// Raft node ends, its log is removed, and this replica's copy of the
    /// topic and its tiers is deleted if the delete was not applied here
    /// (so a new group of the same name starts from nothing).
    async fn stop_member(&self, topic: &str) {
        let member = self.started.lock().await.remove(topic);
        let role = crate::util::lock(&self.leaders).remove(topic);
        if role == Some(Role::Serving) {
            // Moved out before it saw the switch (the next leader took the
            // topic and cleared `leaving` first): its streams end now.
            let _ = self.cluster.begin_move(topic, "the group's next leader");
        }
        if role.is_some_and(|r| r != Role::Follower) {
            self.cluster.end_move(topic);
        }
        if let Some(s) = crate::util::lock(&self.serving).remove(topic) {
            s.retire();
        }
        if let Ok(name) = TopicName::parse_stored(topic) {
            self.core.forget_replicated(&name).await;
        }
        let Some(member) = member else { return };
        member.partition.node().stop().await;
        let group = member.record.raft_group(topic);
        if let Err(e) = ricochet_replication::remove_group(&self.db, &self.settings, &group) {
            tracing::warn!(%topic, error = %e, "cannot remove the deleted group's Raft log");
        }
        if let Err(e) = self.drop_copy(topic) {
            tracing::warn!(%topic, error = %e, "cannot delete this replica's copy of a deleted topic");
        }
        tracing::info!(%topic, "replica stopped: its group was deleted");
    }

    /// Deletes what is left of replicated `topic` in this broker's store
    /// (its group deleted it before this replica applied the delete).
    fn drop_copy(&self, topic: &str) -> Result<()> {
        let stored = self.storage.list_topics()?;
        if !stored.iter().any(|t| t.name == topic && t.replicas > 1) {
            return Ok(());
        }
        tracing::warn!(%topic, "deleting this replica's copy of a topic its group deleted");
        for sub in self.storage.list_subscriptions(topic)? {
            let (retry, dlq) = crate::tier_owners::tier_names(&sub)?;
            self.storage.delete_subscription(&sub)?;
            for tier in [retry, dlq] {
                if stored.iter().any(|t| t.name == tier) {
                    self.storage.delete_topic(&tier)?;
                }
            }
        }
        self.storage.delete_topic(topic)?;
        Ok(())
    }

    /// Whether this broker serves replicated `topic` now (it leads its
    /// group and opened it).
    pub fn is_serving(&self, topic: &str) -> bool {
        !self.poisoned(topic)
    }

    /// This broker's member of `topic`'s group, if started.
    pub async fn member(&self, topic: &str) -> Option<Arc<ReplicatedPartition>> {
        self.started
            .lock()
            .await
            .get(topic)
            .map(|m| m.partition.clone())
    }

    /// The Raft registry the `Replication` service routes to.
    pub fn registry(&self) -> &GroupRegistry {
        &self.registry
    }
}

/// The command creating replicated `topic` (a no-op once it exists).
fn create_command(topic: &TopicName, replicas: u32) -> PartitionCommand {
    PartitionCommand::CreateTopic(TopicRecord {
        name: topic.to_string(),
        created_ms: ricochet_storage::util::wall_ms(),
        kind: TopicKind::Normal,
        replicas,
        trimmed_below: 0,
    })
}

/// The answer to a create of `topic` with factor `replicas` whose group
/// exists already as `existing`.
fn exists(topic: &TopicName, existing: &GroupRecord, replicas: u32) -> Result<bool> {
    if existing.replicas == replicas {
        Ok(false)
    } else {
        Err(BrokerError::TopicExists(format!(
            "{topic} (with replication factor {}, not {replicas})",
            existing.replicas
        )))
    }
}

/// Proposes `command` on `partition`, waiting out the first election of a
/// new group (this member initialized it, so it usually stands first).
/// When another member wins it, the proposal fails, unless
/// `applied_elsewhere` is given: then it waits until that says the
/// command's effect arrived here through the winner.
async fn propose_as_leader(
    partition: &ReplicatedPartition,
    command: &PartitionCommand,
    applied_elsewhere: Option<&(dyn Fn() -> Result<bool> + Sync)>,
) -> Result<()> {
    loop {
        match partition.propose(command).await {
            Ok(PartitionReply::Refused(why)) => return Err(BrokerError::Conflict(why)),
            Ok(_) => return Ok(()),
            Err(ricochet_replication::ReplicationError::NotLeader { leader: None, .. }) => {}
            Err(ricochet_replication::ReplicationError::NotLeader { .. })
                if let Some(applied) = applied_elsewhere =>
            {
                if applied()? {
                    return Ok(());
                }
            }
            Err(e) => return Err(replication(e)),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Groups {
    /// Commits a new group's creation (`command`, the `CreateTopic` of
    /// `topic`) from the member that formed it. Another member may win the
    /// group's first election: that leader commits the creation itself when
    /// it takes the topic ([`Self::take`]), so here it is enough that the
    /// record arrives in this member's store.
    async fn commit_creation(
        &self,
        partition: &ReplicatedPartition,
        command: &PartitionCommand,
        topic: &TopicName,
    ) -> Result<()> {
        let applied = || self.holds_record(topic.as_str());
        propose_as_leader(partition, command, Some(&applied)).await
    }

    /// Whether this broker's store holds the record of topic `name`.
    pub(super) fn holds_record(&self, name: &str) -> Result<bool> {
        Ok(self
            .core
            .storage
            .list_topics()?
            .iter()
            .any(|t| t.name == name))
    }
}

/// A replication error as the broker's.
pub(crate) fn replication(e: ricochet_replication::ReplicationError) -> BrokerError {
    BrokerError::Peer(e.to_string())
}
