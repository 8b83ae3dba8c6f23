//! The `Tiered` service on the wire: offloading a topic now, its offload
//! status, and the offload policies of namespaces and topics (see
//! [`crate::storage::tiered`]). Without a `[tiered]` section every call is
//! FAILED_PRECONDITION; a bad name or a negative threshold is
//! INVALID_ARGUMENT and changes nothing. A replicated topic is offloaded
//! by its group's leader, each segment a command of the group
//! (`Tiered::offload_through`, after a seal of its active segment by the
//! group: FAILED_PRECONDITION naming the member while one does not
//! advertise that it applies the seal, `crate::replication::gate`), and
//! its own offload policy is a command
//! of the group too, which the leader's pass follows
//! ([`crate::replication::offload`]).

use crate::error::BrokerError;
use crate::name::Target;
use crate::name::TopicName;
use crate::node::Node;
use crate::offload_policies::NamespaceOffload;
use crate::replication::offload::ThroughGroup;
use crate::storage::TopicKind;
use crate::storage::tiered::policy::OffloadPolicy as Policy;
use crate::storage::tiered::{Phase, Tiered};
use ricochet_proto::tiered_server::Tiered as TieredRpc;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Tiered` RPCs.
#[derive(Debug, Clone)]
pub struct TieredService {
    node: Arc<Node>,
    tiered: Option<Arc<Tiered>>,
    /// The namespaces' policies (in a cluster, the cluster's).
    namespaces: Option<NamespaceOffload>,
}

impl TieredService {
    /// A service over `node` and its object-store tier, if configured,
    /// with the tier's namespace policies.
    pub fn new(
        node: Arc<Node>,
        tiered: Option<Arc<Tiered>>,
        namespaces: Option<NamespaceOffload>,
    ) -> Self {
        Self {
            node,
            tiered,
            namespaces,
        }
    }

    fn tiered(&self) -> Result<&Arc<Tiered>, BrokerError> {
        self.tiered.as_ref().ok_or_else(|| {
            BrokerError::Conflict(
                "tiered storage is not configured on this broker (no [tiered] section)".into(),
            )
        })
    }

    /// An existing ordinary topic.
    async fn ordinary(&self, topic: &str) -> Result<TopicName, BrokerError> {
        let name = TopicName::parse(topic)?;
        let entry = self.node.core.topic(&name).await?;
        if entry.topic.kind() != TopicKind::Normal {
            return Err(BrokerError::Conflict(format!(
                "{name} is a retry or dead-letter tier: only ordinary topics are offloaded"
            )));
        }
        Ok(name)
    }

    /// The policy set on `target` and, for a topic, the one in force. A
    /// namespace's is read where it is kept (in a cluster, etcd).
    async fn answer(&self, target: &Target) -> Result<OffloadPolicyResponse, BrokerError> {
        let t = self.tiered()?;
        let own = match (target, &self.namespaces) {
            (Target::Namespace(ns), Some(n)) => n.get(ns).await?,
            _ => t.policies().get(target.key()),
        };
        let (effective, from) = match target {
            Target::Namespace(_) => (own.clone(), own.as_ref().map(|_| target.key().to_owned())),
            Target::Topic(name) => match t.effective(name.as_str()) {
                Some((p, from)) => (Some(p), Some(from)),
                None => (None, None),
            },
        };
        Ok(OffloadPolicyResponse {
            target: target.key().to_owned(),
            policy: own.as_ref().map(to_wire),
            effective: effective.as_ref().map(to_wire),
            effective_from: from.unwrap_or_default(),
        })
    }
}

fn to_wire(p: &Policy) -> OffloadPolicy {
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    OffloadPolicy {
        offload_after_ms: p.offload_after_ms.map(signed),
        local_limit_bytes: p.local_limit_bytes.map(signed),
        delete_lag_ms: p.delete_lag_ms.map(signed),
        keep_local: p.keep_local,
    }
}

fn from_wire(p: OffloadPolicy) -> Result<Policy, BrokerError> {
    let check = |v: Option<i64>, what: &str, zero_ok: bool| match v {
        None => Ok(None),
        Some(n) if n > 0 || (zero_ok && n == 0) => Ok(Some(n as u64)),
        Some(n) => Err(BrokerError::InvalidArgument(format!(
            "{what} must be {}, got {n} (leave it unset for none)",
            if zero_ok { "zero or more" } else { "positive" }
        ))),
    };
    Ok(Policy {
        offload_after_ms: check(p.offload_after_ms, "offload_after_ms", true)?,
        local_limit_bytes: check(p.local_limit_bytes, "local_limit_bytes", true)?,
        delete_lag_ms: check(p.delete_lag_ms, "delete_lag_ms", true)?,
        keep_local: p.keep_local,
    })
}

#[tonic::async_trait]
impl TieredRpc for TieredService {
    async fn offload(
        &self,
        r: Request<TieredOffloadRequest>,
    ) -> Result<Response<TieredOffloadResponse>, Status> {
        let t = self.tiered()?.clone();
        let name = self.ordinary(&r.get_ref().topic).await?;
        let entry = self.node.core.topic(&name).await?;
        let done = if entry.topic.is_replicated() {
            // It seals the active segment through the group first
            // (`SealBelow`): refused while a member would not apply it.
            if let Some(groups) = self.node.groups()
                && let Some(why) = groups
                    .unready_for(name.as_str(), crate::replication::gate::SEAL_BELOW)
                    .await
            {
                return Err(BrokerError::Conflict(format!(
                    "{name} is not offloaded: its group's seal cannot be proposed while a member may not apply it ({why})"
                ))
                .into());
            }
            // The leader's offload, a command of the group per segment.
            let recorder = ThroughGroup(entry.topic.storage().clone());
            t.offload_through(name.as_str(), &recorder).await
        } else {
            t.offload_topic(name.as_str(), true).await
        }
        .map_err(BrokerError::from)?;
        Ok(Response::new(TieredOffloadResponse {
            offloaded_segments: done.segments,
            offloaded_bytes: done.bytes,
            local_deleted: done.local_deleted,
        }))
    }

    async fn offload_status(
        &self,
        r: Request<TieredStatusRequest>,
    ) -> Result<Response<TieredStatusResponse>, Status> {
        let t = self.tiered()?.clone();
        let name = self.ordinary(&r.get_ref().topic).await?;
        let topic = name.as_str();
        let states = t.states(topic);
        let mut resp = TieredStatusResponse {
            topic: topic.to_owned(),
            enabled: true,
            last_error: t.last_error(topic).unwrap_or_default(),
            ..Default::default()
        };
        let seg =
            |first, next, state: &str, bytes, s: Option<&crate::storage::tiered::SegmentState>| {
                TieredSegment {
                    first,
                    next,
                    state: state.to_owned(),
                    bytes,
                    object: s.map(|s| s.key.clone()).unwrap_or_default(),
                    offloaded_at_ms: s.map_or(0, |s| s.offloaded_ms),
                }
            };
        for s in t.remote(topic) {
            resp.offloaded_segments += 1;
            resp.offloaded_bytes += s.file_len;
            resp.remote_only_segments += 1;
            resp.segments
                .push(seg(s.first, s.next, "remote", s.file_len, Some(&s)));
        }
        for l in t.log().segment_infos(topic) {
            resp.local_segments += 1;
            resp.local_bytes += l.len;
            let s = states.get(&l.header.first);
            let state = match (l.active, s.map(|s| s.phase)) {
                (true, _) => "active",
                (false, Some(Phase::Offloaded)) => {
                    resp.offloaded_segments += 1;
                    resp.offloaded_bytes += l.len;
                    "offloaded"
                }
                (false, Some(Phase::Offloading)) => "offloading",
                (false, None) => "local",
            };
            resp.segments
                .push(seg(l.header.first, l.next, state, l.len, s));
        }
        if let Some((p, from)) = t.effective(topic) {
            resp.effective = Some(to_wire(&p));
            resp.effective_from = from;
        }
        Ok(Response::new(resp))
    }

    async fn set_offload_policy(
        &self,
        r: Request<SetOffloadPolicyRequest>,
    ) -> Result<Response<OffloadPolicyResponse>, Status> {
        let t = self.tiered()?.clone();
        let r = r.into_inner();
        let target = Target::parse(&r.namespace, &r.topic)?;
        let policy = from_wire(r.policy.unwrap_or_default())?;
        match &target {
            // A replicated topic's own policy is its group's: committed
            // and applied on every replica before the answer.
            Target::Topic(name)
                if self
                    .node
                    .groups()
                    .is_some_and(|g| g.group_of(name.as_str()).is_some()) =>
            {
                let entry = self.node.core.topic(name).await?;
                if !entry.topic.is_replicated() {
                    return Err(BrokerError::Peer(format!(
                        "{name} is replicated and its leader is taking it over; look it up again"
                    ))
                    .into());
                }
                entry
                    .topic
                    .storage()
                    .put_offload_policy(name.as_str(), &policy)
                    .map_err(BrokerError::from)?;
            }
            // A namespace's: in a cluster, etcd's first.
            Target::Namespace(ns) if self.namespaces.is_some() => {
                if let Some(n) = &self.namespaces {
                    n.set(ns, policy).await?;
                }
            }
            _ => {
                t.set_policy(target.key(), policy)
                    .map_err(BrokerError::from)?;
                self.node.core.flusher.durable().await?;
            }
        }
        Ok(Response::new(self.answer(&target).await?))
    }

    async fn get_offload_policy(
        &self,
        r: Request<GetOffloadPolicyRequest>,
    ) -> Result<Response<OffloadPolicyResponse>, Status> {
        let r = r.into_inner();
        let target = Target::parse(&r.namespace, &r.topic)?;
        Ok(Response::new(self.answer(&target).await?))
    }
}
