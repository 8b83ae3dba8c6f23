//! The Ricochet broker, as a library.
//!
//! A durable, Pulsar-style broker whose distinguishing feature is failure
//! handling: persisted delivery counts, and broker-owned retry and
//! dead-letter tiers driven by a [`ricochet_policy::DeadLetterPolicy`]. It
//! runs standalone (the default) or as one of several brokers sharing
//! topics through etcd ([`cluster`]); each topic's data lives on the one
//! broker that owns it.
//!
//! Map of the crate (see `ARCHITECTURE.md` at the top of the repository for
//! the path of a publish, a delivery and a failure):
//! * `server`: [`Broker`] (open, serve, shut down) and [`TestBroker`];
//!   `connections`: connection and per-connection call limits, idle timeout;
//! * `core`: [`BrokerCore`], the registry of topics and subscriptions; it
//!   knows nothing of the features below, which give it hooks;
//! * `node`: [`Node`], the core composed with authorization, partitioned
//!   topics, retention and the cluster: what the services receive;
//! * `topic`: a topic's writer and retention;
//! * `subscription`: the actor that dispatches, acks, counts failures and
//!   moves messages between tiers, split by concern;
//! * `scheduler`: persisted due times with a near-term timer window;
//! * [`storage`]: the `ricochet-storage` crate, re-exported: the storage trait, its records, sled and in-memory engines;
//! * `keeper`: the manifest (id reservations, what the store must hold);
//! * `flusher`: group commit; `disk`: free space on the data directory
//!   (publishes refused on a full disk, resumed once space returns); `service`: the gRPC services (the only place
//!   that knows protobuf requests and gRPC statuses);
//! * `metrics`: the Prometheus series; `failure_log`: the periodic summary
//!   of retries and dead letters in the log; [`clock`]: injected wall time;
//! * `tier_owners`: which subscription owns each tier name; `limits`: what
//!   clients may create or hold open;
//! * `partitions`: partitioned topics (counts, names); [`retention`]:
//!   retention policies and backlog quotas; `replay_jobs`: durable paced
//!   dead-letter replays;
//! * [`check`]: `ricochet-broker check`, verifying a stopped store;
//! * [`console`]: serves the web console (`ricochet-console`) over the
//!   broker's own authenticated, guarded admin services;
//! * [`tls`]: TLS and mTLS on the listener;
//! * [`gate`]: the RPC table (each RPC's permission, scope, route and
//!   audit line) every service runs behind;
//! * [`auth`]: tokens, grants and the permission check;
//! * [`cluster`]: cluster mode (membership, placement and fenced ownership
//!   of topics through etcd);
//! * [`replication`]: a partition's state changes as Raft commands, applied
//!   through [`storage::Storage`], and topics created with a factor above 1
//!   in cluster mode (issue 22, first slice);
//! * `config`, `name`, `error`, `util`.
//!
//! ```no_run
//! # async fn run() -> Result<(), ricochet_broker::BrokerError> {
//! use ricochet_broker::{Broker, BrokerConfig};
//! let broker = Broker::builder(BrokerConfig::for_dir("/tmp/ricochet")).open().await?;
//! broker.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```

// The package denies unsafe code rather than forbidding it, for the one
// call into the allocator the binary makes (src/main.rs); the library has
// none.
#![forbid(unsafe_code)]

pub mod auth;
mod backpressure;
pub mod check;
pub mod clock;
mod config;
mod connections;
pub mod console;
mod core;
mod disk;
mod error;
pub mod events;
mod events_route;
mod failure_log;
mod flusher;
pub mod gate;
mod idle;
mod keeper;
mod limits;
mod metrics;
mod name;
mod node;
mod ns_shared;
mod offload_policies;
mod partitions;
pub mod process;
mod replay_jobs;
pub mod replication;
pub mod retention;
mod scheduler;
mod server;
mod service;
mod status;
pub use ricochet_storage as storage;
mod subscription;
mod tier_owners;
pub mod tls;
mod topic;
mod transfer;
mod util;

pub use config::{BrokerConfig, Durability, LogEngine, LogFormat, PolicyRule, VerifyOnStart};
pub use core::{BrokerCore, Hooks, Placement, ReservedNames, TopicEntry, TopicOpened};
pub use error::{BrokerError, Result};
pub use flusher::Flusher;
pub use metrics::{install_prometheus, install_prometheus_secured};
pub use name::{SubscriptionName, TopicName};
pub use node::Node;
pub use scheduler::{FireSender, Fired, PREFETCH_LEAD, Scheduler, SchedulerStats};
pub use server::{Broker, BrokerBuilder, TestBroker};
pub use service::{
    AdminService, BrokerService, CallerRole, ClusterService, OWNER_TRAILER, OWNER_URL_TRAILER,
};
pub use subscription::{
    BrokerLink, ConsumerEvent, ConsumerId, ConsumerRequest, ConsumerSpec, ConsumerStats,
    ConsumerTx, DueBucket, FailedItem, MessageRef, MessageState, MessageStatus, Outcome,
    PolicyInfo, SubscriptionDeps, SubscriptionHandle, SubscriptionStats,
};
pub use tier_owners::TierOverrides;
pub use topic::{Topic, TopicCounters, Written};
