//! The `Cluster` service: `Lookup` (which broker owns a topic) and
//! `ListBrokers`. In cluster mode the answers come from etcd through
//! [`ricochet_cluster::Cluster`]; a standalone broker answers them itself:
//! every topic is its own (`cluster` empty, `live`, epoch 0, its
//! advertised or listen URL, its store id), and it is the only broker.

use crate::error::BrokerError;
use crate::name::TopicName;
use crate::node::Node;
use crate::replication::status;
use crate::storage::TopicKind;
use crate::transfer::{Incoming, TopicState, mover};
use ricochet_proto::cluster_server::Cluster;
use ricochet_proto::{
    BrokerInfo, DrainRequest, DrainResponse, ImportTopicResponse, ListBrokersRequest,
    ListBrokersResponse, LookupRequest, LookupResponse, MoveTopicRequest, MoveTopicResponse,
    TopicMoved, TopicNotMoved, TopicTransferPart, topic_transfer_part::Part,
};
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

/// The `Cluster` RPCs.
#[derive(Debug, Clone)]
pub struct ClusterService {
    node: Arc<Node>,
    /// This broker's id and URL when standalone (in cluster mode the
    /// cluster's own are used).
    id: String,
    url: String,
}

impl ClusterService {
    /// A service over `node`; `url` is where this broker is reached.
    pub fn new(node: Arc<Node>, url: String) -> Self {
        let id = node.core.keeper.store_id();
        Self { node, id, url }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn lookup(&self, r: Request<LookupRequest>) -> Result<Response<LookupResponse>, Status> {
        let name = TopicName::parse(&r.into_inner().topic)?;
        let Some(cluster) = self.node.cluster() else {
            if let Some(n) = self.node.partitions.count(&name) {
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
        let owner = cluster
            .lookup(name.as_str())
            .await
            .map_err(BrokerError::from)?;
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
        let Some(cluster) = self.node.cluster() else {
            let topics: Vec<String> = self
                .node
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
                groups: Vec::new(),
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
                    draining: false,
                }],
            }));
        };
        let brokers = cluster
            .brokers()
            .await
            .map_err(BrokerError::from)?
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
                draining: b.draining,
            })
            .collect::<Vec<_>>();
        let mut groups = Vec::new();
        if let Some(g) = self.node.groups() {
            let live: Vec<&str> = brokers
                .iter()
                .filter(|b| b.live)
                .map(|b| b.id.as_str())
                .collect();
            let reports = status::read_all(cluster).await?;
            let now_ms = ricochet_storage::util::wall_ms();
            for (topic, record) in g.all() {
                let leader = cluster
                    .placement(&topic)
                    .await
                    .map_err(BrokerError::from)?
                    .unwrap_or_default();
                let report = reports.get(&topic);
                let fresh =
                    report.filter(|r| r.leader == leader && !status::stale(r.at_ms, now_ms));
                let member_status = record
                    .members
                    .iter()
                    .map(|m| member(m, fresh, live.contains(&m.as_str())))
                    .collect();
                groups.push(ricochet_proto::ReplicationGroup {
                    topic,
                    replicas: record.replicas,
                    members: record.members,
                    leader,
                    last_index: fresh.map_or(0, |r| r.last_index),
                    member_status,
                    status_age_ms: report.map_or(0, |r| now_ms.saturating_sub(r.at_ms)),
                });
            }
        }
        Ok(Response::new(ListBrokersResponse {
            cluster: cluster.name().to_owned(),
            brokers,
            groups,
        }))
    }

    async fn drain(&self, r: Request<DrainRequest>) -> Result<Response<DrainResponse>, Status> {
        let auth = r.metadata().get("authorization").cloned();
        let broker_id = r.into_inner().broker_id;
        let report = mover::drain(&self.node, &broker_id, auth.as_ref()).await?;
        Ok(Response::new(DrainResponse {
            broker_id,
            moved: report.moved.into_iter().map(moved).collect(),
            not_moved: report
                .not_moved
                .into_iter()
                .map(|(topic, reason)| TopicNotMoved { topic, reason })
                .collect(),
            millis: report.millis,
        }))
    }

    async fn move_topic(
        &self,
        r: Request<MoveTopicRequest>,
    ) -> Result<Response<MoveTopicResponse>, Status> {
        let auth = r.metadata().get("authorization").cloned();
        let r = r.into_inner();
        let topic = TopicName::parse(&r.topic)?;
        let to = Some(r.to_broker.as_str()).filter(|t| !t.is_empty());
        let m = mover::move_topic(&self.node, &topic, to, auth.as_ref()).await?;
        Ok(Response::new(MoveTopicResponse {
            moved: Some(moved(m)),
        }))
    }

    async fn import_topic(
        &self,
        r: Request<Streaming<TopicTransferPart>>,
    ) -> Result<Response<ImportTopicResponse>, Status> {
        let bad = |m: &str| Status::from(BrokerError::InvalidArgument(m.to_owned()));
        let Some(cluster) = self.node.cluster() else {
            return Err(bad(
                "this broker runs standalone and takes no topics from others",
            ));
        };
        let mut inbound = r.into_inner();
        let mut encoded = Vec::new();
        let mut first_entries = None;
        while let Some(part) = inbound.message().await? {
            match part.part {
                Some(Part::Begin(b)) => encoded.extend_from_slice(&b.state),
                Some(other) => {
                    first_entries = Some(other);
                    break;
                }
                None => return Err(bad("an empty transfer part")),
            }
        }
        // A pre-copy that sent no entries (its log was empty, or trimmed
        // while it was read) is followed by the final state at once.
        let mut states = serde_json::Deserializer::from_slice(&encoded).into_iter::<TopicState>();
        let state = match states.next() {
            Some(Ok(s)) => s,
            Some(Err(e)) => return Err(bad(&format!("the topic's state does not decode: {e}"))),
            None => return Err(bad("the topic's state does not decode: nothing sent")),
        };
        let then = match states.next() {
            Some(Ok(s)) if state.precopy => Some(s),
            Some(Ok(_)) => return Err(bad("two states in a move without a pre-copy")),
            Some(Err(e)) => {
                return Err(bad(&format!(
                    "the topic's final state does not decode: {e}"
                )));
            }
            None => None,
        };
        if states.next().is_some() {
            return Err(bad("more than two states in a move"));
        }
        let name = TopicName::parse_stored(state.topic())?;
        let placed = cluster
            .placement(name.as_str())
            .await
            .map_err(BrokerError::from)?;
        if placed.as_deref() == Some(cluster.id()) {
            return Err(BrokerError::Conflict(format!(
                "{name} is placed on this broker ({}) already",
                cluster.id()
            ))
            .into());
        }
        let mut incoming = Incoming::begin(&self.node.core, state).await?;
        let received = async {
            if let Some(last) = then {
                incoming.resume(&self.node.core, last).await?;
            }
            let mut part = first_entries;
            // The final state's pieces, after a pre-copy's entries.
            let mut last = Vec::new();
            let mut unflushed = 0;
            loop {
                if !last.is_empty() && !matches!(part, Some(Part::Begin(_))) {
                    let state: TopicState = serde_json::from_slice(&std::mem::take(&mut last))
                        .map_err(|e| {
                            bad(&format!("the topic's final state does not decode: {e}"))
                        })?;
                    incoming.resume(&self.node.core, state).await?;
                }
                match part {
                    Some(Part::Begin(b)) if incoming.awaits_final() => {
                        last.extend_from_slice(&b.state)
                    }
                    Some(Part::Entries(e)) => {
                        incoming.entries(&self.node.core, &e.topic, e.first_id, &e.entries)?;
                        // Pre-copied entries are made durable as they come,
                        // while the source still serves the topic, so the
                        // flush before the answer covers little more than
                        // the tail.
                        if incoming.awaits_final() {
                            unflushed += e.entries.iter().map(Vec::len).sum::<usize>();
                            if unflushed >= PRECOPY_FLUSH_BYTES {
                                self.node
                                    .core
                                    .storage
                                    .flush()
                                    .await
                                    .map_err(BrokerError::from)?;
                                unflushed = 0;
                            }
                        }
                    }
                    Some(Part::End(end)) => {
                        if inbound.message().await?.is_some() {
                            return Err(bad("parts after TransferEnd"));
                        }
                        let sent = end.entries.into_iter().collect();
                        return Ok(incoming.finish(&self.node, &sent).await?);
                    }
                    Some(Part::Begin(_)) => {
                        return Err(bad("the topic's state must come before its entries"));
                    }
                    None => return Err(bad("the transfer ended without TransferEnd")),
                }
                part = inbound.message().await?.and_then(|p| p.part);
            }
        }
        .await;
        match received {
            Ok(entries) => {
                tracing::info!(topic = %name, entries, "topic received");
                Ok(Response::new(ImportTopicResponse { entries }))
            }
            Err(e) => {
                incoming.abort(&self.node.core).await;
                Err(e)
            }
        }
    }
}

