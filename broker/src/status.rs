//! The one mapping from broker errors to gRPC status codes.

use crate::error::BrokerError;
use crate::storage::StorageError;
use ricochet_proto::error_details::{self, Detail, Reason};
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
        | BrokerError::Etcd(_)
        | BrokerError::Storage(StorageError::Remote(_) | StorageError::Replication(_)) => {
            Code::Unavailable
        }
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
    let text = crate::util::truncate(&e.to_string(), MAX_MESSAGE_CHARS).into_owned();
    if reworded() {
        return reword(&text);
    }
    text
}

/// Test switch: with `RICOCHET_TEST_REWORD_ERRORS=1` in its environment a
/// broker words every error message differently (the words reversed), so
/// tests can prove that clients decide redirects and error kinds from the
/// status code and its structured details, never from the text. Read once;
/// unset, messages are as written.
fn reworded() -> bool {
    static REWORD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REWORD
        .get_or_init(|| std::env::var_os("RICOCHET_TEST_REWORD_ERRORS").is_some_and(|v| v == "1"))
}

/// `text` with its words in reverse order, marked as reworded.
fn reword(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().rev().collect();
    format!("[reworded] {}", words.join(" "))
}

/// The trailer naming the broker that owns a topic (cluster mode), kept
/// for clients older than the structured details ([`status_of`]).
pub const OWNER_TRAILER: &str = "ricochet-owner";
/// The trailer with the owner's advertised URL (absent when it is down),
/// kept for older clients.
pub const OWNER_URL_TRAILER: &str = "ricochet-owner-url";

/// The structured details of `e`, for the errors that are about where a
/// topic is served (cluster mode) or whether this broker serves at all.
pub fn detail_of(e: &BrokerError) -> Option<Detail> {
    Some(match e {
        BrokerError::NotOwner {
            topic,
            owner,
            url,
            epoch,
        } => Detail {
            topic: Some(topic.clone()),
            owner: Some(owner.clone()),
            owner_url: url.clone(),
            epoch: *epoch,
            ..Detail::new(Reason::NotOwner)
        },
        BrokerError::OwnerDown { topic, owner } => Detail {
            topic: Some(topic.clone()),
            owner: Some(owner.clone()),
            ..Detail::new(Reason::OwnerDown)
        },
        BrokerError::Fenced(broker) => Detail {
            owner: Some(broker.clone()),
            ..Detail::new(Reason::Fenced)
        },
        BrokerError::Moving { topic, from, to } => Detail {
            topic: Some(topic.clone()),
            owner: Some(from.clone()),
            moving_to: Some(to.clone()),
            ..Detail::new(Reason::Moving)
        },
        BrokerError::ShuttingDown => Detail::new(Reason::ShuttingDown),
        _ => return None,
    })
}

