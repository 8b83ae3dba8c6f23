//! The client's one error type, [`Error`], what a program matches on,
//! [`ErrorKind`], the owner a redirect names, [`Redirect`], and the
//! [`Result`] alias.
//!
//! An [`Error`] is one shared allocation (`Arc`), so it is cheap to clone:
//! one broker answer (say a rejected batch) is handed to every message of
//! the batch, each keeping the cause chain ([`std::error::Error::source`]).
//! The kind is decided from types and codes only: a broker's refusal by its
//! gRPC code and, for cluster routing, the structured details it attaches
//! (`ricochet_proto::error_details`); a transport failure by the error
//! object tonic keeps as the status's source (a broker's answer never has
//! one). No message text is ever parsed. No tonic type is part of this
//! API: the gRPC code is kept as its plain number ([`Error::grpc_code`]).

use std::fmt;
use std::sync::Arc;

use ricochet_policy::PolicyError;
use ricochet_proto::error_details::{self, Reason};

/// Result alias used throughout the client.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, for a program to match on. More kinds may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The topic, subscription or other named thing does not exist.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// The request cannot work as given (a bad name, an oversize payload, a
    /// cumulative ack on a Shared subscription, ...), refused by the broker
    /// or found by the client before sending anything.
    InvalidArgument,
    /// The caller's role lacks the permission.
    PermissionDenied,
    /// No valid credentials.
    Unauthenticated,
    /// The request conflicts with the current state (an Exclusive
    /// subscription already taken, a topic in use, ...).
    FailedPrecondition,
    /// A limit of the broker's was reached (topics, connections, a backlog
    /// quota).
    ResourceExhausted,
    /// The broker could not be reached, or the connection or stream broke
    /// (the client reconnects on its own; this is returned when an
    /// operation cannot wait for that, or a connect attempt fails).
    Disconnected,
    /// The broker answered that it cannot serve now (shutting down, its
    /// etcd unreachable, a topic moving), naming no owner.
    Unavailable,
    /// The broker that owns the topic is down or fenced (it lost its etcd
    /// lease): the topic is unavailable until that broker returns; nothing
    /// it acknowledged is lost. [`Error::redirect`] names it.
    OwnerDown,
    /// The broker asked does not own the topic: [`Error::redirect`] names
    /// the owner. Producers and consumers follow it on their own.
    Redirect,
    /// An operation did not complete within its deadline (connect, request,
    /// send timeout).
    Timeout,
    /// The producer, consumer or client was closed.
    Closed,
    /// The producer's queue of pending messages is full and the producer was
    /// built to fail fast instead of waiting for room
    /// ([`ProducerBuilder::block_if_queue_full`](crate::ProducerBuilder::block_if_queue_full)).
    QueueFull,
    /// The message arrived on a stream that has since broken (the consumer
    /// reconnected): the broker redelivers it, so settle that delivery
    /// instead. Nothing was sent.
    StaleDelivery,
    /// Acks the broker never confirmed as durable (`close`, `flush`): lost
    /// with a broken stream, or unanswered in time. The broker redelivers
    /// those messages; [`Error::unconfirmed_count`] says how many.
    Unconfirmed,
    /// A dead-letter policy that does not validate or cannot be built (the
    /// source is the policy crate's error).
    Policy,
    /// The broker holds damaged or incomplete data.
    DataLoss,
    /// The broker failed internally.
    Internal,
    /// Any other refusal ([`Error::grpc_code`] says which).
    Other,
}

/// Where a topic is served, as a broker's refusal names it (kinds
/// [`ErrorKind::Redirect`] and [`ErrorKind::OwnerDown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Redirect {
    /// The owning broker's id (empty when the broker did not say).
    pub owner: String,
    /// The owner's URL, when it is live.
    pub url: Option<String>,
    /// The fencing epoch of the owner's claim, when known.
    pub epoch: Option<u64>,
}

/// Everything that can go wrong in the client: a [kind](Error::kind), a
/// message for people, the broker's gRPC code when it answered, the owner
/// when a redirect or a down owner is the cause, and the cause chain.
#[derive(Clone)]
pub struct Error(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    kind: ErrorKind,
    message: String,
    code: Option<i32>,
    redirect: Option<Redirect>,
    unconfirmed: u64,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// The gRPC code numbers the client looks at (`google.rpc.Code`).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const ALREADY_EXISTS: i32 = 6;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const ABORTED: i32 = 10;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
    pub const DATA_LOSS: i32 = 15;
    pub const UNAUTHENTICATED: i32 = 16;
}

