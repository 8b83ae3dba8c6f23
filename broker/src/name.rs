//! Topic and subscription names: parsing, validation and the names of a
//! subscription's retry and dead-letter tiers.
//!
//! A topic is `persistent://tenant/namespace/topic`; a bare `orders` means
//! `persistent://public/default/orders` and `tenant/ns/orders` means
//! `persistent://tenant/ns/orders`, as in Pulsar.

use crate::error::BrokerError;
use std::fmt;

const SCHEME: &str = "persistent://";
const MAX_PART_LEN: usize = 200;

/// A validated, fully qualified topic name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(String);

fn valid_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= MAX_PART_LEN
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '=' | ':' | '%'))
}

impl TopicName {
    /// Parses and normalises a topic name.
    pub fn parse(input: &str) -> Result<Self, BrokerError> {
        let bad =
            |why: &str| BrokerError::InvalidName(format!("invalid topic name {input:?}: {why}"));
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
            if !valid_part(part) {
                return Err(bad(&format!(
                    "{what} must be 1-{MAX_PART_LEN} characters of [A-Za-z0-9-_.=:%]"
                )));
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
        TopicName(format!("{}-{}-RETRY", self.0, subscription.0))
    }

    /// The default dead-letter tier of `subscription`: `<topic>-<sub>-DLQ`.
    pub fn dead_letter_tier(&self, subscription: &SubscriptionName) -> TopicName {
        TopicName(format!("{}-{}-DLQ", self.0, subscription.0))
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
    /// Validates a subscription name (same character set as topic parts).
    pub fn parse(input: &str) -> Result<Self, BrokerError> {
        if valid_part(input) {
            Ok(Self(input.to_owned()))
        } else {
            Err(BrokerError::InvalidName(format!(
                "invalid subscription name {input:?}: must be 1-{MAX_PART_LEN} characters of [A-Za-z0-9-_.=:%]"
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
        ] {
            assert!(TopicName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(SubscriptionName::parse("").is_err());
        assert!(SubscriptionName::parse("has space").is_err());
        assert!(SubscriptionName::parse(&"x".repeat(201)).is_err());
    }
}
