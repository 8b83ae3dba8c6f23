//! Consumer settings: [`ConsumerConfig`], how they
//! are checked and completed before subscribing, and the `Subscribe`
//! frame they become.

use std::sync::Arc;
use std::time::Duration;

use ricochet_policy::{DeadLetterPolicy, PolicySpec};
use ricochet_proto::{DeadLetterPolicyConfig, Subscribe};

use super::{InitialPosition, SubscriptionType};
use crate::error::{Error, Result};

/// A consumer's dead-letter policy, for
/// [`ConsumerBuilder::policy`](super::ConsumerBuilder::policy): a spec, or
/// an implementation of your own. Made with `From`.
#[derive(Clone)]
#[non_exhaustive]
pub enum ConsumerPolicy {
    /// A policy spec: sent to the broker and built locally.
    Spec(PolicySpec),
    /// A policy of your own, consulted locally (sent to the broker when it
    /// has a [`spec`](DeadLetterPolicy::spec)).
    Custom(Arc<dyn DeadLetterPolicy>),
}

impl std::fmt::Debug for ConsumerPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConsumerPolicy::Spec(s) => f.debug_tuple("Spec").field(s).finish(),
            ConsumerPolicy::Custom(p) => f.debug_tuple("Custom").field(&p.name()).finish(),
        }
    }
}

impl From<PolicySpec> for ConsumerPolicy {
    fn from(spec: PolicySpec) -> Self {
        ConsumerPolicy::Spec(spec)
    }
}

impl From<Arc<dyn DeadLetterPolicy>> for ConsumerPolicy {
    fn from(policy: Arc<dyn DeadLetterPolicy>) -> Self {
        ConsumerPolicy::Custom(policy)
    }
}

/// Consumer settings, as the [`ConsumerBuilder`](super::ConsumerBuilder)
/// methods set them; see those for each.
#[derive(Clone)]
#[non_exhaustive]
pub struct ConsumerConfig {
    /// Subscription name (required).
    pub subscription: String,
    /// Subscription type.
    pub subscription_type: SubscriptionType,
    /// Initial position of a new subscription.
    pub initial_position: InitialPosition,
    /// Consumer name; `None` generates a unique one (kept across reconnects,
    /// so a Failover consumer keeps its rank).
    pub consumer_name: Option<String>,
    /// Messages the broker may push ahead of the application (default 1000).
    pub receiver_queue_size: u32,
    /// Redeliver messages not acked within this; `None` (default) disables.
    pub ack_timeout: Option<Duration>,
    /// Granularity of the ack-timeout tracker (default `min(1 s, ack_timeout)`).
    pub ack_timeout_tick: Option<Duration>,
    /// Nack delay when no policy is in force (default 60 s, like Pulsar).
    pub negative_ack_delay: Duration,
    /// The policy consulted for nack delays (not sent to the broker unless
    /// it has a [`spec`](DeadLetterPolicy::spec)).
    pub policy: Option<Arc<dyn DeadLetterPolicy>>,
    /// A policy spec, sent to the broker in `Subscribe` and built locally.
    pub policy_spec: Option<PolicySpec>,
    /// Overrides the retry tier topic (with a policy).
    pub retry_topic: Option<String>,
    /// Overrides the dead-letter topic (with a policy).
    pub dead_letter_topic: Option<String>,
    /// Whether to also receive from the retry tier (broker default).
    pub retry_enabled: Option<bool>,
    /// Per-key ordered retries, sent with the policy.
    pub key_order: Option<ricochet_policy::KeyOrder>,
    /// This consumer reads a dead-letter tier topic on purpose (the broker
    /// refuses subscriptions to `…-DLQ` topics otherwise).
    pub dead_letter_reader: bool,
    /// Ack grouping window (default 100 ms; zero sends every ack at once).
    pub ack_group_time: Duration,
    /// Ack grouping size (default 1000 ids).
    pub ack_group_max: usize,
    /// Held acks are sent as soon as the application waits on an empty
    /// queue or awaits an ack's receipt, not only when `ack_group_time`
    /// ends (default on).
    pub ack_flush_on_idle: bool,
    /// Ack receipts (Pulsar's `isAckReceiptEnabled`, NATS's `AckSync`): each
    /// ack, cumulative ack and nack completes only once the broker has made
    /// it durable (default off: they complete once queued).
    pub ack_receipts: bool,
    /// A nack whose delay is at least this long is handed to the broker at
    /// once, which holds it (persisted, surviving this client) and
    /// redelivers it when due; shorter ones are held here (default 10 s).
    /// With ack receipts every nack goes to the broker.
    pub broker_nack_threshold: Duration,
    /// How long before a nack held here is due it goes to the broker, with
    /// the rest of its delay for the broker to hold (default zero: at the
    /// due time). The broker makes the new delivery count durable
    /// within the lead and redelivers at the due time from its timer, so no
    /// flush sits between the due time and the redelivery.
    pub nack_lead: Duration,
    /// Whether a nack held here, once the broker has counted it ahead
    /// (stored its new delivery count durably), is redelivered from a copy
    /// kept here when its delay is over, with the broker told afterwards
    /// (no storage read, dispatch or round trip on the way). `None`
    /// (default): on, except on Shared subscriptions, where a nacked
    /// message then comes back to the consumer that nacked it rather than
    /// to whichever consumer has room, as it does through the broker.
    pub local_redelivery: Option<bool>,
    /// The payload bytes of those copies kept at most (default 16 MiB);
    /// nacks beyond it are redelivered by the broker.
    pub local_redelivery_budget: usize,
    /// On a partitioned topic: how often the partition count is looked up
    /// again to subscribe to partitions added later (default 60 s, as
    /// Pulsar's `autoUpdatePartitionsInterval`; zero never).
    pub partitions_refresh: Duration,
}

