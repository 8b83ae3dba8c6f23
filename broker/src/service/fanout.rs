//! The admin service's view of a partitioned topic as a whole. Each admin
//! call on a partitioned topic's base name ([`partitioned`]) is answered by
//! making the same call on every partition and combining the answers:
//! stats are summed (and listed per partition), a policy or a breaker set
//! applies to every partition, dead letters are listed, grouped, replayed
//! and purged over all partitions, subscriptions listed, read and deleted
//! over all of them, and deleting the base name deletes every partition.
//!
//! Each partition keeps its own retry and dead-letter tiers
//! (`<topic>-partition-<i>-<sub>-RETRY` / `-DLQ`); the tools here present
//! them together. A dead letter's message id names its partition's tier,
//! so one picked from the combined list can be addressed on its own.
//!
//! The per-partition calls go through the generated [`Admin`] trait, not
//! the admin service itself: the admin service uses this module, and this
//! module does not know it. The same code serves both modes: standalone
//! the `Admin` given is this broker's own; in cluster mode, where the
//! partitions live on different brokers, it is [`super::owners::Owners`],
//! which makes each partition's call at the partition's owner (this
//! broker's through its own service, another's through that broker's
//! `Admin` service with the caller's credential), and names the partition
//! and the broker in a failure (UNAVAILABLE when the owner cannot be
//! reached in time).
//!
//! Reads ask every partition at once. Changes (policy, breaker, replay,
//! purge, subscription and topic delete) go one partition after another,
//! in partition order, and a failure stops the call ([`midway`], as
//! Pulsar's admin does): partitions already changed stay changed, the
//! error names them, and since each step is idempotent (a policy set
//! again, a dead letter replayed or purged once, a deleted partition
//! skipped) the same call made again finishes the job. A partition without
//! the subscription (or, in a cluster, never created by its owner) has
//! nothing to do and is skipped.

use super::dead_letters::CallerRole;
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::node::Node;
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use std::collections::BTreeMap;
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
    for (p, answer) in parts
        .iter()
        .zip(ask(&parts, |p| admin.topic_stats(topic_req(p))).await)
    {
        each.push(match answer {
            Ok(s) => s,
            // In a cluster a partition is created by its owner when first
            // used: until then it is empty.
            Err(s) if s.code() == tonic::Code::NotFound => TopicStatsResponse {
                topic: p.to_string(),
                ..Default::default()
            },
            Err(s) => return Err(s),
        });
    }
    Ok(combine_topic_stats(name, each))
}

/// `call` made for every partition at once (reads only), the answers in
/// partition order.
async fn ask<'a, T, F, Fut>(parts: &'a [TopicName], call: F) -> Vec<Result<T, Status>>
where
    F: Fn(&'a TopicName) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    futures::future::join_all(
        parts
            .iter()
            .map(|p| async { call(p).await.map(tonic::Response::into_inner) }),
    )
    .await
}

