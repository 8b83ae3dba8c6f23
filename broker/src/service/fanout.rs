//! The admin service's view of a partitioned topic as a whole. Each admin
//! call on a partitioned topic's base name ([`partitioned`]) is answered by
//! making the same call on every partition and combining the answers:
//! stats are summed (and listed per partition), a policy set applies to
//! every partition, dead letters are listed, replayed and purged over all
//! partitions.
//!
//! Each partition keeps its own retry and dead-letter tiers
//! (`<topic>-partition-<i>-<sub>-RETRY` / `-DLQ`); the tools here present
//! them together. A dead letter's message id names its partition's tier,
//! so one picked from the combined list can be addressed on its own.
//!
//! The per-partition calls go through the generated [`Admin`] trait, not
//! the admin service itself: the admin service uses this module, and this
//! module does not know it.
//!
//! In cluster mode the partitions live on different brokers; so far only
//! `TopicStats` fans out there ([`cluster_topic_stats`]: each partition
//! asked of its owner, this broker's own through [`Admin`], another's
//! through its `Admin` service with the caller's credential, as moves
//! call brokers). The other calls on a base name are still refused with
//! INVALID_ARGUMENT in cluster mode (the router's answer).

use super::dead_letters::CallerRole;
use super::routing::{AdminAt, admin_at};
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::node::Node;
use crate::transfer::mover::authorized;
use ricochet_cluster::Cluster;
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use std::collections::BTreeMap;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Request, Status};

/// The partitions of `topic` when it names a partitioned topic.
pub(super) fn partitioned(node: &Node, topic: &str) -> Option<(TopicName, Vec<TopicName>)> {
    let name = TopicName::parse(topic).ok()?;
    node.partitions.count(&name)?;
    let parts = node.partitions.partitions_of(&name);
    Some((name, parts))
}

fn topic_req(p: &TopicName) -> Request<TopicRequest> {
    Request::new(TopicRequest {
        topic: p.to_string(),
    })
}

/// TopicStats of a partitioned topic: totals, subscriptions merged by
/// name, and each partition's own stats.
pub(super) async fn topic_stats(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
) -> Result<TopicStatsResponse, Status> {
    let mut each = Vec::with_capacity(parts.len());
    for p in &parts {
        each.push(admin.topic_stats(topic_req(p)).await?.into_inner());
    }
    Ok(combine_topic_stats(name, each))
}

/// TopicStats of partitioned topic `name` of `count` partitions in
/// cluster mode: each partition's asked of the broker that owns it (its
/// group's leader when replicated), through `admin` when that is this
/// broker, else through that broker's `Admin.TopicStats` with the
/// caller's credential `auth`; combined as [`topic_stats`] does.
pub(super) async fn cluster_topic_stats(
    admin: &impl Admin,
    node: &Node,
    cluster: &Cluster,
    name: &TopicName,
    count: u32,
    auth: Option<&AsciiMetadataValue>,
) -> Result<TopicStatsResponse, Status> {
    let asks = (0..count).map(|i| async move {
        let p = crate::name::partition(name, i);
        let AdminAt::Owner { broker, mut client } =
            admin_at(&node.core.config, cluster, &p).await?
        else {
            return Ok(admin.topic_stats(topic_req(&p)).await?.into_inner());
        };
        client
            .topic_stats(authorized(
                TopicRequest {
                    topic: p.to_string(),
                },
                auth,
            ))
            .await
            .map(tonic::Response::into_inner)
            // Its code, not its routing details: those name the
            // partition, not the topic this call asked about.
            .map_err(|e| Status::new(e.code(), format!("{p} at broker {broker}: {}", e.message())))
    });
    let each = futures::future::try_join_all(asks).await?;
    Ok(combine_topic_stats(name, each))
}

/// The stats of a partitioned topic from its partitions' own (in
/// partition order).
fn combine_topic_stats(name: &TopicName, each: Vec<TopicStatsResponse>) -> TopicStatsResponse {
    let mut total = TopicStatsResponse {
        topic: name.to_string(),
        partition_count: each.len() as u32,
        ..Default::default()
    };
    let mut subs: BTreeMap<String, Vec<SubscriptionStatsResponse>> = BTreeMap::new();
    for s in each {
        total.message_count += s.message_count;
        total.producers += s.producers;
        total.messages_in += s.messages_in;
        total.bytes_in += s.bytes_in;
        for sub in &s.subscriptions {
            subs.entry(sub.subscription.clone())
                .or_default()
                .push(sub.clone());
        }
        total.partitions.push(s);
    }
    total.subscriptions = subs
        .into_values()
        .map(|all| merge_subscription_stats(name, all))
        .collect();
    total
}

