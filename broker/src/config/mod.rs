//! Broker configuration: every setting, its default, and the TOML file format.
//!
//! ```toml
//! data_dir = "./data"
//! listen = "127.0.0.1:6650"
//! durability = "sync"            # or "interval"
//! flush_interval = "50ms"        # interval mode only
//! auto_create_topics = true
//! max_message_size = 5242880   # payload + key + property names and values
//! max_key_size = 4096
//! max_properties = 256
//! max_unacked_per_consumer = 50000
//! max_pending_requests_per_consumer = 10000  # per consumer stream: ids read, not yet handled
//! segment_entries = 16384
//! log_engine = "segments"        # ordinary topics' entries in segment files; "sled": in sled (the old layout)
//! segment_max_bytes = 67108864   # a segment file is sealed at this size ...
//! segment_max_age = "1h"         # ... or this age (and at each block of segment_entries ids)
//! retry_window = "60s"
//! max_delay = "7days"            # longest retry, held nack or deliver_at accepted
//! replay_rate_per_second = 1000
//! log_format = "text"            # or "json" (one JSON object per line)
//! failure_summary_interval = "10s"  # INFO summary of retries and dead letters ("0s": none)
//! retention_interval = "5s"      # how often retention policies are enforced ("0s": never)
//! cache_capacity = 16777216      # sled's page cache in bytes (resident: a few times this)
//!
//! # Limits on what clients create or hold open (0 = unlimited); over one, a
//! # request gets RESOURCE_EXHAUSTED naming the setting.
//! max_topics = 10000                 # ordinary topics, broker-wide
//! max_topics_per_namespace = 1000
//! max_subscriptions_per_topic = 100
//! max_connections = 1024
//! max_streams_per_connection = 1000  # calls (streams and unary) open at once
//! idle_timeout = "5m"                # close a connection with no call open this long ("0s": never)
//! keepalive_interval = "30s"         # HTTP/2 pings on every connection ("0s": none) ...
//! keepalive_timeout = "20s"          # ... and a connection whose ping is not answered in time closes
//! min_free_space = 67108864      # refuse publishes below this many bytes free on the data dir's disk (0: never)
//! accept_data_loss = false       # start on a store that lacks what its manifest records
//! verify_on_start = "background" # read every stored value once serving (report damage);
//!                                # "before": before serving (refuse damage; slower start), "off"
//! # console_listen = "127.0.0.1:8080"  # the web console (off unless set; sign-in by token
//!                                #   with [auth]; loopback only ...)
//! console_allow_remote = false   # ... unless this is true (HTTPS with [tls])
//!
//! # advertise = "http://10.0.0.5:6650"  # the URL clients are sent to (default: http(s)://<listen>)
//!
//! # [cluster]                    # cluster mode (off unless set; needs `advertise`)
//! # name = "prod"                # keys under /ricochet/<name>/ in etcd
//! # etcd = ["http://127.0.0.1:2379"]
//! # broker_id = "b1"             # default: the data directory's store id
//! # lease_ttl = "10s"            # fenced after 4/5 of it without a renewal
//! # default_replicas = 1         # factor of a topic created without one (1..7)
//! # replace_after = "5m"         # a group member's broker down this long is replaced ("0s": never)
//! # snapshot_every = 10000       # Raft entries between snapshots of a partition (0: never)
//! # partition_form_timeout = "30s"  # a replicated partitioned create waits this long for its groups
//! # peer_token_file = "/etc/ricochet/broker.token"  # with [auth]: a superuser's token for Raft calls
//! # peer_ca_file = "/etc/ricochet/ca.pem"  # with [tls]: verifies the other brokers (default tls.client_ca_file)
//!
//! # [tiered]                     # offload sealed segments to an object store (off unless set)
//! # url = "s3://bucket/prefix"   # or "file:///var/lib/ricochet-tier"
//! # endpoint = "http://127.0.0.1:5000"; region = "us-east-1"; allow_http = false
//! # credentials_file = "/etc/ricochet/aws-credentials"  # default: AWS_* variables
//! # pace_bytes_per_second = 0    # 0: unpaced
//! # cache_bytes = 67108864       # LRU of blocks read back
//! # offload_after = "1h"         # default policy (namespaces/topics override it)
//!
//! [auth]                         # see `ricochet_broker::auth::AuthConfig`
//! enabled = false                # require tokens and check grants
//! superusers = []
//! allow_insecure = false         # serve a non-loopback address without auth
//!
//! [[policies]]                   # default dead-letter policies by topic pattern
//! topic = "persistent://public/default/orders*"
//! policy = { type = "delay_levels" }
//! breaker = { ratio = 0.5, window = 200 }   # optional outage breaker (docs: breaker.md)
//! ```

