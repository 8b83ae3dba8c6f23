//! The `Partitions` service: create a partitioned topic, look up and raise
//! its partition count; standalone through the node's partitions, in
//! cluster mode through etcd (the partitions are placed over the brokers).
//! A partitioned topic created with a factor above 1 (or in a namespace
//! whose default is) has it recorded in etcd, and each partition becomes
//! its own Raft group of that factor before the create answers ([`form`]);
//! partitions added by a raised count likewise. A group that did not form
//! in time forms when its partition is first used
//! (`replication::groups`).
//! The admin service's view of a partitioned topic as a whole is
//! [`super::fanout`].

mod form;

use crate::error::BrokerError;
use crate::name::{TopicName, check_partition_count};
use crate::node::Node;
use crate::replication::{factor, namespaces};
use ricochet_cluster::Cluster;
use ricochet_proto::partitions_server::Partitions;
use ricochet_proto::{PartitionedTopicMetadata, PartitionsRequest, UpdatePartitionsRequest};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Partitions` RPCs.
#[derive(Debug, Clone)]
pub struct PartitionsService {
    node: Arc<Node>,
}

impl PartitionsService {
    /// A service over `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// The factor a partitioned topic `name` created asking for
    /// `requested` (0: its namespace's default, else the cluster's) gets
    /// in `cluster`, checked against the live brokers and this broker's
    /// peer setup (a token with auth on, a CA with TLS).
    async fn factor(
        &self,
        cluster: &Cluster,
        name: &TopicName,
        requested: u32,
    ) -> Result<u32, BrokerError> {
        let config = &self.node.core.config;
        let wanted = match requested {
            0 => {
                let cluster_default = config.cluster.as_ref().map_or(1, |c| c.default_replicas);
                namespaces::default_factor(cluster, name.namespace(), cluster_default).await?
            }
            r => r,
        };
        let live = cluster
            .brokers()
            .await?
            .iter()
            .filter(|b| b.live && !b.draining)
            .count();
        let replicas = factor::check(wanted, Some(live))?;
        factor::peers_ready(config, replicas)?;
        Ok(replicas)
    }
}

#[tonic::async_trait]
impl Partitions for PartitionsService {
    async fn create_partitioned_topic(
        &self,
        r: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let auth = r.metadata().get("authorization").cloned();
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        match self.node.cluster() {
            // The count lives in etcd; the partitions are placed over the
            // brokers; with a factor above 1 each is formed as a group now,
            // else created by the broker it is placed on at first use.
            Some(c) => {
                check_partition_count(&name, r.partitions)?;
                let replicas = self.factor(c, &name, r.replicas).await?;
                let factor = namespaces::partitioned_factor_record(c, name.as_str(), replicas);
                c.create_partitioned(name.as_str(), r.partitions, factor.as_slice())
                    .await
                    .map_err(BrokerError::from)?;
                if replicas > 1 {
                    form::form_groups(
                        &self.node,
                        c,
                        &name,
                        0..r.partitions,
                        replicas,
                        auth.as_ref(),
                    )
                    .await?;
                }
            }
            None => {
                // Standalone every topic has factor 1: above is refused.
                factor::check(r.replicas, None)?;
                self.node.partitions.create(&name, r.partitions).await?
            }
        }
        Ok(Response::new(PartitionedTopicMetadata {
            topic: name.to_string(),
            partitions: r.partitions,
        }))
    }

    async fn get_partitions(
        &self,
        r: Request<PartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let name = TopicName::parse(&r.into_inner().topic)?;
        let count = match self.node.cluster() {
            Some(c) => c
                .partition_count(name.as_str())
                .await
                .map_err(BrokerError::from)?,
            None => self.node.partitions.count(&name),
        };
        Ok(Response::new(PartitionedTopicMetadata {
            partitions: count.unwrap_or(0),
            topic: name.to_string(),
        }))
    }

    async fn update_partitions(
        &self,
        r: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let auth = r.metadata().get("authorization").cloned();
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        let partitions = match self.node.cluster() {
            Some(c) => {
                let before = c
                    .partition_count(name.as_str())
                    .await
                    .map_err(BrokerError::from)?
                    .unwrap_or(0);
                let after = c
                    .update_partitions(name.as_str(), r.partitions, |n| {
                        check_partition_count(&name, n)
                    })
                    .await?;
                // The partitions added take the topic's factor: above 1
                // their groups form now, as at create.
                if after > before
                    && let Some(replicas) = namespaces::partitioned_factor(c, name.as_str())
                        .await?
                        .filter(|r| *r > 1)
                {
                    form::form_groups(&self.node, c, &name, before..after, replicas, auth.as_ref())
                        .await?;
                }
                after
            }
            None => self.node.partitions.update(&name, r.partitions).await?,
        };
        Ok(Response::new(PartitionedTopicMetadata {
            topic: name.to_string(),
            partitions,
        }))
    }
}
