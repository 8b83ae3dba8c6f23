//! The one mapping from broker errors to gRPC status codes.

use crate::error::BrokerError;
use crate::storage::StorageError;
use tonic::{Code, Status};

/// The gRPC code a client is told for `e`.
pub fn code_of(e: &BrokerError) -> Code {
    match e {
        BrokerError::InvalidName(_) | BrokerError::InvalidArgument(_) | BrokerError::Policy(_) => {
            Code::InvalidArgument
        }
        BrokerError::TopicNotFound(_) | BrokerError::SubscriptionNotFound { .. } => Code::NotFound,
        BrokerError::TopicExists(_) => Code::AlreadyExists,
        BrokerError::Conflict(_) => Code::FailedPrecondition,
        BrokerError::ShuttingDown => Code::Unavailable,
        BrokerError::Storage(StorageError::Corrupt(_) | StorageError::Missing(_))
        | BrokerError::DataLoss(_) => Code::DataLoss,
        BrokerError::Storage(
            StorageError::Engine(_) | StorageError::Io(_) | StorageError::Unhealthy,
        )
        | BrokerError::Io(_)
        | BrokerError::Config(_) => Code::Internal,
    }
}

/// The status for `e`: its code and its message.
pub fn status_of(e: &BrokerError) -> Status {
    Status::new(code_of(e), e.to_string())
}

impl From<BrokerError> for Status {
    fn from(e: BrokerError) -> Self {
        status_of(&e)
    }
}

impl From<StorageError> for Status {
    fn from(e: StorageError) -> Self {
        BrokerError::from(e).into()
    }
}
