//! A subscription's dead-letter policy at runtime: the one in force and
//! where it comes from ([`Admin::policy`]), an operator's own
//! ([`Admin::set_policy`]), which outranks the client's and the config's,
//! and its removal ([`Admin::clear_policy`]).

use ricochet_policy::{KeyOrder, PolicySpec};
use ricochet_proto::{DeadLetterPolicyConfig, SetPolicyRequest, SubscriptionRequest};

use super::{Admin, PolicyInForce};
use crate::error::Result;

impl Admin {
    /// The policy in force on `subscription` of `topic`, and its source
    /// (`admin`, `client`, `config` or `default`).
    pub async fn policy(&self, topic: &str, subscription: &str) -> Result<PolicyInForce> {
        let req = SubscriptionRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).get_policy(r).await
        })
        .await
    }

    /// Sets the operator's policy of `subscription`, durably; it applies
    /// to the next failure of every message. Answers the policy in force.
    pub async fn set_policy(
        &self,
        topic: &str,
        subscription: &str,
        policy: &PolicySpec,
    ) -> Result<PolicyInForce> {
        self.put_policy(topic, subscription, Some(policy.into()))
            .await
    }

    /// Sets the operator's policy of `subscription` with per-key ordered
    /// retries ([`KeyOrder`]; key order needs a Key_Shared, Failover or
    /// Exclusive subscription, `InvalidArgument` otherwise); `policy`
    /// `None`: key order without a dead-letter policy. Answers the policy
    /// in force.
    pub async fn set_policy_with_key_order(
        &self,
        topic: &str,
        subscription: &str,
        policy: Option<&PolicySpec>,
        key_order: KeyOrder,
    ) -> Result<PolicyInForce> {
        let mut config = policy.map(DeadLetterPolicyConfig::from).unwrap_or_default();
        config.key_order = Some((&key_order).into());
        self.put_policy(topic, subscription, Some(config)).await
    }

    /// Sets the operator's policy, key order and outage breaker of
    /// `subscription` together, durably (each may be `None`: none of the
    /// operator's). Answers the policy in force.
    pub async fn set_policy_options(
        &self,
        topic: &str,
        subscription: &str,
        policy: Option<&PolicySpec>,
        key_order: Option<KeyOrder>,
        breaker: Option<&ricochet_policy::BreakerSpec>,
    ) -> Result<PolicyInForce> {
        let mut config = policy.map(DeadLetterPolicyConfig::from);
        if let Some(k) = &key_order {
            config.get_or_insert_with(Default::default).key_order = Some(k.into());
        }
        if let Some(b) = breaker {
            config.get_or_insert_with(Default::default).breaker = Some(b.into());
        }
        self.put_policy(topic, subscription, config).await
    }

    /// Removes the operator's policy of `subscription`: the client's or the
    /// config's applies again. Answers the policy in force.
    pub async fn clear_policy(&self, topic: &str, subscription: &str) -> Result<PolicyInForce> {
        self.put_policy(topic, subscription, None).await
    }

    async fn put_policy(
        &self,
        topic: &str,
        subscription: &str,
        policy: Option<DeadLetterPolicyConfig>,
    ) -> Result<PolicyInForce> {
        let req = SetPolicyRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            policy,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).set_policy(r).await
        })
        .await
    }
}
