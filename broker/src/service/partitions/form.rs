//! Forming the replication groups of a partitioned topic's partitions when
//! the topic is created, or its count raised, with a factor above 1 in
//! cluster mode, so that the replicas exist once the call answers OK.
//!
//! Each partition is formed by the broker it was placed on, through the
//! path a `topics create <partition> --replicas R` takes: this broker when
//! the partition is placed here ([`Groups::create`]), else that broker's
//! `Admin.CreateTopic`, called with the caller's credential (as moves do).
//! Both end in [`Groups::create`], the code first use runs too, so the
//! members are chosen the same way and the call answers once the group
//! committed the topic's creation (a leader was elected). Partitions are
//! formed [`FORM_PARALLEL`] at a time, all within `[cluster]
//! partition_form_timeout` (30 s by default); those not formed by then are
//! named in an UNAVAILABLE answer. The partitioned
//! topic stays created (its record is in etcd) and first use forms any
//! group still missing.

use crate::error::BrokerError;
use crate::name::{TopicName, partition};
use crate::node::Node;
use crate::replication::factor;
use crate::service::routing::{AdminAt, admin_at};
use crate::transfer::mover::authorized;
use futures::StreamExt;
use ricochet_cluster::Cluster;
use ricochet_proto::CreateTopicRequest;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;
use tonic::metadata::AsciiMetadataValue;

/// Partitions formed at once.
const FORM_PARALLEL: usize = 8;

/// How long a partition's forming may go on after the create stopped
/// waiting for it.
const FORM_LINGER: Duration = Duration::from_secs(120);

/// The most partitions an error names one by one.
const NAMED: usize = 32;

/// Forms the groups of factor `replicas` of partitions `range` of `base`
/// (placed already), each by the broker it is placed on; `auth`: the
/// caller's credential, shown to the other brokers. UNAVAILABLE naming
/// the partitions whose group did not form within `[cluster]
/// partition_form_timeout`.
///
/// Each partition's forming runs as its own task, which the deadline only
/// stops waiting for (bounded by [`FORM_LINGER`]): dropped half-way, a
/// create could leave a group record whose first member never
/// initialized the group. Partitions not begun by the deadline are not
/// begun.
pub async fn form_groups(
    node: &Arc<Node>,
    cluster: &Arc<Cluster>,
    base: &TopicName,
    range: Range<u32>,
    replicas: u32,
    auth: Option<&AsciiMetadataValue>,
) -> Result<(), BrokerError> {
    // Cluster mode only: the default when (never) standalone.
    let within = match &node.core.config.cluster {
        Some(c) => c.partition_form_timeout,
        None => ricochet_cluster::ClusterConfig::default().partition_form_timeout,
    };
    let deadline = tokio::time::Instant::now() + within;
    let started = std::time::Instant::now();
    let count = range.len();
    let late = || {
        "not formed in time (the broker it is placed on did not answer, or was still forming it)"
            .to_owned()
    };
    let mut failed: Vec<(u32, String)> = futures::stream::iter(range)
        .map(|i| {
            let (node, cluster, auth) = (node.clone(), cluster.clone(), auth.cloned());
            let name = partition(base, i);
            async move {
                if tokio::time::Instant::now() >= deadline {
                    return Some((i, late()));
                }
                let task = tokio::spawn(async move {
                    let formed = tokio::time::timeout(
                        FORM_LINGER,
                        form_one(&node, &cluster, &name, replicas, auth.as_ref()),
                    )
                    .await;
                    formed.unwrap_or_else(|_| Err(BrokerError::Peer(late())))
                });
                match tokio::time::timeout_at(deadline, task).await {
                    Ok(Ok(Ok(()))) => None,
                    Ok(Ok(Err(e))) => Some((i, e.to_string())),
                    Ok(Err(e)) => Some((i, format!("forming stopped: {e}"))),
                    Err(_) => Some((i, late())),
                }
            }
        })
        .buffer_unordered(FORM_PARALLEL)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let millis = started.elapsed().as_millis() as u64;
    if failed.is_empty() {
        tracing::info!(topic = %base, partitions = count, replicas, millis, "partitions' replication groups formed");
        return Ok(());
    }
    failed.sort();
    let mut which: Vec<String> = failed
        .iter()
        .take(NAMED)
        .map(|(i, _)| i.to_string())
        .collect();
    if failed.len() > NAMED {
        which.push(format!("... ({} in all)", failed.len()));
    }
    let (first, why) = &failed[0];
    tracing::warn!(topic = %base, not_formed = ?which, millis, "partitions' replication groups not formed");
    Err(BrokerError::Peer(format!(
        "{base} is created, but the replication groups of partitions {} (of {count}) did not form \
         within {within:?} (partition {first}: {why}); they form when first used",
        which.join(", ")
    )))
}

/// Forms `name`'s group of factor `replicas` at the broker it is placed on.
async fn form_one(
    node: &Node,
    cluster: &Cluster,
    name: &TopicName,
    replicas: u32,
    auth: Option<&AsciiMetadataValue>,
) -> Result<(), BrokerError> {
    // Where it is placed (it was at create), claimed when that is here.
    let AdminAt::Owner { broker, mut client } = admin_at(&node.core.config, cluster, name).await?
    else {
        let groups = node.groups().ok_or_else(|| {
            BrokerError::Peer("this broker's replication groups are not started".into())
        })?;
        factor::peers_ready(&node.core.config, replicas)?;
        groups.create(name, replicas).await?;
        return Ok(());
    };
    let request = CreateTopicRequest {
        topic: name.to_string(),
        replicas,
    };
    client
        .create_topic(authorized(request, auth))
        .await
        .map_err(|s| BrokerError::Peer(format!("broker {broker}: {}", s.message())))?;
    // This broker's list of groups (what `ListBrokers` here shows) has
    // the new record now, not at its next read.
    if let Some(groups) = node.groups() {
        groups.read_group(name.as_str()).await?;
    }
    Ok(())
}
