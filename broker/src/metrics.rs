//! Prometheus metrics: the series the broker exports and the handles the
//! topic and subscription code update.
//!
//! Recording goes through the `metrics` facade; [`install_prometheus`] puts
//! the `metrics-exporter-prometheus` recorder behind it and serves
//! `/metrics` (the binary does this for `--metrics-listen`). Without an
//! installed recorder every update is a no-op, so embedded and test brokers pay
//! nothing. Handles are built once per topic or subscription; labels are the
//! topic, the subscription and, for dead letters, the failure reason (one of a
//! fixed set, never free text).

use crate::error::{BrokerError, Result};
use metrics::{
    Counter, Gauge, Histogram, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use ricochet_policy::FailureReason;
use std::net::SocketAddr;
use std::sync::OnceLock;

static INSTALLED: OnceLock<SocketAddr> = OnceLock::new();

/// Buckets (seconds) for retry delay and lateness histograms.
const DELAY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0,
    7200.0,
];
/// Buckets (seconds) for the replication latencies
/// (`ricochet_replication::latency`): an `fdatasync` to a leader's commit
/// on loopback is 0.1–10 ms; a stalled peer shows in the top ones.
const RAFT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Buckets for delivery counts.
const COUNT_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0];

/// Installs the Prometheus recorder and serves `/metrics` on `addr` (once
/// per process; a second call with another address fails).
pub fn install_prometheus(addr: SocketAddr) -> Result<()> {
    install_prometheus_secured(addr, None)
}

/// Like [`install_prometheus`]; with a `token`, `/metrics` answers 401
/// unless the request carries `Authorization: Bearer <token>` (served by a
/// small axum server, since the exporter's own listener checks nothing;
/// must run inside a tokio runtime then).
pub fn install_prometheus_secured(addr: SocketAddr, token: Option<Vec<u8>>) -> Result<()> {
    if let Some(existing) = INSTALLED.get() {
        return if *existing == addr {
            Ok(())
        } else {
            Err(BrokerError::Config(format!(
                "metrics are already served on {existing}"
            )))
        };
    }
    let builder = match &token {
        None => PrometheusBuilder::new().with_http_listener(addr),
        Some(_) => PrometheusBuilder::new(),
    };
    let builder = builder
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            DELAY_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("ricochet_delivery_attempts".into()),
                COUNT_BUCKETS,
            )
        })
        // A prefix matcher is consulted before any suffix matcher, so these
        // buckets, not the delay ones, apply to the Raft `_seconds`.
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Prefix("ricochet_raft_".into()),
                RAFT_BUCKETS,
            )
        })
        .map_err(|e| BrokerError::Config(format!("metrics buckets: {e}")))?;
    match token {
        None => builder
            .install()
            .map_err(|e| BrokerError::Config(format!("cannot serve metrics on {addr}: {e}")))?,
        Some(token) => serve_with_token(builder, addr, token)?,
    }
    let _ = INSTALLED.set(addr);
    describe();
    tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    Ok(())
}

