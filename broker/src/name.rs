//! Topic and subscription names: parsing, validation and the names of a
//! subscription's retry and dead-letter tiers.
//!
//! A topic is `persistent://tenant/namespace/topic`; a bare `orders` means
//! `persistent://public/default/orders` and `tenant/ns/orders` means
//! `persistent://tenant/ns/orders`, as in Pulsar.
//!
//! Every part (tenant, namespace, topic, subscription) is 1 to 200 characters
//! of `[A-Za-z0-9-_.=:]` and does not start with a dot, so nothing a client
//! names looks like a path (`.`, `..`, `.hidden`) or an escape (`%2F`).
//! Names an earlier version stored under looser rules (`%` was allowed, a
//! leading dot was not refused) still load: [`TopicName::parse_stored`].

use crate::error::BrokerError;
use crate::util::echo;
use std::fmt;

const SCHEME: &str = "persistent://";
const MAX_PART_LEN: usize = 200;
const RULE: &str = "1-200 characters of [A-Za-z0-9-_.=:], not starting with '.'";

/// A validated, fully qualified topic name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(String);

/// Which rules a name is held to: today's for anything a client names, the
/// looser ones of earlier versions for names read back from storage.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rules {
    Strict,
    Stored,
}

fn valid_part(part: &str, rules: Rules) -> bool {
    let char_ok = |c: char| {
        c.is_ascii_alphanumeric()
            || matches!(c, '-' | '_' | '.' | '=' | ':')
            || (rules == Rules::Stored && c == '%')
    };
    !part.is_empty()
        && part.len() <= MAX_PART_LEN
        && part.chars().all(char_ok)
        && (rules == Rules::Stored || !part.starts_with('.'))
}

impl TopicName {
    /// Parses and normalises a topic name a client sent.
    pub fn parse(input: &str) -> Result<Self, BrokerError> {
        Self::parse_with(input, Rules::Strict)
    }

    /// Parses a topic name read back from storage: an earlier version may
    /// have stored one that today's rules refuse, and it must still load.
    pub fn parse_stored(input: &str) -> Result<Self, BrokerError> {
        Self::parse_with(input, Rules::Stored)
    }

