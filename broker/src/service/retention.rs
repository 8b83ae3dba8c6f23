//! The `Retention` service on the wire: setting and reading the retention
//! policies of namespaces and topics (see [`crate::retention`]). Limits
//! must be positive; a negative or zero one, both or neither of namespace
//! and topic, or a bad name is INVALID_ARGUMENT and changes nothing.

use crate::error::BrokerError;
use crate::node::Node;
use crate::retention::Target;
use crate::storage::{QuotaAction, RetentionRecord};
use ricochet_proto::retention_server::Retention;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Retention` RPCs.
#[derive(Debug, Clone)]
pub struct RetentionService {
    node: Arc<Node>,
}

impl RetentionService {
    /// A service over `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// The policy set on `target` and, for a topic, the one in force. A
    /// namespace's is read where it is kept (in a cluster, etcd).
    async fn answer(&self, target: &Target) -> Result<RetentionResponse, BrokerError> {
        let retention = &self.node.retention;
        let policies = retention.policies();
        let own = match target {
            Target::Namespace(ns) => retention.namespace_policy(ns).await?,
            Target::Topic(_) => policies.get(target.key()),
        };
        let (effective, from) = match target {
            Target::Namespace(_) => (own.clone(), own.as_ref().map(|r| r.target.clone())),
            Target::Topic(t) => {
                let e = policies.effective(t);
                let from = e.as_ref().map(|r| r.target.clone());
                (e, from)
            }
        };
        Ok(RetentionResponse {
            target: target.key().to_owned(),
            policy: own.as_ref().map(to_wire),
            effective: effective.as_ref().map(to_wire),
            effective_from: from.unwrap_or_default(),
        })
    }
}

fn to_wire(r: &RetentionRecord) -> RetentionPolicy {
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    RetentionPolicy {
        max_age_ms: r.max_age_ms.map(signed),
        max_size_bytes: r.max_size_bytes.map(signed),
        backlog_quota_bytes: r.backlog_quota_bytes.map(signed),
        quota_action: match (r.backlog_quota_bytes, r.quota_action) {
            (None, _) => String::new(),
            (Some(_), QuotaAction::Refuse) => "refuse".into(),
            (Some(_), QuotaAction::DropOldest) => "drop_oldest".into(),
        },
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
        let quota = limit(p.backlog_quota_bytes, "backlog_quota_bytes")?;
        let quota_action = match (p.quota_action.as_str(), quota) {
            ("" | "refuse", _) => QuotaAction::Refuse,
            ("drop_oldest", Some(_)) => QuotaAction::DropOldest,
            ("drop_oldest", None) => {
                return Err(BrokerError::InvalidArgument(
                    "quota_action needs backlog_quota_bytes".into(),
                )
                .into());
            }
            (other, _) => {
                return Err(BrokerError::InvalidArgument(format!(
                    "unknown quota_action {:?}: expected refuse or drop_oldest",
                    other.chars().take(64).collect::<String>()
                ))
                .into());
            }
        };
        let record = RetentionRecord {
            target: String::new(),
            max_age_ms: limit(p.max_age_ms, "max_age_ms")?,
            max_size_bytes: limit(p.max_size_bytes, "max_size_bytes")?,
            backlog_quota_bytes: quota,
            quota_action,
        };
        let set = self.node.retention.set(&target, record).await?;
        tracing::info!(target = target.key(), policy = ?set, "retention policy set");
        Ok(Response::new(self.answer(&target).await?))
    }

    async fn get_retention(
        &self,
        r: Request<GetRetentionRequest>,
    ) -> Result<Response<RetentionResponse>, Status> {
        let r = r.into_inner();
        let target = Target::parse(&r.namespace, &r.topic)?;
        Ok(Response::new(self.answer(&target).await?))
    }
}
