//! The `Partitions` service: create a partitioned topic, look up and raise
//! its partition count; standalone through the node's partitions, in
//! cluster mode through etcd (the partitions are placed over the brokers).
//! The admin service's view of a partitioned topic as a whole is
//! [`super::fanout`].

use crate::error::BrokerError;
use crate::name::{TopicName, check_partition_count};
use crate::node::Node;
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
}

#[tonic::async_trait]
impl Partitions for PartitionsService {
    async fn create_partitioned_topic(
        &self,
        r: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        match self.node.cluster() {
            // The count lives in etcd; the partitions are placed over the
            // brokers and created by each on first use.
            Some(c) => {
                check_partition_count(&name, r.partitions)?;
                c.create_partitioned(name.as_str(), r.partitions)
                    .await
                    .map_err(BrokerError::from)?
            }
            None => self.node.partitions.create(&name, r.partitions).await?,
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
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        let partitions = match self.node.cluster() {
            Some(c) => {
                c.update_partitions(name.as_str(), r.partitions, |n| {
                    check_partition_count(&name, n)
                })
                .await?
            }
            None => self.node.partitions.update(&name, r.partitions).await?,
        };
        Ok(Response::new(PartitionedTopicMetadata {
            topic: name.to_string(),
            partitions,
        }))
    }
}
