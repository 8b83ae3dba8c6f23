//! Retention policies: how much of an ordinary topic's log the broker
//! keeps, whether or not subscriptions consumed it (Kafka's
//! `retention.ms`/`retention.bytes`, NATS's `max_age`/`max_bytes`,
//! Pulsar's retention policies). A policy is set on a `tenant/namespace`
//! or on a topic; a topic's own policy replaces its namespace's whole.
//! Without either a topic keeps every message until all its subscriptions
//! consumed it (the broker's default).
//!
//! A policy may also carry a backlog quota: the most message bytes the
//! topic's log may hold (with subscriptions, what the slowest one has not
//! consumed, to the segment; without, everything retained). At the quota a
//! publish is refused with RESOURCE_EXHAUSTED naming it (`refuse`), or the
//! oldest segments are dropped as retention by size does (`drop_oldest`).
//!
//! Policies are stored durably ([`Storage::put_retention`]) and enforced
//! every `retention_interval` by [`Topic::enforce_retention`], which drops
//! whole segments, oldest first, and on a topic as soon as a write starts
//! a new segment of it ([`SegmentRolled`]): a topic written at 20 MB/s
//! would otherwise overshoot its size limit by a whole interval's writes.
//! Retry and dead-letter tiers are never trimmed by it.
//!
//! [`Policies`] (the policies in force) is loaded before the core opens and
//! given to it as the hook that sets each opened topic's quota;
//! [`Retention`] is the feature over the core: setting policies, moving
//! them with a topic, the enforcing task. In cluster mode namespaces'
//! policies are the cluster's, kept in etcd ([`cluster`]).

mod cluster;

use crate::core::{BrokerCore, TopicOpened};
use crate::error::{BrokerError, Result};
pub use crate::name::Target;
use crate::name::TopicName;
use crate::storage::{QuotaAction, RetentionRecord, Storage, TopicKind};
use crate::topic::{SegmentRolled, Topic};
use ricochet_cluster::Cluster;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The policies in force, by namespace or topic name.
#[derive(Debug, Default)]
pub struct Policies {
    by_target: Mutex<BTreeMap<String, RetentionRecord>>,
    /// Topics that started a new segment since the enforcing task last
    /// looked.
    rolled: Arc<Rolled>,
}

/// Topics that started a new segment, waiting for the enforcing task.
#[derive(Debug, Default)]
struct Rolled {
    topics: Mutex<std::collections::BTreeSet<TopicName>>,
    wake: tokio::sync::Notify,
}

impl SegmentRolled for Rolled {
    fn rolled(&self, topic: &TopicName) {
        if crate::util::lock(&self.topics).insert(topic.clone()) {
            self.wake.notify_one();
        }
    }
}

impl Policies {
    /// The stored policies.
    pub fn load(storage: &dyn Storage) -> Result<Self> {
        let by_target = storage
            .retention_policies()?
            .into_iter()
            .map(|r| (r.target.clone(), r))
            .collect();
        Ok(Self {
            by_target: Mutex::new(by_target),
            rolled: Arc::default(),
        })
    }

    /// The policy set on exactly `target`, if any.
    pub fn get(&self, target: &str) -> Option<RetentionRecord> {
        crate::util::lock(&self.by_target).get(target).cloned()
    }

    /// The policy that applies to `topic`: its own, else its namespace's.
    pub fn effective(&self, topic: &TopicName) -> Option<RetentionRecord> {
        let map = crate::util::lock(&self.by_target);
        map.get(topic.as_str())
            .or_else(|| map.get(topic.namespace()))
            .cloned()
    }

    /// Takes `record` in force as stored (a topic moved here with it).
    pub(crate) fn adopt(&self, record: RetentionRecord) {
        crate::util::lock(&self.by_target).insert(record.target.clone(), record);
    }

    /// Drops the policy of `target` from those in force (a topic that
    /// moved away; the caller deletes the stored one).
    pub(crate) fn forget(&self, target: &str) {
        crate::util::lock(&self.by_target).remove(target);
    }

    /// Takes in force the own policy a replicated topic's group stored:
    /// this broker starts leading it, and the policy may have been set or
    /// cleared while another member led (its followers apply the change
    /// to their store, not to the policies in force here).
    fn refresh_replicated(&self, topic: &Topic) {
        let name = topic.name().as_str();
        match topic.storage().retention_policies() {
            Ok(stored) => match stored.into_iter().find(|r| r.target == name) {
                Some(r) => self.adopt(r),
                None => self.forget(name),
            },
            Err(e) => {
                tracing::warn!(topic = name, error = %e, "cannot read a replicated topic's retention policy: the one in force here is kept");
            }
        }
    }

