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
    let channel = crate::transfer::mover::connect(config, &owner.url).await?;
    Ok(AdminAt::Owner {
        broker: owner.broker_id,
        client: AdminClient::new(channel),
    })
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

    /// `Ok` when this broker serves `topic` for a call (`method`, as
    /// `Service/Method`) routed by `how`; else the refusal naming the
    /// owner. A replicated topic is served by its group's leader once it
    /// opened it; a call with no replicated form (`unreplicated` says why)
    /// is refused there, naming itself.
    pub async fn route(
        &self,
        method: &str,
        how: Route,
        topic: Option<&str>,
        unreplicated: Option<&str>,
    ) -> Result<(), Status> {
        let (Some(cluster), Some(topic)) = (&self.cluster, topic) else {
            return Ok(());
        };
        let place = match how {
            Route::Here => return Ok(()),
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
            && cluster
                .partition_count(name.as_str())
                .await
                .map_err(BrokerError::from)?
                .is_some()
        {
            return Ok(());
        }
        routed.map_err(BrokerError::from)?;
        if how != Route::Place
            && let Some(groups) = self.groups.as_ref()
            && let Some(g) = groups.group_of(name.as_str())
        {
            if let Some(why) = unreplicated {
                return Err(not_served(&name, g.replicas, method, why).into());
            }
            if !groups.is_serving(name.as_str()) {
                return Err(BrokerError::Peer(format!(
                    "{name} is replicated and its leader is taking it over; look it up again"
                ))
                .into());
            }
        }
        Ok(())
    }
}

/// The refusal of `method` on a replicated topic: it has no replicated
/// form yet.
pub(crate) fn not_served(topic: &TopicName, replicas: u32, method: &str, why: &str) -> BrokerError {
    BrokerError::Conflict(format!(
        "{method} is not served on replicated topics yet ({topic} has replication factor \
         {replicas}; {why})"
    ))
}
