//! The `[cluster]` section of the broker's configuration: its settings
//! and their checks (the broker's configuration embeds it).

use crate::error::{ClusterError, Result};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The `[cluster]` settings. Absent: the broker runs standalone.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// The cluster's name (keys live under `/ricochet/<name>/`).
    pub name: String,
    /// etcd client URLs (`http://host:2379`).
    pub etcd: Vec<String>,
    /// This broker's id; default: the store id of its data directory, so
    /// it is stable across restarts (placement is sticky to the data).
    pub broker_id: Option<String>,
    /// The etcd lease TTL (whole seconds, at least 2 s). A broker that
    /// cannot renew its lease stops acknowledging after four fifths of it.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// With `[auth]` on: a file holding the token (a role that may produce
    /// to `__failure_events` topics) this broker sends failure events with
    /// to the broker owning a namespace's events topic. Without it those
    /// events are refused there (a WARN line here).
    pub events_token_file: Option<std::path::PathBuf>,
    /// With `[auth]` on: a file holding the token this broker's Raft calls
    /// to the other brokers carry (a role listed in `auth.superusers`;
    /// the `Replication` service admits no other). Needed for replicated
    /// topics with auth on; read at start and at each new connection.
    /// The role it proves is registered with this broker: the other
    /// brokers let only that role speak Raft for this broker id, so a
    /// token of its own per broker keeps each broker to its own calls.
    pub peer_token_file: Option<std::path::PathBuf>,
    /// With `[tls]`: the CA certificates (PEM) the other brokers'
    /// certificates are verified against when this broker calls them
    /// (Raft); default: `tls.client_ca_file`.
    pub peer_ca_file: Option<std::path::PathBuf>,
    /// The replication factor of a topic created without one in a
    /// namespace that has no default of its own (`namespaces
    /// set-replication`): 1 to 7, default 1.
    pub default_replicas: u32,
    /// A replication group's member whose broker has not been live for
    /// this long is replaced by a live broker outside the group (`"0s"`:
    /// never). Default 5 minutes.
    #[serde(with = "humantime_serde")]
    pub replace_after: Duration,
    /// A replication group's member builds a snapshot of its partition
    /// once this many Raft entries were applied since its last one, and
    /// purges its log up to it (0: never; the log is kept whole). Default
    /// 10 000.
    pub snapshot_every: u64,
    /// How long creating a partitioned topic with a replication factor
    /// above 1 (or raising its count) waits for its partitions' groups to
    /// form; those not formed by then are named in an UNAVAILABLE answer
    /// and form on first use. At least 1 s; default 30 s.
    #[serde(with = "humantime_serde")]
    pub partition_form_timeout: Duration,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            etcd: vec!["http://127.0.0.1:2379".into()],
            broker_id: None,
            lease_ttl: Duration::from_secs(10),
            events_token_file: None,
            peer_token_file: None,
            peer_ca_file: None,
            default_replicas: 1,
            replace_after: Duration::from_secs(300),
            snapshot_every: 10_000,
            partition_form_timeout: Duration::from_secs(30),
        }
    }
}

/// Whether `s` may name a cluster or a broker: 1–128 of `[A-Za-z0-9._-]`
/// (they go into etcd keys and gRPC metadata).
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl ClusterConfig {
    /// Rejects settings that cannot work; `advertise` is the broker's.
    pub fn validate(&self, advertise: Option<&str>) -> Result<()> {
        let bad = |m: String| Err(ClusterError::Config(m));
        if !valid_id(&self.name) {
            return bad(format!(
                "cluster name {:?} must be 1 to 128 of A-Z a-z 0-9 . _ -",
                self.name
            ));
        }
        if let Some(id) = &self.broker_id
            && !valid_id(id)
        {
            return bad(format!(
                "broker id {id:?} must be 1 to 128 of A-Z a-z 0-9 . _ -"
            ));
        }
        if self.etcd.is_empty() || self.etcd.iter().any(|u| !u.starts_with("http")) {
            return bad(format!(
                "cluster mode needs etcd URLs like http://127.0.0.1:2379, got {:?}",
                self.etcd
            ));
        }
        if self.lease_ttl < Duration::from_secs(2) {
            return bad("lease_ttl must be at least 2s".into());
        }
        if !(1..=7).contains(&self.default_replicas) {
            return bad(format!(
                "default_replicas must be 1 to 7, not {}",
                self.default_replicas
            ));
        }
        if !self.replace_after.is_zero() && self.replace_after < Duration::from_secs(1) {
            return bad("replace_after must be at least 1s (or \"0s\": never)".into());
        }
        if self.partition_form_timeout < Duration::from_secs(1) {
            return bad("partition_form_timeout must be at least 1s".into());
        }
        match advertise {
            Some(a) if a.starts_with("http://") || a.starts_with("https://") => Ok(()),
            Some(a) => bad(format!(
                "advertise {a:?} must be a URL clients can reach, like http://host:6650"
            )),
            None => bad(
                "cluster mode needs an advertised URL (--advertise http://host:port): other brokers send clients there".into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_settings_are_checked() {
        let ok = ClusterConfig {
            name: "prod".into(),
            ..Default::default()
        };
        ok.validate(Some("http://10.0.0.5:6650")).unwrap();
        assert_eq!(ok.default_replicas, 1);
        let three = ClusterConfig {
            default_replicas: 3,
            ..ok.clone()
        };
        three.validate(Some("http://10.0.0.5:6650")).unwrap();
        let e = ok.validate(None).unwrap_err().to_string();
        assert!(e.contains("--advertise"), "{e}");
        assert!(ok.validate(Some("10.0.0.5:6650")).is_err());
        for bad in [
            ClusterConfig::default(),
            ClusterConfig {
                name: "a/b".into(),
                ..ok.clone()
            },
            ClusterConfig {
                broker_id: Some("b 1".into()),
                ..ok.clone()
            },
            ClusterConfig {
                etcd: vec![],
                ..ok.clone()
            },
            ClusterConfig {
                lease_ttl: Duration::from_secs(1),
                ..ok.clone()
            },
            ClusterConfig {
                default_replicas: 0,
                ..ok.clone()
            },
            ClusterConfig {
                default_replicas: 8,
                ..ok.clone()
            },
            ClusterConfig {
                partition_form_timeout: Duration::from_millis(500),
                ..ok.clone()
            },
        ] {
            assert!(bad.validate(Some("http://h:1")).is_err(), "{bad:?}");
        }
    }
}
