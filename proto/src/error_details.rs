//! The structured part of Ricochet's errors: why a call about a topic was
//! refused in a cluster (sent to a broker that does not own the topic, an
//! owner that is down or fenced, a topic moving, a broker shutting down)
//! and who owns the topic, as a `google.rpc.ErrorInfo` in the gRPC rich
//! error model (the `grpc-status-details-bin` trailer, through
//! `tonic-types`). The broker attaches it with [`attach`]; the client reads
//! it with [`read`] and decides redirects from it alone, never from the
//! status message, which is for people and may be reworded.
//!
//! A refusal sent inside a stream (`SendError`, `CommandResult`) carries
//! the same encoded details in its `details` field; [`status_from_frame`]
//! turns such a frame back into a status that [`read`] understands.

use std::collections::HashMap;

use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of Ricochet's reasons.
pub const DOMAIN: &str = "ricochet.io";

/// Metadata key: the topic the refusal is about.
pub const KEY_TOPIC: &str = "topic";
/// Metadata key: the id of the broker that owns the topic (or is fenced).
pub const KEY_OWNER: &str = "owner";
/// Metadata key: the owner's advertised URL (absent when it is not live).
pub const KEY_OWNER_URL: &str = "owner_url";
/// Metadata key: the fencing epoch of the owner's claim, in decimal
/// (absent when unknown).
pub const KEY_EPOCH: &str = "epoch";
/// Metadata key: the broker a moving topic goes to.
pub const KEY_MOVING_TO: &str = "moving_to";

/// Why a call about a topic was refused, as `ErrorInfo.reason` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `NOT_OWNER`: another broker owns the topic; go there.
    NotOwner,
    /// `OWNER_DOWN`: the broker the topic is placed on is down.
    OwnerDown,
    /// `FENCED`: the answering broker lost its etcd lease.
    Fenced,
    /// `MOVING`: the topic is being moved to another broker; look it up again.
    Moving,
    /// `SHUTTING_DOWN`: the broker is shutting down.
    ShuttingDown,
}

impl Reason {
    /// The `ErrorInfo.reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotOwner => "NOT_OWNER",
            Reason::OwnerDown => "OWNER_DOWN",
            Reason::Fenced => "FENCED",
            Reason::Moving => "MOVING",
            Reason::ShuttingDown => "SHUTTING_DOWN",
        }
    }

    /// The reason named `s`; `None` for a reason this version does not know.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "NOT_OWNER" => Reason::NotOwner,
            "OWNER_DOWN" => Reason::OwnerDown,
            "FENCED" => Reason::Fenced,
            "MOVING" => Reason::Moving,
            "SHUTTING_DOWN" => Reason::ShuttingDown,
            _ => return None,
        })
    }
}

/// One refusal's structured details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detail {
    /// Why.
    pub reason: Reason,
    /// The topic, when the refusal is about one.
    pub topic: Option<String>,
    /// The owning (or fenced) broker's id.
    pub owner: Option<String>,
    /// The owner's URL, when it is live.
    pub owner_url: Option<String>,
    /// The owner's claim epoch, when known.
    pub epoch: Option<u64>,
    /// Where a moving topic goes.
    pub moving_to: Option<String>,
}

impl Detail {
    /// A detail with only its reason.
    pub fn new(reason: Reason) -> Self {
        Self {
            reason,
            topic: None,
            owner: None,
            owner_url: None,
            epoch: None,
            moving_to: None,
        }
    }

    fn metadata(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                m.insert(k.to_owned(), v);
            }
        };
        put(KEY_TOPIC, self.topic.clone());
        put(KEY_OWNER, self.owner.clone());
        put(KEY_OWNER_URL, self.owner_url.clone());
        put(KEY_EPOCH, self.epoch.map(|e| e.to_string()));
        put(KEY_MOVING_TO, self.moving_to.clone());
        m
    }
}

/// A status with `code`, `message` and `detail` as its `ErrorInfo`.
pub fn attach(code: tonic::Code, message: impl Into<String>, detail: &Detail) -> tonic::Status {
    tonic::Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(detail.reason.as_str(), DOMAIN, detail.metadata()),
    )
}

/// The Ricochet `ErrorInfo` of `status`, if it has one with a reason this
/// version knows. The message is not looked at.
pub fn read(status: &tonic::Status) -> Option<Detail> {
    let details = status.get_error_details();
    let info = details.error_info()?;
    if info.domain != DOMAIN {
        return None;
    }
    let reason = Reason::parse(&info.reason)?;
    let get = |k: &str| {
        info.metadata
            .get(k)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    Some(Detail {
        reason,
        topic: get(KEY_TOPIC),
        owner: get(KEY_OWNER),
        owner_url: get(KEY_OWNER_URL),
        epoch: get(KEY_EPOCH).and_then(|e| e.parse().ok()),
        moving_to: get(KEY_MOVING_TO),
    })
}

/// The status a `SendError` or `CommandResult` frame stands for: its
/// `google.rpc.Code`, message and encoded details (empty when none).
pub fn status_from_frame(code: i32, message: impl Into<String>, details: &[u8]) -> tonic::Status {
    tonic::Status::with_details(
        tonic::Code::from_i32(code),
        message.into(),
        bytes::Bytes::copy_from_slice(details),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_survive_a_status_and_a_frame_whatever_the_message() {
        let d = Detail {
            topic: Some("persistent://a/b/t".into()),
            owner: Some("b2".into()),
            owner_url: Some("http://10.0.0.2:6650".into()),
            epoch: Some(42),
            ..Detail::new(Reason::NotOwner)
        };
        let s = attach(tonic::Code::FailedPrecondition, "zzz garbage", &d);
        assert_eq!(read(&s), Some(d.clone()));
        let again = status_from_frame(s.code() as i32, "other garbage", s.details());
        assert_eq!(again.code(), tonic::Code::FailedPrecondition);
        assert_eq!(read(&again), Some(d));
    }

    #[test]
    fn statuses_without_ricochet_details_have_none() {
        assert_eq!(
            read(&tonic::Status::unavailable("broker b1 lost its etcd lease")),
            None
        );
        let foreign = tonic::Status::with_error_details(
            tonic::Code::Unavailable,
            "x",
            ErrorDetails::with_error_info("NOT_OWNER", "example.com", HashMap::new()),
        );
        assert_eq!(read(&foreign), None, "another domain's reason");
        let unknown = tonic::Status::with_error_details(
            tonic::Code::Unavailable,
            "x",
            ErrorDetails::with_error_info("SOMETHING_NEW", DOMAIN, HashMap::new()),
        );
        assert_eq!(read(&unknown), None, "a reason this version does not know");
        assert_eq!(read(&status_from_frame(9, "x", &[])), None);
        for r in [
            Reason::NotOwner,
            Reason::OwnerDown,
            Reason::Fenced,
            Reason::Moving,
            Reason::ShuttingDown,
        ] {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
        }
    }
}