fn describe() {
    describe_counter!(
        "ricochet_messages_published_total",
        "Messages stored on a topic."
    );
    describe_counter!(
        "ricochet_bytes_published_total",
        "Payload bytes stored on a topic."
    );
    describe_counter!(
        "ricochet_messages_dispatched_total",
        "Messages sent to consumers (first deliveries and redeliveries)."
    );
    describe_counter!(
        "ricochet_bytes_dispatched_total",
        "Payload bytes sent to consumers."
    );
    describe_counter!("ricochet_messages_acked_total", "Messages acknowledged.");
    describe_tiered();
    describe_replication();
    describe_counter!(
        "ricochet_raft_coalesced_entries_total",
        "Raft entries a replicated topic's leader proposed carrying several queued writes at once (coalesced)."
    );
    describe_counter!(
        "ricochet_raft_coalesced_commands_total",
        "Writes (partition commands) carried by the coalesced Raft entries."
    );
    describe_gauge!(
        "ricochet_backlog_messages",
        "Messages of the main topic not yet acknowledged by the subscription."
    );
    describe_gauge!(
        "ricochet_unacked_messages",
        "Messages delivered and not yet acknowledged."
    );
    describe_gauge!(
        "ricochet_consumers_blocked_on_unacked",
        "Consumers holding max_unacked_per_consumer unacked messages, sent nothing until they ack."
    );
    describe_counter!(
        "ricochet_consumer_stream_throttled_total",
        "Times a consumer stream was not read for a while: its requests not yet handled, or its answers not yet written, reached max_pending_requests_per_consumer."
    );
    describe_gauge!(
        "ricochet_consumer_streams_throttled",
        "Consumer streams not being read now, waiting for the broker to handle their requests or for the client to read its answers."
    );
    describe_gauge!(
        "ricochet_key_order_blocked_keys",
        "Keys held back by key order, each waiting for a failed message to be acked or dead-lettered."
    );
    describe_gauge!(
        "ricochet_key_order_held_messages",
        "Messages held back behind blocked keys (key order)."
    );
    describe_gauge!(
        "ricochet_retry_queue_size",
        "Messages in the subscription's retry tier, not yet acknowledged."
    );
    describe_counter!(
        "ricochet_retries_scheduled_total",
        "Messages moved into the retry tier."
    );
    describe_counter!(
        "ricochet_retries_fired_total",
        "Scheduled retries that became due."
    );
    describe_counter!(
        "ricochet_retry_succeeded_total",
        "Retry-tier messages acknowledged (acked after at least one retry)."
    );
    describe_gauge!(
        "ricochet_retry_success_ratio",
        "ricochet_retry_succeeded_total / ricochet_retries_scheduled_total since the broker started."
    );
    describe_histogram!(
        "ricochet_retry_delay_seconds",
        "Delay chosen for each scheduled retry."
    );
    describe_histogram!(
        "ricochet_retry_lateness_seconds",
        "How late each scheduled retry became due, against its due time."
    );
    describe_counter!(
        "ricochet_redeliveries_total",
        "Failed deliveries, by reason."
    );
    describe_counter!(
        "ricochet_dead_lettered_total",
        "Messages moved to the dead-letter tier, by the reason of the last failure."
    );
    describe_gauge!(
        "ricochet_dlq_size",
        "Messages in the subscription's dead-letter tier."
    );
    describe_histogram!(
        "ricochet_delivery_attempts",
        "Delivery count of each dispatched message."
    );
    describe_gauge!(
        "ricochet_storage_bytes",
        "Bytes the storage engine uses on disk."
    );
    describe_gauge!(
        "ricochet_storage_healthy",
        "1 while every storage flush has succeeded."
    );
    describe_gauge!(
        "ricochet_storage_free_bytes",
        "Bytes free on the data directory's filesystem."
    );
    describe_gauge!(
        "ricochet_storage_disk_full",
        "1 while publishes are refused because the data directory's disk has less than min_free_space free."
    );
    describe_counter!(
        "ricochet_limit_rejections_total",
        "Requests and connections refused because a configured limit was reached, by limit."
    );
    describe_gauge!("ricochet_connections", "Client connections being served.");
}

/// Counts one refusal by a configured limit (`limit` is one of a fixed set).
pub fn limit_rejected(limit: &'static str) {
    counter!("ricochet_limit_rejections_total", "limit" => limit).increment(1);
}

/// Per-topic handles.
#[derive(Debug, Clone)]
pub struct TopicMetrics {
    /// Messages stored.
    pub published: Counter,
    /// Payload bytes stored.
    pub published_bytes: Counter,
    /// Stored message bytes dropped by retention.
    pub retention_dropped_bytes: Counter,
    /// Segments dropped by retention.
    pub retention_dropped_segments: Counter,
    /// Publishes refused at the backlog quota.
    pub quota_refusals: Counter,
}

impl TopicMetrics {
    /// Handles for `topic`.
    pub fn new(topic: &str) -> Self {
        let t = topic.to_owned();
        Self {
            published: counter!("ricochet_messages_published_total", "topic" => t.clone()),
            published_bytes: counter!("ricochet_bytes_published_total", "topic" => t.clone()),
            retention_dropped_bytes: counter!(
                "ricochet_retention_dropped_bytes_total", "topic" => t.clone()
            ),
            retention_dropped_segments: counter!(
                "ricochet_retention_dropped_segments_total", "topic" => t.clone()
            ),
            quota_refusals: counter!("ricochet_backlog_quota_refusals_total", "topic" => t),
        }
    }
}

