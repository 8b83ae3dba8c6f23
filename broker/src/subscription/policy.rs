//! Which dead-letter policy a subscription follows. Precedence, highest
//! first: set by an operator (admin `SetPolicy`), sent by the subscribing
//! client, the broker config's `[[policies]]` rule for the topic, none.
//! Without a policy a `reconsume_later` still needs delays: it uses
//! RocketMQ's defaults (the fallback).

use super::SubscriptionActor;
use super::requests::PolicyInfo;
use crate::error::Result;
use crate::storage::PolicySource;
use ricochet_policy::{DeadLetterPolicy, PolicySpec};
use std::sync::Arc;

/// The policy in force, built.
#[derive(Debug)]
pub(super) struct PolicyState {
    pub policy: Option<Arc<dyn DeadLetterPolicy>>,
    pub source: PolicySource,
    /// Used by `reconsume_later` when there is no policy: RocketMQ's
    /// defaults (16 retries on the 18-level table, then DLQ).
    pub fallback: Option<Arc<dyn DeadLetterPolicy>>,
}

impl Default for PolicyState {
    fn default() -> Self {
        Self {
            policy: None,
            source: PolicySource::Default,
            fallback: PolicySpec::delay_levels_default().build().ok(),
        }
    }
}

/// Refuses a policy whose longest delay exceeds the broker's `max_delay`.
pub(crate) fn check_max_delay(spec: &PolicySpec, max_delay: std::time::Duration) -> Result<()> {
    match spec.max_delay() {
        Some(d) if d > max_delay => Err(crate::error::BrokerError::InvalidArgument(format!(
            "policy {spec} waits up to {} ms, more than the broker's max_delay of {} ms",
            d.as_millis(),
            max_delay.as_millis()
        ))),
        _ => Ok(()),
    }
}

impl SubscriptionActor {
    /// Builds the policy the record and the config call for.
    pub(super) fn resolve_policy(&mut self) -> Result<()> {
        let (spec, source) = match (&self.rec.policy, self.rec.policy_source) {
            (Some(p), src) => (Some(p.clone()), src.unwrap_or(PolicySource::Admin)),
            (None, _) => match self.deps.link.configured_policy(&self.rec.topic) {
                Some(p) => (Some(p), PolicySource::Config),
                None => (None, PolicySource::Default),
            },
        };
        self.policy.policy = match &spec {
            Some(s) => Some(self.deps.link.build_policy(s)?),
            None => None,
        };
        self.policy.source = source;
        Ok(())
    }

    pub(super) fn policy_info(&self) -> PolicyInfo {
        PolicyInfo {
            spec: self
                .policy
                .policy
                .as_ref()
                .and_then(|p| p.spec())
                .or_else(|| self.rec.policy.clone()),
            source: self.policy.source,
            retry_topic: self.tiers.retry_name.clone(),
            dead_letter_topic: self.tiers.dead_letter_name.clone(),
            key_order: self.rec.key_order,
            breaker: self.breaker_stats().map(|b| b.spec),
        }
    }

    /// Sets (or clears) the policy from `source`; nothing changes if it
    /// does not validate or build.
    pub(super) fn set_policy(
        &mut self,
        spec: Option<PolicySpec>,
        source: PolicySource,
    ) -> Result<PolicyInfo> {
        if let Some(s) = &spec {
            s.validate()?;
            check_max_delay(s, self.deps.max_delay)?;
            self.deps.link.build_policy(s)?;
        }
        let old = (self.rec.policy.clone(), self.rec.policy_source);
        self.rec.policy_source = spec.as_ref().map(|_| source);
        self.rec.policy = spec;
        if let Err(e) = self.resolve_policy() {
            (self.rec.policy, self.rec.policy_source) = old;
            return Err(e);
        }
        self.dirty = true;
        Ok(self.policy_info())
    }
}
