//! [`AuthorizedCluster`]: the `Cluster` service behind the permission
//! table. `Lookup` needs some permission on the topic (as `TopicStats`
//! does: it reveals where the topic lives); `ListBrokers` only an
//! authenticated caller, and the topic names it lists (`with_topics`) are
//! filtered to those the caller may see, as `ListTopics` filters.

use super::Auth;
use super::admin::{check_call, principal};
use crate::name::TopicName;
use crate::service::ClusterService;
use ricochet_proto::cluster_server::Cluster;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The cluster service, checked.
#[derive(Debug, Clone)]
pub struct AuthorizedCluster {
    inner: ClusterService,
    auth: Arc<Auth>,
}

impl AuthorizedCluster {
    /// Checks calls to `inner` against `auth`.
    pub fn new(inner: ClusterService, auth: Arc<Auth>) -> Self {
        Self { inner, auth }
    }
}

#[tonic::async_trait]
impl Cluster for AuthorizedCluster {
    async fn lookup(&self, r: Request<LookupRequest>) -> Result<Response<LookupResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        check_call(&self.auth, &r, "Cluster/Lookup", &topic)?;
        self.inner.lookup(r).await
    }

    async fn list_brokers(
        &self,
        r: Request<ListBrokersRequest>,
    ) -> Result<Response<ListBrokersResponse>, Status> {
        let p = principal(&self.auth, &r)?;
        let mut resp = self.inner.list_brokers(r).await?;
        if !self.auth.is_superuser(p.as_ref()) {
            for b in &mut resp.get_mut().brokers {
                b.topics.retain(|t| {
                    TopicName::parse_stored(t)
                        .is_ok_and(|t| self.auth.check_visible(p.as_ref(), &t).is_ok())
                });
            }
        }
        Ok(resp)
    }
}