mod auth;

pub(crate) use auth::read_secret;
pub use auth::{AuthConfig, metrics_token};
pub use ricochet_cluster::ClusterConfig;

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

/// Where ordinary topics' entries are stored (`log_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogEngine {
    /// Append-only segment files under `<data_dir>/log/`
    /// (`crate::storage::segments`); a store written with `sled` is
    /// converted once at start.
    #[default]
    Segments,
    /// sled's segment trees, as before the segment files (a store once
    /// converted is not converted back).
    Sled,
}

/// The largest `max_delay` a config may set: far beyond any use, and far
/// below the point where a due time in milliseconds could overflow.
pub const MAX_DELAY_CEILING: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// When the broker reads and checks every stored value at start
/// (`verify_on_start`; `true` and `false` still read as `before` and `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum VerifyOnStart {
    /// Before serving: a store with a damaged value is refused (unless
    /// `accept_data_loss`); the start takes one pass over the store.
    Before,
    /// After the broker starts serving, in a background task: damage found
    /// is logged (ERROR), turns `ricochet_storage_healthy` to 0 and the gRPC
    /// health check to NOT_SERVING, as a damaged read does. Until the pass
    /// reaches a damaged value, only a read of it finds it (and fails).
    /// What the manifest records (entries, segments, subscriptions, and
    /// after a clean stop each subscription's dead-letter and scheduled
    /// counts: a scan of those keys) is still compared before serving.
    #[default]
    Background,
    /// Never: only reads check values (each against its checksum). The fast
    /// mode: the counts of a clean stop are neither recorded nor compared
    /// (entries, segments and subscriptions still are).
    Off,
}

impl<'de> Deserialize<'de> for VerifyOnStart {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Flag(bool),
            Name(String),
        }
        match Repr::deserialize(d)? {
            Repr::Flag(true) => Ok(Self::Before),
            Repr::Flag(false) => Ok(Self::Off),
            Repr::Name(n) => n.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl std::str::FromStr for VerifyOnStart {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "before" => Ok(Self::Before),
            "background" => Ok(Self::Background),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "unknown verify_on_start {other:?}: use before, background or off"
            )),
        }
    }
}

/// The log's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?}: use text or json")),
        }
    }
}

