//! Which subscription each retry and dead-letter tier name belongs to.
//!
//! A subscription's tiers are `<topic>-<sub>-RETRY` and `<topic>-<sub>-DLQ`
//! unless its creator named others (Pulsar's `retryLetterTopic` and
//! `deadLetterTopic`); they are fixed when the subscription is created. The
//! registry here holds every live subscription's two tier names, so that a
//! requested name can be refused when it belongs to another subscription or
//! exists as a topic of another kind, and so that a tier topic first named by
//! a producer or consumer is created as the tier it is (a producer is then
//! refused, a dead-letter reader may wait on it) instead of as an ordinary
//! topic squatting the name. Tier topics themselves are created on first use.

use crate::error::{BrokerError, Result};
use crate::name::{SubscriptionName, TopicName};
use crate::storage::{SubscriptionRecord, TopicKind};
use std::collections::HashMap;

/// Tier names a subscribing client asked for (each `None`: the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierOverrides {
    /// The retry tier's topic.
    pub retry: Option<TopicName>,
    /// The dead-letter tier's topic.
    pub dead_letter: Option<TopicName>,
}

/// The retry and dead-letter tier names of a stored subscription: its
/// overrides, or the defaults.
pub fn tier_names(rec: &SubscriptionRecord) -> Result<(String, String)> {
    let topic = TopicName::parse_stored(&rec.topic)?;
    let sub = SubscriptionName::parse_stored(&rec.name)?;
    Ok((
        rec.retry_topic
            .clone()
            .unwrap_or_else(|| topic.retry_tier(&sub).to_string()),
        rec.dead_letter_topic
            .clone()
            .unwrap_or_else(|| topic.dead_letter_tier(&sub).to_string()),
    ))
}

#[derive(Debug, Clone)]
struct Owner {
    kind: TopicKind,
    topic: String,
    subscription: String,
}

/// Every live subscription's tier names.
#[derive(Debug, Default)]
pub struct TierOwners {
    by_tier: HashMap<String, Owner>,
    by_subscription: HashMap<(String, String), (String, String)>,
}

impl TierOwners {
    /// Records `rec`'s tiers (at start, and once a subscription is created).
    pub fn claim(&mut self, rec: &SubscriptionRecord) -> Result<()> {
        let (retry, dead_letter) = tier_names(rec)?;
        for (name, kind) in [
            (&retry, TopicKind::Retry),
            (&dead_letter, TopicKind::DeadLetter),
        ] {
            self.by_tier.insert(
                name.clone(),
                Owner {
                    kind,
                    topic: rec.topic.clone(),
                    subscription: rec.name.clone(),
                },
            );
        }
        self.by_subscription
            .insert((rec.topic.clone(), rec.name.clone()), (retry, dead_letter));
        Ok(())
    }

    /// Forgets a deleted subscription's tiers.
    pub fn release(&mut self, topic: &str, subscription: &str) {
        if let Some((retry, dead_letter)) = self
            .by_subscription
            .remove(&(topic.to_owned(), subscription.to_owned()))
        {
            for name in [retry, dead_letter] {
                let ours = self
                    .by_tier
                    .get(&name)
                    .is_some_and(|o| o.topic == topic && o.subscription == subscription);
                if ours {
                    self.by_tier.remove(&name);
                }
            }
        }
    }

    /// The (retry, dead-letter) tier names of a live subscription.
    pub fn tiers_of(&self, topic: &str, subscription: &str) -> Option<(String, String)> {
        self.by_subscription
            .get(&(topic.to_owned(), subscription.to_owned()))
            .cloned()
    }

    /// The subscription (topic, name) whose tier `name` is, if any.
    pub fn owner_of(&self, name: &str) -> Option<(String, String)> {
        self.by_tier
            .get(name)
            .map(|o| (o.topic.clone(), o.subscription.clone()))
    }

    /// What a topic of this name must be created as: the tier kind when a
    /// subscription claims the name, else `Normal`.
    pub fn kind_of(&self, name: &str) -> TopicKind {
        self.by_tier.get(name).map_or(TopicKind::Normal, |o| o.kind)
    }

    /// An existing subscription asked for with `wanted`: the request must
    /// name the tiers it has, or none.
    pub fn check_existing(
        &self,
        topic: &TopicName,
        sub: &SubscriptionName,
        wanted: &TierOverrides,
    ) -> Result<()> {
        let Some((retry, dead_letter)) = self
            .by_subscription
            .get(&(topic.to_string(), sub.to_string()))
        else {
            return Ok(());
        };
        for (what, asked, has) in [
            ("retry", &wanted.retry, retry),
            ("dead-letter", &wanted.dead_letter, dead_letter),
        ] {
            if let Some(asked) = asked
                && asked.as_str() != has
            {
                return Err(BrokerError::Conflict(format!(
                    "subscription {sub} on {topic} already has the {what} tier {has}, not {asked}: tiers are chosen when a subscription is created"
                )));
            }
        }
        Ok(())
    }

