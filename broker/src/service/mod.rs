//! gRPC services: the data plane ([`BrokerService`]: producer and consumer
//! streams) and the control plane ([`AdminService`]).

mod admin;
mod breaker;
mod cluster;
mod consume;
mod dead_letters;
mod event_view;
mod everywhere;
mod fanout;
mod input;
mod owners;
mod partitions;
mod produce;
mod retention;
mod routing;
mod tiered;
mod wire;

pub use crate::status::{OWNER_TRAILER, OWNER_URL_TRAILER};
pub(crate) use crate::status::{message_of, status_of};
pub use admin::AdminService;
pub use cluster::ClusterService;
pub use dead_letters::CallerRole;
pub(crate) use event_view::hide_excerpt;
pub use partitions::PartitionsService;
pub use retention::RetentionService;
pub use routing::{Route, Router};
pub use tiered::TieredService;

use crate::error::BrokerError;
use crate::name::TopicName;
use crate::node::Node;
use crate::tier_owners::TierOverrides;
use futures::Stream;
use ricochet_proto::broker_server::Broker;
use ricochet_proto::{ConsumeRequest, ConsumeResponse, ProduceRequest, ProduceResponse};
use std::pin::Pin;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Ends `stream` with `UNAVAILABLE` once the broker starts shutting down, so
/// graceful shutdown does not wait for clients to hang up.
fn until_shutdown<T: Send + 'static>(
    stream: impl Stream<Item = Result<T, Status>> + Unpin + Send + 'static,
    token: tokio_util::sync::CancellationToken,
) -> BoxStream<T> {
    use futures::StreamExt;
    Box::pin(futures::stream::unfold(
        (stream, token, false),
        |(mut s, token, done)| async move {
            if done {
                return None;
            }
            tokio::select! {
                biased;
                _ = token.cancelled() => Some((Err(status_of(&crate::error::BrokerError::ShuttingDown)), (s, token, true))),
                item = s.next() => item.map(|i| (i, (s, token, false))),
            }
        },
    ))
}

/// A stream's right to serve its topic in cluster mode: the cluster and the
/// claim the stream was opened under.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    cluster: Arc<ricochet_cluster::Cluster>,
    claim: ricochet_cluster::Tenure,
    topic: String,
}

impl Served {
    /// In cluster mode, whether this broker may serve `topic` (placing it
    /// on first use, claiming it if placed here); `None` when standalone.
    pub(crate) async fn route(node: &Node, topic: &TopicName) -> Result<Option<Self>, Status> {
        let Some(cluster) = node.cluster() else {
            return Ok(None);
        };
        let route = cluster
            .route(topic.as_str(), true)
            .await
            .map_err(BrokerError::from)?;
        // A new topic takes its namespace's default factor (else the
        // cluster's): above 1 it is created here as a group first.
        if let Some(groups) = node.groups()
            && node.core.config.auto_create_topics
            && groups.group_of(topic.as_str()).is_none()
        {
            let cluster_default = node
                .core
                .config
                .cluster
                .as_ref()
                .map_or(1, |c| c.default_replicas);
            groups.create_on_first_use(topic, cluster_default).await?;
        }
        if let Some(groups) = node.groups()
            && groups.group_of(topic.as_str()).is_some()
            && !groups.is_serving(topic.as_str())
        {
            return Err(BrokerError::Peer(format!(
                "{topic} is replicated and its leader is taking it over; look it up again"
            ))
            .into());
        }
        match route {
            Some(claim) => Ok(Some(Self {
                cluster: cluster.clone(),
                claim,
                topic: topic.to_string(),
            })),
            None => Err(Status::internal("the topic could not be placed")),
        }
    }

    /// The epoch acknowledgements carry.
    pub(crate) fn epoch(&self) -> u64 {
        self.claim.epoch
    }

    /// `Ok` while this broker may still acknowledge for the stream; else
    /// UNAVAILABLE ("broker B lost its etcd lease").
    pub(crate) fn check(&self) -> Result<(), BrokerError> {
        self.cluster.fence.check(self.claim.generation)?;
        if self.claim.released.is_cancelled() {
            return Err(self.cluster.released_error(&self.topic).into());
        }
        Ok(())
    }

