//! The client's one error type, [`Error`], and its [`Result`] alias.
//!
//! Every fallible call of the client returns [`Error`]. It is `Clone`, so
//! one broker answer (say a rejected batch) can be handed to every message of
//! the batch. Errors the broker sends as gRPC statuses or as `google.rpc`
//! codes in `SendError`/`CommandResult` frames become [`Error::Rejected`];
//! broken or unreachable connections become [`Error::Connection`]; in a
//! cluster, a topic whose broker is down is [`Error::OwnerDown`] and the
//! not-owner redirect [`Error::NotOwner`].

use ricochet_policy::PolicyError;

use crate::routing::Reroute;

/// Result alias used throughout the client.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the client.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker cannot be reached, or the stream broke (the client
    /// reconnects on its own; this is returned when an operation cannot
    /// wait for that, or when a connect attempt fails).
    #[error("connection error: {0}")]
    Connection(String),
    /// An operation did not complete within its deadline (connect timeout,
    /// request timeout, send timeout).
    #[error("timed out: {0}")]
    Timeout(String),
    /// The broker refused the request.
    #[error("rejected by the broker ({code:?}): {message}")]
    Rejected {
        /// The gRPC status code the broker answered with.
        code: tonic::Code,
        /// The broker's explanation.
        message: String,
    },
    /// The caller asked for something that cannot work (bad URL, oversize
    /// payload, cumulative ack on a Shared subscription, ...). Nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The producer or consumer was closed.
    #[error("closed")]
    Closed,
    /// The message arrived on a stream that has since broken (the consumer
    /// reconnected): the broker redelivers it, so settle that delivery
    /// instead. Nothing was sent.
    #[error(
        "stale delivery: {0} arrived before the consumer reconnected; the broker redelivers it"
    )]
    StaleDelivery(String),
    /// Acks the broker never confirmed as durable (`close`, `flush`): lost
    /// with a broken stream, or unanswered in time. The broker redelivers
    /// those messages.
    #[error("{count} ack(s) not confirmed by the broker: {reason}")]
    Unconfirmed {
        /// How many acks.
        count: u64,
        /// Why they are not confirmed.
        reason: String,
    },
    /// The broker that owns the topic is down, or fenced (it lost its etcd
    /// lease): the topic is unavailable until that broker returns; nothing
    /// it acknowledged is lost. Producers and consumers keep reconnecting
    /// (this is returned when opening one gives up, or by
    /// [`Client::lookup`](crate::Client::lookup)).
    #[error("the topic's broker {broker_id} is down: {message}")]
    OwnerDown {
        /// The id of the broker the topic is placed on.
        broker_id: String,
        /// The broker's explanation.
        message: String,
    },
    /// The broker asked does not own the topic (the not-owner redirect):
    /// look it up again and go to the owner. Streams do so on their own.
    #[error("not the topic's owner: {message}")]
    NotOwner {
        /// The owner's broker id.
        owner: String,
        /// The owner's URL (empty when the broker did not say).
        url: String,
        /// The broker's explanation.
        message: String,
    },
    /// A dead-letter policy that does not validate or cannot be built.
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
}

impl Error {
    /// A [`Error::Rejected`] from a raw `google.rpc.Code` value as carried in
    /// `SendError` and `CommandResult` frames.
    pub(crate) fn from_code(code: i32, message: impl Into<String>) -> Self {
        let code = tonic::Code::from_i32(code);
        let message = message.into();
        // The not-owner redirect sent as a frame (no trailers there): the
        // owner's id is in the message; its URL comes from a new lookup.
        if code == tonic::Code::FailedPrecondition
            && let Some(owner) = crate::routing::owner_named(&message)
        {
            return Error::NotOwner {
                owner,
                url: String::new(),
                message,
            };
        }
        Error::Rejected { code, message }
    }

    /// The gRPC code when the broker rejected the request.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Rejected { code, .. } => Some(*code),
            Error::OwnerDown { .. } => Some(tonic::Code::Unavailable),
            Error::NotOwner { .. } => Some(tonic::Code::FailedPrecondition),
            _ => None,
        }
    }

    /// The id of the topic's broker when the error is that it is down
    /// ([`Error::OwnerDown`]).
    pub fn owner_down(&self) -> Option<&str> {
        match self {
            Error::OwnerDown { broker_id, .. } => Some(broker_id),
            _ => None,
        }
    }

    /// Whether retrying the same operation later may succeed (a broken
    /// connection, a timeout, or a broker that is unavailable or busy).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connection(_)
            | Error::Timeout(_)
            | Error::OwnerDown { .. }
            | Error::NotOwner { .. } => true,
            Error::Rejected { code, .. } => is_transient(*code),
            Error::InvalidArgument(_)
            | Error::Closed
            | Error::Policy(_)
            | Error::StaleDelivery(_)
            | Error::Unconfirmed { .. } => false,
        }
    }
}

/// gRPC codes worth retrying on a reconnect.
pub(crate) fn is_transient(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable
            | Unknown
            | Internal
            | Cancelled
            | DeadlineExceeded
            | ResourceExhausted
            | Aborted
    )
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        match crate::routing::reroute(&s) {
            Reroute::NotOwner { owner, url } => {
                return Error::NotOwner {
                    owner,
                    url,
                    message: s.message().to_owned(),
                };
            }
            Reroute::OwnerDown { broker_id } => {
                return Error::OwnerDown {
                    broker_id,
                    message: s.message().to_owned(),
                };
            }
            Reroute::Unavailable | Reroute::No => {}
        }
        match s.code() {
            // Transport failures surface as Unavailable/Unknown with a
            // transport source; present them as connection errors.
            tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
                if std::error::Error::source(&s).is_some() || s.message().contains("transport") =>
            {
                Error::Connection(s.to_string())
            }
            tonic::Code::DeadlineExceeded => Error::Timeout(s.message().to_owned()),
            code => Error::Rejected {
                code,
                message: s.message().to_owned(),
            },
        }
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::Connection(error_chain(&e))
    }
}

/// `e` and its sources, joined with `: `.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