impl Error {
    fn build(kind: ErrorKind, message: impl Into<String>) -> Inner {
        Inner {
            kind,
            message: message.into(),
            code: None,
            redirect: None,
            unconfirmed: 0,
            source: None,
        }
    }

    /// An error of `kind` with `message`, made by the client itself.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error(Arc::new(Self::build(kind, message)))
    }

    /// A broken or unreachable connection.
    pub(crate) fn disconnected(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Disconnected, message)
    }

    /// A deadline that passed.
    pub(crate) fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    /// A deadline that passed while `cause` stood in the way (kept as the
    /// source).
    pub(crate) fn timeout_after(message: impl Into<String>, cause: &Error) -> Self {
        let mut inner = Self::build(ErrorKind::Timeout, message);
        inner.source = Some(Arc::new(cause.clone()));
        Error(Arc::new(inner))
    }

    /// A request the client refuses to send.
    pub(crate) fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// The handle (or its driver) is closed.
    pub(crate) fn closed() -> Self {
        Self::new(ErrorKind::Closed, "")
    }

    /// A delivery `what` from a stream that has since broken.
    pub(crate) fn stale_delivery(what: impl Into<String>) -> Self {
        Self::new(ErrorKind::StaleDelivery, what)
    }

    /// `count` acks the broker did not confirm, and why.
    pub(crate) fn unconfirmed(count: u64, reason: impl Into<String>) -> Self {
        let mut inner = Self::build(ErrorKind::Unconfirmed, reason);
        inner.unconfirmed = count;
        Error(Arc::new(inner))
    }

    /// The topic's owner, broker `broker_id`, is down.
    pub(crate) fn owner_is_down(broker_id: impl Into<String>, message: impl Into<String>) -> Self {
        let mut inner = Self::build(ErrorKind::OwnerDown, message);
        inner.code = Some(code::UNAVAILABLE);
        inner.redirect = Some(Redirect {
            owner: broker_id.into(),
            url: None,
            epoch: None,
        });
        Error(Arc::new(inner))
    }

    /// The error a failed call's status stands for; see the module docs.
    pub(crate) fn from_status(status: tonic::Status) -> Self {
        let code = status.code() as i32;
        let message = status.message().to_owned();
        // A transport failure: tonic keeps the local error object (hyper,
        // h2, a connect error, a timeout) as the source. A status decoded
        // from a broker's answer has none.
        if std::error::Error::source(&status).is_some() {
            let kind = if code == code::DEADLINE_EXCEEDED {
                ErrorKind::Timeout
            } else {
                ErrorKind::Disconnected
            };
            let mut inner = Self::build(kind, message);
            inner.source = Some(Arc::new(TransportFailure(status)));
            return Error(Arc::new(inner));
        }
        let mut inner = Self::build(kind_of_code(code), message);
        inner.code = Some(code);
        if let Some(d) = error_details::read(&status) {
            match d.reason {
                Reason::NotOwner => {
                    // The owner without a URL is not live.
                    inner.kind = if d.owner_url.is_some() {
                        ErrorKind::Redirect
                    } else {
                        ErrorKind::OwnerDown
                    };
                }
                Reason::OwnerDown | Reason::Fenced => inner.kind = ErrorKind::OwnerDown,
                Reason::Moving | Reason::ShuttingDown => inner.kind = ErrorKind::Unavailable,
            }
            if matches!(inner.kind, ErrorKind::Redirect | ErrorKind::OwnerDown) {
                inner.redirect = Some(Redirect {
                    owner: d.owner.unwrap_or_default(),
                    url: d.owner_url,
                    epoch: d.epoch,
                });
            }
        }
        Error(Arc::new(inner))
    }

    /// The error a `SendError`/`CommandResult` frame stands for: its raw
    /// `google.rpc.Code`, message and encoded structured details.
    pub(crate) fn from_frame(code: i32, message: impl Into<String>, details: &[u8]) -> Self {
        Self::from_status(error_details::status_from_frame(code, message, details))
    }

    /// A transport-level failure to set up a channel.
    pub(crate) fn from_transport(e: tonic::transport::Error) -> Self {
        let mut inner = Self::build(ErrorKind::Disconnected, e.to_string());
        inner.source = Some(Arc::new(e));
        Error(Arc::new(inner))
    }

    /// What went wrong, to match on.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// The broker's (or the client's) explanation, for people. Do not
    /// parse it: match on [`kind`](Self::kind).
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The gRPC status code (`google.rpc.Code`, 5 = NOT_FOUND, ...) when
    /// the broker answered with a refusal; `None` for errors the client
    /// found itself or a broken connection.
    pub fn grpc_code(&self) -> Option<i32> {
        self.0.code
    }

    /// The owner a redirect names ([`ErrorKind::Redirect`]), or the down
    /// owner ([`ErrorKind::OwnerDown`]).
    pub fn redirect(&self) -> Option<&Redirect> {
        self.0.redirect.as_ref()
    }

    /// The id of the topic's broker when the error is that it is down
    /// ([`ErrorKind::OwnerDown`]).
    pub fn owner_down(&self) -> Option<&str> {
        match (self.0.kind, &self.0.redirect) {
            (ErrorKind::OwnerDown, Some(r)) => Some(&r.owner),
            _ => None,
        }
    }

    /// How many acks were not confirmed ([`ErrorKind::Unconfirmed`]).
    pub fn unconfirmed_count(&self) -> Option<u64> {
        (self.0.kind == ErrorKind::Unconfirmed).then_some(self.0.unconfirmed)
    }

    /// Whether retrying the same operation later may succeed (a broken
    /// connection, a timeout, a redirect, or a broker that is unavailable
    /// or busy).
    pub fn is_retryable(&self) -> bool {
        match self.0.kind {
            ErrorKind::Disconnected
            | ErrorKind::Timeout
            | ErrorKind::OwnerDown
            | ErrorKind::Redirect
            | ErrorKind::Unavailable => true,
            _ => self.0.code.is_some_and(is_transient),
        }
    }
}

