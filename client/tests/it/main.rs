//! The client's integration tests, one binary (one module per former test file).

mod ack_grouping;
mod admin;
mod cluster;
mod cluster_admin;
mod cluster_drain;
mod cluster_events;
mod cluster_routing;
mod common;
mod event_excerpts;
mod failures;
mod history;
mod key_order;
mod local_redelivery;
mod partitions;
mod producer_queue;
mod receipts;
mod reconnect;
mod replicated;
mod replicated_members;
mod replicated_moves;
mod replicated_partitions;
mod replicated_peerid;
mod replicated_retries;
mod replicated_secure;
mod replicated_transfer;
mod roundtrip;
