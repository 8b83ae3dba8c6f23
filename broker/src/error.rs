//! The broker's one error type and its mapping to gRPC statuses.

use tonic::{Code, Status};

/// Everything that can go wrong inside the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A topic or subscription name that does not parse.
    #[error("{0}")]
    InvalidName(String),
    /// A request that is malformed or breaks a rule (oversize payload, bad ack, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// The topic does not exist and auto-creation is off.
    #[error("topic {0} not found")]
    TopicNotFound(String),
    /// The subscription does not exist.
    #[error("subscription {subscription} on {topic} not found")]
    SubscriptionNotFound {
        /// Topic name.
        topic: String,
        /// Subscription name.
        subscription: String,
    },
    /// The topic already exists.
    #[error("topic {0} already exists")]
    TopicExists(String),
    /// The request conflicts with current state (a second Exclusive consumer, a
    /// subscription type mismatch, deleting a topic in use, ...).
    #[error("{0}")]
    Conflict(String),
    /// A dead-letter policy that does not validate.
    #[error("invalid dead-letter policy: {0}")]
    Policy(#[from] ricochet_policy::PolicyError),
    /// The storage engine failed; the broker stops accepting writes.
    #[error("storage error: {0}")]
    Storage(String),
    /// A persisted record that cannot be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The broker is shutting down or a component it needs is gone.
    #[error("broker is shutting down")]
    ShuttingDown,
    /// An I/O error outside storage (binding a socket, reading config).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A configuration file that does not parse.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl From<sled::Error> for BrokerError {
    fn from(e: sled::Error) -> Self {
        BrokerError::Storage(e.to_string())
    }
}

impl From<prost::DecodeError> for BrokerError {
    fn from(e: prost::DecodeError) -> Self {
        BrokerError::Corrupt(e.to_string())
    }
}

impl BrokerError {
    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            BrokerError::InvalidName(_)
            | BrokerError::InvalidArgument(_)
            | BrokerError::Policy(_) => Code::InvalidArgument,
            BrokerError::TopicNotFound(_) | BrokerError::SubscriptionNotFound { .. } => {
                Code::NotFound
            }
            BrokerError::TopicExists(_) => Code::AlreadyExists,
            BrokerError::Conflict(_) => Code::FailedPrecondition,
            BrokerError::ShuttingDown => Code::Unavailable,
            BrokerError::Storage(_)
            | BrokerError::Corrupt(_)
            | BrokerError::Io(_)
            | BrokerError::Config(_) => Code::Internal,
        }
    }
}

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

/// Result alias for the broker.
pub type Result<T, E = BrokerError> = std::result::Result<T, E>;