/// A transport failure as tonic reported it: shown as its message, with
/// tonic's cause (hyper, h2, I/O, a connect error) as its source.
struct TransportFailure(tonic::Status);

impl fmt::Debug for TransportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for TransportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.message())
    }
}

impl std::error::Error for TransportFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

/// The kind a broker's refusal with `code` is, before its details.
fn kind_of_code(c: i32) -> ErrorKind {
    match c {
        code::INVALID_ARGUMENT => ErrorKind::InvalidArgument,
        code::NOT_FOUND => ErrorKind::NotFound,
        code::ALREADY_EXISTS => ErrorKind::AlreadyExists,
        code::PERMISSION_DENIED => ErrorKind::PermissionDenied,
        code::UNAUTHENTICATED => ErrorKind::Unauthenticated,
        code::FAILED_PRECONDITION => ErrorKind::FailedPrecondition,
        code::RESOURCE_EXHAUSTED => ErrorKind::ResourceExhausted,
        code::UNAVAILABLE => ErrorKind::Unavailable,
        code::DEADLINE_EXCEEDED => ErrorKind::Timeout,
        code::DATA_LOSS => ErrorKind::DataLoss,
        code::INTERNAL => ErrorKind::Internal,
        _ => ErrorKind::Other,
    }
}

/// gRPC codes worth retrying on a reconnect.
pub(crate) fn is_transient(c: i32) -> bool {
    matches!(
        c,
        code::UNAVAILABLE
            | code::UNKNOWN
            | code::INTERNAL
            | code::CANCELLED
            | code::DEADLINE_EXCEEDED
            | code::RESOURCE_EXHAUSTED
            | code::ABORTED
    )
}

