//! What can go wrong below the [`Storage`](super::Storage) trait.
//!
//! Kept apart from [`BrokerError`](crate::BrokerError) so the storage
//! interface carries no gRPC notion: the engine's own error stays the
//! `source`, and the service layer alone decides what a client is told.

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The engine (sled) failed; after an I/O error it refuses further work.
    #[error("storage engine error: {0}")]
    Engine(sled::Error),
    /// A file beside the engine's (the manifest) could not be read or written.
    #[error("storage i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A stored record or frame that does not decode.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Something that must exist is not there (an entry a cursor points at).
    #[error("missing from storage: {0}")]
    Missing(String),
    /// The object store of tiered storage failed (down, refused, timed
    /// out): the read or offload may be retried; nothing is lost.
    #[error("object store unavailable: {0}")]
    Remote(String),
    /// A flush failed earlier: the store refuses writes for good.
    #[error("storage failed to flush; the broker refuses writes")]
    Unhealthy,
    /// A replicated partition's write was not committed by its group (no
    /// majority, not the leader, timed out) or has no replicated form.
    #[error("replication: {0}")]
    Replication(String),
}

impl From<sled::Error> for StorageError {
    /// sled's own checksum failures are damage like ours: `Corrupt`.
    fn from(e: sled::Error) -> Self {
        match e {
            sled::Error::Corruption { at, .. } => StorageError::Corrupt(match at {
                Some(at) => format!("sled found damaged data at {at:?}"),
                None => "sled found damaged data".to_owned(),
            }),
            // A file sled expects is gone (a blob): damage too.
            sled::Error::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                StorageError::Corrupt(format!("a file of the store is missing ({e})"))
            }
            other => StorageError::Engine(other),
        }
    }
}

impl StorageError {
    /// Whether the engine failed on a full disk.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StorageError::Engine(sled::Error::Io(e)) | StorageError::Io(e) => {
                e.kind() == std::io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

impl From<prost::DecodeError> for StorageError {
    fn from(e: prost::DecodeError) -> Self {
        StorageError::Corrupt(e.to_string())
    }
}

impl StorageError {
    /// A blocking storage task that did not finish (it panicked or was
    /// cancelled).
    pub(crate) fn joined(e: tokio::task::JoinError) -> Self {
        StorageError::Io(std::io::Error::other(e))
    }
}

/// Result alias for storage operations.
pub type StorageResult<T> = std::result::Result<T, StorageError>;
