//! The replication latency histograms a broker exports (through the
//! `metrics` facade; without an installed recorder, as in tests and
//! embedded brokers, each record is a no-op). Broker-wide, not per group:
//! a label per partition would multiply the series by the partitions.
//!
//! Together they say where a replicated write's time goes (the book's
//! "Session 25: where an R3 publish's 9 ms go" traced the same steps by
//! hand): [`LOG_APPEND`] on the leader and then on each follower (openraft
//! 0.9 replicates an entry only after the leader's own flush),
//! [`APPEND_ENTRIES`] per follower, [`APPLY`], and [`COMMIT`] around all
//! of it.

use std::time::Instant;

/// A Raft log append on this broker, as leader or follower, until it is
/// durable (`sync`: written and `fdatasync`ed; `interval`: written).
pub const LOG_APPEND: &str = "ricochet_raft_log_append_seconds";

/// An `AppendEntries` carrying entries (not a heartbeat) from this
/// broker as leader to one follower (label `peer`: its node id), until
/// its answer: the follower's append and flush included.
pub const APPEND_ENTRIES: &str = "ricochet_raft_append_entries_seconds";

/// One batch of committed entries applied to this broker's state machine.
pub const APPLY: &str = "ricochet_raft_apply_seconds";

/// A write this broker proposed as leader, from the proposal until it was
/// committed by a majority and applied here (what a replicated publish or
/// ack waits for before its receipt).
pub const COMMIT: &str = "ricochet_raft_commit_seconds";

/// Records the time since `started` in histogram `name`.
pub(crate) fn record(name: &'static str, started: Instant) {
    metrics::histogram!(name).record(started.elapsed());
}
