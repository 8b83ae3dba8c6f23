//! Domain values as wire messages (the admin API's answers).

use crate::storage::{AttemptRecord, FailureRecord};
use crate::subscription::{PolicyInfo, SubscriptionStats};
use ricochet_proto::{
    Attempt, ConsumerStats, DeadLetterPolicyConfig, DueBucket, KeyOrderBlockedKey, PolicyResponse,
    SubscriptionStatsResponse,
};

pub(super) fn attempt(a: &AttemptRecord) -> Attempt {
    Attempt {
        time_ms: a.time_ms,
        delivery_count: a.delivery_count,
        consumer: a.consumer.clone(),
        reason: ricochet_proto::convert::failure_reason_to_i32(a.reason),
        detail: a.detail.clone(),
    }
}

pub(super) fn attempts(f: &FailureRecord) -> Vec<Attempt> {
    f.attempts.iter().map(attempt).collect()
}

/// The policy in force on the wire: its spec, key order and breaker (a
/// config without a `kind` when only those are set); `None` with none.
pub(super) fn policy_config(info: &PolicyInfo) -> Option<DeadLetterPolicyConfig> {
    let key_order = info.key_order.as_ref().map(Into::into);
    let breaker = info.breaker.as_ref().map(Into::into);
    let mut policy = match &info.spec {
        Some(s) => DeadLetterPolicyConfig::from(s),
        None if key_order.is_some() || breaker.is_some() => DeadLetterPolicyConfig::default(),
        None => return None,
    };
    policy.key_order = key_order;
    policy.breaker = breaker;
    Some(policy)
}

pub(super) fn policy_response(info: PolicyInfo) -> PolicyResponse {
    let mut policy = policy_config(&info);
    if let Some(p) = &mut policy {
        p.retry_topic = info.retry_topic;
        p.dead_letter_topic = info.dead_letter_topic;
    }
    PolicyResponse {
        policy,
        source: info.source.as_str().to_owned(),
    }
}

pub(super) fn subscription_stats(s: SubscriptionStats) -> SubscriptionStatsResponse {
    SubscriptionStatsResponse {
        topic: s.topic,
        subscription: s.subscription,
        subscription_type: s.subscription_type.as_str_name().to_owned(),
        backlog: s.backlog,
        unacked: s.unacked,
        consumers: s
            .consumers
            .into_iter()
            .map(|c| ConsumerStats {
                name: c.name,
                unacked: c.unacked,
                permits: c.permits,
                active: c.active,
                blocked_on_unacked: c.blocked_on_unacked,
            })
            .collect(),
        mark_delete_position: s.mark_delete_position,
        scheduled_retries: s.scheduled_retries,
        dead_lettered: s.dead_lettered,
        next_retry_due_ms: s.next_retry_due_ms.unwrap_or(0),
        retry_topic: s.retry_topic,
        dead_letter_topic: s.dead_letter_topic,
        scheduled_by_due: s
            .scheduled_by_due
            .into_iter()
            .map(|b| DueBucket {
                label: b.label,
                until_ms: b.until_ms,
                count: b.count,
            })
            .collect(),
        key_order: s.key_order.is_some(),
        blocked_keys: s.key_order.as_ref().map_or(0, |k| k.blocked_keys),
        oldest_blocked_ms: s.key_order.as_ref().map_or(0, |k| k.oldest_blocked_ms),
        held_messages: s.key_order.as_ref().map_or(0, |k| k.held_messages),
        top_blocked_keys: s
            .key_order
            .map(|k| k.top)
            .unwrap_or_default()
            .into_iter()
            .map(|b| KeyOrderBlockedKey {
                key: b.key,
                blocked_since_ms: b.blocked_since_ms,
                failed_id: b.failed_id,
                held: b.held,
            })
            .collect(),
        breaker: s.breaker.as_ref().map(super::breaker::status),
    }
}
