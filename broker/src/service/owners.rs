//! [`Owners`]: the admin calls a partitioned topic's base name fans out
//! into, each made where its partition lives. Standalone, and for a
//! partition this broker owns, a call goes to the local admin service
//! (any [`Admin`]: the admin service hands itself in, so this module does
//! not know it); in cluster mode, for a partition another broker owns
//! (its group's leader when replicated), to that broker's `Admin` service
//! with the caller's credential, as moves call brokers. [`Owners`]
//! implements the generated [`Admin`] trait, so the combinators of
//! [`super::fanout`], written against that trait, are the same code in
//! both modes: there is no cluster variant of any of them.
//! [`Owners::at_every_broker`] makes one call at every other live broker
//! the same way, for the lists that are the cluster's (`super::everywhere`).
//!
//! A remote answer's error keeps its code; its message is prefixed with
//! the partition and the broker (`orders-partition-3 at broker b2: …`)
//! and its details (the owner trailers) are dropped: they name the
//! partition, not the topic the caller asked about. A partition whose
//! owner cannot be reached fails the call UNAVAILABLE, named the same way.
//! A caller's deadline (its `grpc-timeout`) bounds every remote call: at
//! nine tenths of it the broker gives up on the partition and answers
//! UNAVAILABLE naming it and its broker, before the caller gives up and
//! learns nothing. Without a deadline, a broker that stopped answering
//! (SIGSTOP, a hung host) is found by the channel's keep-alive
//! ([`PEER_KEEPALIVE`](super::routing::PEER_KEEPALIVE), about twice it), and a long call (a replay) on a
//! live broker goes on.

use super::routing::{AdminAt, admin_at, admin_client};
use crate::name::TopicName;
use crate::node::Node;
use crate::transfer::mover::authorized;
use ricochet_cluster::Cluster;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// Where each partition's admin call is made: here, or at its owner.
pub(crate) struct Owners<H> {
    /// This broker's admin service.
    here: H,
    /// In cluster mode: this broker's node and cluster.
    cluster: Option<(Arc<Node>, Arc<Cluster>)>,
    /// The caller's credential, shown to the other brokers.
    auth: Option<AsciiMetadataValue>,
    /// When the remote calls give up (from the caller's deadline).
    deadline: Option<Instant>,
}

impl<H: Admin> Owners<H> {
    /// Every call made through `here` (standalone).
    pub(crate) fn here(here: H) -> Self {
        Self {
            here,
            cluster: None,
            auth: None,
            deadline: None,
        }
    }

    /// Each call made at its topic's owner in `cluster`, on behalf of the
    /// caller whose request carried `metadata` (its credential and
    /// deadline).
    pub(crate) fn cluster(
        here: H,
        node: Arc<Node>,
        cluster: Arc<Cluster>,
        metadata: &MetadataMap,
    ) -> Self {
        let deadline = metadata
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout)
            .map(|t| Instant::now() + t * 9 / 10);
        Self {
            here,
            cluster: Some((node, cluster)),
            auth: metadata.get("authorization").cloned(),
            deadline,
        }
    }

    /// Where a call about `topic` goes: `None` here, else its owner's id
    /// and a client of its `Admin` service.
    async fn owner_of(
        &self,
        topic: &str,
    ) -> Result<Option<(String, AdminClient<Channel>)>, Status> {
        let Some((node, cluster)) = &self.cluster else {
            return Ok(None);
        };
        let name = TopicName::parse(topic)?;
        let found = self
            .bounded(admin_at(&node.core.config, cluster, &name))
            .await
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "{topic}: its owner was not found and reached before the call's deadline"
                ))
            })?;
        match found {
            Ok(AdminAt::Here) => Ok(None),
            Ok(AdminAt::Owner { broker, client }) => Ok(Some((broker, client))),
            Err(e) => {
                let s = Status::from(e);
                Err(Status::new(s.code(), format!("{topic}: {}", s.message())))
            }
        }
    }

    /// Every other live broker's answer to `call` with `message` (none
    /// standalone), all asked at once with the caller's credential and
    /// deadline. The first failure fails the whole: a broker not reached
    /// or not answering before the deadline is UNAVAILABLE naming `what`
    /// and the broker, as a partition's owner is.
    pub(super) async fn at_every_broker<Q, A, F, Fut>(
        &self,
        what: &str,
        message: Q,
        call: F,
    ) -> Result<Vec<A>, Status>
    where
        Q: Clone,
        F: Fn(AdminClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<A>, Status>>,
    {
        let Some((node, cluster)) = &self.cluster else {
            return Ok(Vec::new());
        };
        let brokers = self
            .bounded(cluster.brokers())
            .await
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "{what}: the brokers were not listed before the call's deadline"
                ))
            })?
            .map_err(crate::error::BrokerError::from)?;
        let asks = brokers
            .into_iter()
            .filter(|b| b.live && b.id != cluster.id())
            .map(|b| {
                let (message, call) = (message.clone(), &call);
                async move {
                    let client = self
                        .bounded(admin_client(&node.core.config, &b.id, &b.url))
                        .await
                        .ok_or_else(|| {
                            Status::unavailable(format!(
                                "{what} at broker {}: not reached before the call's deadline",
                                b.id
                            ))
                        })?
                        .map_err(|e| {
                            let s = Status::from(e);
                            Status::new(s.code(), format!("{what}: {}", s.message()))
                        })?;
                    let answer = self.answer(what, &b.id, call(client, self.remote(message)));
                    Ok::<_, Status>(answer.await?.into_inner())
                }
            });
        futures::future::try_join_all(asks).await
    }

    /// `call` within the deadline, if any (`None`: it passed).
    pub(super) async fn bounded<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        match self.deadline {
            Some(d) => tokio::time::timeout_at(d, call).await.ok(),
            None => Some(call.await),
        }
    }

    /// A request for the owner: `message` with the caller's credential and
    /// what is left of the deadline.
    fn remote<T>(&self, message: T) -> Request<T> {
        let mut r = authorized(message, self.auth.as_ref());
        if let Some(d) = self.deadline {
            r.set_timeout(d.saturating_duration_since(Instant::now()));
        }
        r
    }

    /// The owner's answer to a call about `topic`, its error naming the
    /// partition and `broker`.
    async fn answer<T>(
        &self,
        topic: &str,
        broker: &str,
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<Response<T>, Status> {
        let named =
            |code, why: &str| Status::new(code, format!("{topic} at broker {broker}: {why}"));
        let late = || {
            named(
                tonic::Code::Unavailable,
                "no answer before the call's deadline",
            )
        };
        match self.bounded(call).await {
            Some(Ok(r)) => Ok(r),
            // The request carried the deadline: the channel gave up at it.
            Some(Err(e))
                if e.code() == tonic::Code::Cancelled
                    && self.deadline.is_some_and(|d| Instant::now() >= d) =>
            {
                Err(late())
            }
            // Made by this side's channel, not answered by the broker: the
            // connection failed (a keep-alive unanswered, a reset).
            Some(Err(e)) if std::error::Error::source(&e).is_some() => Err(named(
                e.code(),
                &format!("no answer, the connection failed ({})", e.message()),
            )),
            Some(Err(e)) => Err(named(e.code(), e.message())),
            None => Err(late()),
        }
    }
}

