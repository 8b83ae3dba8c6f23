//! The broker's registry of topics and subscriptions, shared by the gRPC
//! services. It checks the store against its manifest and loads everything
//! from it at start, creates topics and subscriptions on demand, hands out
//! subscription actors, and writes the manifest of a clean stop.

use crate::clock::SharedClock;
use crate::config::{BrokerConfig, Durability};
use crate::error::{BrokerError, Result};
use crate::flusher::Flusher;
use crate::keeper::ManifestKeeper;
use crate::name::{SubscriptionName, TopicName};
use crate::scheduler::Scheduler;
use crate::storage::{Storage, SubscriptionRecord, TopicKind, TopicRecord, Watched};
use crate::subscription::{BrokerLink, SubscriptionActor, SubscriptionDeps, SubscriptionHandle};
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
    /// The manifest: id reservations and what the store must hold.
    pub keeper: Arc<ManifestKeeper>,
    policies: PolicyRegistry,
    topics: Mutex<HashMap<TopicName, Arc<TopicEntry>>>,
    /// Held by every subscription actor while it runs.
    actors: Arc<()>,
    me: Weak<BrokerCore>,
}

/// Gives subscription actors access to tier topics without a strong cycle.
#[derive(Debug)]
struct Link(Weak<BrokerCore>);

#[async_trait::async_trait]
impl BrokerLink for Link {
    async fn tier_topic(&self, name: &str, kind: TopicKind) -> Result<Arc<Topic>> {
        let core = self.0.upgrade().ok_or(BrokerError::ShuttingDown)?;
        let name = TopicName::parse(name)?;
        let topic = core.topic_or_create(&name, kind).await?.topic.clone();
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
}

impl BrokerCore {
    /// Opens storage state: the store is checked against its manifest
    /// (refused with [`BrokerError::DataLoss`] when it lacks something the
    /// manifest records, unless `config.accept_data_loss`), every topic and
    /// subscription is loaded and its actor started; the scheduler then
    /// fires overdue retries.
    pub async fn open(
        config: BrokerConfig,
        storage: Arc<dyn Storage>,
        policies: PolicyRegistry,
        clock: SharedClock,
    ) -> Result<Arc<Self>> {
        let storage: Arc<dyn Storage> = Arc::new(Watched::new(storage));
        let keeper = Arc::new(
            ManifestKeeper::open(storage.clone(), config.accept_data_loss, clock.clone()).await?,
        );
        let shutdown = CancellationToken::new();
        let flusher = Flusher::start(storage.clone(), config.flush_interval, shutdown.clone());
        let scheduler = Scheduler::start(
            storage.clone(),
            config.retry_window,
            clock.clone(),
            shutdown.clone(),
        );
        let core = Arc::new_cyclic(|me| BrokerCore {
            config,
            storage,
            flusher,
            scheduler,
            shutdown,
            clock,
            keeper,
            policies,
            topics: Mutex::new(HashMap::new()),
            actors: Arc::new(()),
            me: me.clone(),
        });
        let mut opened = Vec::new();
        for rec in core.storage.list_topics()? {
            let name = TopicName::parse(&rec.name)?;
            opened.push((name.clone(), core.open_topic(name, rec.kind)?));
        }
        // Ids handed out before a crash and never stored are acked in every
        // cursor over them, durably before anything new is written.
        let voids: HashMap<String, std::ops::Range<u64>> = opened
            .iter()
            .filter_map(|(n, e)| Some((n.to_string(), e.topic.void()?)))
            .collect();
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
                let handle = core.spawn_subscription(sub, entry.topic.clone())?;
                lock(&entry.subscriptions).insert(handle.name().to_owned(), handle);
            }
            topics.insert(name, entry);
        }
        drop(topics);
        if acked_voids {
            core.storage.flush().await?;
        }
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
    /// and the manifest records exactly what the store holds.
    pub async fn stop_clean(&self) -> Result<()> {
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
        let inventory = self.storage.inventory(true)?;
        self.keeper.stop_clean(&handed_out, &inventory).await
    }

