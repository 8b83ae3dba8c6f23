//! [`Router`]: in cluster mode, which broker answers a call about a topic.
//! A call about a topic another broker owns is refused with
//! FAILED_PRECONDITION naming the owner (its `google.rpc.ErrorInfo` and
//! the `ricochet-owner` trailers, see `status.rs`), or UNAVAILABLE when
//! this broker lost its lease; standalone every call is answered here.
//! The RPC table ([`crate::gate`]) says which calls are routed, and runs
//! the route after the permission check, so a caller without the
//! permission learns nothing about where a topic lives.

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::replication::groups::Groups;
use ricochet_cluster::Cluster;
use ricochet_proto::admin_client::AdminClient;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;
use tonic::transport::Channel;

/// Where a broker makes an admin call about a topic on a caller's behalf
/// (a partition's stats for a fan-out, a partition's group to form).
pub(crate) enum AdminAt {
    /// This broker owns the topic.
    Here,
    /// Another broker does: its `Admin` service, reached as moves reach
    /// brokers (TLS and the CA the config names).
    Owner {
        /// The owner's broker id.
        broker: String,
        /// A client of its `Admin` service.
        client: AdminClient<Channel>,
    },
}

/// How often a broker pings another whose `Admin` service it calls, and
/// how long it waits for the answer before failing the calls under way: a
/// broker that stopped (SIGSTOP, a hung host) fails them within about
/// twice this, while a long call (a replay) on a live one goes on.
pub(crate) const PEER_KEEPALIVE: Duration = Duration::from_secs(10);

/// Where admin calls about `name` go: its owner, by `cluster`'s lookup
/// (placing it if it has no place yet).
pub(crate) async fn admin_at(
    config: &BrokerConfig,
    cluster: &Cluster,
    name: &TopicName,
) -> Result<AdminAt, BrokerError> {
    let owner = cluster.lookup(name.as_str()).await?;
    if owner.broker_id == cluster.id() {
        return Ok(AdminAt::Here);
    }
    let client = admin_client(config, &owner.broker_id, &owner.url).await?;
    Ok(AdminAt::Owner {
        broker: owner.broker_id,
        client,
    })
}

/// A client of broker `id`'s `Admin` service at `url`, reached as moves
/// reach brokers, pinged every [`PEER_KEEPALIVE`].
pub(crate) async fn admin_client(
    config: &BrokerConfig,
    id: &str,
    url: &str,
) -> Result<AdminClient<Channel>, BrokerError> {
    let channel = config
        .peer_endpoint(url)
        .map_err(|e| BrokerError::Peer(format!("broker {id}: {e}")))?
        .connect_timeout(crate::transfer::mover::CONNECT_TIMEOUT)
        .http2_keep_alive_interval(PEER_KEEPALIVE)
        .keep_alive_timeout(PEER_KEEPALIVE)
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|e| BrokerError::Peer(format!("cannot reach broker {id} at {url}: {e}")))?;
    Ok(AdminClient::new(channel))
}

/// Put on a call's request by the gate when the router let a partitioned
/// topic's base name through to be answered here over its `partitions`
/// (cluster mode; standalone the node knows its partitioned topics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanOut {
    /// The topic's partition count, as etcd holds it.
    pub partitions: u32,
}

/// How a call about a topic is routed in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Answered by whichever broker receives it (grants, partition counts,
    /// cluster calls, or no topic named).
    Here,
    /// Answered by the topic's owner; a topic placed nowhere is answered
    /// here without being placed.
    Owner,
    /// Answered by the topic's owner, placing the topic first if it has no
    /// place (creating a topic).
    Place,
    /// As [`Route::Owner`], but a partitioned topic's base name is answered
    /// here (the call fans out over the partitions' owners).
    OwnerOrFanOut,
}

/// Routes calls about topics to their owners (a no-op standalone).
#[derive(Debug, Clone, Default)]
pub struct Router {
    cluster: Option<Arc<Cluster>>,
    groups: Option<Arc<Groups>>,
}

impl Router {
    /// Routes through `cluster` and its replication `groups`; `None` on a
    /// standalone broker.
    pub fn new(cluster: Option<Arc<Cluster>>, groups: Option<Arc<Groups>>) -> Self {
        Self { cluster, groups }
    }

    /// `Ok` when this broker serves `topic` for a call routed by `how`;
    /// else the refusal naming the owner. A replicated topic is served by
    /// its group's leader once it opened it. `Ok(Some(_))`: `topic` is a
    /// partitioned topic's base name, answered here over its partitions
    /// ([`Route::OwnerOrFanOut`] only).
    pub async fn route(&self, how: Route, topic: Option<&str>) -> Result<Option<FanOut>, Status> {
        let (Some(cluster), Some(topic)) = (&self.cluster, topic) else {
            return Ok(None);
        };
        let place = match how {
            Route::Here => return Ok(None),
            Route::Owner | Route::OwnerOrFanOut => false,
            Route::Place => true,
        };
        let name = TopicName::parse(topic)?;
        let routed = cluster.route(name.as_str(), place).await;
        // A base name has no placement: it is refused as INVALID_ARGUMENT,
        // unless the call fans out.
        if how == Route::OwnerOrFanOut
            && matches!(
                routed,
                Err(ricochet_cluster::ClusterError::InvalidArgument(_))
            )
            && let Some(partitions) = cluster
                .partition_count(name.as_str())
                .await
                .map_err(BrokerError::from)?
        {
            return Ok(Some(FanOut { partitions }));
        }
        routed.map_err(BrokerError::from)?;
        if how != Route::Place
            && let Some(groups) = self.groups.as_ref()
            && groups.group_of(name.as_str()).is_some()
            && !groups.is_serving(name.as_str())
        {
            return Err(BrokerError::Peer(format!(
                "{name} is replicated and its leader is taking it over; look it up again"
            ))
            .into());
        }
        Ok(None)
    }
}
