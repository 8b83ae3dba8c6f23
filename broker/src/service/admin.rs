//! The admin service: topics, subscriptions, policies, message lookup and
//! dead-letter operations (list, replay, purge). Nothing here happens
//! automatically: replays and purges are operator decisions.

use super::dead_letters::{self, passes};
use super::everywhere;
use super::fanout::{self as parts, partitioned};
use super::owners::Owners;
use super::routing::FanOut;
use super::wire;
use crate::error::BrokerError;
use crate::name::{SubscriptionName, TopicName};
use crate::node::Node;
use crate::replication::namespaces;
use crate::storage::{DeadLetterRecord, StorageError};
use crate::subscription::SubscriptionHandle;
use prost::Message as _;
use ricochet_policy::PolicySpec;
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tonic::{Request, Response, Status};

/// Admin RPCs.
#[derive(Debug, Clone)]
pub struct AdminService {
    node: Arc<Node>,
}

impl AdminService {
    /// A service over `node`.
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// When `r` is about a partitioned topic's base name `topic`: the
    /// topic, its partitions, and where each partition's call is made
    /// (here standalone; at its owner in a cluster, where the router let
    /// the base name through marked [`FanOut`]).
    fn whole<T>(
        &self,
        r: &Request<T>,
        topic: &str,
    ) -> Option<(TopicName, Vec<TopicName>, Owners<Self>)> {
        if let Some((name, ps)) = partitioned(&self.node, topic) {
            return Some((name, ps, Owners::here(self.clone())));
        }
        let fan_out = r.extensions().get::<FanOut>()?;
        let cluster = self.node.cluster()?;
        let name = TopicName::parse(topic).ok()?;
        let ps = (0..fan_out.partitions)
            .map(|i| crate::name::partition(&name, i))
            .collect();
        Some((name, ps, self.owners(cluster, r)))
    }

    /// Calls made at other brokers in `cluster` on behalf of the caller
    /// of `r` (its credential and deadline).
    fn owners<T>(&self, cluster: &Arc<ricochet_cluster::Cluster>, r: &Request<T>) -> Owners<Self> {
        Owners::cluster(
            self.clone(),
            self.node.clone(),
            cluster.clone(),
            r.metadata(),
        )
    }

    async fn sub(
        &self,
        topic: &str,
        sub: &str,
    ) -> Result<(TopicName, SubscriptionHandle), BrokerError> {
        let t = TopicName::parse(topic)?;
        let s = SubscriptionName::parse(sub)?;
        let h = self.node.core.subscription(&t, &s).await?;
        Ok((t, h))
    }

    /// Creates `name` as a replicated topic of factor `replicas` (> 1) in
    /// cluster mode: its group placed in etcd with this broker first.
    async fn create_replicated(
        &self,
        groups: &crate::replication::groups::Groups,
        name: TopicName,
        replicas: u32,
    ) -> Result<Response<TopicInfo>, Status> {
        crate::replication::factor::peers_ready(&self.node.core.config, replicas)?;
        // A member of the group opens the topic locally too, so the local
        // check only counts when no group is recorded for the name.
        if groups.read_group(name.as_str()).await?.is_none()
            && self.node.core.topic(&name).await.is_ok()
        {
            return Err(
                BrokerError::TopicExists(format!("{name} (with replication factor 1)")).into(),
            );
        }
        let created = groups.create(&name, replicas).await?;
        Ok(Response::new(TopicInfo {
            topic: name.to_string(),
            created,
        }))
    }

    /// This broker's own topics for `r` (whose namespace is `ns`).
    async fn local_topics(&self, r: &ListTopicsRequest, ns: Option<&str>) -> ListTopicsResponse {
        let mut topics = self.node.core.list_topics(ns).await;
        if !r.include_system_topics {
            topics.retain(|t| !crate::name::is_system_topic(t));
        }
        ListTopicsResponse {
            topics,
            partitioned: self
                .node
                .partitions
                .list(ns)
                .into_iter()
                .map(|(n, partitions)| PartitionedTopicMetadata {
                    topic: n.to_string(),
                    partitions,
                })
                .collect(),
        }
    }

    /// The cluster's `default_replicas` (1 standalone).
    fn cluster_default(&self) -> u32 {
        self.node
            .core
            .config
            .cluster
            .as_ref()
            .map_or(1, |c| c.default_replicas)
    }

