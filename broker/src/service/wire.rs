//! Domain values as wire messages (the admin API's answers).

use crate::storage::{AttemptRecord, FailureRecord};
use crate::subscription::{PolicyInfo, SubscriptionStats};
use ricochet_proto::{
    Attempt, ConsumerStats, DeadLetterPolicyConfig, DueBucket, PolicyResponse,
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

pub(super) fn policy_response(info: PolicyInfo) -> PolicyResponse {
    let mut policy: Option<DeadLetterPolicyConfig> = info.spec.as_ref().map(Into::into);
    if let Some(b) = &info.breaker {
        policy.get_or_insert_with(Default::default).breaker = Some(b.into());
    }
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
        breaker: s.breaker.as_ref().map(super::breaker::status),
    }
}