    fn open_topic(&self, name: TopicName, kind: TopicKind) -> Result<Arc<TopicEntry>> {
        let sync = self.config.durability == Durability::Sync;
        let topic = Topic::open(
            name,
            kind,
            self.storage.clone(),
            self.flusher.clone(),
            sync,
            self.config.segment_entries,
            self.clock.clone(),
            self.keeper.clone(),
        )?;
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
        let deps = SubscriptionDeps {
            storage: self.storage.clone(),
            flusher: self.flusher.clone(),
            scheduler: self.scheduler.clone(),
            link: Arc::new(Link(self.me.clone())),
            clock: self.clock.clone(),
            max_unacked_per_consumer: self.config.max_unacked_per_consumer,
            sync: self.config.durability == Durability::Sync,
            shutdown: self.shutdown.clone(),
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

    /// An existing topic, or a new one when auto-creation is on.
    pub async fn topic_for_use(&self, name: &TopicName) -> Result<Arc<TopicEntry>> {
        if self.config.auto_create_topics {
            self.topic_or_create(name, TopicKind::Normal).await
        } else {
            self.topic(name).await
        }
    }

    async fn topic_or_create(&self, name: &TopicName, kind: TopicKind) -> Result<Arc<TopicEntry>> {
        let mut topics = self.topics.lock().await;
        if let Some(t) = topics.get(name) {
            return Ok(t.clone());
        }
        self.storage.put_topic(&TopicRecord {
            name: name.to_string(),
            created_ms: self.clock.now_ms(),
            kind,
        })?;
        let entry = self.open_topic(name.clone(), kind)?;
        topics.insert(name.clone(), entry.clone());
        self.keeper.changed();
        tracing::info!(topic = %name, ?kind, "topic created");
        Ok(entry)
    }

    /// Creates a topic explicitly; fails if it exists.
    pub async fn create_topic(&self, name: &TopicName) -> Result<Arc<TopicEntry>> {
        if self.topics.lock().await.contains_key(name) {
            return Err(BrokerError::TopicExists(name.to_string()));
        }
        self.topic_or_create(name, TopicKind::Normal).await
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

    /// Deletes a topic; without `force` it must have no subscriptions.
    pub async fn delete_topic(&self, name: &TopicName, force: bool) -> Result<()> {
        let mut topics = self.topics.lock().await;
        let entry = topics
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::TopicNotFound(name.to_string()))?;
        let subs = entry.subscriptions();
        if !subs.is_empty() && !force {
            return Err(BrokerError::Conflict(format!(
                "topic {name} has {} subscription(s); delete them first or use force",
                subs.len()
            )));
        }
        // The manifest forgets the topic first: a crash in between leaves a
        // topic the manifest does not require, never the reverse.
        let forgetting = self.keeper.forgetting().await;
        forgetting.topic(name.as_str()).await?;
        for sub in subs {
            sub.delete().await?;
        }
        self.storage.delete_topic(name.as_str())?;
        drop(forgetting);
        topics.remove(name);
        tracing::info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// An existing subscription, or a new one positioned per `initial`.
    /// Creation happens under the topic's subscription lock, so two consumers
    /// racing to create one get the same subscription (and one record).
    pub fn subscription_or_create(
        &self,
        entry: &TopicEntry,
        name: &SubscriptionName,
        sub_type: SubscriptionType,
        initial: InitialPosition,
    ) -> Result<SubscriptionHandle> {
        let mut subs = lock(&entry.subscriptions);
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
        self.storage.put_subscription(&rec)?;
        self.keeper.changed();
        let handle = self.spawn_subscription(rec, entry.topic.clone())?;
        subs.insert(name.to_string(), handle.clone());
        Ok(handle)
    }

    /// Deletes a subscription (it must have no consumers).
    pub async fn delete_subscription(
        &self,
        topic: &TopicName,
        name: &SubscriptionName,
    ) -> Result<()> {
        let entry = self.topic(topic).await?;
        let handle =
            entry
                .subscription(name.as_str())
                .ok_or_else(|| BrokerError::SubscriptionNotFound {
                    topic: topic.to_string(),
                    subscription: name.to_string(),
                })?;
        let forgetting = self.keeper.forgetting().await;
        forgetting
            .subscription(topic.as_str(), name.as_str())
            .await?;
        handle.delete().await?;
        drop(forgetting);
        lock(&entry.subscriptions).remove(name.as_str());
        Ok(())
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

    /// Whether storage is healthy: every flush succeeded and no read
    /// found damaged data.
    pub fn healthy(&self) -> bool {
        self.flusher.is_healthy() && self.storage.intact()
    }
}
