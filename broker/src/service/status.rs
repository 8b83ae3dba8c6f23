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
        BrokerError::LimitReached(_) | BrokerError::DiskFull(_) => Code::ResourceExhausted,
        BrokerError::PermissionDenied(_) => Code::PermissionDenied,
        BrokerError::ShuttingDown
        | BrokerError::OwnerDown { .. }
        | BrokerError::Fenced(_)
        | BrokerError::Moving { .. }
        | BrokerError::Peer(_)
        | BrokerError::Etcd(_) => Code::Unavailable,
        BrokerError::NotOwner { .. } => Code::FailedPrecondition,
        // sled met a full disk (the free-space guard was overrun).
        BrokerError::Storage(e) if e.is_disk_full() => Code::ResourceExhausted,
        BrokerError::Storage(StorageError::Corrupt(_) | StorageError::Missing(_))
        | BrokerError::DataLoss(_) => Code::DataLoss,
        BrokerError::Storage(
            StorageError::Engine(_) | StorageError::Io(_) | StorageError::Unhealthy,
        )
        | BrokerError::Io(_)
        | BrokerError::Config(_) => Code::Internal,
    }
}

/// Characters of an error message a client is sent at most. Messages quote
/// client input already cut short (`util::echo`); this bounds the rest, so
/// no message can outgrow the peer's header limit (it travels in the
/// `grpc-message` header).
const MAX_MESSAGE_CHARS: usize = 1024;

/// The message a client is told for `e`.
pub fn message_of(e: &BrokerError) -> String {
    crate::util::truncate(&e.to_string(), MAX_MESSAGE_CHARS).into_owned()
}

/// The trailer naming the broker that owns a topic (cluster mode).
pub const OWNER_TRAILER: &str = "ricochet-owner";
/// The trailer with the owner's advertised URL (absent when it is down).
pub const OWNER_URL_TRAILER: &str = "ricochet-owner-url";

/// The status for `e`: its code and its message; a topic owned by another
/// broker also names it in the `ricochet-owner` and `ricochet-owner-url`
/// trailers.
pub fn status_of(e: &BrokerError) -> Status {
    let mut status = Status::new(code_of(e), message_of(e));
    if let BrokerError::NotOwner { owner, url, .. } = e {
        let md = status.metadata_mut();
        if let Ok(v) = owner.parse() {
            md.insert(OWNER_TRAILER, v);
        }
        if let Some(Ok(v)) = url.as_deref().map(str::parse) {
            md.insert(OWNER_URL_TRAILER, v);
        }
    }
    status
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_owned_elsewhere_names_its_owner_in_the_trailers() {
        let live = status_of(&BrokerError::NotOwner {
            topic: "persistent://a/b/t".into(),
            owner: "b2".into(),
            url: Some("http://10.0.0.2:6650".into()),
        });
        assert_eq!(live.code(), Code::FailedPrecondition);
        assert_eq!(
            live.message(),
            "topic persistent://a/b/t is owned by broker b2"
        );
        let md = live.metadata();
        assert_eq!(md.get(OWNER_TRAILER).unwrap(), "b2");
        assert_eq!(md.get(OWNER_URL_TRAILER).unwrap(), "http://10.0.0.2:6650");
        let down = status_of(&BrokerError::NotOwner {
            topic: "persistent://a/b/t".into(),
            owner: "b2".into(),
            url: None,
        });
        assert_eq!(down.metadata().get(OWNER_TRAILER).unwrap(), "b2");
        assert!(down.metadata().get(OWNER_URL_TRAILER).is_none());
        for e in [
            BrokerError::Fenced("b1".into()),
            BrokerError::OwnerDown {
                topic: "t".into(),
                owner: "b2".into(),
            },
            BrokerError::Etcd("timeout".into()),
        ] {
            assert_eq!(code_of(&e), Code::Unavailable, "{e}");
        }
    }
}
