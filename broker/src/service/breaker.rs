//! The admin side of the outage breaker: `SetBreaker` (force open, force
//! closed, auto; on a partitioned topic's base name, every partition that
//! has the subscription), the breaker's part of `SubscriptionStats`, and
//! the breaker carried in a `SetPolicy` request.

use crate::name::{SubscriptionName, TopicName};
use crate::node::Node;
use crate::subscription::BreakerStats;
use ricochet_policy::BreakerSpec;
use ricochet_proto::{BreakerConfig, BreakerStatus, DeadLetterPolicyConfig, SetBreakerRequest};
use tonic::Status;

/// The breaker a `SetPolicy` request carries, validated.
pub(super) fn requested(
    policy: Option<&DeadLetterPolicyConfig>,
) -> Result<Option<BreakerSpec>, Status> {
    policy
        .and_then(|p| p.breaker.as_ref())
        .map(|b| {
            BreakerSpec::try_from(b)
                .map_err(|e| Status::invalid_argument(format!("invalid breaker: {e}")))
        })
        .transpose()
}

/// A breaker's stats on the wire.
pub(super) fn status(b: &BreakerStats) -> BreakerStatus {
    let s = &b.snapshot;
    BreakerStatus {
        state: s.phase.as_str().to_owned(),
        mode: ricochet_proto::BreakerMode::from(s.mode) as i32,
        since_ms: s.since_ms,
        window_failures: b.window_failures,
        window_settles: b.window_settles,
        trips: s.trips,
        next_probe_ms: if s.phase == ricochet_policy::BreakerPhase::Open
            && s.mode == ricochet_policy::BreakerMode::Auto
        {
            s.next_probe_ms
        } else {
            0
        },
        probe_interval_ms: s.probe_interval_ms,
        config: Some(BreakerConfig::from(&b.spec)),
    }
}

/// The breaker mode a `SetBreaker` request asks for, validated.
pub(super) fn mode_of(mode: i32) -> Result<ricochet_policy::BreakerMode, Status> {
    ricochet_proto::breaker::breaker_mode_from_i32(mode).ok_or_else(|| {
        Status::invalid_argument(format!(
            "mode {mode} is not a breaker mode: use BREAKER_MODE_AUTO, BREAKER_MODE_FORCED_OPEN or BREAKER_MODE_FORCED_CLOSED"
        ))
    })
}

/// `SetBreaker` on one topic: forces (or frees) the subscription's
/// breaker, durably. (On a partitioned topic's base name the admin service
/// makes this call on each partition, `fanout::set_breaker`.)
pub(super) async fn set(node: &Node, r: SetBreakerRequest) -> Result<BreakerStatus, Status> {
    let core = &node.core;
    let mode = mode_of(r.mode)?;
    let s = SubscriptionName::parse(&r.subscription)?;
    let t = TopicName::parse(&r.topic)?;
    let b = core.subscription(&t, &s).await?.set_breaker(mode).await?;
    core.flusher.durable().await?;
    Ok(status(&b))
}