    fn parse_with(input: &str, rules: Rules) -> Result<Self, BrokerError> {
        let bad = |why: &str| {
            BrokerError::InvalidName(format!("invalid topic name {}: {why}", echo(input)))
        };
        let rest = if let Some(rest) = input.strip_prefix(SCHEME) {
            rest
        } else if input.contains("://") {
            return Err(bad("only persistent:// topics are supported"));
        } else {
            input
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (tenant, ns, topic) = match parts.as_slice() {
            [topic] if !input.starts_with(SCHEME) => ("public", "default", *topic),
            [tenant, ns, topic] => (*tenant, *ns, *topic),
            _ => {
                return Err(bad(
                    "expected persistent://tenant/namespace/topic or a bare topic",
                ));
            }
        };
        for (what, part) in [("tenant", tenant), ("namespace", ns), ("topic", topic)] {
            if !valid_part(part, rules) {
                return Err(bad(&format!("{what} must be {RULE}")));
            }
        }
        Ok(Self(format!("{SCHEME}{tenant}/{ns}/{topic}")))
    }

    /// The full name, `persistent://tenant/namespace/topic`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `tenant/namespace`.
    pub fn namespace(&self) -> &str {
        let rest = &self.0[SCHEME.len()..];
        let end = rest.rfind('/').unwrap_or(rest.len());
        &rest[..end]
    }

    /// The default retry tier of `subscription` on this topic: `<topic>-<sub>-RETRY`.
    pub fn retry_tier(&self, subscription: &SubscriptionName) -> TopicName {
        TopicName(crate::storage::default_retry_tier(&self.0, &subscription.0))
    }

    /// The default dead-letter tier of `subscription`: `<topic>-<sub>-DLQ`.
    pub fn dead_letter_tier(&self, subscription: &SubscriptionName) -> TopicName {
        TopicName(crate::storage::default_dead_letter_tier(
            &self.0,
            &subscription.0,
        ))
    }
}

/// The topic name (last part) of a namespace's failure events.
pub const EVENTS_TOPIC: &str = "__failure_events";

/// Whether `topic` (a full name) is a system topic the broker writes
/// itself: a namespace's `__failure_events`.
pub fn is_system_topic(topic: &str) -> bool {
    topic.rsplit('/').next() == Some(EVENTS_TOPIC)
}

/// Checks a `tenant/namespace` a client sent (to filter topics by).
pub fn parse_namespace(input: &str) -> Result<&str, BrokerError> {
    let ok = match input.split('/').collect::<Vec<_>>().as_slice() {
        [tenant, ns] => valid_part(tenant, Rules::Strict) && valid_part(ns, Rules::Strict),
        _ => false,
    };
    if ok {
        Ok(input)
    } else {
        Err(BrokerError::InvalidName(format!(
            "invalid namespace {}: expected tenant/namespace, each {RULE}",
            echo(input)
        )))
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A validated subscription name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionName(String);

impl SubscriptionName {
    /// Validates a subscription name a client sent (the rules of topic parts).
    pub fn parse(input: &str) -> Result<Self, BrokerError> {
        Self::parse_with(input, Rules::Strict)
    }

    /// Validates a subscription name read back from storage (see
    /// [`TopicName::parse_stored`]).
    pub fn parse_stored(input: &str) -> Result<Self, BrokerError> {
        Self::parse_with(input, Rules::Stored)
    }

    fn parse_with(input: &str, rules: Rules) -> Result<Self, BrokerError> {
        if valid_part(input, rules) {
            Ok(Self(input.to_owned()))
        } else {
            Err(BrokerError::InvalidName(format!(
                "invalid subscription name {}: must be {RULE}",
                echo(input)
            )))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SubscriptionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SubscriptionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The most partitions a topic may have.
pub const MAX_PARTITIONS: u32 = 1024;

/// Partition `index` of `base`.
pub fn partition(base: &TopicName, index: u32) -> TopicName {
    TopicName::parse_stored(&ricochet_proto::partitions::partition_name(
        base.as_str(),
        index,
    ))
    // A valid name plus `-partition-<digits>` is valid unless it grows
    // past the length limit, which `check_partition_count` refuses first.
    .unwrap_or_else(|_| base.clone())
}

/// Whether `name` may be a partitioned topic of `partitions` partitions:
/// a count in 1 ..= [`MAX_PARTITIONS`], a name not itself a partition's, and
/// short enough to name its last partition.
pub fn check_partition_count(name: &TopicName, partitions: u32) -> Result<(), BrokerError> {
    if partitions == 0 || partitions > MAX_PARTITIONS {
        return Err(BrokerError::InvalidArgument(format!(
            "partition count must be 1 to {MAX_PARTITIONS}, got {partitions}"
        )));
    }
    if ricochet_proto::partitions::parse_partition(name.as_str()).is_some() {
        return Err(BrokerError::InvalidArgument(format!(
            "{name} is named as a partition; a partitioned topic's name must not end in -partition-<n>"
        )));
    }
    let last = ricochet_proto::partitions::partition_name(name.as_str(), partitions - 1);
    TopicName::parse(&last).map_err(|_| {
        BrokerError::InvalidArgument(format!(
            "{name} is too long to name its partitions ({last})"
        ))
    })?;
    Ok(())
}

/// What a policy (retention, tiered storage) or a grant check is about: a
/// namespace or one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every topic of a `tenant/namespace` without a policy of its own.
    Namespace(String),
    /// One topic.
    Topic(TopicName),
}

impl Target {
    /// Parses a namespace (`tenant/namespace`) or a topic name (anything
    /// with a scheme, or three parts).
    pub fn parse(namespace: &str, topic: &str) -> Result<Self, BrokerError> {
        match (namespace.is_empty(), topic.is_empty()) {
            (false, true) => Ok(Self::Namespace(parse_namespace(namespace)?.to_owned())),
            (true, false) => Ok(Self::Topic(TopicName::parse(topic)?)),
            _ => Err(BrokerError::InvalidArgument(
                "name exactly one of namespace or topic".into(),
            )),
        }
    }

    /// The stored key: `tenant/namespace` or the full topic name.
    pub fn key(&self) -> &str {
        match self {
            Self::Namespace(ns) => ns,
            Self::Topic(t) => t.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_and_full_names_normalise() {
        assert_eq!(
            TopicName::parse("orders").unwrap().as_str(),
            "persistent://public/default/orders"
        );
        assert_eq!(
            TopicName::parse("acme/eu/orders").unwrap().as_str(),
            "persistent://acme/eu/orders"
        );
        let t = TopicName::parse("persistent://acme/eu/orders").unwrap();
        assert_eq!(t.namespace(), "acme/eu");
        let s = SubscriptionName::parse("billing").unwrap();
        assert_eq!(
            t.retry_tier(&s).as_str(),
            "persistent://acme/eu/orders-billing-RETRY"
        );
        assert_eq!(
            t.dead_letter_tier(&s).as_str(),
            "persistent://acme/eu/orders-billing-DLQ"
        );
    }

    #[test]
    fn rejects_malformed_names() {
        for bad in [
            "",
            "a/b",
            "persistent://a/b",
            "non-persistent://a/b/c",
            "a b",
            "persistent:///b/c",
            "x/y/z/w",
            "ü",
            "..",
            ".",
            "../../etc",
            "persistent://../default/t",
            "a/./t",
            ".hidden",
            "a%2Fb",
            "tab\there",
            "nul\0",
        ] {
            assert!(TopicName::parse(bad).is_err(), "{bad:?} accepted");
        }
        for bad in ["", "has space", "..", ".", ".x", "50%", "a\nb"] {
            assert!(SubscriptionName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SubscriptionName::parse(&"x".repeat(201)).is_err());
        // Dots inside a name are fine.
        assert!(TopicName::parse("a.b/c.d/e..f").is_ok());
        assert!(SubscriptionName::parse("s.1").is_ok());
        assert_eq!(parse_namespace("acme/eu").unwrap(), "acme/eu");
        for bad in ["acme", "a/b/c", "../eu", "a/", "/b"] {
            assert!(parse_namespace(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn stored_names_load_under_the_old_rules() {
        assert!(TopicName::parse_stored("persistent://../default/a%2F").is_ok());
        assert!(SubscriptionName::parse_stored("..").is_ok());
        assert!(TopicName::parse_stored("a b").is_err());
    }

    #[test]
    fn errors_echo_a_short_prefix_of_huge_input() {
        let huge = "x".repeat(1 << 20);
        let e = TopicName::parse(&huge).unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
        assert!(e.contains("(1048576 bytes)"), "{e}");
        let e = SubscriptionName::parse(&huge).unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes", e.len());
    }
}
