//! Cluster mode: several brokers coordinated through etcd
//! (`--cluster NAME --etcd URL --advertise URL`). Every topic (each
//! partition of a partitioned topic is a topic) is *placed* on one broker,
//! which keeps its data; it *owns* the topic while it holds its etcd lease,
//! and serves it only then. Any broker answers where a topic lives; a call
//! about a topic sent to another broker is refused with the owner's id and
//! URL ([`ClusterError::NotOwner`]). There is no replication in this step:
//! a broker that is down leaves its topics unavailable until it returns.
//!
//! etcd keys, all under `/ricochet/<cluster>/`:
//! * `brokers/<id>`: a [`membership::Registration`] (JSON), under the
//!   broker's lease;
//! * `placement/<topic>`: the id of the broker the topic's data lives on;
//!   persistent, written once ([`placement`]);
//! * `owners/<topic>`: the owner's id under its lease, created by a
//!   "create if absent" transaction; its create revision is the topic's
//!   fencing *epoch* ([`ownership`]);
//! * `partitioned/<topic>`: a partitioned topic's partition count.
//!
//! This crate owns all of it, split by concern: [`proto`] (etcd's v3 API
//! subset, compiled by this crate's `build.rs`), [`etcd`] (the typed etcd
//! client), [`membership`] (the registration and the local fence
//! deadline), [`placement`] (the pure choice of a broker), [`Cluster`]'s
//! state and shared reads (`cluster.rs`), joining and the lease loop
//! (`lease.rs`), [`ownership`] (claims, the in-memory table of owned
//! topics the hot path reads, lookups, partition counts), moves
//! (`moves.rs`: a topic leaving this broker, draining), the `[cluster]`
//! settings ([`ClusterConfig`]) and the one error type ([`ClusterError`]).
//!
//! It does not know the broker: what cluster mode needs of the broker it
//! runs in is [`Host`], which the broker's node implements, and topic names
//! arrive as the broker validated them. A standalone broker has no
//! [`Cluster`] at all: its hot path pays one `None` check.

mod cluster;
mod config;
mod error;
pub mod etcd;
mod lease;
pub mod membership;
mod moves;
pub mod ownership;
pub mod placement;
mod sync;

pub use cluster::Cluster;
pub use config::{ClusterConfig, valid_id};
pub use error::{ClusterError, Result};
pub use membership::{Advertised, SegmentRolls};
pub use ownership::{BrokerView, Owner, Tenure};

/// A minimal client of etcd's v3 API (KV Range/Put/DeleteRange/Txn and
/// the Lease calls), generated from Ricochet's own subset of etcd's
/// `rpc.proto` and `kv.proto` (same names and field numbers) by this
/// crate's `build.rs`; no other crate compiles it.
pub mod proto {
    /// etcd's `etcdserverpb` package: requests, responses, `kv_client` and
    /// `lease_client`.
    pub mod etcdserverpb {
        #![allow(clippy::all, missing_docs, missing_debug_implementations)]
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
    /// etcd's `mvccpb` package: [`mvccpb::KeyValue`].
    pub mod mvccpb {
        #![allow(clippy::all, missing_docs, missing_debug_implementations)]
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    pub use etcdserverpb::*;
    pub use mvccpb::KeyValue;
}

/// What [`Host::forget_moved`] fails with: the broker's own error, which
/// the cluster only logs.
pub type HostError = Box<dyn std::error::Error + Send + Sync>;

/// What cluster mode needs of the broker it runs in.
#[async_trait::async_trait]
pub trait Host: Send + Sync {
    /// The ordinary topics (not retry or dead-letter tiers) held here, by
    /// full name.
    async fn topics(&self) -> Vec<String>;
    /// Messages stored in those topics so far (the load figure).
    async fn messages_in(&self) -> u64;
    /// Deletes this broker's copy of a topic that lives elsewhere now,
    /// with everything that belongs to it.
    async fn forget_moved(&self, topic: &str) -> Result<(), HostError>;
}