    fn is_empty(&self) -> bool {
        crate::util::lock(&self.by_target).is_empty()
    }

    /// Tells `topic` the backlog quota that refuses its publishes, if any.
    pub fn apply_quota(&self, topic: &Topic) {
        let refuse = (topic.kind() == TopicKind::Normal)
            .then(|| self.effective(topic.name()))
            .flatten()
            .filter(|p| p.quota_action == QuotaAction::Refuse)
            .and_then(|p| p.backlog_quota_bytes);
        topic.set_refusing_quota(refuse);
    }
}

impl TopicOpened for Policies {
    fn opened(&self, topic: &Topic) {
        if topic.kind() == TopicKind::Normal && topic.is_replicated() {
            self.refresh_replicated(topic);
        }
        self.apply_quota(topic);
        if topic.kind() == TopicKind::Normal {
            topic.on_segment_rolled(self.rolled.clone());
        }
    }
}

/// Retention over the core: the policies in force and the topics they
/// apply to.
#[derive(Debug, Clone)]
pub struct Retention {
    policies: Arc<Policies>,
    core: Arc<BrokerCore>,
    /// Set once the broker joined a cluster: namespaces' policies are
    /// then written to and read from etcd.
    cluster: Arc<OnceLock<Arc<Cluster>>>,
    /// Held while namespaces' policies are changed here and while the
    /// cluster's are read and taken: a read from before a set is never
    /// taken after it.
    namespaces: Arc<tokio::sync::Mutex<()>>,
}

impl Retention {
    /// Retention of `core`'s topics by `policies` (the ones the core opened
    /// with); starts the task enforcing them every `retention_interval`.
    pub fn start(policies: Arc<Policies>, core: Arc<BrokerCore>) -> Self {
        spawn(
            Arc::downgrade(&core),
            policies.clone(),
            core.config.retention_interval,
            core.shutdown.clone(),
        );
        Self {
            policies,
            core,
            cluster: Arc::default(),
            namespaces: Arc::default(),
        }
    }

    /// In cluster mode: namespaces' policies are the cluster's from now on
    /// (written to etcd, read from it every [`crate::ns_shared::SYNC_EVERY`]).
    pub(crate) fn join(&self, c: Arc<Cluster>) {
        if self.cluster.set(c.clone()).is_ok() {
            cluster::spawn_sync(self.clone(), c);
        }
    }

    /// A namespace's own policy: in a cluster, the cluster's (in etcd).
    pub async fn namespace_policy(&self, namespace: &str) -> Result<Option<RetentionRecord>> {
        match self.cluster.get() {
            Some(c) => cluster::get(c, namespace).await,
            None => Ok(self.policies.get(namespace)),
        }
    }

    /// The namespaces' policies in force here.
    fn namespace_policies(&self) -> Vec<RetentionRecord> {
        crate::util::lock(&self.policies.by_target)
            .values()
            .filter(|r| is_namespace(&r.target))
            .cloned()
            .collect()
    }

    /// Takes `shared` (the cluster's namespace policies, by namespace) in
    /// force here, stored durably: changed and new ones put, ones it lacks
    /// removed. Nothing is written when nothing differs.
    async fn take_namespaces(&self, shared: BTreeMap<String, RetentionRecord>) -> Result<()> {
        let held: BTreeMap<String, RetentionRecord> = self
            .namespace_policies()
            .into_iter()
            .map(|r| (r.target.clone(), r))
            .collect();
        if held == shared {
            return Ok(());
        }
        let storage = &self.core.storage;
        for (ns, r) in &shared {
            if held.get(ns) != Some(r) {
                storage.put_retention(r)?;
                tracing::info!(namespace = %ns, policy = ?r, "namespace retention policy taken from the cluster");
            }
        }
        for ns in held.keys().filter(|ns| !shared.contains_key(*ns)) {
            storage.delete_retention(ns)?;
            tracing::info!(namespace = %ns, "namespace retention policy removed: the cluster has none");
        }
        self.core.flusher.durable().await?;
        {
            let mut map = crate::util::lock(&self.policies.by_target);
            map.retain(|target, _| !is_namespace(target));
            map.extend(shared);
        }
        for topic in self.core.all_topics().await {
            self.policies.apply_quota(&topic);
        }
        Ok(())
    }

