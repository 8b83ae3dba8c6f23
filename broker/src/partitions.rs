//! Partitioned topics on the broker: a partitioned topic `orders` is its
//! partition count, stored durably (`PartitionedRecord`), and N ordinary
//! topics `orders-partition-0` .. `orders-partition-{N-1}` (Pulsar's names,
//! `ricochet_proto::partitions`), each with its own log, producers,
//! subscriptions and tiers. This module creates, raises and deletes them;
//! the count is never lowered. The base name itself holds no messages:
//! producing to it or subscribing to it is refused (clients route to the
//! partitions), and the admin service aggregates stats, policies and dead
//! letters over the partitions (`service::partitions`). Each partition is
//! addressed by its own name, so a later per-partition owner (a broker of a
//! cluster) fits without changing this layout.
//!
//! [`PartitionCounts`] (the counts) is loaded before the core opens and
//! given to it as the names it must not create topics under;
//! [`Partitions`] is the feature over the core. Partition names themselves
//! are `crate::name`'s ([`partition`]).

use crate::core::{BrokerCore, ReservedNames};
use crate::error::{BrokerError, Result};
use crate::name::{TopicName, check_partition_count, partition};
use crate::storage::{PartitionedRecord, Storage};
use crate::util::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Partitioned topics' partition counts, read by the core under its
/// registry lock when a topic is created.
#[derive(Debug, Default)]
pub struct PartitionCounts {
    counts: Mutex<BTreeMap<TopicName, u32>>,
}

impl PartitionCounts {
    /// The stored counts.
    pub fn load(storage: &dyn Storage) -> Result<Self> {
        let mut counts = BTreeMap::new();
        for rec in storage.list_partitioned()? {
            counts.insert(TopicName::parse_stored(&rec.name)?, rec.partitions);
        }
        Ok(Self {
            counts: Mutex::new(counts),
        })
    }
}

impl ReservedNames for PartitionCounts {
    fn refuse(&self, name: &TopicName) -> Option<BrokerError> {
        let n = *lock(&self.counts).get(name)?;
        Some(base_name_refused(name, n))
    }
}

/// The error for using the base name of a partitioned topic as a topic.
fn base_name_refused(name: &TopicName, partitions: u32) -> BrokerError {
    BrokerError::Conflict(format!(
        "{name} is a partitioned topic ({partitions} partitions): produce to and consume from its partitions {} .. {} (the Ricochet client routes by itself)",
        partition(name, 0),
        partition(name, partitions.saturating_sub(1)),
    ))
}

/// Partitioned topics over the core: their counts, and creating, raising
/// and deleting them.
#[derive(Debug)]
pub struct Partitions {
    counts: Arc<PartitionCounts>,
    /// Serialises creating, raising and deleting partitioned topics.
    ops: tokio::sync::Mutex<()>,
    core: Arc<BrokerCore>,
}

impl Partitions {
    /// Partitioned topics of `core` counted by `counts` (the ones the core
    /// opened with).
    pub fn new(counts: Arc<PartitionCounts>, core: Arc<BrokerCore>) -> Self {
        Self {
            counts,
            ops: tokio::sync::Mutex::new(()),
            core,
        }
    }

    /// The partition count of `name`, if it is a partitioned topic.
    pub fn count(&self, name: &TopicName) -> Option<u32> {
        lock(&self.counts.counts).get(name).copied()
    }

    /// Every partitioned topic with its count, optionally within `tenant/ns`.
    pub fn list(&self, namespace: Option<&str>) -> Vec<(TopicName, u32)> {
        lock(&self.counts.counts)
            .iter()
            .filter(|(n, _)| namespace.is_none_or(|ns| n.namespace() == ns))
            .map(|(n, c)| (n.clone(), *c))
            .collect()
    }

    /// The partitions of `name` (empty when it is not partitioned).
    pub fn partitions_of(&self, name: &TopicName) -> Vec<TopicName> {
        (0..self.count(name).unwrap_or(0))
            .map(|i| partition(name, i))
            .collect()
    }