    /// The error a stream ends with once its claim lapses or is released.
    fn lapse_error(&self) -> Status {
        let e = if self.claim.released.is_cancelled() {
            self.cluster.released_error(&self.topic)
        } else {
            self.cluster.fence.fenced()
        };
        BrokerError::from(e).into()
    }
}

/// In cluster mode, ends `stream` with UNAVAILABLE as soon as the claim it
/// serves under lapses (the lease deadline passed or the lease was lost),
/// and checks the fence again before each item goes out, so nothing is
/// sent under a lapsed claim. Standalone: `stream` unchanged.
fn fenced<T: Send + 'static>(stream: BoxStream<T>, served: Option<Served>) -> BoxStream<T> {
    use futures::StreamExt;
    let Some(served) = served else {
        return stream;
    };
    Box::pin(futures::stream::unfold(
        (stream, served, false),
        |(mut s, served, done)| async move {
            if done {
                return None;
            }
            let lapsed = served.cluster.fence.lapsed(served.claim.generation);
            let released = served.claim.released.cancelled();
            let item = tokio::select! {
                biased;
                _ = lapsed => Some(Err(served.lapse_error())),
                _ = released => Some(Err(served.lapse_error())),
                item = s.next() => item,
            };
            let item = match item {
                Some(Ok(_)) if served.check().is_err() => Some(Err(served.lapse_error())),
                other => other,
            };
            let end = !matches!(item, Some(Ok(_)));
            item.map(|i| (i, (s, served, end)))
        },
    ))
}

/// The next frame of a client's stream; `None` once it ends, or once the
/// broker starts shutting down (dropping the stream then resets it, so the
/// connection can close).
async fn next_frame<T>(
    inbound: &mut Streaming<T>,
    stop: &tokio_util::sync::CancellationToken,
) -> Option<Result<T, Status>> {
    use futures::StreamExt;
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        f = inbound.next() => f,
    }
}

/// The key order a policy on the wire asks for, checked.
fn key_order_of(
    p: Option<&ricochet_proto::DeadLetterPolicyConfig>,
) -> Result<Option<ricochet_policy::KeyOrder>, Status> {
    let Some(k) = p.and_then(|p| p.key_order.as_ref()) else {
        return Ok(None);
    };
    let k = ricochet_policy::KeyOrder::from(k);
    k.validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(Some(k))
}

/// The tier topics a policy on the wire names (`retry_topic`,
/// `dead_letter_topic`; empty means the default).
fn tier_overrides(p: &ricochet_proto::DeadLetterPolicyConfig) -> Result<TierOverrides, Status> {
    let parse = |what: &str, name: &str| -> Result<Option<TopicName>, Status> {
        if name.is_empty() {
            return Ok(None);
        }
        TopicName::parse(name)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("{what}: {}", message_of(&e))))
    };
    Ok(TierOverrides {
        retry: parse("retry_topic", &p.retry_topic)?,
        dead_letter: parse("dead_letter_topic", &p.dead_letter_topic)?,
    })
}

/// The producer and consumer streams.
#[derive(Debug, Clone)]
pub struct BrokerService {
    node: Arc<Node>,
}

impl BrokerService {
    /// A service over `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }
}

#[tonic::async_trait]
impl Broker for BrokerService {
    type ProduceStream = BoxStream<ProduceResponse>;
    type ConsumeStream = BoxStream<ConsumeResponse>;

    async fn produce(
        &self,
        request: Request<Streaming<ProduceRequest>>,
    ) -> Result<Response<Self::ProduceStream>, Status> {
        let principal = request
            .extensions()
            .get::<crate::auth::Principal>()
            .cloned();
        produce::produce(self.node.clone(), principal, request.into_inner()).await
    }

    async fn consume(
        &self,
        request: Request<Streaming<ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let principal = request
            .extensions()
            .get::<crate::auth::Principal>()
            .cloned();
        consume::consume(self.node.clone(), principal, request.into_inner()).await
    }
}
