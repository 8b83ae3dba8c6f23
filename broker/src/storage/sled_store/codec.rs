//! How records are encoded in sled values: small metadata records as JSON
//! (readable with any tool), failure records — written on every failed
//! delivery — in a compact protobuf form after a format byte. Failure records
//! an older broker wrote as JSON still read.

use crate::storage::{AttemptRecord, FailureRecord, StorageError, StorageResult as Result};
use prost::Message as _;
use serde::{Deserialize, Serialize};

/// A metadata record as JSON.
pub fn json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising plain records (strings, integers, vectors) cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// A metadata record from JSON.
pub fn from_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| StorageError::Corrupt(e.to_string()))
}

const PROTOBUF_V1: u8 = 1;

/// The stored form of a failure record (field numbers are the format:
/// never reuse one).
#[derive(Clone, PartialEq, prost::Message)]
struct StoredFailures {
    #[prost(uint32, tag = "1")]
    count: u32,
    #[prost(uint64, tag = "2")]
    first_failure_ms: u64,
    #[prost(message, repeated, tag = "3")]
    attempts: Vec<StoredAttempt>,
    #[prost(uint64, tag = "4")]
    hold_until_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct StoredAttempt {
    #[prost(uint64, tag = "1")]
    time_ms: u64,
    #[prost(uint32, tag = "2")]
    delivery_count: u32,
    #[prost(string, tag = "3")]
    consumer: String,
    /// The protocol number of the failure reason.
    #[prost(int32, tag = "4")]
    reason: i32,
    #[prost(string, tag = "5")]
    detail: String,
}

/// A failure record in its compact form.
pub fn encode_failures(r: &FailureRecord) -> Vec<u8> {
    let stored = StoredFailures {
        count: r.count,
        first_failure_ms: r.first_failure_ms,
        hold_until_ms: r.hold_until_ms,
        attempts: r
            .attempts
            .iter()
            .map(|a| StoredAttempt {
                time_ms: a.time_ms,
                delivery_count: a.delivery_count,
                consumer: a.consumer.clone(),
                reason: ricochet_proto::convert::failure_reason_to_i32(a.reason),
                detail: a.detail.clone(),
            })
            .collect(),
    };
    let mut out = Vec::with_capacity(1 + stored.encoded_len());
    out.push(PROTOBUF_V1);
    stored.encode_raw(&mut out);
    out
}

/// A failure record from either form.
pub fn decode_failures(bytes: &[u8]) -> Result<FailureRecord> {
    match bytes.split_first() {
        Some((&PROTOBUF_V1, rest)) => {
            let s = StoredFailures::decode(rest)?;
            let attempts = s
                .attempts
                .into_iter()
                .map(|a| {
                    Ok(AttemptRecord {
                        time_ms: a.time_ms,
                        delivery_count: a.delivery_count,
                        consumer: a.consumer,
                        reason: ricochet_proto::convert::failure_reason_from_i32(a.reason)
                            .map_err(|e| StorageError::Corrupt(e.to_string()))?,
                        detail: a.detail,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(FailureRecord {
                count: s.count,
                first_failure_ms: s.first_failure_ms,
                attempts,
                hold_until_ms: s.hold_until_ms,
            })
        }
        Some((b'{', _)) => from_json(bytes),
        _ => Err(StorageError::Corrupt(
            "unknown failure record format".into(),
        )),
    }
}

/// A big-endian `u64` key.
pub fn be(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// Inverse of [`be`].
pub fn read_be(bytes: &[u8]) -> Result<u64> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StorageError::Corrupt("bad u64 key".into()))?;
    Ok(u64::from_be_bytes(arr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::records::sample_history as record;
    use ricochet_policy::FailureReason;

    #[test]
    fn failure_records_round_trip_and_legacy_json_still_reads() {
        let r = record(3);
        let bytes = encode_failures(&r);
        assert_eq!(bytes[0], 1);
        assert_eq!(decode_failures(&bytes).unwrap(), r);
        assert!(bytes.len() < json(&r).len() / 2, "{} bytes", bytes.len());
        assert_eq!(decode_failures(&json(&r)).unwrap(), r);
        assert_eq!(
            decode_failures(&encode_failures(&FailureRecord::default())).unwrap(),
            FailureRecord::default()
        );
        assert!(matches!(
            decode_failures(b"\x07junk"),
            Err(StorageError::Corrupt(_))
        ));
        assert!(matches!(
            decode_failures(&[1, 0xff]),
            Err(StorageError::Corrupt(_))
        ));
    }

    /// The stored form is the one wave 1 wrote with the wire `Attempt`
    /// message: a record it wrote still decodes.
    #[test]
    fn the_stored_form_matches_what_the_wire_attempt_wrote() {
        let wire = ricochet_proto::Attempt {
            time_ms: 5,
            delivery_count: 2,
            consumer: "c1".into(),
            reason: ricochet_proto::FailureReason::AckTimeout as i32,
            detail: "slow".into(),
        };
        let mut bytes = vec![PROTOBUF_V1];
        // field 1 (count) = 2, field 2 (first_failure_ms) = 5, field 3 = the attempt
        let mut body = Vec::new();
        prost::encoding::uint32::encode(1, &2, &mut body);
        prost::encoding::uint64::encode(2, &5, &mut body);
        prost::encoding::message::encode(3, &wire, &mut body);
        bytes.extend(body);
        let r = decode_failures(&bytes).unwrap();
        assert_eq!(r.count, 2);
        assert_eq!(r.attempts[0].reason, FailureReason::AckTimeout);
        assert_eq!(r.attempts[0].detail, "slow");
    }
}