/// A default dead-letter policy for topics matching a pattern.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyRule {
    /// A full topic name, optionally ending in `*` to match a prefix.
    pub topic: String,
    /// The policy.
    pub policy: ricochet_policy::PolicySpec,
    /// An outage breaker for the matching topics' subscriptions, e.g.
    /// `breaker = { ratio = 0.5, window = 200 }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<ricochet_policy::BreakerSpec>,
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
    /// Largest accepted message in bytes: payload, key, and every property
    /// name and value counted together.
    pub max_message_size: usize,
    /// Longest accepted message key in bytes.
    pub max_key_size: usize,
    /// Most properties a message may carry (also for the properties a
    /// consumer adds in `ReconsumeLater`).
    pub max_properties: usize,
    /// Dispatch to a consumer pauses while it holds this many unacked messages.
    pub max_unacked_per_consumer: usize,
    /// Backpressure on a consumer stream: at most this many message ids
    /// (of acks, nacks, ...: a request naming none counts as one) read
    /// from one stream and not yet handled by its subscription, and at
    /// most this many answers queued to it and not yet written; at either
    /// limit the broker stops reading the stream until it catches up.
    pub max_pending_requests_per_consumer: u32,
    /// Entries per storage segment; a segment is dropped once every
    /// subscription has acknowledged all of it.
    pub segment_entries: u64,
    /// Where ordinary topics' entries are stored.
    pub log_engine: LogEngine,
    /// A segment file holding this many bytes is sealed and the next one
    /// started (segment-file log only).
    pub segment_max_bytes: u64,
    /// A segment file this old is sealed at the next append
    /// (segment-file log only).
    #[serde(with = "humantime_serde")]
    pub segment_max_age: Duration,
    /// How far ahead the retry scheduler loads due times into memory.
    #[serde(with = "humantime_serde")]
    pub retry_window: Duration,
    /// The longest delay the broker accepts or schedules: a
    /// `reconsume_later` delay, a nack the broker holds, a `deliver_at`, or a
    /// policy's longest step. Longer requests are refused (INVALID_ARGUMENT,
    /// naming this limit), like RocketMQ 5's `timerMaxDelaySec`.
    #[serde(with = "humantime_serde")]
    pub max_delay: Duration,
    /// Default dead-letter replay rate (messages per second).
    pub replay_rate_per_second: u32,
    /// How the binary writes its log (to stdout; colours only on a terminal).
    pub log_format: LogFormat,
    /// Each retry and dead-lettering is a DEBUG event; at INFO, one line per
    /// subscription with failures sums them up this often. Zero: no summary.
    #[serde(with = "humantime_serde")]
    pub failure_summary_interval: Duration,
    /// How often the retention policies set with `SetRetention` are
    /// enforced (dropping whole old segments); zero never enforces them.
    /// Without a policy a topic keeps every message until consumed.
    #[serde(with = "humantime_serde")]
    pub retention_interval: Duration,
    /// sled's page cache, in bytes (`--cache-capacity`). sled counts a page
    /// at its size on disk, while a page in memory takes some 2–4 times
    /// that (its entries, keys and values are separate allocations), so the
    /// cache's resident share is a few times this figure. 16 MiB by default,
    /// sized for a small broker (see `docs/src/storage.md`, "Memory");
    /// more keeps more of a large backlog or retry tier in memory, at the
    /// cost of resident memory.
    pub cache_capacity: u64,
    /// Most ordinary topics (not retry or dead-letter tiers) in the broker;
    /// 0 means unlimited.
    pub max_topics: usize,
    /// Most ordinary topics in one `tenant/namespace`; 0 means unlimited.
    pub max_topics_per_namespace: usize,
    /// Most subscriptions on one topic; 0 means unlimited.
    pub max_subscriptions_per_topic: usize,
    /// Most client connections served at once; 0 means unlimited. An
    /// extra connection is answered RESOURCE_EXHAUSTED, then closed.
    pub max_connections: usize,
    /// Most calls (producer and consumer streams, admin calls) open at once
    /// on one connection; 0 means unlimited.
    pub max_streams_per_connection: usize,
    /// A connection with no call open for this long is closed; zero never.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// How often the broker pings each connection over HTTP/2 (so a peer
    /// that vanished is noticed and its consumers' messages redelivered);
    /// zero sends no pings.
    #[serde(with = "humantime_serde")]
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    #[serde(with = "humantime_serde")]
    pub keepalive_timeout: Duration,
    /// Default dead-letter policies by topic pattern (first match wins).
    pub policies: Vec<PolicyRule>,
    /// Publishes are refused (RESOURCE_EXHAUSTED, naming the data directory
    /// and the space left) while the data directory's filesystem has fewer
    /// bytes than this free, and accepted again by themselves once space
    /// returns, so the storage engine never meets a full disk; 0 never
    /// refuses.
    pub min_free_space: u64,
    /// Start even when the store lacks what its manifest records (each
    /// loss is logged, and what is left becomes the record). Off by default:
    /// a damaged store is refused.
    pub accept_data_loss: bool,
    /// When every stored value is read and checked at start (one pass over
    /// the store: the backlog, parked retries and dead letters): `before`
    /// serving (damage refuses the store), in the `background` once serving
    /// (the default: damage is reported, not refused), or `off`.
    pub verify_on_start: VerifyOnStart,
    /// Where the web console (`crate::console`) listens; `None` (the
    /// default) serves no console.
    pub console_listen: Option<SocketAddr>,
    /// Serve the console on an address other than loopback. Without
    /// `[auth]` whoever reaches it may act, and without `[tls]` (which the
    /// console is served with too) a signed-in token crosses the network in
    /// clear, so without this a non-loopback `console_listen` is refused.
    pub console_allow_remote: bool,
    /// The URL clients are told to reach this broker at (`Lookup`, the
    /// not-owner redirect); default `http://<listen>` (`https` with TLS).
    pub advertise: Option<String>,
    /// Cluster mode (see `ricochet_cluster`); `None`, the default, serves
    /// standalone, with no etcd.
    pub cluster: Option<ClusterConfig>,
    /// Authentication and authorization (off by default).
    pub auth: AuthConfig,
    /// TLS on the listener (off by default).
    pub tls: crate::tls::TlsConfig,
    /// Tiered storage: sealed segments offloaded to an object store
    /// (`crate::storage::tiered`); `None`, the default, keeps every
    /// segment local.
    pub tiered: Option<crate::storage::tiered::TieredConfig>,
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
            max_key_size: 4096,
            max_properties: 256,
            max_unacked_per_consumer: 50_000,
            max_pending_requests_per_consumer: 10_000,
            segment_entries: 16_384,
            log_engine: LogEngine::Segments,
            segment_max_bytes: 64 << 20,
            segment_max_age: Duration::from_secs(3600),
            retry_window: Duration::from_secs(60),
            max_delay: Duration::from_secs(7 * 24 * 3600),
            replay_rate_per_second: 1_000,
            log_format: LogFormat::Text,
            failure_summary_interval: Duration::from_secs(10),
            retention_interval: Duration::from_secs(5),
            cache_capacity: 16 * 1024 * 1024,
            max_topics: 10_000,
            max_topics_per_namespace: 1_000,
            max_subscriptions_per_topic: 100,
            max_connections: 1024,
            max_streams_per_connection: 1000,
            idle_timeout: Duration::from_secs(300),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(20),
            policies: Vec::new(),
            min_free_space: 64 << 20,
            accept_data_loss: false,
            verify_on_start: VerifyOnStart::default(),
            console_listen: None,
            console_allow_remote: false,
            advertise: None,
            cluster: None,
            auth: AuthConfig::default(),
            tls: crate::tls::TlsConfig::default(),
            tiered: None,
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

    /// An endpoint to another broker of the cluster at `url` (a topic
    /// move, a forwarded failure event): over TLS for an `https://` URL,
    /// trusting `[cluster] peer_ca_file` (else `tls.client_ca_file`), and
    /// showing this broker's certificate when clients must show one. An
    /// `https://` URL with no CA to trust is an error naming the setting.
    pub fn peer_endpoint(&self, url: &str) -> Result<tonic::transport::Endpoint, BrokerError> {
        let peer = |e: &dyn std::fmt::Display| BrokerError::Peer(format!("{url}: {e}"));
        let endpoint =
            tonic::transport::Endpoint::from_shared(url.to_owned()).map_err(|e| peer(&e))?;
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        let ca = self
            .cluster
            .as_ref()
            .and_then(|c| c.peer_ca_file.as_deref());
        let tls = self.tls.peer_client_config(ca)?.ok_or_else(|| {
            peer(&"the broker there listens with TLS and this one knows no CA to verify it ([cluster] peer_ca_file or [tls] client_ca_file)")
        })?;
        endpoint.tls_config(tls).map_err(|e| peer(&e))
    }

    /// When the segment-file log rolls.
    pub fn log_settings(&self) -> crate::storage::segments::LogSettings {
        crate::storage::segments::LogSettings {
            segment_entries: self.segment_entries,
            max_bytes: self.segment_max_bytes,
            max_age: self.segment_max_age,
        }
    }

    /// Rejects settings that cannot work.
    pub fn validate(&self) -> Result<(), BrokerError> {
        let bad = |m: &str| Err(BrokerError::Config(m.to_owned()));
        if self.max_message_size == 0 {
            return bad("max_message_size must be positive");
        }
        if self.max_key_size == 0 {
            return bad("max_key_size must be positive");
        }
        if self.segment_entries == 0 {
            return bad("segment_entries must be positive");
        }
        if self.segment_max_bytes < 4096 {
            return bad("segment_max_bytes must be at least 4096");
        }
        if self.segment_max_age.is_zero() {
            return bad("segment_max_age must be positive");
        }
        if let Some(t) = &self.tiered {
            t.validate().map_err(BrokerError::Config)?;
            if self.log_engine != LogEngine::Segments {
                return bad("[tiered] needs log_engine = \"segments\"");
            }
        }
        if self.max_unacked_per_consumer == 0 {
            return bad("max_unacked_per_consumer must be positive");
        }
        if self.max_pending_requests_per_consumer == 0 {
            return bad("max_pending_requests_per_consumer must be positive");
        }
        // sled splits its cache into 256 shards and refuses (panics) below 256 B.
        if self.cache_capacity < 1 << 20 {
            return bad("cache_capacity must be at least 1 MiB (1048576)");
        }
        if self.flush_interval.is_zero() {
            return bad("flush_interval must be positive");
        }
        if self.max_delay.is_zero() || self.max_delay > MAX_DELAY_CEILING {
            return bad("max_delay must be between 1 ms and 100 years");
        }
        if !self.keepalive_interval.is_zero() && self.keepalive_timeout.is_zero() {
            return bad("keepalive_timeout must be positive when keepalive_interval is set");
        }
        if let Some(addr) = self.console_listen
            && !addr.ip().is_loopback()
            && !self.console_allow_remote
        {
            return Err(BrokerError::Config(format!(
                "console_listen {addr} is not a loopback address: set console_allow_remote \
                 (--console-allow-remote) to serve the console there, with [auth] (or whoever \
                 reaches it may act) and [tls] (or a signed-in token crosses the network in clear)"
            )));
        }
        if let Some(addr) = self.metrics_listen
            && self.auth.enabled
            && self.auth.metrics_token_file.is_none()
            && !addr.ip().is_loopback()
        {
            // `/metrics` names every tenant's topics and subscriptions.
            return Err(BrokerError::Config(format!(
                "metrics_listen {addr} is not a loopback address and [auth] is enabled: \
                 /metrics would show every tenant's topics to anyone; set \
                 auth.metrics_token_file (--metrics-token-file) or listen on loopback"
            )));
        }
        if let Some(cluster) = &self.cluster {
            cluster.validate(self.advertise.as_deref())?;
        }
        self.auth.validate(self.listen)?;
        self.tls.server_config()?;
        for rule in &self.policies {
            rule.policy
                .validate()
                .map_err(|e| BrokerError::Config(format!("policy for {}: {e}", rule.topic)))?;
            if let Some(b) = &rule.breaker {
                b.validate()
                    .map_err(|e| BrokerError::Config(format!("policy for {}: {e}", rule.topic)))?;
            }
            if let Some(d) = rule.policy.max_delay().filter(|d| *d > self.max_delay) {
                return Err(BrokerError::Config(format!(
                    "policy for {} waits up to {}, more than max_delay ({})",
                    rule.topic,
                    humantime::format_duration(d),
                    humantime::format_duration(self.max_delay)
                )));
            }
        }
        Ok(())
    }

    /// Whether TLS and authentication are on, for the start line:
    /// `TLS off, authentication off`, `TLS on (client certificates
    /// required), authentication on`, …
    pub fn security_summary(&self) -> String {
        let tls = match (self.tls.enabled(), &self.tls.client_ca_file) {
            (false, _) => "TLS off",
            (true, None) => "TLS on",
            (true, Some(_)) if self.tls.require_client_cert => {
                "TLS on (client certificates required)"
            }
            (true, Some(_)) => "TLS on (client certificates verified)",
        };
        let auth = if self.auth.enabled {
            "authentication on"
        } else {
            "authentication off"
        };
        format!("{tls}, {auth}")
    }

    /// The configured default policy for `topic`, if a rule matches.
    pub fn policy_for(&self, topic: &str) -> Option<&ricochet_policy::PolicySpec> {
        self.policies
            .iter()
            .find(|r| r.matches(topic))
            .map(|r| &r.policy)
    }

    /// The configured outage breaker for `topic`: the first matching
    /// rule's, if it has one.
    pub fn breaker_for(&self, topic: &str) -> Option<&ricochet_policy::BreakerSpec> {
        self.policies
            .iter()
            .find(|r| r.matches(topic))
            .and_then(|r| r.breaker.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_table_parses_and_is_checked() {
        let c: BrokerConfig = toml::from_str(
            "advertise = \"http://h:6650\"\n[cluster]\nname = \"c\"\netcd = [\"http://e:2379\"]\nlease_ttl = \"3s\"",
        )
        .unwrap();
        c.validate().unwrap();
        let cluster = c.cluster.clone().unwrap();
        assert_eq!(
            (cluster.name.as_str(), cluster.lease_ttl),
            ("c", Duration::from_secs(3))
        );
        // A cluster setting that cannot work fails the broker's check, as
        // an invalid configuration.
        let bad = BrokerConfig {
            advertise: None,
            ..c
        };
        let e = bad.validate().unwrap_err();
        assert!(matches!(e, BrokerError::Config(_)), "{e:?}");
        assert!(e.to_string().contains("--advertise"), "{e}");
    }

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

    /// The TOML example in this module's documentation parses, and every
    /// value it shows is the default.
    #[test]
    fn the_documented_example_shows_the_defaults() {
        let source = include_str!("mod.rs");
        let example: String = source
            .lines()
            .map_while(|l| l.strip_prefix("//!"))
            .skip_while(|l| !l.contains("```toml"))
            .skip(1)
            .take_while(|l| !l.contains("```"))
            .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
            .collect();
        assert!(example.contains("max_connections = "), "{example}");
        let parsed: BrokerConfig = toml::from_str(&example).expect("the example parses");
        assert_eq!(parsed.policies.len(), 1);
        parsed.validate().unwrap();
        let defaults = BrokerConfig::default();
        let shown = toml::to_string(&BrokerConfig {
            policies: Vec::new(),
            ..parsed
        })
        .unwrap();
        let expected = toml::to_string(&defaults).unwrap();
        assert_eq!(shown, expected);
        let c: BrokerConfig = toml::from_str(
            "idle_timeout = \"0s\"\nkeepalive_interval = \"0s\"\nlog_format = \"json\"\nmax_connections = 0",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(
            (c.idle_timeout, c.log_format),
            (Duration::ZERO, LogFormat::Json)
        );
        let bad: BrokerConfig = toml::from_str("keepalive_timeout = \"0s\"").unwrap();
        assert!(bad.validate().is_err());
        let tiny: BrokerConfig = toml::from_str("cache_capacity = 1000").unwrap();
        assert!(
            tiny.validate().is_err(),
            "sled would panic on a cache this small"
        );
        let small: BrokerConfig = toml::from_str("cache_capacity = 1048576").unwrap();
        small.validate().unwrap();
    }

    #[test]
    fn a_console_off_loopback_needs_the_explicit_flag() {
        let mut c = BrokerConfig::for_dir("/tmp/x");
        assert!(c.console_listen.is_none(), "the console is off by default");
        c.console_listen = Some("127.0.0.1:8080".parse().unwrap());
        c.validate().unwrap();
        c.console_listen = Some("[::1]:8080".parse().unwrap());
        c.validate().unwrap();
        c.console_listen = Some("0.0.0.0:8080".parse().unwrap());
        let refused = c.validate().unwrap_err().to_string();
        assert!(refused.contains("console_allow_remote"), "{refused}");
        c.console_allow_remote = true;
        c.validate().unwrap();
        // Beside authentication too: it signs in by token.
        c.console_listen = Some("127.0.0.1:8080".parse().unwrap());
        c.auth.enabled = true;
        c.auth.token_secret_file = Some("/tmp/x/secret".into());
        c.validate().unwrap();
    }

    #[test]
    fn a_secured_broker_serves_metrics_only_with_a_token_or_on_loopback() {
        let mut c = BrokerConfig::for_dir("/tmp/x");
        c.auth.enabled = true;
        c.auth.token_secret_file = Some("/x".into());
        c.metrics_listen = Some("127.0.0.1:9464".parse().unwrap());
        c.validate().unwrap();
        c.metrics_listen = Some("0.0.0.0:9464".parse().unwrap());
        let refused = c.validate().unwrap_err().to_string();
        assert!(
            refused.contains("metrics_token_file") && refused.contains("0.0.0.0:9464"),
            "{refused}"
        );
        assert!(!refused.contains('\n'), "one line: {refused}");
        c.auth.metrics_token_file = Some("/etc/ricochet/metrics.token".into());
        c.validate().unwrap();
        // Without [auth] a public broker needs --allow-insecure anyway.
        c.auth = AuthConfig {
            allow_insecure: true,
            ..Default::default()
        };
        c.validate().unwrap();
    }

    #[test]
    fn the_start_line_says_whether_tls_and_authentication_are_on() {
        let mut c = BrokerConfig::for_dir("/tmp/x");
        assert_eq!(c.security_summary(), "TLS off, authentication off");
        c.tls.cert_file = Some("b.pem".into());
        c.tls.key_file = Some("b.key".into());
        c.auth.enabled = true;
        assert_eq!(c.security_summary(), "TLS on, authentication on");
        c.tls.client_ca_file = Some("ca.pem".into());
        c.tls.require_client_cert = true;
        assert_eq!(
            c.security_summary(),
            "TLS on (client certificates required), authentication on"
        );
    }

    #[test]
    fn policy_rules_match_prefixes() {
        let rule = PolicyRule {
            topic: "persistent://public/default/ord*".into(),
            policy: ricochet_policy::PolicySpec::default(),
            breaker: None,
        };
        assert!(rule.matches("persistent://public/default/orders"));
        assert!(!rule.matches("persistent://public/default/payments"));
    }

    #[test]
    fn a_policy_rule_may_carry_a_breaker_which_is_validated() {
        let text = r#"
            [[policies]]
            topic = "persistent://public/default/orders*"
            policy = { type = "backoff", fixed = "10s", max_redeliver_count = 5 }
            breaker = { ratio = 0.5, window = 200, min_settles = 20, probe_interval = "5s", max_probe_interval = "5m" }
        "#;
        let c: BrokerConfig = toml::from_str(text).unwrap();
        let b = c
            .breaker_for("persistent://public/default/orders-eu")
            .unwrap();
        assert_eq!((b.ratio, b.window), (Some(0.5), 200));
        assert!(
            c.breaker_for("persistent://public/default/payments")
                .is_none()
        );
        let bad: BrokerConfig =
            toml::from_str(&text.replace("ratio = 0.5", "ratio = 3.0")).unwrap();
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("ratio must be above 0"), "{e}");
    }
}
