//! Key order: the subscription option that keeps each key's messages in
//! publish order through failures. While a message of key K waits for its
//! redelivery (a nack, a retry), later messages of K are held back; K
//! resumes once the failed message is acked or dead-lettered. With
//! `poison_after`, a key blocked longer than that is a *poison key*: its
//! failed message and everything held behind it go to the dead-letter tier.
//! This is the value (serde, validation); the broker carries it out.

use crate::PolicyError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The shortest `poison_after` accepted.
pub const MIN_POISON_AFTER: Duration = Duration::from_secs(1);

/// Per-key ordered retries for a Key_Shared, Failover or Exclusive
/// subscription (refused for Shared, which has no order to keep).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyOrder {
    /// Dead-letter a key's held messages once it has been blocked this
    /// long (the failed message first); `None`: hold as long as it takes.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub poison_after: Option<Duration>,
}

impl KeyOrder {
    /// Key order with no poison limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Key order whose keys turn poison after `limit`.
    pub fn with_poison_after(limit: Duration) -> Self {
        Self {
            poison_after: Some(limit),
        }
    }

    /// Checks the limit: at least [`MIN_POISON_AFTER`], at most
    /// [`MAX_POLICY_DELAY`](crate::MAX_POLICY_DELAY).
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self.poison_after {
            Some(d) if d < MIN_POISON_AFTER => Err(PolicyError::InvalidKeyOrder(format!(
                "poison_after must be at least {} ms, got {} ms",
                MIN_POISON_AFTER.as_millis(),
                d.as_millis()
            ))),
            Some(d) if d > crate::MAX_POLICY_DELAY => Err(PolicyError::DelayTooLong {
                what: "poison_after",
                delay: d,
                max: crate::MAX_POLICY_DELAY,
            }),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for KeyOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.poison_after {
            Some(d) => write!(
                f,
                "key order, poison after {}",
                humantime::format_duration(d)
            ),
            None => f.write_str("key order"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        assert!(KeyOrder::new().validate().is_ok());
        assert!(
            KeyOrder::with_poison_after(Duration::from_secs(60))
                .validate()
                .is_ok()
        );
        let e = KeyOrder::with_poison_after(Duration::from_millis(10))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("at least 1000 ms"), "{e}");
        assert!(
            KeyOrder::with_poison_after(crate::MAX_POLICY_DELAY * 2)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn serde_and_display() {
        let k = KeyOrder::with_poison_after(Duration::from_secs(600));
        let j = serde_json::to_string(&k).unwrap();
        assert_eq!(j, r#"{"poison_after":"10m"}"#);
        assert_eq!(serde_json::from_str::<KeyOrder>(&j).unwrap(), k);
        assert_eq!(
            serde_json::from_str::<KeyOrder>("{}").unwrap(),
            KeyOrder::new()
        );
        assert_eq!(k.to_string(), "key order, poison after 10m");
    }
}