/// A replicated topic's leader's coalesced Raft entries
/// (`PartitionCommand::Sequence`): entries proposed and the commands they
/// carried, labelled by topic.
#[derive(Debug, Clone)]
pub struct RaftCounters {
    entries: Counter,
    commands: Counter,
}

impl RaftCounters {
    /// Handles for `topic`.
    pub fn new(topic: &str) -> Self {
        let t = topic.to_owned();
        Self {
            entries: counter!("ricochet_raft_coalesced_entries_total", "topic" => t.clone()),
            commands: counter!("ricochet_raft_coalesced_commands_total", "topic" => t),
        }
    }

    /// One coalesced entry carrying `commands` commands was proposed.
    pub fn coalesced(&self, commands: usize) {
        self.entries.increment(1);
        self.commands.increment(commands as u64);
    }
}

/// Per-subscription handles.
#[derive(Debug, Clone)]
pub struct SubscriptionMetrics {
    topic: String,
    subscription: String,
    /// Messages dispatched.
    pub dispatched: Counter,
    /// Bytes dispatched.
    pub dispatched_bytes: Counter,
    /// Messages acked.
    pub acked: Counter,
    /// Main-topic backlog.
    pub backlog: Gauge,
    /// Unacked messages.
    pub unacked: Gauge,
    /// Retry tier size.
    pub retry_queue: Gauge,
    /// Moves into the retry tier.
    pub retries_scheduled: Counter,
    /// Retries that became due.
    pub retries_fired: Counter,
    /// Retry-tier messages acked.
    pub retry_succeeded: Counter,
    /// Succeeded / scheduled.
    pub retry_success_ratio: Gauge,
    /// Chosen retry delays.
    pub retry_delay: Histogram,
    /// Lateness of due retries.
    pub retry_lateness: Histogram,
    /// Dead-letter tier size.
    pub dlq_size: Gauge,
    /// Consumers at the unacked cap.
    pub blocked_consumers: Gauge,
    /// Key order: keys blocked.
    pub blocked_keys: Gauge,
    /// Key order: messages held behind them.
    pub held_messages: Gauge,
    /// Delivery counts at dispatch.
    pub delivery_count: Histogram,
    /// `ricochet_redeliveries_total` by reason, registered on first use
    /// (a lookup in the registry per failed message cost more than the
    /// failure's own bookkeeping in a burst).
    redeliveries: [OnceLock<Counter>; FailureReason::ALL.len()],
}

impl SubscriptionMetrics {
    /// Handles for one subscription.
    pub fn new(topic: &str, subscription: &str) -> Self {
        let l = || {
            [
                ("topic", topic.to_owned()),
                ("subscription", subscription.to_owned()),
            ]
        };
        Self {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            dispatched: counter!("ricochet_messages_dispatched_total", &l()),
            dispatched_bytes: counter!("ricochet_bytes_dispatched_total", &l()),
            acked: counter!("ricochet_messages_acked_total", &l()),
            backlog: gauge!("ricochet_backlog_messages", &l()),
            unacked: gauge!("ricochet_unacked_messages", &l()),
            retry_queue: gauge!("ricochet_retry_queue_size", &l()),
            retries_scheduled: counter!("ricochet_retries_scheduled_total", &l()),
            retries_fired: counter!("ricochet_retries_fired_total", &l()),
            retry_succeeded: counter!("ricochet_retry_succeeded_total", &l()),
            retry_success_ratio: gauge!("ricochet_retry_success_ratio", &l()),
            retry_delay: histogram!("ricochet_retry_delay_seconds", &l()),
            retry_lateness: histogram!("ricochet_retry_lateness_seconds", &l()),
            dlq_size: gauge!("ricochet_dlq_size", &l()),
            blocked_consumers: gauge!("ricochet_consumers_blocked_on_unacked", &l()),
            blocked_keys: gauge!("ricochet_key_order_blocked_keys", &l()),
            held_messages: gauge!("ricochet_key_order_held_messages", &l()),
            delivery_count: histogram!("ricochet_delivery_attempts", &l()),
            redeliveries: Default::default(),
        }
    }

    /// Counts a failed delivery by reason.
    pub fn redelivery(&self, reason: FailureReason) {
        let slot = FailureReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.redeliveries[slot]
            .get_or_init(|| {
                counter!(
                    "ricochet_redeliveries_total",
                    "topic" => self.topic.clone(), "subscription" => self.subscription.clone(),
                    "reason" => reason.as_str()
                )
            })
            .increment(1);
    }