impl std::fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("subscription", &self.subscription)
            .field("subscription_type", &self.subscription_type)
            .field("initial_position", &self.initial_position)
            .field("consumer_name", &self.consumer_name)
            .field("receiver_queue_size", &self.receiver_queue_size)
            .field("ack_timeout", &self.ack_timeout)
            .field("ack_timeout_tick", &self.ack_timeout_tick)
            .field("negative_ack_delay", &self.negative_ack_delay)
            .field("policy", &self.policy.as_ref().map(|p| p.name().to_owned()))
            .field("policy_spec", &self.policy_spec)
            .field("retry_enabled", &self.retry_enabled)
            .field("key_order", &self.key_order)
            .field("dead_letter_reader", &self.dead_letter_reader)
            .field("ack_group_time", &self.ack_group_time)
            .field("ack_group_max", &self.ack_group_max)
            .field("ack_flush_on_idle", &self.ack_flush_on_idle)
            .field("ack_receipts", &self.ack_receipts)
            .field("broker_nack_threshold", &self.broker_nack_threshold)
            .field("nack_lead", &self.nack_lead)
            .field("local_redelivery", &self.local_redelivery)
            .field("local_redelivery_budget", &self.local_redelivery_budget)
            .field("partitions_refresh", &self.partitions_refresh)
            .finish()
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            subscription: String::new(),
            subscription_type: SubscriptionType::default(),
            initial_position: InitialPosition::default(),
            consumer_name: None,
            receiver_queue_size: 1000,
            ack_timeout: None,
            ack_timeout_tick: None,
            negative_ack_delay: Duration::from_secs(60),
            policy: None,
            policy_spec: None,
            retry_topic: None,
            dead_letter_topic: None,
            retry_enabled: None,
            key_order: None,
            dead_letter_reader: false,
            ack_group_time: Duration::from_millis(100),
            ack_group_max: 1000,
            ack_flush_on_idle: true,
            ack_receipts: false,
            broker_nack_threshold: Duration::from_secs(10),
            nack_lead: super::driver::NACK_LEAD,
            local_redelivery: None,
            local_redelivery_budget: 16 << 20,
            partitions_refresh: Duration::from_secs(60),
        }
    }
}

impl ConsumerConfig {
    /// Checks the settings and fills in what the consumer derives: a
    /// generated consumer name (kept for every reconnect) and, with an ack
    /// timeout, its tick (`min(1 s, ack_timeout)` unless given, at least
    /// 1 ms, never above the timeout).
    pub(super) fn resolve(mut self) -> Result<Self> {
        if self.subscription.is_empty() {
            return Err(Error::invalid_argument("a subscription name is required"));
        }
        if let Some(spec) = &self.policy_spec {
            spec.validate()?;
        }
        if let Some(k) = &self.key_order {
            k.validate()?;
            if self.subscription_type == SubscriptionType::Shared {
                return Err(Error::invalid_argument(
                    "key order needs a Key_Shared, Failover or Exclusive subscription; a Shared one has no order to keep",
                ));
            }
        }
        if self.consumer_name.is_none() {
            self.consumer_name = Some(format!("consumer-{}", crate::unique_suffix()));
        }
        if let Some(t) = self.ack_timeout {
            let tick = self
                .ack_timeout_tick
                .unwrap_or(Duration::from_secs(1))
                .min(t);
            self.ack_timeout_tick = Some(tick.max(Duration::from_millis(1)));
        }
        Ok(self)
    }

    /// The payload budget of copies kept for local redelivery; zero when
    /// it is off.
    pub(super) fn local_budget(&self) -> usize {
        let on = self
            .local_redelivery
            .unwrap_or(self.subscription_type != SubscriptionType::Shared);
        if on { self.local_redelivery_budget } else { 0 }
    }

