//! The broker's registry of topics and subscriptions, shared by the gRPC
//! services. It checks the store against its manifest and loads everything
//! from it at start, creates topics and subscriptions on demand, hands out
//! subscription actors, and writes the manifest of a clean stop. It knows
//! nothing of the features built on it (cluster, authorization, partitioned
//! topics, retention, transport): they give it [`Hooks`] when it opens and
//! call it, never the reverse.

#[cfg(test)]
mod actor_tests;
#[cfg(test)]
mod breaker_tests;
mod events;
mod hooks;
#[cfg(test)]
mod intake_tests;
mod moves;
#[cfg(test)]
mod prefetch_tests;
mod replicated;
#[cfg(test)]
mod stage_tests;

pub use hooks::{Hooks, Placement, ReservedNames, TopicOpened};

use crate::clock::SharedClock;
use crate::config::{BrokerConfig, Durability, VerifyOnStart};
use crate::error::{BrokerError, Result};
use crate::events::FailureEvent;
use crate::failure_log::FailureLog;
use crate::flusher::Flusher;
use crate::keeper::ManifestKeeper;
use crate::limits::{Limit, TopicCounts};
use crate::name::{SubscriptionName, TopicName};
use crate::scheduler::Scheduler;
use crate::storage::{Storage, SubscriptionRecord, TopicKind, TopicRecord};
use crate::subscription::{BrokerLink, SubscriptionActor, SubscriptionDeps, SubscriptionHandle};
use crate::tier_owners::{TierOverrides, TierOwners};
use crate::topic::Topic;
use crate::util::lock;
use ricochet_policy::{DeadLetterPolicy, PolicyRegistry, PolicySpec};
use ricochet_proto::{InitialPosition, SubscriptionType};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// A topic with its subscriptions.
#[derive(Debug)]
pub struct TopicEntry {
    /// The topic.
    pub topic: Arc<Topic>,
    /// Its subscriptions by name.
    pub subscriptions: std::sync::Mutex<HashMap<String, SubscriptionHandle>>,
}

impl TopicEntry {
    /// A snapshot of the subscription handles.
    pub fn subscriptions(&self) -> Vec<SubscriptionHandle> {
        lock(&self.subscriptions).values().cloned().collect()
    }

    /// One subscription by name.
    pub fn subscription(&self, name: &str) -> Option<SubscriptionHandle> {
        lock(&self.subscriptions).get(name).cloned()
    }
}

/// How often the manifest records what is durable (when anything changed).
const SNAPSHOT_EVERY: Duration = Duration::from_secs(2);
/// How long a clean stop waits for subscription actors to end.
const ACTORS_STOP_WAIT: Duration = Duration::from_secs(5);
/// How long a clean stop waits for failure events still being published.
const EVENTS_STOP_WAIT: Duration = Duration::from_secs(5);

/// Shared broker state.
#[derive(Debug)]
pub struct BrokerCore {
    /// Configuration.
    pub config: BrokerConfig,
    /// Storage engine.
    pub storage: Arc<dyn Storage>,
    /// Group-commit flusher.
    pub flusher: Flusher,
    /// Retry scheduler.
    pub scheduler: Scheduler,
    /// Cancelled when the broker starts shutting down: open streams end.
    pub shutdown: CancellationToken,
    /// Wall-clock time.
    pub clock: SharedClock,
    /// Retries and dead letters counted for the periodic log summary.
    pub failure_log: Arc<FailureLog>,
    /// The manifest: id reservations and what the store must hold.
    pub keeper: Arc<ManifestKeeper>,
    policies: PolicyRegistry,
    topics: Mutex<HashMap<TopicName, Arc<TopicEntry>>>,
    /// Held by every subscription actor while it runs.
    actors: Arc<()>,
    /// Every live subscription's tier names. Lock order: `topics`, then a
    /// topic's `subscriptions`, then this (held briefly, never across an await).
    tier_owners: std::sync::Mutex<TierOwners>,
    /// Ordinary topics, for `max_topics` and `max_topics_per_namespace`;
    /// changed under the `topics` lock.
    counts: std::sync::Mutex<TopicCounts>,
    /// What the features built on the core gave it when it opened.
    hooks: Hooks,
    /// Where topics are served: set once when the broker joins a cluster;
    /// empty on a standalone broker.
    placement: std::sync::OnceLock<Arc<dyn Placement>>,
    /// Set when the verify pass run in the background after start found
    /// damage (see [`BrokerCore::report_damage`]).
    damage_found: std::sync::atomic::AtomicBool,
    /// The replicated topics served here (their Raft leader is this
    /// broker): the storage each writes through, with its factor.
    replicated: std::sync::Mutex<HashMap<String, replicated::Served>>,
    /// Failure events being published in the background: a clean stop
    /// waits for them (up to [`EVENTS_STOP_WAIT`]).
    events_in_flight: tokio_util::task::TaskTracker,
    me: Weak<BrokerCore>,
}