/// A `grpc-timeout` value (digits and a unit: H, M, S, m, u, n).
fn grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The [`Admin`] methods of [`Owners`]: each made at the owner of the
/// topic its request names (`""`: no topic, made here).
macro_rules! at_owners {
    ($($fn:ident($req:ty) -> $resp:ty: |$r:ident| $topic:expr;)*) => {
        #[tonic::async_trait]
        impl<H: Admin> Admin for Owners<H> {
            $(
                async fn $fn(&self, r: Request<$req>) -> Result<Response<$resp>, Status> {
                    let topic = {
                        let $r = r.get_ref();
                        $topic.to_owned()
                    };
                    if topic.is_empty() {
                        return self.here.$fn(r).await;
                    }
                    let Some((broker, mut client)) = self.owner_of(&topic).await? else {
                        return self.here.$fn(r).await;
                    };
                    let request = self.remote(r.into_inner());
                    self.answer(&topic, &broker, client.$fn(request)).await
                }
            )*
        }
    };
}

at_owners! {
    list_topics(ListTopicsRequest) -> ListTopicsResponse: |_r| "";
    create_topic(CreateTopicRequest) -> TopicInfo: |r| r.topic;
    delete_topic(DeleteTopicRequest) -> DeleteTopicResponse: |r| r.topic;
    topic_stats(TopicRequest) -> TopicStatsResponse: |r| r.topic;
    list_subscriptions(TopicRequest) -> ListSubscriptionsResponse: |r| r.topic;
    subscription_stats(SubscriptionRequest) -> SubscriptionStatsResponse: |r| r.topic;
    delete_subscription(DeleteSubscriptionRequest) -> DeleteSubscriptionResponse: |r| r.topic;
    get_policy(SubscriptionRequest) -> PolicyResponse: |r| r.topic;
    set_policy(SetPolicyRequest) -> PolicyResponse: |r| r.topic;
    get_message(GetMessageRequest) -> GetMessageResponse: |r| r.id.as_ref().map_or("", |i| i.topic.as_str());
    list_dead_letters(ListDeadLettersRequest) -> ListDeadLettersResponse: |r| r.topic;
    replay_dead_letters(ReplayDeadLettersRequest) -> ReplayDeadLettersResponse: |r| r.topic;
    purge_dead_letters(PurgeDeadLettersRequest) -> PurgeDeadLettersResponse: |r| r.topic;
    group_dead_letters(GroupDeadLettersRequest) -> GroupDeadLettersResponse: |r| r.topic;
    list_replay_jobs(ListReplayJobsRequest) -> ListReplayJobsResponse: |r| r.topic;
    cancel_replay_job(CancelReplayJobRequest) -> CancelReplayJobResponse: |r| r.topic;
    set_breaker(SetBreakerRequest) -> BreakerStatus: |r| r.topic;
    set_namespace_replication(SetNamespaceReplicationRequest) -> NamespaceReplication: |_r| "";
    get_namespace_replication(GetNamespaceReplicationRequest) -> NamespaceReplication: |_r| "";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_are_read_in_every_unit() {
        assert_eq!(grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(grpc_timeout("2500m"), Some(Duration::from_millis(2500)));
        assert_eq!(grpc_timeout("1M"), Some(Duration::from_secs(60)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(grpc_timeout("5x"), None);
        assert_eq!(grpc_timeout("S"), None);
        assert_eq!(grpc_timeout(""), None);
    }
}
