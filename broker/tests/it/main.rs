//! The broker's integration tests, one binary (one module per former test file, so the
//! workspace links one test binary per crate instead of one per file). `logs.rs` and
//! `metrics_token.rs` stay binaries of their own: each installs a process-wide recorder (the
//! tracing subscriber, the Prometheus exporter) that would see every other test's broker.

mod auth;
mod backpressure;
mod bad_input;
mod blocked;
mod breaker;
mod cluster;
mod common;
mod console_auth;
mod console_browser;
mod console_http;
mod console_partitioned;
mod corruption;
mod crash_dedup;
mod crash_moves;
mod crash_replay;
mod delays;
mod deletes;
mod disk_full;
mod dlq_listing;
mod dlq_replay;
mod durability;
mod example_config;
mod failure_events;
mod held_layout;
mod held_window;
mod hostile;
mod ids_across_crashes;
mod metrics;
mod ownership;
mod partitions;
mod process;
mod raft;
mod raft_partition;
mod raft_snapshot;
mod raft_storage;
mod raft_upgrade;
mod retention;
mod retry_refs;
mod retry_tiers;
mod segment_log;
mod signals;
mod storage_contract;
mod subscriptions;
mod tiered;
mod tiered_crash;
mod tls;
