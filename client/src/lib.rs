//! The async Rust client for Ricochet, a Pulsar-style message broker built
//! around failure handling.
//!
//! * [`Client`]: one HTTP/2 connection, cheap to clone, shared by every
//!   producer and consumer made from it; [`Client::admin`] gives the typed
//!   admin API, [`Admin`] (module [`admin`]).
//!   Against a cluster of brokers it looks each topic up ([`Client::lookup`])
//!   and opens the topic's streams on its owner, following ownership moves.
//! * [`Producer`]: batched, pipelined sends with per-message receipts and
//!   transparent, de-duplicated resends after a reconnect.
//! * [`Consumer`]: flow-controlled delivery, grouped acks, an ack-timeout
//!   tracker, a negative-ack tracker driven by the subscription's
//!   [`DeadLetterPolicy`](ricochet_policy::DeadLetterPolicy),
//!   `reconsume_later` (broker-side retry tier) and `terminate` (straight to
//!   the dead-letter tier), and transparent resubscription.
//!
//! # Quickstart
//!
//! ```no_run
//! use std::time::Duration;
//! use ricochet_client::{Client, InitialPosition, OutgoingMessage, SubscriptionType};
//! use ricochet_policy::{MultiplierBackoff, PolicySpec};
//!
//! # async fn run() -> ricochet_client::Result<()> {
//! let client = Client::connect("http://127.0.0.1:6650").await?;
//!
//! let producer = client.producer("orders").create().await?;
//! let id = producer.send("hello").await?;                  // waits for the receipt
//! let mut receipts = Vec::new();
//! for i in 0..100 {
//!     // Queued at once (waits only while the producer's queue is full).
//!     receipts.push(producer.send_async(format!("order {i}")).await?);
//! }
//! for r in receipts {
//!     r.await?;                                            // pipelined
//! }
//! producer.send(OutgoingMessage::builder("later").key("k1").deliver_after(Duration::from_secs(5))).await?;
//!
//! let mut consumer = client
//!     .consumer("orders")
//!     .subscription("billing")
//!     .subscription_type(SubscriptionType::Shared)
//!     .initial_position(InitialPosition::Earliest)
//!     .ack_timeout(Duration::from_secs(30))
//!     // 1 s, 2 s, 4 s ... (capped at 1 min), then the dead-letter topic after 5 failures.
//!     .policy(PolicySpec::multiplier_backoff(
//!         MultiplierBackoff { min: Duration::from_secs(1), max: Duration::from_secs(60), ..Default::default() },
//!         5,
//!     ))
//!     .subscribe()
//!     .await?;
//! loop {
//!     let msg = consumer.receive().await?;
//!     if msg.payload().starts_with(b"order") {
//!         consumer.ack(&msg).await?;
//!     } else {
//!         consumer.nack_with_reason(&msg, "not an order").await?;
//!     }
//!     # break;
//! }
//! consumer.close().await?;
//! # let _ = id;
//! # Ok(()) }
//! ```
//!
//! # Failure handling, in one paragraph
//!
//! A [`nack`](Acker::nack) is held by the client for the delay the policy
//! gives the message's next attempt, then sent back; the broker counts the
//! attempt (persistently) and redelivers at once or dead-letters. A
//! [`reconsume_later`](Acker::reconsume_later) is sent at once (queued like
//! an ack: [`flush`](Acker::flush) confirms it, or each call waits with ack
//! receipts); the broker moves the message into the subscription's retry
//! tier and delivers it when due. An unacked message past the [ack timeout](ConsumerBuilder::ack_timeout)
//! is sent back like a nack. [`terminate`](Acker::terminate) dead-letters.

#![warn(missing_docs)]

pub mod admin;
mod client;
mod consumer;
mod credentials;
mod error;
mod ids;
mod message;
mod partitions;
mod producer;
mod reconnect;
mod tls_probe;
#[doc(hidden)]
pub mod tracker;

pub use admin::Admin;
pub use client::TopicOwner;
pub use client::{Client, ClientBuilder, ClientConfig};
pub use consumer::{
    Acker, Consumer, ConsumerBuilder, ConsumerConfig, ConsumerPolicy, InitialPosition,
    SubscriptionType,
};
pub use credentials::Credentials;
/// Not part of the API (no semver promise): the type of
/// [`Client::transport`], tonic's.
#[doc(hidden)]
pub use credentials::Transport;
pub use error::{Error, ErrorKind, Redirect, Result};
pub use message::{Message, MessageBuilder, MessageId, OutgoingMessage};
pub use producer::{Producer, ProducerBuilder, ProducerConfig, ProducerStats, Receipt};
pub use tls_probe::{speaks_tls, tls_advice};

/// Re-exported for convenience: the policy vocabulary the consumer takes.
pub use ricochet_policy::{DeadLetterPolicy, KeyOrder, PolicySpec};
/// Re-exported: the generated protocol types (the admin API's answers are
/// among them, re-exported again under their names in [`admin`]).
pub use ricochet_proto as proto;

/// Not part of the API (no semver promise): for the `ricochet` CLI and
/// tests, which still call generated gRPC clients themselves and want their
/// statuses as this crate's [`Error`].
#[doc(hidden)]
pub mod __private {
    /// The [`Error`](crate::Error) a failed call's status stands for.
    pub fn error_from_status(status: tonic::Status) -> crate::Error {
        crate::Error::from_status(status)
    }
}

/// A process-unique, hard-to-collide suffix for generated names.
pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}-{n}", rand::random::<u64>())
}
