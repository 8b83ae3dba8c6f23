//! The cluster's error type. Its messages are the ones clients see: the
//! broker turns each variant into its own error of the same name and text
//! (`From<ClusterError> for BrokerError`), and the broker's one status
//! mapping decides the gRPC code and the structured details.

/// Everything that can go wrong in cluster mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// A request that breaks a rule (a partitioned topic's base name
    /// addressed as a topic, lowering a partition count, a bad move target).
    #[error("{0}")]
    InvalidArgument(String),
    /// No partitioned topic of that name.
    #[error("topic {0} not found")]
    TopicNotFound(String),
    /// The topic (or a partitioned topic of that name) exists already.
    #[error("topic {0} already exists")]
    TopicExists(String),
    /// The request conflicts with the cluster's state (a topic moving
    /// already, or no longer placed here).
    #[error("{0}")]
    Conflict(String),
    /// Cluster settings that cannot work (`[cluster]`, `--etcd`).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The topic is placed on (owned by) another broker.
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
    /// The broker the topic is placed on is down.
    #[error(
        "topic {topic} is placed on broker {owner}, which is down (it holds no etcd lease); the topic is unavailable until that broker returns"
    )]
    OwnerDown {
        /// The topic.
        topic: String,
        /// The broker it is placed on.
        owner: String,
    },
    /// This broker's lease deadline passed (or etcd expired its lease), so
    /// it acknowledges nothing until it holds a lease again.
    #[error("broker {0} lost its etcd lease")]
    Fenced(String),
    /// The topic is being moved to another broker (a drain or a move);
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
    /// etcd failed or did not answer in time.
    #[error("etcd: {0}")]
    Etcd(String),
}

/// Result alias for the cluster.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