    /// The policies in force.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Sets (or with no limit at all, clears) the policy of `target`,
    /// durably before returning, and applies its quota to the open topics.
    /// `record.target` is ignored (the target's key is used). A replicated
    /// topic's own policy is written through its group (committed by a
    /// majority before this returns); a namespace's is stored per broker.
    pub async fn set(
        &self,
        target: &Target,
        record: RetentionRecord,
    ) -> Result<Option<RetentionRecord>> {
        let core = &self.core;
        let positive = |v: Option<u64>, what: &str| match v {
            Some(0) => Err(BrokerError::InvalidArgument(format!(
                "{what} must be positive (leave it unset for no limit)"
            ))),
            _ => Ok(()),
        };
        positive(record.max_age_ms, "max_age_ms")?;
        positive(record.max_size_bytes, "max_size_bytes")?;
        positive(record.backlog_quota_bytes, "backlog_quota_bytes")?;
        let _namespaces = match target {
            Target::Namespace(_) => Some(self.namespaces.lock().await),
            Target::Topic(_) => None,
        };
        let key = target.key().to_owned();
        let any = record.max_age_ms.is_some()
            || record.max_size_bytes.is_some()
            || record.backlog_quota_bytes.is_some();
        let record = any.then(|| RetentionRecord {
            target: key.clone(),
            ..record
        });
        let storage = match target {
            Target::Topic(t) => core.writer_for(t.as_str())?,
            Target::Namespace(ns) => {
                // The cluster's first: a failure there changes nothing.
                match self.cluster.get() {
                    Some(c) => cluster::publish(c, ns, record.as_ref()).await?,
                    // Stored here only, the cluster's would replace it.
                    None if core.config.cluster.is_some() => {
                        return Err(BrokerError::Etcd(
                            "this broker has not joined its cluster yet, whose namespace \
                             retention policies it keeps: try again"
                                .into(),
                        ));
                    }
                    None => {}
                }
                core.storage.clone()
            }
        };
        match &record {
            Some(r) => storage.put_retention(r)?,
            None => storage.delete_retention(&key)?,
        }
        core.flusher.durable().await?;
        {
            let mut map = crate::util::lock(&self.policies.by_target);
            match &record {
                Some(r) => map.insert(key, r.clone()),
                None => map.remove(&key),
            };
        }
        for topic in core.all_topics().await {
            self.policies.apply_quota(&topic);
        }
        Ok(record)
    }

    /// Deletes the stored policy of a topic that moved away and drops it
    /// from those in force.
    pub(crate) fn forget_moved(&self, topic: &TopicName) -> Result<()> {
        if self.policies.get(topic.as_str()).is_some() {
            self.core.storage.delete_retention(topic.as_str())?;
            self.policies.forget(topic.as_str());
        }
        Ok(())
    }
}

/// Whether a policy's target is a namespace (`tenant/namespace`), not a
/// topic (whose stored name has a scheme).
fn is_namespace(target: &str) -> bool {
    !target.contains("://")
}

/// Applies `topic`'s effective policy once.
pub fn enforce(policies: &Policies, topic: &Topic) -> Result<crate::topic::Dropped> {
    let policy = if topic.kind() == TopicKind::Normal {
        policies.effective(topic.name())
    } else {
        None
    };
    let Some(p) = policy else {
        return Ok(Default::default());
    };
    // A quota that drops the oldest is a size limit enforced the same way.
    let quota = (p.quota_action == QuotaAction::DropOldest)
        .then_some(p.backlog_quota_bytes)
        .flatten();
    let size = match (p.max_size_bytes, quota) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    topic.enforce_retention(p.max_age_ms, size)
}

/// Enforces every policy every `every`, and a topic's as soon as it
/// starts a new segment, until `stop`.
fn spawn(
    core: Weak<BrokerCore>,
    policies: Arc<Policies>,
    every: Duration,
    stop: CancellationToken,
) {
    if every.is_zero() {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let rolled = tokio::select! {
                _ = tick.tick() => None,
                _ = policies.rolled.wake.notified() => {
                    Some(std::mem::take(&mut *crate::util::lock(&policies.rolled.topics)))
                }
                _ = stop.cancelled() => break,
            };
            let Some(core) = core.upgrade() else { break };
            if policies.is_empty() {
                continue;
            }
            let topics = match rolled {
                None => core.all_topics().await,
                Some(names) => {
                    let mut topics = Vec::with_capacity(names.len());
                    for name in names {
                        if let Ok(entry) = core.topic(&name).await {
                            topics.push(entry.topic.clone());
                        }
                    }
                    topics
                }
            };
            for topic in topics {
                policies.apply_quota(&topic);
                let (policies, topic) = (policies.clone(), topic.clone());
                // Scans and trims are blocking storage work.
                let done = tokio::task::spawn_blocking(move || enforce(&policies, &topic)).await;
                match done {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "retention pass failed"),
                    Err(e) => tracing::warn!(error = %e, "retention pass panicked"),
                }
            }
        }
    });
}