    /// Creates partitioned topic `name` with `partitions` partitions: the
    /// partitions first (existing ordinary topics of those names are kept),
    /// then the count, durably before this returns.
    pub async fn create(&self, name: &TopicName, partitions: u32) -> Result<()> {
        check_partition_count(name, partitions)?;
        let _ops = self.ops.lock().await;
        // Claimed before the partitions exist, so no producer creates the base
        // name meanwhile; released if a partition cannot be made.
        self.core
            .reserve_name(name, || {
                let mut counts = lock(&self.counts.counts);
                if counts.contains_key(name) {
                    return Err(BrokerError::TopicExists(name.to_string()));
                }
                counts.insert(name.clone(), partitions);
                Ok(())
            })
            .await?;
        let made = self.add_partitions(name, 0, partitions).await;
        if let Err(e) = made {
            lock(&self.counts.counts).remove(name);
            return Err(e);
        }
        self.store(name, partitions).await?;
        tracing::info!(topic = %name, partitions, "partitioned topic created");
        Ok(())
    }

    /// Raises the partition count of `name` to `partitions`; lowering is
    /// refused, the same count changes nothing. Returns the count in force.
    pub async fn update(&self, name: &TopicName, partitions: u32) -> Result<u32> {
        let _ops = self.ops.lock().await;
        let Some(current) = self.count(name) else {
            return Err(BrokerError::TopicNotFound(format!(
                "{name} (no partitioned topic of that name)"
            )));
        };
        if partitions < current {
            return Err(BrokerError::InvalidArgument(format!(
                "cannot lower the partition count of {name} from {current} to {partitions}: partitions can only be added"
            )));
        }
        if partitions == current {
            return Ok(current);
        }
        check_partition_count(name, partitions)?;
        self.add_partitions(name, current, partitions).await?;
        self.copy_subscriptions(name, current, partitions).await?;
        lock(&self.counts.counts).insert(name.clone(), partitions);
        self.store(name, partitions).await?;
        tracing::info!(topic = %name, from = current, to = partitions, "partitions added");
        Ok(partitions)
    }

    /// Deletes partitioned topic `name`: every partition (as `DeleteTopic`
    /// would, with `force`), then its count. Without `force`, a partition with
    /// subscriptions refuses the whole delete before anything is removed.
    pub async fn delete(&self, name: &TopicName, force: bool) -> Result<()> {
        let core = &self.core;
        let _ops = self.ops.lock().await;
        let parts = self.partitions_of(name);
        if !force {
            for p in &parts {
                if let Ok(entry) = core.topic(p).await {
                    let n = entry.subscriptions().len();
                    if n > 0 {
                        return Err(BrokerError::Conflict(format!(
                            "partition {p} of {name} has {n} subscription(s); delete them first or use force"
                        )));
                    }
                }
            }
        }
        for p in &parts {
            match core.delete_topic(p, force).await {
                Ok(()) | Err(BrokerError::TopicNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        core.storage.delete_partitioned(name.as_str())?;
        lock(&self.counts.counts).remove(name);
        core.flusher.durable().await?;
        tracing::info!(topic = %name, "partitioned topic deleted");
        Ok(())
    }

    async fn add_partitions(&self, name: &TopicName, from: u32, to: u32) -> Result<()> {
        for i in from..to {
            self.core.ensure_topic(&partition(name, i)).await?;
        }
        Ok(())
    }

    /// Gives each new partition `from..to` the subscriptions partition 0 has
    /// (same type, from the earliest entry, with an operator's policy), as
    /// Pulsar does when partitions are added: messages produced to a new
    /// partition before its consumers arrive are kept for them.
    async fn copy_subscriptions(&self, name: &TopicName, from: u32, to: u32) -> Result<()> {
        let core = &self.core;
        let Ok(first) = core.topic(&partition(name, 0)).await else {
            return Ok(());
        };
        for h in first.subscriptions() {
            let sub_type = h.stats(core.storage.clone()).await?.subscription_type;
            let policy = h.policy().await?;
            let sub = crate::name::SubscriptionName::parse_stored(h.name())?;
            for i in from..to {
                let entry = core.topic(&partition(name, i)).await?;
                let new = core
                    .subscription_or_create(
                        &entry,
                        &sub,
                        sub_type,
                        ricochet_proto::InitialPosition::Earliest,
                        &Default::default(),
                    )
                    .await?;
                if policy.source == crate::storage::PolicySource::Admin {
                    new.set_policy(
                        policy.spec.clone(),
                        policy.key_order,
                        policy.breaker.clone(),
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }

    async fn store(&self, name: &TopicName, partitions: u32) -> Result<()> {
        self.core.storage.put_partitioned(&PartitionedRecord {
            name: name.to_string(),
            partitions,
        })?;
        self.core.flusher.durable().await
    }
}
