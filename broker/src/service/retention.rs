//! The `Retention` service on the wire: setting and reading the retention
//! policies of namespaces and topics (see [`crate::retention`]). Limits
//! must be positive; a negative or zero one, both or neither of namespace
//! and topic, or a bad name is INVALID_ARGUMENT and changes nothing.

use crate::core::BrokerCore;
use crate::error::BrokerError;
use crate::retention::Target;
use crate::storage::RetentionRecord;
use ricochet_proto::retention_server::Retention;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Retention` RPCs.
#[derive(Debug, Clone)]
pub struct RetentionService {
    core: Arc<BrokerCore>,
}

impl RetentionService {
    /// A service over `core`.
    pub fn new(core: Arc<BrokerCore>) -> Self {
        Self { core }
    }

    fn answer(&self, target: &Target) -> RetentionResponse {
        let policies = &self.core.retention;
        let own = policies.get(target.key());
        let (effective, from) = match target {
            Target::Namespace(_) => (own.clone(), own.as_ref().map(|r| r.target.clone())),
            Target::Topic(t) => {
                let e = policies.effective(t);
                let from = e.as_ref().map(|r| r.target.clone());
                (e, from)
            }
        };
        RetentionResponse {
            target: target.key().to_owned(),
            policy: own.as_ref().map(to_wire),
            effective: effective.as_ref().map(to_wire),
            effective_from: from.unwrap_or_default(),
        }
    }
}

fn to_wire(r: &RetentionRecord) -> RetentionPolicy {
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    RetentionPolicy {
        max_age_ms: r.max_age_ms.map(signed),
        max_size_bytes: r.max_size_bytes.map(signed),
    }
}

/// A limit from the wire: unset is none; it must be positive.
fn limit(v: Option<i64>, what: &str) -> Result<Option<u64>, BrokerError> {
    match v {
        None => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as u64)),
        Some(n) => Err(BrokerError::InvalidArgument(format!(
            "{what} must be positive, got {n} (leave it unset for no limit)"
        ))),
    }
}

#[tonic::async_trait]
impl Retention for RetentionService {
    async fn set_retention(
        &self,
        r: Request<SetRetentionRequest>,
    ) -> Result<Response<RetentionResponse>, Status> {
        let r = r.into_inner();
        let target = Target::parse(&r.namespace, &r.topic)?;
        let p = r.policy.unwrap_or_default();
        let age = limit(p.max_age_ms, "max_age_ms")?;
        let size = limit(p.max_size_bytes, "max_size_bytes")?;
        self.core
            .retention
            .set(&self.core, &target, age, size)
            .await?;
        tracing::info!(target = target.key(), max_age_ms = ?age, max_size_bytes = ?size, "retention policy set");
        Ok(Response::new(self.answer(&target)))
    }

    async fn get_retention(
        &self,
        r: Request<GetRetentionRequest>,
    ) -> Result<Response<RetentionResponse>, Status> {
        let r = r.into_inner();
        let target = Target::parse(&r.namespace, &r.topic)?;
        Ok(Response::new(self.answer(&target)))
    }
}
