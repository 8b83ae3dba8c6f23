//! The vocabulary shared by broker, client and CLI on top of the generated
//! enums: [`SubscriptionType`] and [`InitialPosition`] with their
//! command-line names, the largest gRPC message either side accepts, and
//! how a message's size is counted against the broker's limit.

use std::fmt;
use std::str::FromStr;

use crate::v1::{InitialPosition, SubscriptionType};

/// Largest gRPC message the broker and the client accept or send: a batch of
/// messages at the size limit, with room to spare.
pub const MAX_GRPC_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The size of a message as the broker's `max_message_size` counts it:
/// payload, key, and every property name and value, in bytes. Producers
/// check it before sending; the broker refuses a batch holding a larger one.
pub fn counted_size<'a>(
    payload: &[u8],
    key: &str,
    properties: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> usize {
    properties
        .into_iter()
        .fold(payload.len() + key.len(), |n, (k, v)| n + k.len() + v.len())
}

impl crate::v1::OutboundMessage {
    /// [`counted_size`] of this message.
    pub fn counted_size(&self) -> usize {
        counted_size(&self.payload, &self.key, &self.properties)
    }
}

impl SubscriptionType {
    /// Every type, in protocol order.
    pub const ALL: [SubscriptionType; 4] = [
        SubscriptionType::Exclusive,
        SubscriptionType::Failover,
        SubscriptionType::Shared,
        SubscriptionType::KeyShared,
    ];

    /// Whether cumulative acks are allowed (Exclusive and Failover: one
    /// consumer at a time reads the stream in order).
    pub fn allows_cumulative_ack(self) -> bool {
        matches!(
            self,
            SubscriptionType::Exclusive | SubscriptionType::Failover
        )
    }

    /// The name used on the command line and in logs: `exclusive`,
    /// `failover`, `shared`, `key_shared`.
    pub fn name(self) -> &'static str {
        match self {
            SubscriptionType::Exclusive => "exclusive",
            SubscriptionType::Failover => "failover",
            SubscriptionType::Shared => "shared",
            SubscriptionType::KeyShared => "key_shared",
        }
    }
}

impl fmt::Display for SubscriptionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a subscription type or initial position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; expected one of: {expected}")]
pub struct UnknownName {
    what: &'static str,
    given: String,
    expected: &'static str,
}

fn normalise(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace('-', "_")
}

impl FromStr for SubscriptionType {
    type Err = UnknownName;

    /// Accepts the names above case-insensitively, with `-` for `_`
    /// (`key-shared`), and Pulsar's `Key_Shared`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let n = normalise(s);
        SubscriptionType::ALL
            .into_iter()
            .find(|t| t.name() == n)
            .ok_or(UnknownName {
                what: "subscription type",
                given: s.to_owned(),
                expected: "exclusive, failover, shared, key_shared",
            })
    }
}

impl InitialPosition {
    /// `latest` or `earliest`.
    pub fn name(self) -> &'static str {
        match self {
            InitialPosition::Latest => "latest",
            InitialPosition::Earliest => "earliest",
        }
    }
}

impl fmt::Display for InitialPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for InitialPosition {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match normalise(s).as_str() {
            "latest" => Ok(InitialPosition::Latest),
            "earliest" => Ok(InitialPosition::Earliest),
            _ => Err(UnknownName {
                what: "initial position",
                given: s.to_owned(),
                expected: "latest, earliest",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_accept_pulsar_spellings() {
        for t in SubscriptionType::ALL {
            assert_eq!(t.to_string().parse::<SubscriptionType>(), Ok(t));
        }
        assert_eq!("Key_Shared".parse(), Ok(SubscriptionType::KeyShared));
        assert_eq!("key-shared".parse(), Ok(SubscriptionType::KeyShared));
        assert_eq!("EARLIEST".parse(), Ok(InitialPosition::Earliest));
        let e = "round_robin".parse::<SubscriptionType>().unwrap_err();
        assert!(e.to_string().contains("key_shared"), "{e}");
        assert!(SubscriptionType::Failover.allows_cumulative_ack());
        assert!(!SubscriptionType::KeyShared.allows_cumulative_ack());
    }
}