/// One subscription's stats over partitions: counts summed, consumers
/// merged by name (a consumer of a partitioned topic has one stream per
/// partition, under one name), the earliest retry due. The cursor
/// position and tier names are per partition, so they are left empty.
pub(super) fn merge_subscription_stats(
    name: &TopicName,
    all: Vec<SubscriptionStatsResponse>,
) -> SubscriptionStatsResponse {
    let mut out = SubscriptionStatsResponse {
        topic: name.to_string(),
        ..Default::default()
    };
    let mut consumers: BTreeMap<String, ConsumerStats> = BTreeMap::new();
    let mut buckets: Vec<DueBucket> = Vec::new();
    for s in all {
        out.subscription = s.subscription;
        out.subscription_type = s.subscription_type;
        out.backlog += s.backlog;
        out.unacked += s.unacked;
        out.scheduled_retries += s.scheduled_retries;
        out.dead_lettered += s.dead_lettered;
        if s.next_retry_due_ms != 0
            && (out.next_retry_due_ms == 0 || s.next_retry_due_ms < out.next_retry_due_ms)
        {
            out.next_retry_due_ms = s.next_retry_due_ms;
        }
        for c in s.consumers {
            let m = consumers.entry(c.name.clone()).or_insert(ConsumerStats {
                name: c.name.clone(),
                ..Default::default()
            });
            m.unacked += c.unacked;
            m.permits += c.permits;
            m.active |= c.active;
            m.blocked_on_unacked |= c.blocked_on_unacked;
        }
        out.key_order |= s.key_order;
        out.blocked_keys += s.blocked_keys;
        out.held_messages += s.held_messages;
        out.oldest_blocked_ms = out.oldest_blocked_ms.max(s.oldest_blocked_ms);
        out.top_blocked_keys.extend(s.top_blocked_keys);
        for (i, b) in s.scheduled_by_due.into_iter().enumerate() {
            match buckets.get_mut(i) {
                Some(have) => have.count += b.count,
                None => buckets.push(b),
            }
        }
    }
    out.consumers = consumers.into_values().collect();
    out.scheduled_by_due = buckets;
    out.top_blocked_keys.sort_by_key(|k| k.blocked_since_ms);
    out.top_blocked_keys
        .truncate(crate::subscription::TOP_BLOCKED_KEYS);
    out
}