/// Bytes of pre-copied entries written between two flushes.
const PRECOPY_FLUSH_BYTES: usize = 16 << 20;

fn moved(m: mover::Moved) -> TopicMoved {
    TopicMoved {
        topic: m.topic,
        to_broker: m.to,
        entries: m.entries,
        millis: m.millis,
        entries_while_stopped: m.entries_while_stopped,
    }
}

/// Member `broker` of a group as listed: from the leader's `report` when it
/// is fresh, else its health `unknown` (`down` when its broker is not live).
fn member(
    broker: &str,
    report: Option<&status::GroupStatus>,
    live: bool,
) -> ricochet_proto::GroupMember {
    let reported = report.and_then(|r| {
        let m = r.members.iter().find(|m| m.broker == broker)?;
        Some((r.last_index, m))
    });
    match reported {
        Some((last, m)) => ricochet_proto::GroupMember {
            broker_id: broker.to_owned(),
            matched_index: m.matched,
            lag: last.saturating_sub(m.matched),
            health: {
                let h = match (m.health, report.is_some_and(|r| r.unreplaced)) {
                    (status::Health::Down, true) => {
                        "down, no spare broker to replace it".to_owned()
                    }
                    (h, _) => h.as_str().to_owned(),
                };
                match report.and_then(|r| r.tier_differs.get(broker)) {
                    Some(how) => format!("{h}; [tiered] differs: {how}"),
                    None => h,
                }
            },
        },
        None => ricochet_proto::GroupMember {
            broker_id: broker.to_owned(),
            matched_index: 0,
            lag: 0,
            health: if live {
                status::Health::Unknown
            } else {
                status::Health::Down
            }
            .as_str()
            .to_owned(),
        },
    }
}
