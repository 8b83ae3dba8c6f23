//! [`TargetGuard`], the permission check of services about a namespace or
//! a topic, and [`AuthorizedRetention`]: the `Retention` service behind the permission
//! table ([`super::admin::required`]): setting a namespace's or topic's
//! retention policy needs `admin` on it, reading it any permission on it.

use super::admin::{principal, required, who};
use super::{AUDIT, Auth, Principal, Requirement};
use crate::error::BrokerError;
use crate::retention::Target;
use crate::service::RetentionService;
use ricochet_proto::retention_server::Retention;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// A service whose calls each name a namespace or a topic (retention,
/// tiered storage), behind the permission table: [`TargetGuard::check`]
/// checks the caller against the method's requirement on that target, and
/// [`TargetGuard::route`] refuses, in cluster mode, a topic this broker
/// does not own (a namespace's policy is set on each broker it is sent to).
#[derive(Debug, Clone)]
pub struct TargetGuard<S> {
    pub(super) inner: S,
    auth: Arc<Auth>,
    cluster: Option<Arc<crate::cluster::Cluster>>,
}

/// The retention service, checked.
pub type AuthorizedRetention = TargetGuard<RetentionService>;

impl<S> TargetGuard<S> {
    /// Checks calls to `inner` against `auth`.
    pub fn new(inner: S, auth: Arc<Auth>) -> Self {
        Self {
            inner,
            auth,
            cluster: None,
        }
    }

    /// In cluster mode, also refuses calls about a topic this broker does
    /// not own.
    pub fn routed(mut self, cluster: Option<Arc<crate::cluster::Cluster>>) -> Self {
        self.cluster = cluster;
        self
    }

    pub(super) async fn route(&self, topic: &str) -> Result<(), Status> {
        if topic.is_empty() {
            return Ok(());
        }
        super::admin::route(self.cluster.as_ref(), topic, false).await
    }

    /// Checks `method` on a namespace or topic.
    pub(super) fn check<T>(
        &self,
        r: &Request<T>,
        method: &str,
        namespace: &str,
        topic: &str,
    ) -> Result<Option<Principal>, Status> {
        check_target(&self.auth, r, method, namespace, topic)
    }
}

/// Checks `method` of a call about a namespace or a topic (exactly one of
/// them named) against the permission table: the caller, if allowed.
fn check_target<T>(
    auth: &Auth,
    r: &Request<T>,
    method: &str,
    namespace: &str,
    topic: &str,
) -> Result<Option<Principal>, Status> {
    let p = principal(auth, r)?;
    if auth.is_superuser(p.as_ref()) {
        return Ok(p);
    }
    let target = Target::parse(namespace, topic)?;
    let (a, p_ref) = (auth, p.as_ref());
    match (required(method), &target) {
        (Some(Requirement::Permission(perm)), Target::Namespace(ns)) => {
            a.check_namespace(p_ref, ns, perm)?
        }
        (Some(Requirement::Permission(perm)), Target::Topic(t)) => a.check(p_ref, t, perm)?,
        (Some(Requirement::Visible), Target::Namespace(ns)) => {
            a.check_namespace_visible(p_ref, ns)?
        }
        (Some(Requirement::Visible), Target::Topic(t)) => a.check_visible(p_ref, t)?,
        (Some(Requirement::Authenticated), _) => {}
        (Some(Requirement::Superuser), _) => {
            return Err(super::admin::superusers_only(method, p_ref).into());
        }
        (None, _) => {
            return Err(BrokerError::PermissionDenied(format!(
                "{method} has no permission mapping"
            ))
            .into());
        }
    }
    Ok(p)
}

#[tonic::async_trait]
impl Retention for TargetGuard<RetentionService> {
    async fn set_retention(
        &self,
        r: Request<SetRetentionRequest>,
    ) -> Result<Response<RetentionResponse>, Status> {
        let (ns, topic) = (r.get_ref().namespace.clone(), r.get_ref().topic.clone());
        let policy = r.get_ref().policy.clone();
        let p = self.check(&r, "Retention/SetRetention", &ns, &topic)?;
        self.route(&topic).await?;
        let resp = self.inner.set_retention(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "set-retention", namespace = %ns, %topic, ?policy);
        Ok(resp)
    }

    async fn get_retention(
        &self,
        r: Request<GetRetentionRequest>,
    ) -> Result<Response<RetentionResponse>, Status> {
        let (ns, topic) = (r.get_ref().namespace.clone(), r.get_ref().topic.clone());
        self.check(&r, "Retention/GetRetention", &ns, &topic)?;
        self.route(&topic).await?;
        self.inner.get_retention(r).await
    }
}
