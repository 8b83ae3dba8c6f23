//! Partitioned topics (a topic split into N ordinary topics
//! `<topic>-partition-<i>`): [`Admin::create_partitioned_topic`],
//! [`Admin::partitions`], [`Admin::update_partitions`]. Asked of the
//! client's broker: any broker of a cluster keeps the counts.

use ricochet_proto::UpdatePartitionsRequest;
use ricochet_proto::partitions_client::PartitionsClient;

use super::{Admin, PartitionedTopic};
use crate::error::Result;

impl Admin {
    /// Creates `topic` as a partitioned topic of `partitions` partitions
    /// (1 to the broker's maximum); [`ErrorKind::AlreadyExists`](crate::ErrorKind)
    /// when it exists.
    pub async fn create_partitioned_topic(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<PartitionedTopic> {
        let req = UpdatePartitionsRequest {
            topic: topic.to_owned(),
            partitions,
            replicas: 0,
        };
        self.on_service(req, |t, r| async move {
            PartitionsClient::new(t).create_partitioned_topic(r).await
        })
        .await
    }

    /// Creates `topic` as a partitioned topic of `partitions` partitions,
    /// each with replication factor `replicas` (0: the namespace's default,
    /// else the cluster's): in a cluster, each partition is its own Raft
    /// group of that many brokers, formed (a leader elected) before this
    /// answers. Above 1 needs cluster mode and that many live brokers
    /// ([`ErrorKind::FailedPrecondition`](crate::ErrorKind) otherwise).
    /// [`ErrorKind::Unavailable`](crate::ErrorKind) naming partitions whose
    /// group did not form within the broker's bound (30 s): the topic is
    /// created all the same, and those form when first used.
    pub async fn create_replicated_partitioned_topic(
        &self,
        topic: &str,
        partitions: u32,
        replicas: u32,
    ) -> Result<PartitionedTopic> {
        let req = UpdatePartitionsRequest {
            topic: topic.to_owned(),
            partitions,
            replicas,
        };
        self.on_service(req, |t, r| async move {
            PartitionsClient::new(t).create_partitioned_topic(r).await
        })
        .await
    }

    /// `topic`'s fully qualified base name and partition count when it is
    /// a partitioned topic; `None` when it is not (an ordinary topic, none
    /// of that name, or a broker older than partitioned topics).
    pub async fn partitions(&self, topic: &str) -> Result<Option<PartitionedTopic>> {
        Ok(crate::partitions::count_once(&self.client, topic)
            .await?
            .map(|(topic, partitions)| PartitionedTopic { topic, partitions }))
    }

    /// Raises the partition count of partitioned `topic` to `partitions`
    /// (never lowers it; the same count changes nothing).
    pub async fn update_partitions(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<PartitionedTopic> {
        let req = UpdatePartitionsRequest {
            topic: topic.to_owned(),
            partitions,
            replicas: 0,
        };
        self.on_service(req, |t, r| async move {
            PartitionsClient::new(t).update_partitions(r).await
        })
        .await
    }
}