    /// How many brokers are live and take topics, for a factor check of
    /// `factor` (counted only above 1); `None` on a standalone broker.
    async fn live_brokers(&self, factor: u32) -> Result<Option<usize>, BrokerError> {
        Ok(match self.node.cluster() {
            Some(c) if factor > 1 => Some(
                c.brokers()
                    .await?
                    .iter()
                    .filter(|b| b.live && !b.draining)
                    .count(),
            ),
            Some(_) => Some(1),
            None => None,
        })
    }

    /// Dead letters of a subscription that pass `filter` (ids and records),
    /// after `after`, and how many there are.
    fn matching_records(
        &self,
        handle: &SubscriptionHandle,
        filter: Option<&DeadLetterFilter>,
        after: Option<u64>,
    ) -> Result<Vec<(u64, DeadLetterRecord)>, BrokerError> {
        Ok(self
            .node
            .core
            .storage
            .dead_letters(handle.id(), after)?
            .into_iter()
            .filter(|(id, rec)| passes(filter, *id, rec))
            .collect())
    }

    /// Dead letters with their messages, as the wire shows them.
    fn dead_letters_with_messages(
        &self,
        dlq_topic: &str,
        records: Vec<(u64, DeadLetterRecord)>,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut out = Vec::with_capacity(records.len());
        for (id, rec) in records {
            let Some(bytes) = self.node.core.storage.read_one(dlq_topic, id)? else {
                continue;
            };
            let mut msg = Message::decode(bytes.as_slice()).map_err(StorageError::from)?;
            msg.id = Some(MessageId {
                topic: dlq_topic.to_owned(),
                entry_id: id,
            });
            msg.delivery_count = rec.failures.count;
            out.push(DeadLetter {
                message: Some(msg),
                origin: Some(MessageId {
                    topic: rec.origin_topic.clone(),
                    entry_id: rec.origin_entry_id,
                }),
                reason: rec.reason.clone(),
                dead_lettered_at_ms: rec.at_ms,
                attempts: wire::attempts(&rec.failures),
                edits: dead_letters::edits(&rec.failures.edits),
                cause: rec.cause(),
            });
        }
        Ok(out)
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn list_topics(
        &self,
        r: Request<ListTopicsRequest>,
    ) -> Result<Response<ListTopicsResponse>, Status> {
        // In a cluster, unless asked for this broker's own: every broker's.
        let everywhere = match self.node.cluster() {
            Some(c) if !r.get_ref().local_only => Some((self.owners(c, &r), c)),
            _ => None,
        };
        let r = r.into_inner();
        let ns = match r.namespace.as_str() {
            "" => None,
            given => Some(crate::name::parse_namespace(given)?),
        };
        let mine = self.local_topics(&r, ns).await;
        Ok(Response::new(match everywhere {
            Some((at, c)) => everywhere::list_topics(&at, c, mine, &r, ns).await?,
            None => mine,
        }))
    }

    async fn create_topic(
        &self,
        r: Request<CreateTopicRequest>,
    ) -> Result<Response<TopicInfo>, Status> {
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        // Without a factor: the namespace's default, else the cluster's.
        let requested = match (r.replicas, self.node.cluster()) {
            (0, Some(c)) => {
                namespaces::default_factor(c, name.namespace(), self.cluster_default()).await?
            }
            (n, _) => n,
        };
        let live = self.live_brokers(requested).await?;
        let replicas = crate::replication::factor::check(requested, live)?;
        if let Some(groups) = self.node.groups() {
            if replicas > 1 {
                return self.create_replicated(groups, name, replicas).await;
            }
            if let Some(g) = groups.read_group(name.as_str()).await? {
                return Err(BrokerError::TopicExists(format!(
                    "{name} (with replication factor {})",
                    g.replicas
                ))
                .into());
            }
        }
        self.node.core.create_topic(&name).await?;
        self.node.core.flusher.durable().await?;
        Ok(Response::new(TopicInfo {
            topic: name.to_string(),
            created: true,
        }))
    }

    async fn delete_topic(
        &self,
        r: Request<DeleteTopicRequest>,
    ) -> Result<Response<DeleteTopicResponse>, Status> {
        if partitioned(&self.node, &r.get_ref().topic).is_some() {
            let r = r.into_inner();
            let name = TopicName::parse(&r.topic)?;
            self.node.partitions.delete(&name, r.force).await?;
            return Ok(Response::new(DeleteTopicResponse {}));
        }
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic)
            && let Some(c) = self.node.cluster()
        {
            // In a cluster: each partition on its owner, then the count
            // (and factor) in etcd, if the count is still the one deleted.
            let count = ps.len() as u32;
            parts::delete_partitions(&at, &name, ps, r.get_ref().force).await?;
            let factor = namespaces::partitioned_factor_key(c, name.as_str());
            c.delete_partitioned(name.as_str(), count, &[factor])
                .await
                .map_err(BrokerError::from)?;
            return Ok(Response::new(DeleteTopicResponse {}));
        }
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        self.node.core.delete_topic(&name, r.force).await?;
        self.node.core.flusher.durable().await?;
        // A replicated topic was deleted through its group (every replica
        // applies it); the group goes with it.
        if let Some(groups) = self.node.groups()
            && groups.group_of(name.as_str()).is_some()
        {
            groups.dissolve(name.as_str()).await?;
        }
        Ok(Response::new(DeleteTopicResponse {}))
    }