/// Gives subscription actors access to tier topics without a strong cycle.
#[derive(Debug)]
struct Link(Weak<BrokerCore>);

#[async_trait::async_trait]
impl BrokerLink for Link {
    async fn tier_topic(&self, name: &str, kind: TopicKind) -> Result<Arc<Topic>> {
        let core = self.0.upgrade().ok_or(BrokerError::ShuttingDown)?;
        let name = TopicName::parse_stored(name)?;
        let topic = core
            .topic_or_create(&name, kind, &|_| Ok(()))
            .await?
            .topic
            .clone();
        // A topic of that name created by a producer or consumer first (or
        // named as an override) is not a tier: its data could be trimmed and
        // read by anyone. Refuse rather than mix dead letters into it.
        if topic.kind() != kind {
            return Err(BrokerError::Conflict(format!(
                "{name} exists as a {:?} topic and cannot serve as a {kind:?} tier; delete it or override the tier's name",
                topic.kind()
            )));
        }
        Ok(topic)
    }

    fn build_policy(&self, spec: &PolicySpec) -> Result<Arc<dyn DeadLetterPolicy>> {
        let core = self.0.upgrade().ok_or(BrokerError::ShuttingDown)?;
        Ok(core.policies.build(spec)?)
    }

    fn configured_policy(&self, topic: &str) -> Option<PolicySpec> {
        self.0.upgrade()?.config.policy_for(topic).cloned()
    }

    fn emit(&self, events: Vec<FailureEvent>) {
        if let Some(core) = self.0.upgrade() {
            core.emit_events(events);
        }
    }

    fn configured_breaker(&self, topic: &str) -> Option<ricochet_policy::BreakerSpec> {
        self.0.upgrade()?.config.breaker_for(topic).cloned()
    }
}

