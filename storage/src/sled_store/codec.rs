//! How records are encoded in sled values: small metadata records as JSON
//! (readable with any tool), failure records — written on every failed
//! delivery — in a compact protobuf form after a format byte.
//!
//! Every value is *sealed* ([`seal`]): a format byte ([`SEALED`]), a
//! CRC-32C of the key and the body, then the body. Reading goes through
//! [`unseal`], so damage — a flipped bit, a value under the wrong key, a
//! torn value — is a [`StorageError::Corrupt`] for that read, never a
//! different payload. Values of the unsealed format (stores written before
//! storage format 2) do not read: such stores are refused at open.

use crate::{AttemptRecord, FailureHead, FailureRecord, StorageError, StorageResult as Result};
use prost::Message as _;
use serde::{Deserialize, Serialize};

/// The first byte of every value this format writes (older values began
/// with a zero byte, `{` or `1`).
pub const SEALED: u8 = 0xC2;

fn checksum(key: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(key), body)
}

/// `body` as stored under `key`: format byte, CRC-32C (big-endian) of key
/// and body, body.
pub fn seal(key: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(SEALED);
    out.extend_from_slice(&checksum(key, body).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A key for messages: text when it is printable, hex otherwise.
pub fn show_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if s.chars().all(|c| !c.is_control() || c == '\0') => s.replace('\0', "/"),
        _ => key.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// The body of a value stored under `key`, once its checksum matches.
pub fn unseal<'a>(key: &[u8], value: &'a [u8]) -> Result<&'a [u8]> {
    let Some((&tag, rest)) = value.split_first() else {
        return Err(StorageError::Corrupt(format!(
            "empty value under key {}",
            show_key(key)
        )));
    };
    if tag != SEALED {
        return Err(StorageError::Corrupt(format!(
            "value under key {} has no checksum (format byte {tag:#04x})",
            show_key(key)
        )));
    }
    let (crc, body) = rest.split_at_checked(4).ok_or_else(|| {
        StorageError::Corrupt(format!("truncated value under key {}", show_key(key)))
    })?;
    let crc = u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if checksum(key, body) != crc {
        return Err(StorageError::Corrupt(format!(
            "checksum mismatch under key {}",
            show_key(key)
        )));
    }
    Ok(body)
}

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
    /// Operators' edits (JSON of [`EditRecord`]s, rare and small).
    #[prost(bytes = "vec", tag = "5")]
    edits: Vec<u8>,
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
        edits: if r.edits.is_empty() {
            Vec::new()
        } else {
            json(&r.edits)
        },
    };
    let mut out = Vec::with_capacity(1 + stored.encoded_len());
    out.push(PROTOBUF_V1);
    stored.encode_raw(&mut out);
    out
}

/// The fields of [`StoredFailures`] a [`FailureHead`] needs; decoding
/// skips the others (the attempt history) without allocating them.
#[derive(Clone, PartialEq, prost::Message)]
struct StoredFailureHead {
    #[prost(uint32, tag = "1")]
    count: u32,
    #[prost(uint64, tag = "4")]
    hold_until_ms: u64,
}

/// A failure record's count and hold, from either form.
pub fn decode_failure_head(bytes: &[u8]) -> Result<FailureHead> {
    match bytes.split_first() {
        Some((&PROTOBUF_V1, rest)) => {
            let h = StoredFailureHead::decode(rest)?;
            Ok(FailureHead {
                count: h.count,
                hold_until_ms: h.hold_until_ms,
            })
        }
        _ => decode_failures(bytes).map(|f| FailureHead::of(&f)),
    }
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
                edits: if s.edits.is_empty() {
                    Vec::new()
                } else {
                    from_json(&s.edits)?
                },
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

/// Appends `value` as the zigzag varint of its difference from `*prev`
/// (wrapping), and makes it `*prev`: runs of close numbers (entry ids, due
/// times) take a byte or two each. The compact layouts of schedule
/// chunks, reference frames and the reference index use it.
pub fn put_delta(out: &mut Vec<u8>, value: u64, prev: &mut u64) {
    let d = value.wrapping_sub(*prev) as i64;
    prost::encoding::encode_varint(((d << 1) ^ (d >> 63)) as u64, out);
    *prev = value;
}

/// Reads a value [`put_delta`] wrote after `*prev`, and makes it `*prev`
/// (`None`: `rest` ends inside the varint).
pub fn take_delta(rest: &mut &[u8], prev: &mut u64) -> Option<u64> {
    let z = prost::encoding::decode_varint(rest).ok()?;
    let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
    *prev = prev.wrapping_add(d as u64);
    Some(*prev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::sample_history as record;
    use ricochet_policy::FailureReason;

    #[test]
    fn sealed_values_read_back_and_every_damage_is_corrupt() {
        let key = b"t:topic";
        let v = seal(key, b"{\"a\":1}");
        assert_eq!(v[0], SEALED);
        assert_eq!(unseal(key, &v).unwrap(), b"{\"a\":1}");
        assert_eq!(unseal(b"k", &seal(b"k", b"")).unwrap(), b"");
        for at in 0..v.len() {
            for bit in 0..8 {
                let mut bad = v.clone();
                bad[at] ^= 1 << bit;
                assert!(
                    matches!(unseal(key, &bad), Err(StorageError::Corrupt(_))),
                    "flip of bit {bit} at {at} read back"
                );
            }
        }
        for len in 0..v.len() {
            assert!(unseal(key, &v[..len]).is_err(), "truncated to {len}");
        }
        // The same value under another key is damage too.
        assert!(unseal(b"t:other", &v).is_err());
        // Values of the unsealed format are refused.
        assert!(unseal(key, b"{\"a\":1}").is_err());
        assert!(unseal(key, &[0, 0, 0, 1, 0, 0, 0, 0]).is_err());
        let e = unseal(&[0, 1, 0xff], &[1]).unwrap_err().to_string();
        assert!(e.contains("0001ff"), "{e}");
    }

    #[test]
    fn a_failure_head_reads_count_and_hold_of_either_form() {
        let mut r = record(3);
        r.hold_until_ms = 1_764_000_000_123;
        let head = FailureHead::of(&r);
        assert_eq!((head.count, head.hold_until_ms), (3, 1_764_000_000_123));
        assert_eq!(decode_failure_head(&encode_failures(&r)).unwrap(), head);
        assert_eq!(decode_failure_head(&json(&r)).unwrap(), head);
        // Not held, no history.
        let plain = FailureRecord::default();
        assert_eq!(
            decode_failure_head(&encode_failures(&plain)).unwrap(),
            FailureHead::default()
        );
        // A body that is not a record is damage, not a zero head.
        assert!(decode_failure_head(&[PROTOBUF_V1, 0x0a, 0x7f]).is_err());
        assert!(decode_failure_head(b"{not json").is_err());
    }

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