    async fn topic_stats(
        &self,
        r: Request<TopicRequest>,
    ) -> Result<Response<TopicStatsResponse>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(parts::topic_stats(&at, &name, ps).await?));
        }
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        let entry = self.node.core.topic(&name).await?;
        let (first, next) = entry.topic.entry_range();
        let mut subscriptions = Vec::new();
        for h in entry.subscriptions() {
            subscriptions.push(wire::subscription_stats(
                h.stats(self.node.core.storage.clone()).await?,
            ));
        }
        subscriptions.sort_by(|a, b| a.subscription.cmp(&b.subscription));
        let c = &entry.topic.counters;
        Ok(Response::new(TopicStatsResponse {
            topic: name.to_string(),
            message_count: next - first,
            first_entry_id: first,
            next_entry_id: next,
            producers: c.producers.load(Ordering::Relaxed),
            messages_in: c.messages_in.load(Ordering::Relaxed),
            bytes_in: c.bytes_in.load(Ordering::Relaxed),
            subscriptions,
            partition_count: 0,
            partitions: Vec::new(),
        }))
    }

    async fn list_subscriptions(
        &self,
        r: Request<TopicRequest>,
    ) -> Result<Response<ListSubscriptionsResponse>, Status> {
        if let Some((_, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(parts::list_subscriptions(&at, ps).await?));
        }
        let r = r.into_inner();
        let name = TopicName::parse(&r.topic)?;
        let entry = self.node.core.topic(&name).await?;
        let mut subscriptions: Vec<String> = entry
            .subscriptions()
            .iter()
            .map(|h| h.name().to_owned())
            .collect();
        subscriptions.sort();
        Ok(Response::new(ListSubscriptionsResponse { subscriptions }))
    }

    async fn subscription_stats(
        &self,
        r: Request<SubscriptionRequest>,
    ) -> Result<Response<SubscriptionStatsResponse>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            let s = parts::subscription_stats(&at, &name, ps, &r.get_ref().subscription).await?;
            return Ok(Response::new(s));
        }
        let r = r.into_inner();
        let (_, h) = self.sub(&r.topic, &r.subscription).await?;
        Ok(Response::new(wire::subscription_stats(
            h.stats(self.node.core.storage.clone()).await?,
        )))
    }

    async fn delete_subscription(
        &self,
        r: Request<DeleteSubscriptionRequest>,
    ) -> Result<Response<DeleteSubscriptionResponse>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::delete_subscription(&at, &name, ps, r.into_inner()).await?,
            ));
        }
        let r = r.into_inner();
        let t = TopicName::parse(&r.topic)?;
        let s = SubscriptionName::parse(&r.subscription)?;
        self.node.core.delete_subscription(&t, &s, r.force).await?;
        self.node.core.flusher.durable().await?;
        Ok(Response::new(DeleteSubscriptionResponse {}))
    }

    async fn get_policy(
        &self,
        r: Request<SubscriptionRequest>,
    ) -> Result<Response<PolicyResponse>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            let p = parts::get_policy(&at, &name, ps, &r.get_ref().subscription).await?;
            return Ok(Response::new(p));
        }
        let r = r.into_inner();
        let (_, h) = self.sub(&r.topic, &r.subscription).await?;
        Ok(Response::new(wire::policy_response(h.policy().await?)))
    }

    async fn set_policy(
        &self,
        r: Request<SetPolicyRequest>,
    ) -> Result<Response<PolicyResponse>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::set_policy(&at, &name, ps, r.into_inner()).await?,
            ));
        }
        let r = r.into_inner();
        let spec = match &r.policy {
            Some(p) if p.kind.is_some() => Some(PolicySpec::try_from(p).map_err(|e| {
                Status::invalid_argument(format!("invalid dead-letter policy: {e}"))
            })?),
            // An empty policy clears the operator's choice.
            _ => None,
        };
        let tiers = match &r.policy {
            Some(p) => super::tier_overrides(p)?,
            None => Default::default(),
        };
        let key_order = super::key_order_of(r.policy.as_ref())?;
        let (t, h) = self.sub(&r.topic, &r.subscription).await?;
        // A policy read back with GetPolicy names the tiers in force: fine.
        // Other names would be ignored, so they are refused.
        let s = SubscriptionName::parse(&r.subscription)?;
        self.node.core.check_tiers(&t, &s, &tiers)?;
        let breaker = super::breaker::requested(r.policy.as_ref())?;
        let info = h.set_policy(spec, key_order, breaker).await?;
        self.node.core.flusher.durable().await?;
        Ok(Response::new(wire::policy_response(info)))
    }

    async fn get_message(
        &self,
        r: Request<GetMessageRequest>,
    ) -> Result<Response<GetMessageResponse>, Status> {
        let id = r
            .into_inner()
            .id
            .ok_or_else(|| Status::invalid_argument("id is required"))?;
        let name = TopicName::parse(&id.topic)?;
        let entry = self.node.core.topic(&name).await?;
        // Through the topic's storage: a replicated topic's skips ids below
        // its group's trim point.
        let bytes = entry
            .topic
            .storage()
            .read_one(name.as_str(), id.entry_id)
            .map_err(BrokerError::from)?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "message {}:{} not found (never written, or removed by retention)",
                    id.topic, id.entry_id
                ))
            })?;
        let mut message =
            Message::decode(bytes.as_slice()).map_err(|e| Status::internal(e.to_string()))?;
        message.id = Some(MessageId {
            topic: name.to_string(),
            entry_id: id.entry_id,
        });
        let mut subscriptions = Vec::new();
        for h in entry.subscriptions() {
            let st = h.message_status(id.entry_id).await?;
            let dead = self
                .node
                .core
                .storage
                .dead_letters(h.id(), None)
                .map_err(BrokerError::from)?
                .into_iter()
                .find(|(_, d)| d.origin_topic == name.as_str() && d.origin_entry_id == id.entry_id);
            let (state, failures) = match dead {
                Some((_, d)) => ("dead_lettered".to_owned(), Some(d.failures)),
                None => (st.state.as_str().to_owned(), st.failures),
            };
            subscriptions.push(SubscriptionMessageState {
                subscription: h.name().to_owned(),
                state,
                delivery_count: failures.as_ref().map_or(0, |f| f.count),
                attempts: failures.as_ref().map(wire::attempts).unwrap_or_default(),
                edits: failures
                    .as_ref()
                    .map(|f| dead_letters::edits(&f.edits))
                    .unwrap_or_default(),
            });
        }
        subscriptions.sort_by(|a, b| a.subscription.cmp(&b.subscription));
        Ok(Response::new(GetMessageResponse {
            message: Some(message),
            subscriptions,
        }))
    }

    async fn list_dead_letters(
        &self,
        r: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        if let Some((_, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::list_dead_letters(&at, ps, r.into_inner()).await?,
            ));
        }
        let r = r.into_inner();
        let (_, h) = self.sub(&r.topic, &r.subscription).await?;
        let limit = if r.limit == 0 { 100 } else { r.limit as usize };
        // `total` counts every match of the filter, whatever page this is.
        let matching = self.matching_records(&h, r.filter.as_ref(), None)?;
        let total = matching.len() as u64;
        let records: Vec<_> = matching
            .into_iter()
            .filter(|(id, _)| r.after_entry_id.is_none_or(|after| *id > after))
            .take(limit)
            .collect();
        let dlq_topic = h.policy().await?.dead_letter_topic;
        let dead_letters = self.dead_letters_with_messages(&dlq_topic, records)?;
        Ok(Response::new(ListDeadLettersResponse {
            dead_letters,
            total,
        }))
    }

    async fn replay_dead_letters(
        &self,
        r: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        if let Some((_, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(parts::replay_dead_letters(&at, ps, r).await?));
        }
        Ok(Response::new(
            dead_letters::replay(&self.node.core, r).await?,
        ))
    }

    async fn purge_dead_letters(
        &self,
        r: Request<PurgeDeadLettersRequest>,
    ) -> Result<Response<PurgeDeadLettersResponse>, Status> {
        if let Some((_, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::purge_dead_letters(&at, ps, r.into_inner()).await?,
            ));
        }
        let by = dead_letters::caller(&r);
        let r = r.into_inner();
        Ok(Response::new(
            dead_letters::purge(&self.node.core, r, by).await?,
        ))
    }

    async fn group_dead_letters(
        &self,
        r: Request<GroupDeadLettersRequest>,
    ) -> Result<Response<GroupDeadLettersResponse>, Status> {
        if let Some((_, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::group_dead_letters(&at, ps, r.into_inner()).await?,
            ));
        }
        let r = r.into_inner();
        Ok(Response::new(
            dead_letters::group(&self.node.core, r).await?,
        ))
    }

    async fn list_replay_jobs(
        &self,
        r: Request<ListReplayJobsRequest>,
    ) -> Result<Response<ListReplayJobsResponse>, Status> {
        if let Some((_, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::list_replay_jobs(&at, &ps, r.into_inner()).await?,
            ));
        }
        // Without a topic in a cluster, unless asked for this broker's
        // own: every broker's jobs.
        let everywhere = match self.node.cluster() {
            Some(c) if r.get_ref().topic.is_empty() && !r.get_ref().local_only => {
                Some(self.owners(c, &r))
            }
            _ => None,
        };
        let r = r.into_inner();
        let mine = dead_letters::list_jobs(&self.node.core, r.clone())?;
        Ok(Response::new(match everywhere {
            Some(at) => everywhere::list_replay_jobs(&at, mine, r).await?,
            None => mine,
        }))
    }

    async fn cancel_replay_job(
        &self,
        r: Request<CancelReplayJobRequest>,
    ) -> Result<Response<CancelReplayJobResponse>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            return Ok(Response::new(
                parts::cancel_replay_job(&at, &name, &ps, r.into_inner()).await?,
            ));
        }
        Ok(Response::new(
            dead_letters::cancel_job(&self.node.core, r.into_inner()).await?,
        ))
    }

    async fn set_breaker(
        &self,
        r: Request<SetBreakerRequest>,
    ) -> Result<Response<BreakerStatus>, Status> {
        if let Some((name, ps, at)) = self.whole(&r, &r.get_ref().topic) {
            // Refused before any partition is asked.
            super::breaker::mode_of(r.get_ref().mode)?;
            SubscriptionName::parse(&r.get_ref().subscription)?;
            return Ok(Response::new(
                parts::set_breaker(&at, &name, ps, r.into_inner()).await?,
            ));
        }
        Ok(Response::new(
            super::breaker::set(&self.node, r.into_inner()).await?,
        ))
    }

    async fn set_namespace_replication(
        &self,
        r: Request<SetNamespaceReplicationRequest>,
    ) -> Result<Response<NamespaceReplication>, Status> {
        let r = r.into_inner();
        let ns = crate::name::parse_namespace(&r.namespace)?;
        let live = self.live_brokers(r.replicas).await?;
        let replicas = crate::replication::factor::check_namespace(r.replicas, live)?;
        crate::replication::factor::peers_ready(&self.node.core.config, replicas)?;
        // Standalone only 1 passes the check: every topic has it already.
        if let Some(c) = self.node.cluster() {
            namespaces::set(c, ns, replicas).await?;
        }
        Ok(Response::new(NamespaceReplication {
            namespace: ns.to_owned(),
            replicas,
            effective: replicas,
        }))
    }

    async fn get_namespace_replication(
        &self,
        r: Request<GetNamespaceReplicationRequest>,
    ) -> Result<Response<NamespaceReplication>, Status> {
        let r = r.into_inner();
        let ns = crate::name::parse_namespace(&r.namespace)?;
        let own = match self.node.cluster() {
            Some(c) => namespaces::get(c, ns).await?,
            None => None,
        };
        let effective = crate::replication::factor::default_for(own, self.cluster_default());
        Ok(Response::new(NamespaceReplication {
            namespace: ns.to_owned(),
            replicas: own.unwrap_or(0),
            effective,
        }))
    }
}