impl BrokerCore {
    /// Opens storage state: the store is checked against its manifest
    /// (refused with [`BrokerError::DataLoss`] when it lacks something the
    /// manifest records, unless `config.accept_data_loss`), every topic and
    /// subscription is loaded and its actor started; the scheduler then
    /// fires overdue retries. `hooks`: what the features built on the core
    /// give it ([`Hooks::default`]: none). `storage` is used as given: the
    /// broker's [`Node`](crate::Node) wraps it in
    /// [`Watched`](crate::storage::Watched) first, so damage a read meets
    /// turns storage unhealthy.
    pub async fn open(
        config: BrokerConfig,
        storage: Arc<dyn Storage>,
        policies: PolicyRegistry,
        clock: SharedClock,
        hooks: Hooks,
    ) -> Result<Arc<Self>> {
        let phase = std::time::Instant::now();
        let keeper = Arc::new(
            ManifestKeeper::open(
                storage.clone(),
                config.accept_data_loss,
                config.verify_on_start != VerifyOnStart::Off,
                clock.clone(),
            )
            .await?,
        );
        tracing::info!(
            took_ms = phase.elapsed().as_millis() as u64,
            "start: store checked against its manifest"
        );
        let phase = std::time::Instant::now();
        let shutdown = CancellationToken::new();
        let flusher = Flusher::start(
            storage.clone(),
            config.flush_interval,
            shutdown.clone(),
            crate::disk::DiskGuard::new(config.data_dir.clone(), config.min_free_space),
        );
        let scheduler = Scheduler::start(
            storage.clone(),
            config.retry_window,
            clock.clone(),
            shutdown.clone(),
        );
        let failure_log = Arc::new(FailureLog::default());
        if !config.failure_summary_interval.is_zero() {
            failure_log
                .clone()
                .spawn(config.failure_summary_interval, shutdown.clone());
        }
        let core = Arc::new_cyclic(|me| BrokerCore {
            config,
            storage,
            flusher,
            scheduler,
            shutdown,
            clock,
            failure_log,
            keeper,
            policies,
            topics: Mutex::new(HashMap::new()),
            actors: Arc::new(()),
            tier_owners: Default::default(),
            counts: Default::default(),
            hooks,
            placement: std::sync::OnceLock::new(),
            damage_found: Default::default(),
            replicated: Default::default(),
            events_in_flight: Default::default(),
            me: me.clone(),
        });
        let mut opened = Vec::new();
        for rec in core.storage.list_topics()? {
            if rec.replicas > 1 {
                // A replicated partition's copy: its group serves it.
                continue;
            }
            let name = TopicName::parse_stored(&rec.name)?;
            let entry = core.open_topic(name.clone(), rec.kind)?;
            if rec.kind == TopicKind::Normal {
                lock(&core.counts).add(&name);
            }
            opened.push((name, entry));
        }
        // Ids handed out before a crash and never stored are acked in every
        // cursor over them, durably before anything new is written.
        let voids: HashMap<String, std::ops::Range<u64>> = opened
            .iter()
            .filter_map(|(n, e)| Some((n.to_string(), e.topic.void()?)))
            .collect();
        tracing::info!(
            topics = opened.len(),
            took_ms = phase.elapsed().as_millis() as u64,
            "start: topics opened"
        );
        let phase = std::time::Instant::now();
        let mut subscriptions = 0usize;
        let mut acked_voids = false;
        let mut topics = core.topics.lock().await;
        for (name, entry) in opened {
            for mut sub in core.storage.list_subscriptions(name.as_str())? {
                let mut changed = false;
                if let Some(v) = voids.get(&sub.topic) {
                    changed |= sub.main.ack_range(v.clone());
                }
                if let Some(v) = voids.get(&crate::subscription::retry_tier_name(&sub)?) {
                    changed |= sub.retry.ack_range(v.clone());
                }
                if changed {
                    core.storage.put_subscription(&sub)?;
                    acked_voids = true;
                }
                lock(&core.tier_owners).claim(&sub)?;
                let handle = core.spawn_subscription(sub, entry.topic.clone())?;
                lock(&entry.subscriptions).insert(handle.name().to_owned(), handle);
                subscriptions += 1;
            }
            topics.insert(name, entry);
        }
        drop(topics);
        if acked_voids {
            core.storage.flush().await?;
        }
        tracing::info!(
            subscriptions,
            took_ms = phase.elapsed().as_millis() as u64,
            "start: subscriptions loaded"
        );
        core.start_snapshots();
        Ok(core)
    }