/// The status for `e`: its code and its message, and for the errors about
/// where a topic is served the structured details ([`detail_of`]: a
/// `google.rpc.ErrorInfo` with the reason, the owner's id, URL and epoch),
/// which clients decide from. A topic owned by another broker also names
/// it in the `ricochet-owner` and `ricochet-owner-url` trailers, for older
/// clients.
pub fn status_of(e: &BrokerError) -> Status {
    let mut status = match detail_of(e) {
        Some(d) => error_details::attach(code_of(e), message_of(e), &d),
        None => Status::new(code_of(e), message_of(e)),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_owned_elsewhere_names_its_owner_in_the_trailers() {
        let live = status_of(&BrokerError::NotOwner {
            topic: "persistent://a/b/t".into(),
            owner: "b2".into(),
            url: Some("http://10.0.0.2:6650".into()),
            epoch: Some(7),
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
            epoch: None,
        });
        assert_eq!(down.metadata().get(OWNER_TRAILER).unwrap(), "b2");
        assert!(down.metadata().get(OWNER_URL_TRAILER).is_none());
        let d = error_details::read(&live).expect("structured details");
        assert_eq!(d.reason, Reason::NotOwner);
        assert_eq!(d.owner.as_deref(), Some("b2"));
        assert_eq!(d.owner_url.as_deref(), Some("http://10.0.0.2:6650"));
        assert_eq!(d.epoch, Some(7));
        assert_eq!(d.topic.as_deref(), Some("persistent://a/b/t"));
        let d = error_details::read(&down).expect("structured details");
        assert_eq!((d.owner.as_deref(), d.owner_url), (Some("b2"), None));
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

    #[test]
    fn cluster_refusals_carry_their_reason_and_broker_as_details() {
        let cases = [
            (BrokerError::Fenced("b1".into()), Reason::Fenced, "b1"),
            (
                BrokerError::OwnerDown {
                    topic: "t".into(),
                    owner: "b2".into(),
                },
                Reason::OwnerDown,
                "b2",
            ),
            (
                BrokerError::Moving {
                    topic: "t".into(),
                    from: "b3".into(),
                    to: "b4".into(),
                },
                Reason::Moving,
                "b3",
            ),
        ];
        for (e, reason, owner) in cases {
            let d = error_details::read(&status_of(&e)).expect("details");
            assert_eq!((d.reason, d.owner.as_deref()), (reason, Some(owner)), "{e}");
        }
        let d = error_details::read(&status_of(&BrokerError::ShuttingDown)).unwrap();
        assert_eq!(d.reason, Reason::ShuttingDown);
        for e in [
            BrokerError::Etcd("timeout".into()),
            BrokerError::Conflict("an exclusive consumer".into()),
            BrokerError::TopicNotFound("t".into()),
        ] {
            assert_eq!(error_details::read(&status_of(&e)), None, "{e}");
        }
    }

    #[test]
    fn a_cluster_error_reaches_the_client_as_the_broker_error_of_its_name() {
        use ricochet_cluster::ClusterError as C;
        let not_owner = C::NotOwner {
            topic: "persistent://a/b/t".into(),
            owner: "b2".into(),
            url: Some("http://10.0.0.2:6650".into()),
            epoch: Some(7),
        };
        let cases = [
            (
                C::InvalidArgument("bad".into()),
                Code::InvalidArgument,
                None,
            ),
            (C::TopicNotFound("t".into()), Code::NotFound, None),
            (C::TopicExists("t".into()), Code::AlreadyExists, None),
            (C::Conflict("moving".into()), Code::FailedPrecondition, None),
            (C::Config("no etcd".into()), Code::Internal, None),
            (not_owner, Code::FailedPrecondition, Some(Reason::NotOwner)),
            (
                C::OwnerDown {
                    topic: "t".into(),
                    owner: "b2".into(),
                },
                Code::Unavailable,
                Some(Reason::OwnerDown),
            ),
            (
                C::Fenced("b1".into()),
                Code::Unavailable,
                Some(Reason::Fenced),
            ),
            (
                C::Moving {
                    topic: "t".into(),
                    from: "b3".into(),
                    to: "b4".into(),
                },
                Code::Unavailable,
                Some(Reason::Moving),
            ),
            (C::Etcd("timeout".into()), Code::Unavailable, None),
        ];
        for (e, code, reason) in cases {
            let text = e.to_string();
            let status = status_of(&BrokerError::from(e));
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text, "the message is the cluster's own");
            let got = error_details::read(&status).map(|d| d.reason);
            assert_eq!(got, reason, "{text}");
        }
        // The owner's trailers and details come through too.
        let status = status_of(&BrokerError::from(C::NotOwner {
            topic: "persistent://a/b/t".into(),
            owner: "b2".into(),
            url: Some("http://10.0.0.2:6650".into()),
            epoch: Some(7),
        }));
        assert_eq!(status.metadata().get(OWNER_TRAILER).unwrap(), "b2");
        let d = error_details::read(&status).unwrap();
        assert_eq!(
            (d.owner_url.as_deref(), d.epoch),
            (Some("http://10.0.0.2:6650"), Some(7))
        );
    }

    #[test]
    fn reworded_messages_keep_no_original_sentence() {
        let r = reword("topic t is owned by broker b2");
        assert_eq!(r, "[reworded] b2 broker by owned is t topic");
        assert!(!r.contains("owned by broker"));
    }
}
