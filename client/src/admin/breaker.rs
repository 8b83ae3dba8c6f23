//! A subscription's outage breaker: set with the operator's policy
//! ([`Admin::set_policy_with_breaker`]), forced open or closed or handed
//! back to its rules ([`Admin::set_breaker`]). Its state is part of
//! [`Admin::subscription_stats`] (`breaker`).

use ricochet_policy::{BreakerMode as Mode, BreakerSpec, PolicySpec};
use ricochet_proto::{BreakerMode, DeadLetterPolicyConfig, SetBreakerRequest, SetPolicyRequest};

use super::{Admin, BreakerStatus, PolicyInForce};
use crate::error::Result;

impl Admin {
    /// Sets the operator's policy and outage breaker of `subscription`
    /// together, durably (either may be `None`: no policy, or no breaker,
    /// of the operator's). Answers the policy in force.
    pub async fn set_policy_with_breaker(
        &self,
        topic: &str,
        subscription: &str,
        policy: Option<&PolicySpec>,
        breaker: Option<&BreakerSpec>,
    ) -> Result<PolicyInForce> {
        let mut config = policy.map(DeadLetterPolicyConfig::from);
        if let Some(b) = breaker {
            config.get_or_insert_with(Default::default).breaker = Some(b.into());
        }
        let req = SetPolicyRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            policy: config,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).set_policy(r).await
        })
        .await
    }

    /// Forces the outage breaker of `subscription` open or closed, or hands
    /// it back to its rules, durably. A subscription without a breaker is
    /// refused ([`ErrorKind::FailedPrecondition`](crate::ErrorKind)).
    pub async fn set_breaker(
        &self,
        topic: &str,
        subscription: &str,
        mode: Mode,
    ) -> Result<BreakerStatus> {
        let req = SetBreakerRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            mode: BreakerMode::from(mode) as i32,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).set_breaker(r).await
        })
        .await
    }
}
