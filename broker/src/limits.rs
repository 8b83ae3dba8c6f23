//! Limits on what clients can create or hold open, so that no client can
//! grow the broker without bound: ordinary topics (broker-wide and per
//! namespace), subscriptions per topic, connections and calls open per
//! connection (the last two enforced in `connections`). A request
//! over a limit is refused with RESOURCE_EXHAUSTED naming the setting, and
//! counted in `ricochet_limit_rejections_total{limit=...}`. Every limit is a
//! config setting where 0 means unlimited; tier topics are not counted
//! (there are at most two per subscription, and refusing one would strand a
//! message that has to move).

use crate::error::BrokerError;
use crate::name::TopicName;
use std::collections::HashMap;

/// One of the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_topics`.
    Topics,
    /// `max_topics_per_namespace`.
    TopicsPerNamespace,
    /// `max_subscriptions_per_topic`.
    SubscriptionsPerTopic,
    /// `max_connections`.
    Connections,
    /// `max_streams_per_connection`.
    StreamsPerConnection,
}

impl Limit {
    /// The `limit` label of the rejection counter.
    pub fn label(self) -> &'static str {
        match self {
            Limit::Topics => "topics",
            Limit::TopicsPerNamespace => "topics_per_namespace",
            Limit::SubscriptionsPerTopic => "subscriptions_per_topic",
            Limit::Connections => "connections",
            Limit::StreamsPerConnection => "streams_per_connection",
        }
    }

    /// The config setting.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::Topics => "max_topics",
            Limit::TopicsPerNamespace => "max_topics_per_namespace",
            Limit::SubscriptionsPerTopic => "max_subscriptions_per_topic",
            Limit::Connections => "max_connections",
            Limit::StreamsPerConnection => "max_streams_per_connection",
        }
    }

    /// Whether `current` more would pass a limit of `max` (0: unlimited).
    pub fn reached(current: usize, max: usize) -> bool {
        max != 0 && current >= max
    }

    /// The refusal for this limit (`what` says what is full), counted.
    pub fn refuse(self, what: String, max: usize) -> BrokerError {
        crate::metrics::limit_rejected(self.label());
        BrokerError::LimitReached(format!(
            "{what}: the limit is {max} ({} in the broker's config)",
            self.setting()
        ))
    }
}

/// Ordinary topics, broker-wide and per namespace.
#[derive(Debug, Default)]
pub struct TopicCounts {
    total: usize,
    per_namespace: HashMap<String, usize>,
}

impl TopicCounts {
    /// Counts a topic that exists (loaded or created).
    pub fn add(&mut self, name: &TopicName) {
        self.total += 1;
        *self
            .per_namespace
            .entry(name.namespace().to_owned())
            .or_default() += 1;
    }

    /// Forgets a deleted topic.
    pub fn remove(&mut self, name: &TopicName) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_namespace.get_mut(name.namespace()) {
            *n -= 1;
            if *n == 0 {
                self.per_namespace.remove(name.namespace());
            }
        }
    }

    /// Refuses one more topic `name` over `max_topics` or
    /// `max_topics_per_namespace`.
    pub fn check(
        &self,
        name: &TopicName,
        max_total: usize,
        max_per_ns: usize,
    ) -> Result<(), BrokerError> {
        if Limit::reached(self.total, max_total) {
            return Err(Limit::Topics.refuse(
                format!("cannot create {name}: the broker has {} topics", self.total),
                max_total,
            ));
        }
        let ns = name.namespace();
        let in_ns = self.per_namespace.get(ns).copied().unwrap_or(0);
        if Limit::reached(in_ns, max_per_ns) {
            return Err(Limit::TopicsPerNamespace.refuse(
                format!("cannot create {name}: namespace {ns} has {in_ns} topics"),
                max_per_ns,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_namespaces_are_limited_and_zero_is_unlimited() {
        let t = |s: &str| TopicName::parse(s).unwrap();
        let mut c = TopicCounts::default();
        c.add(&t("a/x/1"));
        c.add(&t("a/x/2"));
        c.add(&t("b/y/1"));
        assert!(c.check(&t("a/x/3"), 0, 0).is_ok());
        assert!(c.check(&t("b/y/2"), 4, 2).is_ok());
        let e = c.check(&t("a/x/3"), 4, 2).unwrap_err().to_string();
        assert!(
            e.contains("namespace a/x has 2") && e.contains("max_topics_per_namespace"),
            "{e}"
        );
        let e = c.check(&t("c/z/1"), 3, 0).unwrap_err().to_string();
        assert!(
            e.contains("has 3 topics") && e.contains("(max_topics in"),
            "{e}"
        );
        c.remove(&t("a/x/2"));
        assert!(c.check(&t("a/x/3"), 3, 2).is_ok());
    }
}