    /// The policy sent to the broker: the spec, else the policy object's
    /// own spec, with the tier topic overrides.
    fn wire_policy(&self) -> Option<DeadLetterPolicyConfig> {
        let spec = self
            .policy_spec
            .clone()
            .or_else(|| self.policy.as_ref().and_then(|p| p.spec()));
        let mut wire = match (&spec, &self.key_order) {
            (Some(spec), _) => DeadLetterPolicyConfig::from(spec),
            (None, Some(_)) => DeadLetterPolicyConfig::default(),
            (None, None) => return None,
        };
        wire.key_order = self.key_order.as_ref().map(Into::into);
        wire.retry_topic = self.retry_topic.clone().unwrap_or_default();
        wire.dead_letter_topic = self.dead_letter_topic.clone().unwrap_or_default();
        Some(wire)
    }

    /// The `Subscribe` frame that opens (and reopens) a stream on `topic`.
    pub(super) fn subscribe_request(&self, topic: &str) -> Subscribe {
        Subscribe {
            topic: topic.to_owned(),
            subscription: self.subscription.clone(),
            subscription_type: self.subscription_type as i32,
            initial_position: self.initial_position as i32,
            consumer_name: self.consumer_name.clone().unwrap_or_default(),
            dead_letter_policy: self.wire_policy(),
            retry_enabled: self.retry_enabled,
            dead_letter_reader: self.dead_letter_reader,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(subscription: &str) -> ConsumerConfig {
        ConsumerConfig {
            subscription: subscription.into(),
            ..ConsumerConfig::default()
        }
    }

    #[test]
    fn resolve_requires_a_subscription_and_a_valid_spec() {
        let e = ConsumerConfig::default().resolve().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument, "{e}");
        let bad = ConsumerConfig {
            policy_spec: Some(PolicySpec::fixed_backoff(Duration::ZERO, 3)),
            ..named("s")
        };
        let e = bad.resolve().unwrap_err();
        assert!(e.kind() == crate::ErrorKind::Policy, "{e}");
    }

    #[test]
    fn resolve_names_the_consumer_once() {
        let c = named("s").resolve().unwrap();
        let name = c.consumer_name.clone().unwrap();
        assert!(name.starts_with("consumer-"), "{name}");
        let again = c.resolve().unwrap();
        assert_eq!(again.consumer_name.as_deref(), Some(name.as_str()));
        let given = ConsumerConfig {
            consumer_name: Some("mine".into()),
            ..named("s")
        };
        assert_eq!(
            given.resolve().unwrap().consumer_name.as_deref(),
            Some("mine")
        );
    }

    #[test]
    fn resolve_bounds_the_ack_timeout_tick() {
        let tick = |timeout_ms: Option<u64>, tick: Option<Duration>| {
            ConsumerConfig {
                ack_timeout: timeout_ms.map(Duration::from_millis),
                ack_timeout_tick: tick,
                ..named("s")
            }
            .resolve()
            .unwrap()
            .ack_timeout_tick
        };
        let ms = Duration::from_millis;
        assert_eq!(tick(None, None), None);
        assert_eq!(tick(Some(30_000), None), Some(ms(1000)));
        assert_eq!(tick(Some(400), None), Some(ms(400)));
        assert_eq!(tick(Some(400), Some(ms(50))), Some(ms(50)));
        assert_eq!(tick(Some(400), Some(ms(900))), Some(ms(400)));
        assert_eq!(tick(Some(400), Some(Duration::ZERO)), Some(ms(1)));
    }

    #[test]
    fn subscribe_request_carries_the_settings_and_the_policy() {
        let cfg = ConsumerConfig {
            subscription_type: SubscriptionType::Shared,
            initial_position: InitialPosition::Earliest,
            consumer_name: Some("c".into()),
            policy_spec: Some(PolicySpec::fixed_backoff(Duration::from_secs(1), 3)),
            dead_letter_topic: Some("dlq".into()),
            retry_enabled: Some(true),
            ..named("s")
        };
        let r = cfg.subscribe_request("orders");
        assert_eq!(r.topic, "orders");
        assert_eq!(r.subscription, "s");
        assert_eq!(
            r.subscription_type,
            ricochet_proto::SubscriptionType::Shared as i32
        );
        assert_eq!(
            r.initial_position,
            ricochet_proto::InitialPosition::Earliest as i32
        );
        assert_eq!(r.consumer_name, "c");
        assert_eq!(r.retry_enabled, Some(true));
        assert!(!r.dead_letter_reader);
        let wire = r.dead_letter_policy.expect("the spec is sent");
        assert_eq!(wire.dead_letter_topic, "dlq");
        assert_eq!(wire.retry_topic, "");
        assert!(
            named("s")
                .subscribe_request("t")
                .dead_letter_policy
                .is_none()
        );
    }
}
