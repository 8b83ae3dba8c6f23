//! The crate's error type.

use crate::NodeId;

/// What can go wrong in a replica.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// The log store (sled) failed.
    #[error("replication log: {0}")]
    Log(#[from] sled::Error),
    /// A stored or received value did not decode.
    #[error("replication codec: {0}")]
    Codec(String),
    /// This node does not lead the group; `leader` does, if known.
    #[error("not the leader of group {group}{}", leader_text(*.leader, .leader_addr.as_deref()))]
    NotLeader {
        /// The group.
        group: String,
        /// The leader's node id, if known.
        leader: Option<NodeId>,
        /// The leader's address, if known.
        leader_addr: Option<String>,
    },
    /// The group's Raft stopped (a storage failure, or shut down).
    #[error("raft group {group} stopped: {message}")]
    Stopped {
        /// The group.
        group: String,
        /// Why.
        message: String,
    },
    /// The state machine refused a committed command (it named something
    /// that is not there, or did not decode); nothing was changed.
    #[error("refused: {0}")]
    Refused(String),
    /// Any other Raft failure (initialisation, membership).
    #[error("raft: {0}")]
    Raft(String),
    /// Binding or serving the Replication service failed.
    #[error("replication transport: {0}")]
    Transport(String),
    /// The state machine could not apply a committed command (its storage
    /// failed): the group stops on this node rather than diverge.
    #[error("apply: {0}")]
    Apply(String),
    /// I/O outside sled.
    #[error("replication I/O: {0}")]
    Io(#[from] std::io::Error),
}

fn leader_text(leader: Option<NodeId>, addr: Option<&str>) -> String {
    match (leader, addr) {
        (Some(l), Some(a)) => format!(" (leader: node {l} at {a})"),
        (Some(l), None) => format!(" (leader: node {l})"),
        _ => " (no leader known)".to_owned(),
    }
}

/// Results of this crate.
pub type Result<T, E = ReplicationError> = std::result::Result<T, E>;