    /// Checks the tier names a new subscription `sub` on `topic` would get
    /// with `wanted`: the two differ, neither is the subscription's own
    /// topic, neither belongs to another subscription, and a name the
    /// client chose does not exist as a topic of another kind (`existing`
    /// says what kind a topic of that name has, if it exists; a default
    /// name taken by an ordinary topic is refused only when a message first
    /// moves there, as before overrides existed).
    pub fn check_new(
        &self,
        topic: &TopicName,
        sub: &SubscriptionName,
        wanted: &TierOverrides,
        existing: impl Fn(&TopicName) -> Option<TopicKind>,
    ) -> Result<()> {
        let retry = wanted
            .retry
            .clone()
            .unwrap_or_else(|| topic.retry_tier(sub));
        let dead_letter = wanted
            .dead_letter
            .clone()
            .unwrap_or_else(|| topic.dead_letter_tier(sub));
        if retry == dead_letter {
            return Err(BrokerError::InvalidArgument(format!(
                "the retry and dead-letter tiers must be different topics (both {retry})"
            )));
        }
        for (what, name, kind, asked) in [
            ("retry", &retry, TopicKind::Retry, wanted.retry.is_some()),
            (
                "dead-letter",
                &dead_letter,
                TopicKind::DeadLetter,
                wanted.dead_letter.is_some(),
            ),
        ] {
            if name == topic {
                return Err(BrokerError::InvalidArgument(format!(
                    "the {what} tier cannot be the subscription's own topic {topic}"
                )));
            }
            if let Some(o) = self.by_tier.get(name.as_str()) {
                return Err(BrokerError::Conflict(format!(
                    "{name} is already a tier of subscription {} on {}; choose another {what} topic",
                    o.subscription, o.topic
                )));
            }
            match existing(name) {
                Some(k) if asked && k != kind => {
                    return Err(BrokerError::Conflict(format!(
                        "{name} exists as a {k:?} topic and cannot serve as a {kind:?} tier; choose another {what} topic"
                    )));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::SubscriptionType;

    fn t(s: &str) -> TopicName {
        TopicName::parse(s).unwrap()
    }

    fn s(n: &str) -> SubscriptionName {
        SubscriptionName::parse(n).unwrap()
    }

    fn rec(topic: &str, sub: &str, dlq: Option<&str>) -> SubscriptionRecord {
        let mut r = SubscriptionRecord::new(1, t(topic).as_str(), sub, SubscriptionType::Shared, 0);
        r.dead_letter_topic = dlq.map(|d| t(d).to_string());
        r
    }

    fn wants(retry: Option<&str>, dlq: Option<&str>) -> TierOverrides {
        TierOverrides {
            retry: retry.map(t),
            dead_letter: dlq.map(t),
        }
    }

    #[test]
    fn overrides_must_be_free_distinct_and_of_their_kind() {
        let mut owners = TierOwners::default();
        owners
            .claim(&rec("orders", "a", Some("shared-dlq")))
            .unwrap();
        let none = |_: &TopicName| None;
        let (orders, b) = (t("orders"), s("b"));
        assert!(
            owners
                .check_new(&orders, &b, &wants(None, Some("mine")), none)
                .is_ok()
        );
        let e = owners
            .check_new(&orders, &b, &wants(None, Some("shared-dlq")), none)
            .unwrap_err();
        assert!(matches!(e, BrokerError::Conflict(_)), "{e}");
        let e = owners
            .check_new(&orders, &b, &wants(None, Some("orders-a-RETRY")), none)
            .unwrap_err();
        assert!(e.to_string().contains("subscription a"), "{e}");
        let e = owners
            .check_new(&orders, &b, &wants(Some("x"), Some("x")), none)
            .unwrap_err();
        assert!(matches!(e, BrokerError::InvalidArgument(_)), "{e}");
        let e = owners
            .check_new(&orders, &b, &wants(Some("orders"), None), none)
            .unwrap_err();
        assert!(matches!(e, BrokerError::InvalidArgument(_)), "{e}");
        let normal = |_: &TopicName| Some(TopicKind::Normal);
        let e = owners
            .check_new(&orders, &b, &wants(Some("busy"), None), normal)
            .unwrap_err();
        assert!(e.to_string().contains("Normal"), "{e}");
        // A default name another subscription chose as its tier.
        owners
            .claim(&rec("other", "x", Some("orders-c-RETRY")))
            .unwrap();
        let e = owners
            .check_new(&orders, &s("c"), &TierOverrides::default(), none)
            .unwrap_err();
        assert!(e.to_string().contains("subscription x"), "{e}");
        assert!(
            owners
                .check_new(&orders, &b, &TierOverrides::default(), normal)
                .is_ok()
        );
        let leftover = |_: &TopicName| Some(TopicKind::Retry);
        assert!(
            owners
                .check_new(&orders, &b, &wants(Some("old-retry"), None), leftover)
                .is_ok()
        );
    }

    #[test]
    fn claimed_names_become_tiers_until_released() {
        let mut owners = TierOwners::default();
        owners
            .claim(&rec("orders", "a", Some("shared-dlq")))
            .unwrap();
        assert_eq!(
            owners.kind_of(t("shared-dlq").as_str()),
            TopicKind::DeadLetter
        );
        assert_eq!(
            owners.kind_of(t("orders-a-RETRY").as_str()),
            TopicKind::Retry
        );
        assert_eq!(
            owners.kind_of(t("orders-a-DLQ").as_str()),
            TopicKind::Normal
        );
        let (orders, a) = (t("orders"), s("a"));
        assert!(
            owners
                .check_existing(&orders, &a, &TierOverrides::default())
                .is_ok()
        );
        assert!(
            owners
                .check_existing(&orders, &a, &wants(None, Some("shared-dlq")))
                .is_ok()
        );
        let e = owners
            .check_existing(&orders, &a, &wants(None, Some("other")))
            .unwrap_err();
        assert!(matches!(e, BrokerError::Conflict(_)), "{e}");
        owners.release(orders.as_str(), "a");
        assert_eq!(owners.kind_of(t("shared-dlq").as_str()), TopicKind::Normal);
    }
}
