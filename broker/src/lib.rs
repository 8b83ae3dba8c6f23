//! The Ricochet broker, as a library.
//!
//! A durable, single-node, Pulsar-style broker whose distinguishing feature is
//! failure handling: persisted delivery counts, and broker-owned retry and
//! dead-letter tiers driven by a [`ricochet_policy::DeadLetterPolicy`].
//!
//! Map of the crate:
//! * [`server`]: [`Broker`] (open, serve, shut down) and [`TestBroker`];
//! * [`core`]: the registry of topics and subscriptions;
//! * [`topic`]: a topic's writer and retention; [`subscription`]: the actor that
//!   dispatches, acks, counts failures and moves messages between tiers;
//! * [`scheduler`]: persisted due times with a near-term timer window;
//! * [`storage`]: the storage trait and its sled implementation;
//! * [`flusher`]: group commit; [`service`]: the gRPC services;
//! * [`metrics`]: the Prometheus series;
//! * [`config`], [`name`], [`error`], [`util`].
//!
//! ```no_run
//! # async fn run() -> Result<(), ricochet_broker::BrokerError> {
//! use ricochet_broker::{Broker, BrokerConfig};
//! let broker = Broker::builder(BrokerConfig::for_dir("/tmp/ricochet")).open().await?;
//! broker.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
//! # Ok(()) }
//! ```

pub mod config;
pub mod core;
pub mod error;
pub mod flusher;
pub mod metrics;
pub mod name;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod storage;
pub mod subscription;
pub mod topic;
pub mod util;

pub use config::{BrokerConfig, Durability};
pub use error::BrokerError;
pub use server::{Broker, BrokerBuilder, TestBroker};
