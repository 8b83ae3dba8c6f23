//! The one encoding of everything this crate stores or sends: CBOR
//! (`ciborium`), self-describing, so records with optional or skipped
//! fields decode across versions.

use crate::{ReplicationError, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `value` as CBOR.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    encode_sized(value, 0)
}

/// `value` as CBOR, into a buffer made for about `size` bytes: a command
/// or a log entry carries a batch of hundreds of KB, and a buffer grown
/// by doubling copies it again at each step.
pub fn encode_sized<T: Serialize>(value: &T, size: usize) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(size);
    ciborium::into_writer(value, &mut out)
        .map_err(|e| ReplicationError::Codec(format!("encode: {e}")))?;
    Ok(out)
}

/// `value` as CBOR, appended to `out` (a log record's buffer).
pub fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    ciborium::into_writer(value, out).map_err(|e| ReplicationError::Codec(format!("encode: {e}")))
}

/// A value from CBOR bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    ciborium::from_reader(bytes).map_err(|e| ReplicationError::Codec(format!("decode: {e}")))
}
