//! [`AuthorizedPartitions`]: the `Partitions` service behind the same
//! permission table as the admin service: creating and raising a
//! partitioned topic needs `admin`, looking its count up (as every
//! partition-aware producer and consumer does) any permission on it.

use super::admin::{check_call, who};
use super::{AUDIT, Auth};
use crate::service::PartitionsService;
use ricochet_proto::partitions_server::Partitions;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The partitions service, checked.
#[derive(Debug, Clone)]
pub struct AuthorizedPartitions {
    inner: PartitionsService,
    auth: Arc<Auth>,
}

impl AuthorizedPartitions {
    /// Checks calls to `inner` against `auth`.
    pub fn new(inner: PartitionsService, auth: Arc<Auth>) -> Self {
        Self { inner, auth }
    }
}

#[tonic::async_trait]
impl Partitions for AuthorizedPartitions {
    async fn create_partitioned_topic(
        &self,
        r: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let (topic, n) = (r.get_ref().topic.clone(), r.get_ref().partitions);
        let p = check_call(&self.auth, &r, "Partitions/CreatePartitionedTopic", &topic)?;
        let resp = self.inner.create_partitioned_topic(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "create-partitioned-topic", %topic, partitions = n);
        Ok(resp)
    }

    async fn get_partitions(
        &self,
        r: Request<PartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let topic = r.get_ref().topic.clone();
        check_call(&self.auth, &r, "Partitions/GetPartitions", &topic)?;
        self.inner.get_partitions(r).await
    }

    async fn update_partitions(
        &self,
        r: Request<UpdatePartitionsRequest>,
    ) -> Result<Response<PartitionedTopicMetadata>, Status> {
        let (topic, n) = (r.get_ref().topic.clone(), r.get_ref().partitions);
        let p = check_call(&self.auth, &r, "Partitions/UpdatePartitions", &topic)?;
        let resp = self.inner.update_partitions(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "update-partitions", %topic, partitions = n);
        Ok(resp)
    }
}