    /// Records what is durable in the manifest every [`SNAPSHOT_EVERY`].
    fn start_snapshots(&self) {
        let me = self.me.clone();
        let stop = self.shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.cancelled() => break,
                }
                let Some(core) = me.upgrade() else { break };
                if let Err(e) = core.keeper.snapshot(&core.flusher).await {
                    tracing::warn!(error = %e, "cannot record a manifest snapshot");
                }
            }
        });
    }

    /// The end of a clean stop (streams closed): no more ids are handed
    /// out, subscription actors are given time to stop, storage is flushed,
    /// and the manifest records exactly what the store holds: the
    /// dead-letter and schedule counts of each subscription too (a scan of
    /// the keys of both trees, compared at the next start), except with
    /// `verify_on_start = "off"`, the fast mode, which never compares them.
    pub async fn stop_clean(&self) -> Result<()> {
        // The events of changes already answered go out first: a client
        // told its message was dead-lettered finds the event after a restart.
        self.events_in_flight.close();
        if tokio::time::timeout(EVENTS_STOP_WAIT, self.events_in_flight.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                pending = self.events_in_flight.len(),
                "stopping with failure events still unpublished"
            );
        }
        self.keeper.close();
        let entries: Vec<Arc<TopicEntry>> = self.topics.lock().await.values().cloned().collect();
        let handed_out: Vec<(String, u64)> = entries
            .iter()
            .map(|e| (e.topic.name().to_string(), e.topic.seal()))
            .collect();
        let deadline = tokio::time::Instant::now() + ACTORS_STOP_WAIT;
        while Arc::strong_count(&self.actors) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.storage.flush().await?;
        let count = self.config.verify_on_start != VerifyOnStart::Off;
        let inventory = self.storage.inventory(count)?;
        self.keeper.stop_clean(&handed_out, &inventory).await
    }

    fn open_topic(&self, name: TopicName, kind: TopicKind) -> Result<Arc<TopicEntry>> {
        let sync = self.config.durability == Durability::Sync;
        let storage = self.storage_for(name.as_str());
        let replicated = self.factor_of(name.as_str()) > 1;
        let topic = Topic::open(
            name,
            kind,
            storage,
            self.flusher.clone(),
            sync,
            self.config.segment_entries,
            self.clock.clone(),
            self.keeper.clone(),
            replicated,
        )?;
        self.hooks.opened.opened(&topic);
        Ok(Arc::new(TopicEntry {
            topic: Arc::new(topic),
            subscriptions: Default::default(),
        }))
    }

    fn spawn_subscription(
        &self,
        rec: SubscriptionRecord,
        topic: Arc<Topic>,
    ) -> Result<SubscriptionHandle> {
        let storage = self.storage_for(topic.name().as_str());
        let flusher = if self.factor_of(topic.name().as_str()) > 1 {
            self.flusher.through(storage.clone())
        } else {
            self.flusher.clone()
        };
        let deps = SubscriptionDeps {
            storage,
            flusher,
            scheduler: self.scheduler.clone(),
            link: Arc::new(Link(self.me.clone())),
            clock: self.clock.clone(),
            max_unacked_per_consumer: self.config.max_unacked_per_consumer,
            max_delay: self.config.max_delay,
            shutdown: self.shutdown.clone(),
            failure_log: self.failure_log.clone(),
            running: self.actors.clone(),
        };
        SubscriptionActor::spawn(rec, topic, deps)
    }

    /// An existing topic.
    pub async fn topic(&self, name: &TopicName) -> Result<Arc<TopicEntry>> {
        self.topics
            .lock()
            .await
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::TopicNotFound(name.to_string()))
    }

    /// Records where topics are served, once the broker joined a cluster
    /// (once; later calls change nothing).
    pub fn set_placement(&self, placement: Arc<dyn Placement>) {
        let _ = self.placement.set(placement);
    }

    /// An existing topic, or a new one when auto-creation is on, for a
    /// caller that may use a topic of the kinds `allowed` accepts. The kind
    /// a new topic would have is checked before it is created, so a refused
    /// caller creates nothing.
    pub async fn topic_for_use(
        &self,
        name: &TopicName,
        allowed: impl Fn(TopicKind) -> Result<()> + Sync,
    ) -> Result<Arc<TopicEntry>> {
        if let Some(refused) = self.hooks.reserved.refuse(name) {
            return Err(refused);
        }
        if self.config.auto_create_topics {
            self.topic_or_create(name, TopicKind::Normal, &allowed)
                .await
        } else {
            let entry = self.topic(name).await?;
            allowed(entry.topic.kind())?;
            Ok(entry)
        }
    }

    /// The topic `name`, created as `kind` if it does not exist. A name a
    /// subscription claims as a tier is created as that tier whatever the
    /// caller asked for (a producer is then refused, a dead-letter reader
    /// may subscribe before the first dead letter).
    async fn topic_or_create(
        &self,
        name: &TopicName,
        kind: TopicKind,
        allowed: &(dyn Fn(TopicKind) -> Result<()> + Sync),
    ) -> Result<Arc<TopicEntry>> {
        let mut topics = self.topics.lock().await;
        if let Some(t) = topics.get(name) {
            allowed(t.topic.kind())?;
            return Ok(t.clone());
        }
        let kind = match kind {
            TopicKind::Normal => lock(&self.tier_owners).kind_of(name.as_str()),
            tier => tier,
        };
        allowed(kind)?;
        if let Some(refused) = self.hooks.reserved.refuse(name) {
            return Err(refused);
        }
        if kind == TopicKind::Normal {
            let c = &self.config;
            lock(&self.counts).check(name, c.max_topics, c.max_topics_per_namespace)?;
        }
        self.storage_for(name.as_str()).put_topic(&TopicRecord {
            name: name.to_string(),
            created_ms: self.clock.now_ms(),
            kind,
            replicas: self.factor_of(name.as_str()),
            trimmed_below: 0,
        })?;
        let entry = self.open_topic(name.clone(), kind)?;
        if kind == TopicKind::Normal {
            lock(&self.counts).add(name);
        }
        topics.insert(name.clone(), entry.clone());
        self.keeper.changed();
        tracing::info!(topic = %name, ?kind, "topic created");
        Ok(entry)
    }

    /// The ordinary topic `name`, created if it does not exist (a partition
    /// of a partitioned topic); refused if it exists as a tier.
    pub async fn ensure_topic(&self, name: &TopicName) -> Result<Arc<TopicEntry>> {
        self.topic_or_create(name, TopicKind::Normal, &|kind| match kind {
            TopicKind::Normal => Ok(()),
            other => Err(BrokerError::Conflict(format!(
                "{name} exists as a {other:?} tier and cannot be a partition"
            ))),
        })
        .await
    }

    /// Runs `reserve` (which records `name` as reserved, see
    /// [`ReservedNames`]) unless a topic named `name` exists: refused with
    /// [`BrokerError::TopicExists`] then. Both under the `topics` lock, so
    /// no producer creates the name meanwhile.
    pub async fn reserve_name(
        &self,
        name: &TopicName,
        reserve: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let topics = self.topics.lock().await;
        if topics.contains_key(name) {
            return Err(BrokerError::TopicExists(name.to_string()));
        }
        reserve()
    }

    /// Creates a topic explicitly; fails if it exists.
    pub async fn create_topic(&self, name: &TopicName) -> Result<Arc<TopicEntry>> {
        if self.topics.lock().await.contains_key(name) || self.hooks.reserved.refuse(name).is_some()
        {
            return Err(BrokerError::TopicExists(name.to_string()));
        }
        self.topic_or_create(name, TopicKind::Normal, &|_| Ok(()))
            .await
    }

    /// Every open topic (ordinary ones and tiers).
    pub async fn all_topics(&self) -> Vec<Arc<Topic>> {
        self.topics
            .lock()
            .await
            .values()
            .map(|e| e.topic.clone())
            .collect()
    }

    /// Every topic name, optionally within `tenant/namespace`.
    pub async fn list_topics(&self, namespace: Option<&str>) -> Vec<String> {
        let mut names: Vec<String> = self
            .topics
            .lock()
            .await
            .keys()
            .filter(|n| namespace.is_none_or(|ns| n.namespace() == ns))
            .map(|n| n.to_string())
            .collect();
        names.sort();
        names
    }

    /// Deletes a topic. Without `force` it must have no subscriptions; with
    /// it, connected clients are disconnected and every subscription is
    /// deleted with its tiers. A subscription's retry or dead-letter tier
    /// is refused even with `force`: its records belong to the subscription
    /// (delete or purge through it), and deleting the topic alone would
    /// leave them pointing at nothing.
    pub async fn delete_topic(&self, name: &TopicName, force: bool) -> Result<()> {
        let entry = self.topic(name).await?;
        if let Some((topic, sub)) = lock(&self.tier_owners).owner_of(name.as_str()) {
            return Err(BrokerError::Conflict(format!(
                "{name} is a tier of subscription {sub} on {topic}; delete that subscription, or purge its dead letters, instead"
            )));
        }
        let subs = entry.subscriptions();
        if !subs.is_empty() && !force {
            return Err(BrokerError::Conflict(format!(
                "topic {name} has {} subscription(s); delete them first or use force",
                subs.len()
            )));
        }
        for sub in subs {
            self.remove_subscription(&entry, &sub, true).await?;
        }
        let storage = self.storage_for(name.as_str());
        self.drop_topic(name, &storage).await
    }

    /// Removes a topic from the registry and from `storage` (the store it
    /// writes through: a replicated topic's group); its producers are told
    /// it is gone.
    async fn drop_topic(&self, name: &TopicName, storage: &Arc<dyn Storage>) -> Result<()> {
        // The manifest forgets the topic first: a crash in between leaves a
        // topic the manifest does not require, never the reverse.
        let forgetting = self.keeper.forgetting().await;
        forgetting.topic(name.as_str()).await?;
        let mut topics = self.topics.lock().await;
        if let Some(entry) = topics.remove(name) {
            entry.topic.close();
            if entry.topic.kind() == TopicKind::Normal {
                lock(&self.counts).remove(name);
            }
        }
        storage.delete_topic(name.as_str())?;
        drop(forgetting);
        tracing::info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// Deletes one subscription (see [`SubscriptionHandle::delete`]) and its
    /// tier topics, and forgets it.
    async fn remove_subscription(
        &self,
        entry: &TopicEntry,
        handle: &SubscriptionHandle,
        force: bool,
    ) -> Result<()> {
        let topic = entry.topic.name().as_str();
        // The tiers are written through the topic's store (its group's).
        let storage = self.storage_for(topic);
        let forgetting = self.keeper.forgetting().await;
        forgetting.subscription(topic, handle.name()).await?;
        let tiers = handle.delete(force).await?;
        drop(forgetting);
        lock(&entry.subscriptions).remove(handle.name());
        lock(&self.tier_owners).release(entry.topic.name().as_str(), handle.name());
        for tier in tiers {
            let tier = TopicName::parse_stored(&tier)?;
            if self.topics.lock().await.contains_key(&tier) {
                self.drop_topic(&tier, &storage).await?;
            }
        }
        Ok(())
    }

    /// An existing subscription, or a new one positioned per `initial`
    /// whose tiers are `tiers` (each one left out: the default name).
    /// Creation happens under the topic's subscription lock, so two consumers
    /// racing to create one get the same subscription (and one record); an
    /// existing one must have the tiers asked for.
    pub async fn subscription_or_create(
        &self,
        entry: &TopicEntry,
        name: &SubscriptionName,
        sub_type: SubscriptionType,
        initial: InitialPosition,
        tiers: &TierOverrides,
    ) -> Result<SubscriptionHandle> {
        // Held so no topic appears under a tier name while it is checked.
        let topics = self.topics.lock().await;
        let mut subs = lock(&entry.subscriptions);
        let topic = entry.topic.name();
        self.check_subscription_in(&topics, &subs, topic, name, tiers)?;
        if let Some(h) = subs.get(name.as_str()) {
            return Ok(h.clone());
        }
        let (first, next) = entry.topic.entry_range();
        let start = match initial {
            InitialPosition::Earliest => first,
            InitialPosition::Latest => next,
        };
        let mut rec = SubscriptionRecord::new(
            self.storage.next_id()?,
            entry.topic.name().as_str(),
            name.as_str(),
            sub_type,
            start,
        );
        rec.created_ms = self.clock.now_ms();
        rec.retry_topic = tiers.retry.as_ref().map(ToString::to_string);
        rec.dead_letter_topic = tiers.dead_letter.as_ref().map(ToString::to_string);
        self.storage_for(topic.as_str()).put_subscription(&rec)?;
        self.keeper.changed();
        lock(&self.tier_owners).claim(&rec)?;
        let handle = match self.spawn_subscription(rec, entry.topic.clone()) {
            Ok(h) => h,
            Err(e) => {
                lock(&self.tier_owners).release(topic.as_str(), name.as_str());
                return Err(e);
            }
        };
        subs.insert(name.to_string(), handle.clone());
        drop(subs);
        drop(topics);
        Ok(handle)
    }

    /// Whether subscription `sub` on `topic` may be joined (it exists with
    /// the tiers asked for) or created (room under the limit, tier names
    /// free): checked before a Subscribe creates its topic, so a refused
    /// one creates nothing. [`subscription_or_create`] checks again.
    ///
    /// [`subscription_or_create`]: Self::subscription_or_create
    pub async fn check_subscription(
        &self,
        topic: &TopicName,
        sub: &SubscriptionName,
        tiers: &TierOverrides,
    ) -> Result<()> {
        let topics = self.topics.lock().await;
        match topics.get(topic) {
            Some(entry) => {
                let subs = lock(&entry.subscriptions);
                self.check_subscription_in(&topics, &subs, topic, sub, tiers)
            }
            None => self.check_subscription_in(&topics, &HashMap::new(), topic, sub, tiers),
        }
    }

    /// [`check_subscription`](Self::check_subscription) with the registry
    /// and the topic's subscriptions locked by the caller.
    fn check_subscription_in(
        &self,
        topics: &HashMap<TopicName, Arc<TopicEntry>>,
        subs: &HashMap<String, SubscriptionHandle>,
        topic: &TopicName,
        sub: &SubscriptionName,
        tiers: &TierOverrides,
    ) -> Result<()> {
        if subs.contains_key(sub.as_str()) {
            return lock(&self.tier_owners).check_existing(topic, sub, tiers);
        }
        let max = self.config.max_subscriptions_per_topic;
        if Limit::reached(subs.len(), max) {
            return Err(Limit::SubscriptionsPerTopic.refuse(
                format!(
                    "cannot create subscription {sub}: {topic} has {} subscriptions",
                    subs.len()
                ),
                max,
            ));
        }
        lock(&self.tier_owners)
            .check_new(topic, sub, tiers, |n| topics.get(n).map(|e| e.topic.kind()))
    }

    /// Refuses tier names other than those the existing subscription has
    /// (tiers are chosen when a subscription is created).
    pub fn check_tiers(
        &self,
        topic: &TopicName,
        sub: &SubscriptionName,
        wanted: &TierOverrides,
    ) -> Result<()> {
        lock(&self.tier_owners).check_existing(topic, sub, wanted)
    }

    /// Deletes a subscription with its retry and dead-letter tiers.
    /// Without `force` it must have no consumers, no dead letters and no
    /// scheduled retries.
    pub async fn delete_subscription(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
        force: bool,
    ) -> Result<()> {
        let entry = self.topic(topic).await?;
        let handle = self.subscription(topic, name).await?;
        self.remove_subscription(&entry, &handle, force).await
    }

    /// An existing subscription.
    pub async fn subscription(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<SubscriptionHandle> {
        self.topic(topic)
            .await?
            .subscription(name.as_str())
            .ok_or_else(|| BrokerError::SubscriptionNotFound {
                topic: topic.to_string(),
                subscription: name.to_string(),
            })
    }

    /// Registers topics and subscriptions a move wrote to storage (see
    /// `crate::transfer`): opens the logs and starts the subscriptions'
    /// actors. They are served once etcd places the topic here.
    pub(crate) async fn adopt(
        &self,
        logs: &[(TopicName, TopicKind)],
        subs: Vec<SubscriptionRecord>,
    ) -> Result<()> {
        // The tiers are claimed first: a tier's storage and factor follow
        // its owner's ([`Self::storage_for`]), so a replicated topic's tiers
        // open written through its group, like the topic.
        for (i, rec) in subs.iter().enumerate() {
            if let Err(e) = lock(&self.tier_owners).claim(rec) {
                for r in &subs[..i] {
                    lock(&self.tier_owners).release(&r.topic, &r.name);
                }
                return Err(e);
            }
        }
        let mut topics = self.topics.lock().await;
        let mut main = None;
        for (name, kind) in logs {
            let entry = self.open_topic(name.clone(), *kind)?;
            if *kind == TopicKind::Normal {
                lock(&self.counts).add(name);
                main = Some(entry.clone());
            }
            topics.insert(name.clone(), entry);
        }
        let main =
            main.ok_or_else(|| BrokerError::InvalidArgument("a move without its topic".into()))?;
        for rec in subs {
            let handle = self.spawn_subscription(rec, main.topic.clone())?;
            lock(&main.subscriptions).insert(handle.name().to_owned(), handle);
        }
        drop(topics);
        self.keeper.changed();
        Ok(())
    }

    /// Deletes this broker's copy of a topic that now lives elsewhere,
    /// with its subscriptions and their tiers.
    pub(crate) async fn forget_moved(&self, name: &TopicName) -> Result<()> {
        match self.delete_topic(name, true).await {
            Ok(()) | Err(BrokerError::TopicNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether storage is healthy: every flush succeeded, and no read nor
    /// the verify pass found damaged data.
    pub fn healthy(&self) -> bool {
        self.flusher.is_healthy()
            && self.storage.intact()
            && !self.damage_found.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records damage found outside a read (the verify pass run in the
    /// background): storage is unhealthy from now on.
    pub fn report_damage(&self) {
        self.damage_found
            .store(true, std::sync::atomic::Ordering::Release);
    }
}