/// A mutating call's failure at one partition, naming the partitions done
/// before it (changed, or with nothing to change): those stay done, and
/// since each step is idempotent, the same call made again does the rest.
fn midway(failed: Status, done: &[&TopicName]) -> Status {
    let done = if done.is_empty() {
        "none".to_owned()
    } else {
        done.iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Status::new(
        failed.code(),
        format!(
            "{}; partitions done before this failure, which stay done (the same call again does the rest): {done}",
            failed.message()
        ),
    )
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
    let answers = ask(&parts, |p| {
        admin.subscription_stats(Request::new(SubscriptionRequest {
            topic: p.to_string(),
            subscription: subscription.to_owned(),
        }))
    })
    .await;
    let all = found(answers)?;
    if all.is_empty() {
        return Err(not_found(name, subscription));
    }
    Ok(merge_subscription_stats(name, all))
}

/// The answers of the partitions that have what was asked about (NOT_FOUND
/// skipped); the first other error.
fn found<T>(answers: Vec<Result<T, Status>>) -> Result<Vec<T>, Status> {
    let mut out = Vec::with_capacity(answers.len());
    for a in answers {
        match a {
            Ok(r) => out.push(r),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    Ok(out)
}

fn not_found(name: &TopicName, subscription: &str) -> Status {
    BrokerError::SubscriptionNotFound {
        topic: name.to_string(),
        subscription: subscription.to_owned(),
    }
    .into()
}

/// Every subscription on any partition.
pub(super) async fn list_subscriptions(
    admin: &impl Admin,
    parts: Vec<TopicName>,
) -> Result<ListSubscriptionsResponse, Status> {
    let mut names = std::collections::BTreeSet::new();
    let answers = ask(&parts, |p| admin.list_subscriptions(topic_req(p))).await;
    for listed in found(answers)? {
        names.extend(listed.subscriptions);
    }
    Ok(ListSubscriptionsResponse {
        subscriptions: names.into_iter().collect(),
    })
}

/// Makes `change` on every partition in `parts`, one after another, and
/// answers with the first answer: a partition without `subscription`
/// (NOT_FOUND) is skipped, and if none has it the call is NOT_FOUND; any
/// other failure stops the call, naming the partitions done ([`midway`]).
async fn each_with_subscription<T, F, Fut>(
    name: &TopicName,
    parts: &[TopicName],
    subscription: &str,
    mut change: F,
) -> Result<T, Status>
where
    F: FnMut(&TopicName) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let mut first = None;
    let mut done = Vec::new();
    for p in parts {
        match change(p).await {
            Ok(resp) => {
                first.get_or_insert(resp.into_inner());
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(midway(s, &done)),
        }
        done.push(p);
    }
    first.ok_or_else(|| not_found(name, subscription))
}

/// Sets the policy on every partition's subscription, one partition after
/// another; answers with the first partition's. Partitions without the
/// subscription are skipped; if none has it, NOT_FOUND. A failure stops
/// the call ([`midway`]).
pub(super) async fn set_policy(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    r: SetPolicyRequest,
) -> Result<PolicyResponse, Status> {
    each_with_subscription(name, &parts, &r.subscription, |p| {
        admin.set_policy(Request::new(SetPolicyRequest {
            topic: p.to_string(),
            ..r.clone()
        }))
    })
    .await
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
    Err(not_found(name, subscription))
}

/// Forces (or frees) the subscription's breaker on every partition that has
/// it, one after another; answers with the first partition's breaker. If
/// none has it, NOT_FOUND. A failure stops the call ([`midway`]).
pub(super) async fn set_breaker(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    r: SetBreakerRequest,
) -> Result<BreakerStatus, Status> {
    each_with_subscription(name, &parts, &r.subscription, |p| {
        admin.set_breaker(Request::new(SetBreakerRequest {
            topic: p.to_string(),
            ..r.clone()
        }))
    })
    .await
}

/// Deletes the subscription on every partition that has it, one after
/// another. A failure stops the call ([`midway`]).
pub(super) async fn delete_subscription(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    r: DeleteSubscriptionRequest,
) -> Result<DeleteSubscriptionResponse, Status> {
    each_with_subscription(name, &parts, &r.subscription, |p| {
        admin.delete_subscription(Request::new(DeleteSubscriptionRequest {
            topic: p.to_string(),
            ..r.clone()
        }))
    })
    .await
}

/// Deletes every partition of `name` (each as `DeleteTopic` would, with
/// `force`; a partition never created is skipped), one after another; the
/// caller then removes the topic's count. Without `force`, a partition
/// with subscriptions refuses the whole delete before anything is removed.
/// A failure stops the call ([`midway`]). Cluster mode: standalone the
/// node's [`crate::partitions::Partitions::delete`] does the same under
/// its lock.
pub(super) async fn delete_partitions(
    admin: &impl Admin,
    name: &TopicName,
    parts: Vec<TopicName>,
    force: bool,
) -> Result<(), Status> {
    if !force {
        let answers = ask(&parts, |p| admin.list_subscriptions(topic_req(p))).await;
        for (p, subs) in parts.iter().zip(answers) {
            let n = match subs {
                Ok(s) => s.subscriptions.len(),
                Err(s) if s.code() == tonic::Code::NotFound => 0,
                Err(s) => return Err(s),
            };
            if n > 0 {
                return Err(BrokerError::Conflict(format!(
                    "partition {p} of {name} has {n} subscription(s); delete them first or use force"
                ))
                .into());
            }
        }
    }
    let mut done = Vec::new();
    for p in &parts {
        let req = Request::new(DeleteTopicRequest {
            topic: p.to_string(),
            force,
        });
        match admin.delete_topic(req).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(midway(s, &done)),
        }
        done.push(p);
    }
    Ok(())
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
    let answers = ask(&parts, |p| {
        admin.list_dead_letters(Request::new(ListDeadLettersRequest {
            topic: p.to_string(),
            ..r.clone()
        }))
    })
    .await;
    let mut out = ListDeadLettersResponse::default();
    for resp in found(answers)? {
        out.total += resp.total;
        out.dead_letters.extend(resp.dead_letters);
    }
    out.dead_letters.sort_by_key(|d| d.dead_lettered_at_ms);
    out.dead_letters.truncate(limit);
    Ok(out)
}

/// Replays matching dead letters of every partition (each partition's at
/// the requested rate, one partition after another), as the caller. A
/// failure stops the call ([`midway`]).
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
    let mut done = Vec::new();
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
                // A detached replay runs one job per partition: each is
                // in `jobs`, the largest id in `job_id`.
                out.job_id = out.job_id.max(resp.job_id);
                out.jobs.extend(resp.jobs);
            }
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(midway(s, &done)),
        }
        done.push(p);
    }
    Ok(out)
}

