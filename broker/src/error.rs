//! The broker's error type. What a client is told for each (its gRPC status)
//! is decided in one place, [`crate::service`].

use crate::storage::StorageError;

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
    /// Storage failed, or holds something it cannot read back.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The caller may not do this (a dead-letter tier read without saying so).
    #[error("{0}")]
    PermissionDenied(String),
    /// A configured limit would be exceeded (topics, subscriptions,
    /// connections, streams); the message names the setting.
    #[error("{0}")]
    LimitReached(String),
    /// The broker is shutting down or a component it needs is gone.
    #[error("broker is shutting down")]
    ShuttingDown,
    /// An I/O error outside storage (binding a socket, reading config).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A configuration file that does not parse.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Cluster mode: the topic is placed on (owned by) another broker. The
    /// status carries the owner, its URL and epoch as structured details
    /// (`status::status_of`).
    #[error("topic {topic} is owned by broker {owner}")]
    NotOwner {
        /// The topic.
        topic: String,
        /// The broker it is placed on.
        owner: String,
        /// Its advertised URL, when it is live.
        url: Option<String>,
        /// The fencing epoch of its claim, when it holds one.
        epoch: Option<u64>,
    },
    /// Cluster mode: the broker the topic is placed on is down.
    #[error(
        "topic {topic} is placed on broker {owner}, which is down (it holds no etcd lease); the topic is unavailable until that broker returns"
    )]
    OwnerDown {
        /// The topic.
        topic: String,
        /// The broker it is placed on.
        owner: String,
    },
    /// Cluster mode: this broker's lease deadline passed (or etcd expired
    /// its lease), so it acknowledges nothing until it holds a lease again.
    #[error("broker {0} lost its etcd lease")]
    Fenced(String),
    /// Cluster mode: the topic is being moved to another broker (a drain);
    /// clients look it up again shortly.
    #[error("topic {topic} is moving from broker {from} to broker {to}; look it up again")]
    Moving {
        /// The topic.
        topic: String,
        /// This broker.
        from: String,
        /// Where it goes.
        to: String,
    },
    /// Cluster mode: another broker could not be reached or refused a
    /// broker-to-broker call (a topic being moved to it).
    #[error("broker to broker: {0}")]
    Peer(String),
    /// Cluster mode: etcd failed or did not answer in time.
    #[error("etcd: {0}")]
    Etcd(String),
    /// The data directory's filesystem has less than `min_free_space` free
    /// (or sled met a full disk); the message names the directory and the
    /// space left.
    #[error("{0}")]
    DiskFull(String),
    /// The store lacks what its manifest says it must hold (or cannot be
    /// verified): the broker refuses to start on it.
    #[error("refusing to start: the store is damaged or incomplete: {0}")]
    DataLoss(String),
}

/// The cluster's errors are the broker's of the same name and text, so what
/// a client is told for them (code, message, structured details) is
/// decided by the broker's one status mapping, as for every other error.
impl From<ricochet_cluster::ClusterError> for BrokerError {
    fn from(e: ricochet_cluster::ClusterError) -> Self {
        use ricochet_cluster::ClusterError as C;
        match e {
            C::InvalidArgument(m) => Self::InvalidArgument(m),
            C::TopicNotFound(t) => Self::TopicNotFound(t),
            C::TopicExists(t) => Self::TopicExists(t),
            C::Conflict(m) => Self::Conflict(m),
            C::Config(m) => Self::Config(m),
            C::NotOwner {
                topic,
                owner,
                url,
                epoch,
            } => Self::NotOwner {
                topic,
                owner,
                url,
                epoch,
            },
            C::OwnerDown { topic, owner } => Self::OwnerDown { topic, owner },
            C::Fenced(broker) => Self::Fenced(broker),
            C::Moving { topic, from, to } => Self::Moving { topic, from, to },
            C::Etcd(m) => Self::Etcd(m),
        }
    }
}

/// Result alias for the broker.
pub type Result<T, E = BrokerError> = std::result::Result<T, E>;