    /// The subscription was deleted: its gauges read zero from now on (the
    /// exporter keeps a series once written; zero is what is left).
    pub fn clear(&self) {
        for g in [
            &self.backlog,
            &self.unacked,
            &self.retry_queue,
            &self.dlq_size,
            &self.blocked_keys,
            &self.held_messages,
        ] {
            g.set(0.0);
        }
    }

    /// Counts dead-lettered messages by the reason of their last failure.
    pub fn dead_lettered(&self, reason: &str, n: u64) {
        counter!(
            "ricochet_dead_lettered_total",
            "topic" => self.topic.clone(), "subscription" => self.subscription.clone(), "reason" => reason.to_owned()
        )
        .increment(n);
    }
}

/// Broker-wide gauges, refreshed periodically.
pub fn record_storage(bytes: u64, healthy: bool) {
    gauge!("ricochet_storage_bytes").set(bytes as f64);
    gauge!("ricochet_storage_healthy").set(if healthy { 1.0 } else { 0.0 });
}

/// Serves `/metrics` on `addr`, to requests bearing `token` only.
fn serve_with_token(builder: PrometheusBuilder, addr: SocketAddr, token: Vec<u8>) -> Result<()> {
    use axum::http::{StatusCode, header};
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| BrokerError::Config(format!("cannot serve metrics on {addr}: {e}")))?;
    let handle = builder
        .install_recorder()
        .map_err(|e| BrokerError::Config(format!("cannot install the metrics recorder: {e}")))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let token = std::sync::Arc::new(token);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let (handle, token) = (handle.clone(), token.clone());
            async move {
                let given = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
                if !given.is_some_and(|g| same_bytes(g, &token)) {
                    return (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "metrics need Authorization: Bearer <token>\n".to_owned(),
                    );
                }
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    handle.render(),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

/// Compares a presented token with the expected one in time that does not
/// depend on where they differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The replication latency histograms (`ricochet_replication::latency`).
fn describe_replication() {
    use ricochet_replication::latency;
    describe_histogram!(
        latency::LOG_APPEND,
        "A Raft log append on this broker (leader or follower) until durable: in sync mode written and fdatasynced."
    );
    describe_histogram!(
        latency::APPEND_ENTRIES,
        "An AppendEntries with entries from this broker as leader to one follower (label peer), until its answer."
    );
    describe_histogram!(
        latency::APPLY,
        "One batch of committed Raft entries applied to this broker's state."
    );
    describe_histogram!(
        latency::COMMIT,
        "A write this broker proposed as leader, from the proposal to committed by a majority and applied here."
    );
}

/// Tiered storage's series (`crate::storage::tiered`).
fn describe_tiered() {
    describe_counter!(
        "ricochet_tiered_offloaded_bytes_total",
        "Segment bytes written to the object store and verified."
    );
    describe_counter!(
        "ricochet_tiered_offloaded_segments_total",
        "Segments offloaded and verified."
    );
    describe_counter!(
        "ricochet_tiered_offload_errors_total",
        "Offload attempts that failed (the object store down or refusing)."
    );
    describe_gauge!(
        "ricochet_tiered_offload_lag_seconds",
        "Age of the oldest sealed segment the offload policy says to offload and is not yet offloaded."
    );
    describe_gauge!(
        "ricochet_tiered_offload_pending_bytes",
        "Bytes of sealed segments due for offload and not yet offloaded."
    );
    describe_counter!(
        "ricochet_tiered_read_bytes_total",
        "Bytes read back from the object store (ranged GETs)."
    );
    describe_histogram!(
        "ricochet_tiered_read_seconds",
        "Latency of one ranged GET from the object store."
    );
    describe_counter!(
        "ricochet_tiered_read_errors_total",
        "Reads from the object store that failed (not damage: that is DATA_LOSS)."
    );
    describe_counter!(
        "ricochet_tiered_cache_hits_total",
        "Tiered reads served from the block cache alone."
    );
    describe_gauge!(
        "ricochet_tiered_cache_bytes",
        "Bytes of object blocks held in the tiered read cache."
    );
    describe_counter!(
        "ricochet_tiered_delete_errors_total",
        "Unreferenced objects that could not be deleted (left in the store)."
    );
}
