//! Raft groups for replicated partitions (issue 22), on openraft 0.9.
//!
//! A partition with replication factor R is one Raft group of R nodes
//! (brokers). This crate owns what every group needs and knows nothing of
//! topics: the openraft type configuration ([`TypeConfig`]: a command is
//! opaque bytes the broker encodes), the durable log (segment files)
//! and vote (sled) ([`log_store`]), the state machine that hands committed commands to an
//! [`Apply`] implementation and remembers what it applied
//! ([`state_machine`]), the `Replication` gRPC service and its client
//! ([`network`]; the code generated from this crate's own `.proto` is
//! [`proto`]), [`ReplicaNode`], which starts a group's Raft on one
//! broker ([`node`]), and snapshot files ([`snapshot`]: a state machine's
//! applied state, so the log can be purged and a member far behind, or
//! new, catches up from it), and the latency histograms it exports
//! ([`latency`]). The broker's side — which commands exist and how
//! they are applied through its `Storage` trait — lives in
//! `ricochet_broker::replication`.

mod codec;
mod error;
pub mod latency;
pub mod log_store;
pub mod network;
pub mod node;
pub mod snapshot;
pub mod state_machine;
mod takeover;

/// The `Replication` service's generated code (package
/// `ricochet.replication.v1`, compiled by this crate's `build.rs`): the
/// bodies ([`proto::RaftRequest`], [`proto::RaftReply`]), the server and
/// the client. A broker-to-broker service, not part of
/// `ricochet_proto::FILE_DESCRIPTOR_SET`.
pub mod proto {
    #![allow(clippy::all, missing_docs, missing_debug_implementations)]
    include!(concat!(env!("OUT_DIR"), "/ricochet.replication.v1.rs"));
}

pub use codec::{decode, encode, encode_into, encode_sized};
pub use error::{ReplicationError, Result};
pub use network::{
    GroupRegistry, PeerCall, PeerGuard, PeerTransport, ReplicationService, claimed_node,
};
pub use node::{Durability, NodeSettings, Progress, RaftDb, ReplicaNode, open_db, remove_group};
pub use state_machine::{Apply, SnapshotWriter};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A node's id within its group (a broker's numeric id).
pub type NodeId = u64;

/// A state change for the group's state machine: bytes the broker encoded
/// (`ricochet_broker::replication::PartitionCommand`).
///
/// Held as [`Bytes`], so an entry cloned out of the log store's cache of
/// recent entries (replication to each follower, the apply) shares the
/// batch rather than copying it. Encoded as before (one CBOR byte string,
/// what `#[serde(with = "serde_bytes")] Vec<u8>` wrote), so logs and
/// messages of earlier brokers decode unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command(pub Bytes);

/// [`Command`]'s encoding: a newtype `Command` around a byte string.
#[derive(Serialize)]
#[serde(rename = "Command")]
struct CommandRef<'a>(#[serde(with = "serde_bytes")] &'a [u8]);

/// [`Command`] as decoded (the byte string, owned).
#[derive(Deserialize)]
#[serde(rename = "Command")]
struct CommandBuf(#[serde(with = "serde_bytes")] Vec<u8>);

impl Serialize for Command {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        CommandRef(&self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        CommandBuf::deserialize(d).map(|c| Command(Bytes::from(c.0)))
    }
}

impl Command {
    /// About how many bytes this command takes encoded (a size hint for
    /// the buffers it is encoded into).
    pub fn encoded_size(&self) -> usize {
        self.0.len() + 16
    }
}

/// What applying a [`Command`] answered (the broker's encoded reply).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(#[serde(with = "serde_bytes")] pub Vec<u8>);

openraft::declare_raft_types!(
    /// The openraft types of a replicated partition's group.
    pub TypeConfig:
        D = Command,
        R = Reply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A group's Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;