impl From<PolicyError> for Error {
    fn from(e: PolicyError) -> Self {
        let mut inner = Self::build(ErrorKind::Policy, e.to_string());
        inner.source = Some(Arc::new(e));
        Error(Arc::new(inner))
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.0.message;
        match self.0.kind {
            ErrorKind::Disconnected => write!(f, "connection error: {m}"),
            ErrorKind::Timeout => write!(f, "timed out: {m}"),
            ErrorKind::Closed if m.is_empty() => f.write_str("closed"),
            ErrorKind::Closed => write!(f, "closed: {m}"),
            ErrorKind::QueueFull => write!(f, "producer queue full: {m}"),
            ErrorKind::StaleDelivery => write!(
                f,
                "stale delivery: {m} arrived before the consumer reconnected; the broker redelivers it"
            ),
            ErrorKind::Unconfirmed => write!(
                f,
                "{} ack(s) not confirmed by the broker: {m}",
                self.0.unconfirmed
            ),
            ErrorKind::Policy => write!(f, "policy: {m}"),
            ErrorKind::OwnerDown => {
                let id = self.0.redirect.as_ref().map_or("", |r| r.owner.as_str());
                write!(f, "the topic's broker {id} is down: {m}")
            }
            ErrorKind::Redirect => write!(f, "not the topic's owner: {m}"),
            _ => match self.0.code {
                Some(c) => write!(
                    f,
                    "rejected by the broker ({:?}): {m}",
                    tonic::Code::from_i32(c)
                ),
                None if self.0.kind == ErrorKind::InvalidArgument => {
                    write!(f, "invalid argument: {m}")
                }
                None => write!(f, "{:?}: {m}", self.0.kind),
            },
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source.as_ref().map(|s| &**s as _)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::error_details::{Detail, attach};

    #[test]
    fn kinds_follow_the_code_whatever_the_message() {
        for (code, kind) in [
            (tonic::Code::NotFound, ErrorKind::NotFound),
            (tonic::Code::AlreadyExists, ErrorKind::AlreadyExists),
            (tonic::Code::InvalidArgument, ErrorKind::InvalidArgument),
            (tonic::Code::PermissionDenied, ErrorKind::PermissionDenied),
            (tonic::Code::Unauthenticated, ErrorKind::Unauthenticated),
            (
                tonic::Code::FailedPrecondition,
                ErrorKind::FailedPrecondition,
            ),
            (tonic::Code::ResourceExhausted, ErrorKind::ResourceExhausted),
            (tonic::Code::Unavailable, ErrorKind::Unavailable),
            (tonic::Code::DataLoss, ErrorKind::DataLoss),
            (tonic::Code::Aborted, ErrorKind::Other),
        ] {
            // A message a broker of an older (or newer) version might send:
            // it must not matter.
            let e = Error::from_status(tonic::Status::new(
                code,
                "broker b1 lost its etcd lease; topic t is owned by broker b2 (transport)",
            ));
            assert_eq!(e.kind(), kind, "{code:?}");
            assert_eq!(e.grpc_code(), Some(code as i32));
            assert!(e.redirect().is_none(), "no details, no redirect: {e:?}");
        }
    }

    #[test]
    fn a_transport_failure_is_known_by_its_source_not_its_text() {
        let mut s = tonic::Status::unavailable("zzz");
        s.set_source(Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let e = Error::from_status(s);
        assert_eq!(e.kind(), ErrorKind::Disconnected);
        assert_eq!(e.grpc_code(), None);
        assert!(e.is_retryable());
        // The cause chain: the transport failure, then the I/O error.
        let failure = std::error::Error::source(&e).expect("the transport failure");
        assert_eq!(failure.to_string(), "zzz");
        let io = failure.source().expect("the I/O error");
        assert!(io.downcast_ref::<std::io::Error>().is_some());
        // The same words from a broker are its answer, not a transport error.
        let e = Error::from_status(tonic::Status::unknown("transport error"));
        assert_eq!(e.kind(), ErrorKind::Other);
    }

    #[test]
    fn policy_errors_keep_their_cause() {
        let e = Error::from(PolicyError::EmptyLevelTable);
        assert_eq!(e.kind(), ErrorKind::Policy);
        assert!(
            std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<PolicyError>())
                .is_some()
        );
    }

    #[test]
    fn redirects_come_from_the_details() {
        let d = Detail {
            owner: Some("b2".into()),
            owner_url: Some("http://h:1".into()),
            epoch: Some(9),
            ..Detail::new(Reason::NotOwner)
        };
        let e = Error::from_status(attach(tonic::Code::FailedPrecondition, "#$%", &d));
        assert_eq!(e.kind(), ErrorKind::Redirect);
        let r = e.redirect().unwrap();
        assert_eq!(
            (r.owner.as_str(), r.url.as_deref(), r.epoch),
            ("b2", Some("http://h:1"), Some(9))
        );
        assert!(e.is_retryable());
        let down = Detail {
            owner: Some("b3".into()),
            ..Detail::new(Reason::Fenced)
        };
        let e = Error::from_status(attach(tonic::Code::Unavailable, "", &down));
        assert_eq!(
            (e.kind(), e.owner_down()),
            (ErrorKind::OwnerDown, Some("b3"))
        );
        let clone = e.clone();
        assert_eq!(clone.owner_down(), Some("b3"));
    }
}