/// The replay jobs of every partition (asked at once), in partition order.
pub(super) async fn list_replay_jobs(
    admin: &impl Admin,
    parts: &[TopicName],
    r: ListReplayJobsRequest,
) -> Result<ListReplayJobsResponse, Status> {
    let mut jobs = Vec::new();
    for answer in ask(parts, |p| {
        admin.list_replay_jobs(Request::new(ListReplayJobsRequest {
            topic: p.to_string(),
            ..r.clone()
        }))
    })
    .await
    {
        match answer {
            Ok(listed) => jobs.extend(listed.jobs),
            // A partition its owner never created has no jobs.
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s),
        }
    }
    Ok(ListReplayJobsResponse { jobs })
}

/// Cancels replay job `r.id` of whichever partition of `name` runs it.
/// Standalone the id is unique; in a cluster each broker numbers its own
/// jobs, so two partitions may each have a job of that id: then nothing is
/// cancelled and the caller is asked to name the partition.
pub(super) async fn cancel_replay_job(
    admin: &impl Admin,
    name: &TopicName,
    parts: &[TopicName],
    r: CancelReplayJobRequest,
) -> Result<CancelReplayJobResponse, Status> {
    let listed = list_replay_jobs(
        admin,
        parts,
        ListReplayJobsRequest {
            topic: String::new(),
            subscription: String::new(),
            local_only: false,
        },
    )
    .await?;
    let with_id: Vec<&ReplayJob> = listed.jobs.iter().filter(|j| j.id == r.id).collect();
    match with_id.as_slice() {
        [] => Err(Status::not_found(format!(
            "no replay job {} on {name} (none of its partitions runs one)",
            r.id
        ))),
        [job] => admin
            .cancel_replay_job(Request::new(CancelReplayJobRequest {
                id: r.id,
                topic: job.topic.clone(),
            }))
            .await
            .map(tonic::Response::into_inner),
        several => Err(Status::failed_precondition(format!(
            "replay job {} names a job on each of {}: cancel it by its partition's name",
            r.id,
            several
                .iter()
                .map(|j| j.topic.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Purges matching dead letters of every partition, one after another. A
/// failure stops the call ([`midway`]).
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
    let mut done = Vec::new();
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
            Err(s) => return Err(midway(s, &done)),
        }
        done.push(p);
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
    let answers = ask(&parts, |p| {
        admin.group_dead_letters(Request::new(GroupDeadLettersRequest {
            topic: p.to_string(),
            ..r.clone()
        }))
    })
    .await;
    let mut groups: BTreeMap<String, DeadLetterGroup> = BTreeMap::new();
    let mut total = 0;
    for resp in found(answers)? {
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
                if e.verdicts.len() < super::dead_letters::MAX_VERDICTS && !e.verdicts.contains(&v)
                {
                    e.verdicts.push(v);
                }
            }
        }
    }
    let mut groups: Vec<_> = groups.into_values().collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    Ok(GroupDeadLettersResponse { groups, total })
}
