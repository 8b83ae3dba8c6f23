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

use crate::core::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::storage::PartitionedRecord;
use crate::util::lock;

/// The most partitions a topic may have.
pub const MAX_PARTITIONS: u32 = 1024;

/// The error for using the base name of a partitioned topic as a topic.
pub fn base_name_refused(name: &TopicName, partitions: u32) -> BrokerError {
    BrokerError::Conflict(format!(
        "{name} is a partitioned topic ({partitions} partitions): produce to and consume from its partitions {} .. {} (the Ricochet client routes by itself)",
        partition(name, 0),
        partition(name, partitions.saturating_sub(1)),
    ))
}

/// Partition `index` of `base`.
pub fn partition(base: &TopicName, index: u32) -> TopicName {
    TopicName::parse_stored(&ricochet_proto::partitions::partition_name(
        base.as_str(),
        index,
    ))
    // A valid name plus `-partition-<digits>` is valid unless it grows
    // past the length limit, which `check_count_and_name` refuses first.
    .unwrap_or_else(|_| base.clone())
}

pub(crate) fn check_count_and_name(name: &TopicName, partitions: u32) -> Result<()> {
    if partitions == 0 || partitions > MAX_PARTITIONS {
        return Err(BrokerError::InvalidArgument(format!(
            "partition count must be 1 to {MAX_PARTITIONS}, got {partitions}"
        )));
    }
    if ricochet_proto::partitions::parse_partition(name.as_str()).is_some() {
        return Err(BrokerError::InvalidArgument(format!(
            "{name} is named as a partition; a partitioned topic's name must not end in -partition-<n>"
        )));
    }
    let last = ricochet_proto::partitions::partition_name(name.as_str(), partitions - 1);
    TopicName::parse(&last).map_err(|_| {
        BrokerError::InvalidArgument(format!(
            "{name} is too long to name its partitions ({last})"
        ))
    })?;
    Ok(())
}

/// The partition count of `name`, if it is a partitioned topic.
pub fn count(core: &BrokerCore, name: &TopicName) -> Option<u32> {
    lock(&core.partitioned).get(name).copied()
}

/// Every partitioned topic with its count, optionally within `tenant/ns`.
pub fn list(core: &BrokerCore, namespace: Option<&str>) -> Vec<(TopicName, u32)> {
    lock(&core.partitioned)
        .iter()
        .filter(|(n, _)| namespace.is_none_or(|ns| n.namespace() == ns))
        .map(|(n, c)| (n.clone(), *c))
        .collect()
}

/// The partitions of `name` (empty when it is not partitioned).
pub fn partitions_of(core: &BrokerCore, name: &TopicName) -> Vec<TopicName> {
    (0..count(core, name).unwrap_or(0))
        .map(|i| partition(name, i))
        .collect()
}

/// Creates partitioned topic `name` with `partitions` partitions: the
/// partitions first (existing ordinary topics of those names are kept),
/// then the count, durably before this returns.
pub async fn create(core: &BrokerCore, name: &TopicName, partitions: u32) -> Result<()> {
    check_count_and_name(name, partitions)?;
    let _ops = core.partition_ops.lock().await;
    // Claimed before the partitions exist, so no producer creates the base
    // name meanwhile; released if a partition cannot be made.
    core.claim_partitioned(name, partitions).await?;
    let made = add_partitions(core, name, 0, partitions).await;
    if let Err(e) = made {
        lock(&core.partitioned).remove(name);
        return Err(e);
    }
    store(core, name, partitions).await?;
    tracing::info!(topic = %name, partitions, "partitioned topic created");
    Ok(())
}

/// Raises the partition count of `name` to `partitions`; lowering is
/// refused, the same count changes nothing. Returns the count in force.
pub async fn update(core: &BrokerCore, name: &TopicName, partitions: u32) -> Result<u32> {
    let _ops = core.partition_ops.lock().await;
    let Some(current) = count(core, name) else {
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
    check_count_and_name(name, partitions)?;
    add_partitions(core, name, current, partitions).await?;
    copy_subscriptions(core, name, current, partitions).await?;
    lock(&core.partitioned).insert(name.clone(), partitions);
    store(core, name, partitions).await?;
    tracing::info!(topic = %name, from = current, to = partitions, "partitions added");
    Ok(partitions)
}

/// Deletes partitioned topic `name`: every partition (as `DeleteTopic`
/// would, with `force`), then its count. Without `force`, a partition with
/// subscriptions refuses the whole delete before anything is removed.
pub async fn delete(core: &BrokerCore, name: &TopicName, force: bool) -> Result<()> {
    let _ops = core.partition_ops.lock().await;
    let parts = partitions_of(core, name);
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
    lock(&core.partitioned).remove(name);
    core.flusher.durable().await?;
    tracing::info!(topic = %name, "partitioned topic deleted");
    Ok(())
}

async fn add_partitions(core: &BrokerCore, name: &TopicName, from: u32, to: u32) -> Result<()> {
    for i in from..to {
        core.ensure_topic(&partition(name, i)).await?;
    }
    Ok(())
}

/// Gives each new partition `from..to` the subscriptions partition 0 has
/// (same type, from the earliest entry, with an operator's policy), as
/// Pulsar does when partitions are added: messages produced to a new
/// partition before its consumers arrive are kept for them.
async fn copy_subscriptions(core: &BrokerCore, name: &TopicName, from: u32, to: u32) -> Result<()> {
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

async fn store(core: &BrokerCore, name: &TopicName, partitions: u32) -> Result<()> {
    core.storage.put_partitioned(&PartitionedRecord {
        name: name.to_string(),
        partitions,
    })?;
    core.flusher.durable().await
}
