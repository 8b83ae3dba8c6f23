//! The one encoding of everything this crate stores or sends: CBOR
//! (`ciborium`), self-describing, so records with optional or skipped
//! fields decode across versions.

use crate::{ReplicationError, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `value` as CBOR.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out)
        .map_err(|e| ReplicationError::Codec(format!("encode: {e}")))?;
    Ok(out)
}

/// A value from CBOR bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    ciborium::from_reader(bytes).map_err(|e| ReplicationError::Codec(format!("decode: {e}")))
}
