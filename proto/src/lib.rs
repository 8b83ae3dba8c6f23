//! Ricochet's wire protocol.
//!
//! The `.proto` files under `proto/ricochet/v1/` define three things: value
//! types ([`v1::MessageId`], [`v1::Message`], [`v1::DeadLetterPolicyConfig`] …),
//! the data plane ([`v1::broker_server`]: producer and consumer streams) and the
//! control plane ([`v1::admin_server`]: topics, subscriptions, policies, dead
//! letters). This crate only holds the generated code and a few helpers on it;
//! conversions to richer types live with those types, except those to
//! `ricochet-policy`'s types, which live in [`convert`] so that the policy
//! crate stays free of tonic and prost. The servers decode requests with
//! [`codec::RequestCodec`]: a request that is not valid protobuf is
//! `INVALID_ARGUMENT`.

#![allow(missing_debug_implementations)]

/// Generated protobuf and gRPC code for package `ricochet.v1`: messages and
/// servers (whose codec is [`codec::RequestCodec`]), then clients.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/ricochet.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/client/ricochet.v1.rs"));
}

/// The encoded `FileDescriptorSet` of every `.proto` file (a
/// `prost_types::FileDescriptorSet`), to enumerate services and RPCs.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ricochet_descriptor.bin"));

pub use names::{MAX_GRPC_MESSAGE_BYTES, UnknownName, counted_size};
pub use v1::*;

pub mod breaker;
pub mod codec;
pub mod convert;
pub mod error_details;
mod names;
pub mod partitions;

/// Properties Ricochet (like Pulsar) sets on messages that move between tiers.
pub mod props {
    /// The topic the message was first published to.
    pub const REAL_TOPIC: &str = "REAL_TOPIC";
    /// `topic:entry_id` of the message in its original topic.
    pub const ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
    /// How many times the message has been reconsumed (failed attempts).
    pub const RECONSUME_TIMES: &str = "RECONSUMETIMES";
    /// The delay applied before this delivery, in milliseconds.
    pub const DELAY_TIME: &str = "DELAY_TIME";
    /// Why the message was dead-lettered.
    pub const DEAD_LETTER_REASON: &str = "DEAD_LETTER_REASON";
}
