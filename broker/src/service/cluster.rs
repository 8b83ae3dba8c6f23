//! The `Cluster` service: `Lookup` (which broker owns a topic) and
//! `ListBrokers`. In cluster mode the answers come from etcd through
//! [`crate::cluster::Cluster`]; a standalone broker answers them itself:
//! every topic is its own (`cluster` empty, `live`, epoch 0, its
//! advertised or listen URL, its store id), and it is the only broker.

use crate::core::BrokerCore;
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::storage::TopicKind;
use ricochet_proto::cluster_server::Cluster;
use ricochet_proto::{
    BrokerInfo, ListBrokersRequest, ListBrokersResponse, LookupRequest, LookupResponse,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `Cluster` RPCs.
#[derive(Debug, Clone)]
pub struct ClusterService {
    core: Arc<BrokerCore>,
    /// This broker's id and URL when standalone (in cluster mode the
    /// cluster's own are used).
    id: String,
    url: String,
}

impl ClusterService {
    /// A service over `core`; `url` is where this broker is reached.
    pub fn new(core: Arc<BrokerCore>, url: String) -> Self {
        let id = core.keeper.store_id();
        Self { core, id, url }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn lookup(&self, r: Request<LookupRequest>) -> Result<Response<LookupResponse>, Status> {
        let name = TopicName::parse(&r.into_inner().topic)?;
        let Some(cluster) = self.core.cluster() else {
            if let Some(n) = crate::partitions::count(&self.core, &name) {
                return Err(BrokerError::InvalidArgument(format!(
                    "{name} is a partitioned topic ({n} partitions): look up its partitions"
                ))
                .into());
            }
            return Ok(Response::new(LookupResponse {
                topic: name.to_string(),
                broker_id: self.id.clone(),
                url: self.url.clone(),
                live: true,
                epoch: 0,
                cluster: String::new(),
            }));
        };
        let owner = cluster.lookup(&name).await?;
        Ok(Response::new(LookupResponse {
            topic: name.to_string(),
            broker_id: owner.broker_id,
            url: owner.url,
            live: true,
            epoch: owner.epoch,
            cluster: cluster.name().to_owned(),
        }))
    }

    async fn list_brokers(
        &self,
        r: Request<ListBrokersRequest>,
    ) -> Result<Response<ListBrokersResponse>, Status> {
        let with_topics = r.into_inner().with_topics;
        let Some(cluster) = self.core.cluster() else {
            let topics: Vec<String> = self
                .core
                .all_topics()
                .await
                .iter()
                .filter(|t| t.kind() == TopicKind::Normal)
                .map(|t| t.name().to_string())
                .collect();
            let n = topics.len() as u64;
            let mut topics = if with_topics { topics } else { Vec::new() };
            topics.sort();
            return Ok(Response::new(ListBrokersResponse {
                cluster: String::new(),
                brokers: vec![BrokerInfo {
                    id: self.id.clone(),
                    url: self.url.clone(),
                    live: true,
                    placed_topics: n,
                    owned_topics: n,
                    load: 0.0,
                    registered_at_ms: 0,
                    topics,
                }],
            }));
        };
        let brokers = cluster
            .brokers()
            .await?
            .into_iter()
            .map(|b| BrokerInfo {
                id: b.id,
                url: b.url,
                live: b.live,
                placed_topics: b.placed,
                owned_topics: b.owned,
                load: b.load,
                registered_at_ms: b.registered_at_ms,
                topics: if with_topics { b.topics } else { Vec::new() },
            })
            .collect();
        Ok(Response::new(ListBrokersResponse {
            cluster: cluster.name().to_owned(),
            brokers,
        }))
    }
}
