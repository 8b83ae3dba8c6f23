//! [`AuthorizedTiered`]: the `Tiered` service behind the permission table
//! ([`super::admin::required`]): offloading a topic and setting an offload
//! policy need `admin` on the topic or namespace, reading status or a
//! policy any permission on it.

use super::AUDIT;
use super::admin::who;
use super::retention::TargetGuard;
use crate::service::TieredService;
use ricochet_proto::tiered_server::Tiered;
use ricochet_proto::*;
use tonic::{Request, Response, Status};

/// The tiered-storage service, checked.
pub type AuthorizedTiered = TargetGuard<TieredService>;

#[tonic::async_trait]
impl Tiered for TargetGuard<TieredService> {
    async fn offload(
        &self,
        r: Request<TieredOffloadRequest>,
    ) -> Result<Response<TieredOffloadResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        let p = self.check(&r, "Tiered/Offload", "", &topic)?;
        self.route(&topic).await?;
        let resp = self.inner.offload(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "offload", %topic);
        Ok(resp)
    }

    async fn offload_status(
        &self,
        r: Request<TieredStatusRequest>,
    ) -> Result<Response<TieredStatusResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Tiered/OffloadStatus", "", &topic)?;
        self.route(&topic).await?;
        self.inner.offload_status(r).await
    }

    async fn set_offload_policy(
        &self,
        r: Request<SetOffloadPolicyRequest>,
    ) -> Result<Response<OffloadPolicyResponse>, Status> {
        let (ns, topic) = (r.get_ref().namespace.clone(), r.get_ref().topic.clone());
        let policy = r.get_ref().policy;
        let p = self.check(&r, "Tiered/SetOffloadPolicy", &ns, &topic)?;
        self.route(&topic).await?;
        let resp = self.inner.set_offload_policy(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "set-offload-policy", namespace = %ns, %topic, ?policy);
        Ok(resp)
    }

    async fn get_offload_policy(
        &self,
        r: Request<GetOffloadPolicyRequest>,
    ) -> Result<Response<OffloadPolicyResponse>, Status> {
        let (ns, topic) = (r.get_ref().namespace.clone(), r.get_ref().topic.clone());
        self.check(&r, "Tiered/GetOffloadPolicy", &ns, &topic)?;
        self.route(&topic).await?;
        self.inner.get_offload_policy(r).await
    }
}
