//! Broker configuration: every setting, its default, and the TOML file format.
//!
//! ```toml
//! data_dir = "./data"
//! listen = "127.0.0.1:6650"
//! durability = "sync"            # or "interval"
//! flush_interval = "50ms"        # interval mode only
//! auto_create_topics = true
//! max_message_size = 5242880
//! max_unacked_per_consumer = 50000
//! segment_entries = 16384
//! retry_window = "60s"
//! replay_rate_per_second = 1000
//! accept_data_loss = false       # start on a store that lacks what its manifest records
//! verify_on_start = true         # read every stored value at start (refuse damage early)
//!
//! [[policies]]                   # default dead-letter policies by topic pattern
//! topic = "persistent://public/default/orders*"
//! policy = { type = "delay_levels" }
//! ```

use crate::error::BrokerError;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// When a publish receipt may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// A receipt is sent only after the write is flushed to disk. Concurrent
    /// writers share one flush (group commit).
    #[default]
    Sync,
    /// Writes are flushed every `flush_interval`; a crash may lose the last
    /// interval of acknowledged writes.
    Interval,
}

/// A default dead-letter policy for topics matching a pattern.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyRule {
    /// A full topic name, optionally ending in `*` to match a prefix.
    pub topic: String,
    /// The policy.
    pub policy: ricochet_policy::PolicySpec,
}

impl PolicyRule {
    /// Whether this rule applies to `topic`.
    pub fn matches(&self, topic: &str) -> bool {
        match self.topic.strip_suffix('*') {
            Some(prefix) => topic.starts_with(prefix),
            None => topic == self.topic,
        }
    }
}

/// Every broker setting. Unset fields in a file take these defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Where sled keeps its files.
    pub data_dir: PathBuf,
    /// gRPC listen address.
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listen address; `None` disables it.
    pub metrics_listen: Option<SocketAddr>,
    /// Receipt durability.
    pub durability: Durability,
    /// Background flush period (interval mode; also bounds ack loss in sync mode).
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Create topics on first use.
    pub auto_create_topics: bool,
    /// Largest accepted payload in bytes.
    pub max_message_size: usize,
    /// Dispatch to a consumer pauses while it holds this many unacked messages.
    pub max_unacked_per_consumer: usize,
    /// Entries per storage segment; a segment is dropped once every
    /// subscription has acknowledged all of it.
    pub segment_entries: u64,
    /// How far ahead the retry scheduler loads due times into memory.
    #[serde(with = "humantime_serde")]
    pub retry_window: Duration,
    /// Default dead-letter replay rate (messages per second).
    pub replay_rate_per_second: u32,
    /// sled page cache size in bytes.
    pub cache_capacity: u64,
    /// Default dead-letter policies by topic pattern (first match wins).
    pub policies: Vec<PolicyRule>,
    /// Start even when the store lacks what its manifest records (each
    /// loss is logged, and what is left becomes the record). Off by default:
    /// a damaged store is refused.
    pub accept_data_loss: bool,
    /// Read and check every stored value at start, so damage is refused
    /// before serving rather than found by a read later (costs one pass over
    /// the store; the backlog, since consumed segments are dropped).
    pub verify_on_start: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 6650)),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            durability: Durability::Sync,
            flush_interval: Duration::from_millis(50),
            auto_create_topics: true,
            max_message_size: 5 * 1024 * 1024,
            max_unacked_per_consumer: 50_000,
            segment_entries: 16_384,
            retry_window: Duration::from_secs(60),
            replay_rate_per_second: 1_000,
            cache_capacity: 256 * 1024 * 1024,
            policies: Vec::new(),
            accept_data_loss: false,
            verify_on_start: true,
        }
    }
}

impl BrokerConfig {
    /// A config for tests: the given data dir, port 0, no metrics listener.
    pub fn for_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: dir.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            ..Self::default()
        }
    }

    /// Reads a TOML file; missing fields keep their defaults.
    pub fn from_file(path: &Path) -> Result<Self, BrokerError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BrokerError::Config(format!("cannot read {}: {e}", path.display())))?;
        let config: Self = toml::from_str(&text)
            .map_err(|e| BrokerError::Config(format!("{}: {e}", path.display())))?;
        config.validate()?;
        Ok(config)
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<(), BrokerError> {
        let bad = |m: &str| Err(BrokerError::Config(m.to_owned()));
        if self.max_message_size == 0 {
            return bad("max_message_size must be positive");
        }
        if self.segment_entries == 0 {
            return bad("segment_entries must be positive");
        }
        if self.max_unacked_per_consumer == 0 {
            return bad("max_unacked_per_consumer must be positive");
        }
        if self.flush_interval.is_zero() {
            return bad("flush_interval must be positive");
        }
        for rule in &self.policies {
            rule.policy
                .validate()
                .map_err(|e| BrokerError::Config(format!("policy for {}: {e}", rule.topic)))?;
        }
        Ok(())
    }

    /// The configured default policy for `topic`, if a rule matches.
    pub fn policy_for(&self, topic: &str) -> Option<&ricochet_policy::PolicySpec> {
        self.policies
            .iter()
            .find(|r| r.matches(topic))
            .map(|r| &r.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults_and_unknown_keys_fail() {
        let c: BrokerConfig = toml::from_str("").unwrap();
        assert_eq!(c.durability, Durability::Sync);
        assert_eq!(c.max_message_size, 5 * 1024 * 1024);
        let c: BrokerConfig =
            toml::from_str("durability = \"interval\"\nflush_interval = \"10ms\"").unwrap();
        assert_eq!(c.durability, Durability::Interval);
        assert_eq!(c.flush_interval, Duration::from_millis(10));
        assert!(toml::from_str::<BrokerConfig>("no_such_key = 1").is_err());
    }

    #[test]
    fn policy_rules_match_prefixes() {
        let rule = PolicyRule {
            topic: "persistent://public/default/ord*".into(),
            policy: ricochet_policy::PolicySpec::default(),
        };
        assert!(rule.matches("persistent://public/default/orders"));
        assert!(!rule.matches("persistent://public/default/payments"));
    }
}