/// SubscriptionStats of a partitioned topic's subscription.
pub(super) async fn subscription_stats(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    subscription: &str,
) -> Result<SubscriptionStatsResponse, Status> {
    let mut all = Vec::new();
    for p in &parts {
        let req = Request::new(SubscriptionRequest {
            topic: p.to_string(),
            subscription: subscription.to_owned(),
        });
        match admin.subscription_stats(req).await {
            Ok(r) => all.push(r.into_inner()),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    if all.is_empty() {
        return Err(BrokerError::SubscriptionNotFound {
            topic: name.to_string(),
            subscription: subscription.to_owned(),
        }
        .into());
    }
    Ok(merge_subscription_stats(name, all))
}

/// Every subscription on any partition.
pub(super) async fn list_subscriptions(
    admin: &impl Admin,
    parts: Vec<TopicName>,
) -> Result<ListSubscriptionsResponse, Status> {
    let mut names = std::collections::BTreeSet::new();
    for p in &parts {
        names.extend(
            admin
                .list_subscriptions(topic_req(p))
                .await?
                .into_inner()
                .subscriptions,
        );
    }
    Ok(ListSubscriptionsResponse {
        subscriptions: names.into_iter().collect(),
    })
}

/// Sets the policy on every partition's subscription; answers with the
/// first partition's. Partitions without the subscription are skipped; if
/// none has it, NOT_FOUND.
pub(super) async fn set_policy(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    r: SetPolicyRequest,
) -> Result<PolicyResponse, Status> {
    let mut first = None;
    for p in &parts {
        let req = Request::new(SetPolicyRequest {
            topic: p.to_string(),
            ..r.clone()
        });
        match admin.set_policy(req).await {
            Ok(resp) => {
                first.get_or_insert(resp.into_inner());
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    first.ok_or_else(|| {
        BrokerError::SubscriptionNotFound {
            topic: name.to_string(),
            subscription: r.subscription.clone(),
        }
        .into()
    })
}

/// The policy of the first partition that has the subscription.
pub(super) async fn get_policy(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    subscription: &str,
) -> Result<PolicyResponse, Status> {
    for p in &parts {
        let req = Request::new(SubscriptionRequest {
            topic: p.to_string(),
            subscription: subscription.to_owned(),
        });
        match admin.get_policy(req).await {
            Ok(resp) => return Ok(resp.into_inner()),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    Err(BrokerError::SubscriptionNotFound {
        topic: name.to_string(),
        subscription: subscription.to_owned(),
    }
    .into())
}

/// Deletes the subscription on every partition that has it.
pub(super) async fn delete_subscription(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    r: DeleteSubscriptionRequest,
) -> Result<DeleteSubscriptionResponse, Status> {
    let mut found = false;
    for p in &parts {
        let req = Request::new(DeleteSubscriptionRequest {
            topic: p.to_string(),
            ..r.clone()
        });
        match admin.delete_subscription(req).await {
            Ok(_) => found = true,
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    if !found {
        return Err(BrokerError::SubscriptionNotFound {
            topic: name.to_string(),
            subscription: r.subscription,
        }
        .into());
    }
    Ok(DeleteSubscriptionResponse {})
}

/// Entry ids and paging positions are per partition's dead-letter tier:
/// over a whole partitioned topic they would be ambiguous.
fn check_filter(filter: Option<&DeadLetterFilter>, after: Option<u64>) -> Result<(), Status> {
    if filter.is_some_and(|f| !f.entry_ids.is_empty()) || after.is_some() {
        return Err(Status::invalid_argument(
            "entry ids and after_entry_id are per partition on a partitioned topic; name the partition (<topic>-partition-<i>) to select by entry id",
        ));
    }
    Ok(())
}

/// Dead letters of every partition, oldest first, up to the limit;
/// `total` counts every match on every partition.
pub(super) async fn list_dead_letters(
    admin: &impl Admin,
    parts: Vec<TopicName>,
    r: ListDeadLettersRequest,
) -> Result<ListDeadLettersResponse, Status> {
    check_filter(r.filter.as_ref(), r.after_entry_id)?;
    let limit = if r.limit == 0 { 100 } else { r.limit as usize };
    let mut out = ListDeadLettersResponse::default();
    for p in &parts {
        let req = Request::new(ListDeadLettersRequest {
            topic: p.to_string(),
            ..r.clone()
        });
        match admin.list_dead_letters(req).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                out.total += resp.total;
                out.dead_letters.extend(resp.dead_letters);
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    out.dead_letters.sort_by_key(|d| d.dead_lettered_at_ms);
    out.dead_letters.truncate(limit);
    Ok(out)
}

/// Replays matching dead letters of every partition (each partition's at
/// the requested rate, one partition after another), as the caller.
pub(super) async fn replay_dead_letters(
    admin: &impl Admin,
    parts: Vec<TopicName>,
    r: Request<ReplayDeadLettersRequest>,
) -> Result<ReplayDeadLettersResponse, Status> {
    let caller = r.extensions().get::<CallerRole>().cloned();
    let r = r.into_inner();
    check_filter(r.filter.as_ref(), None)?;
    let mut out = ReplayDeadLettersResponse {
        dry_run: r.dry_run,
        ..Default::default()
    };
    for p in &parts {
        let mut req = Request::new(ReplayDeadLettersRequest {
            topic: p.to_string(),
            ..r.clone()
        });
        if let Some(c) = &caller {
            req.extensions_mut().insert(c.clone());
        }
        match admin.replay_dead_letters(req).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                out.replayed += resp.replayed;
                out.new_ids.extend(resp.new_ids);
                // Ids of each partition's own dead-letter tier.
                out.dead_letter_ids.extend(resp.dead_letter_ids);
                // A detached replay runs one job per partition; the last
                // is named (all are listed by ListReplayJobs).
                out.job_id = out.job_id.max(resp.job_id);
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    Ok(out)
}

/// Purges matching dead letters of every partition.
pub(super) async fn purge_dead_letters(
    admin: &impl Admin,
    parts: Vec<TopicName>,
    r: PurgeDeadLettersRequest,
) -> Result<PurgeDeadLettersResponse, Status> {
    check_filter(r.filter.as_ref(), None)?;
    let mut out = PurgeDeadLettersResponse {
        dry_run: r.dry_run,
        ..Default::default()
    };
    for p in &parts {
        let req = Request::new(PurgeDeadLettersRequest {
            topic: p.to_string(),
            ..r.clone()
        });
        match admin.purge_dead_letters(req).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                out.purged += resp.purged;
                out.dead_letter_ids.extend(resp.dead_letter_ids);
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    Ok(out)
}

/// Dead-letter groups over every partition: counts and times merged by
/// key. Entry ids are per partition's tier, so none are listed here.
pub(super) async fn group_dead_letters(
    admin: &impl Admin,
    parts: Vec<TopicName>,
    r: GroupDeadLettersRequest,
) -> Result<GroupDeadLettersResponse, Status> {
    check_filter(r.filter.as_ref(), None)?;
    let mut groups: BTreeMap<String, DeadLetterGroup> = BTreeMap::new();
    let mut total = 0;
    for p in &parts {
        let req = Request::new(GroupDeadLettersRequest {
            topic: p.to_string(),
            ..r.clone()
        });
        match admin.group_dead_letters(req).await {
            Ok(resp) => {
                let resp = resp.into_inner();
                total += resp.total;
                for g in resp.groups {
                    let e = groups
                        .entry(g.key.clone())
                        .or_insert_with(|| DeadLetterGroup {
                            key: g.key.clone(),
                            first_at_ms: u64::MAX,
                            ..Default::default()
                        });
                    e.count += g.count;
                    e.first_at_ms = e.first_at_ms.min(g.first_at_ms);
                    e.last_at_ms = e.last_at_ms.max(g.last_at_ms);
                    for v in g.verdicts {
                        if e.verdicts.len() < super::dead_letters::MAX_VERDICTS
                            && !e.verdicts.contains(&v)
                        {
                            e.verdicts.push(v);
                        }
                    }
                }
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    let mut groups: Vec<_> = groups.into_values().collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    Ok(GroupDeadLettersResponse { groups, total })
}
