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
use tonic::{Request, Response, Status, Streaming};

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

    async fn drain(&self, r: Request<DrainRequest>) -> Result<Response<DrainResponse>, Status> {
        superuser(&self.auth, &r, "Cluster/Drain")?;
        self.inner.drain(r).await
    }

    async fn move_topic(
        &self,
        r: Request<MoveTopicRequest>,
    ) -> Result<Response<MoveTopicResponse>, Status> {
        superuser(&self.auth, &r, "Cluster/MoveTopic")?;
        self.inner.move_topic(r).await
    }

    async fn import_topic(
        &self,
        r: Request<Streaming<TopicTransferPart>>,
    ) -> Result<Response<ImportTopicResponse>, Status> {
        superuser(&self.auth, &r, "Cluster/ImportTopic")?;
        self.inner.import_topic(r).await
    }
}

/// Refuses `method` to anyone but a superuser (moving data between brokers
/// is the cluster operator's business). With authentication off everyone
/// is one.
fn superuser<T>(auth: &Auth, r: &Request<T>, method: &str) -> Result<(), Status> {
    let p = principal(auth, r)?;
    if auth.is_superuser(p.as_ref()) {
        return Ok(());
    }
    Err(super::admin::superusers_only(method, p.as_ref()).into())
}
