//! The perf payload: a 24-byte header (magic, send time, sequence number)
//! stamped on every message `perf` publishes, and read back on receipt to
//! measure end-to-end and redelivery latency.

use std::time::{SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 4] = b"RCP1";
/// Bytes of the payload header.
pub const HEADER: usize = 24;

pub(super) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A perf payload of `size` bytes (at least [`HEADER`]) stamped now.
pub fn make_payload(size: usize, seq: u64) -> Vec<u8> {
    let mut p = vec![b'.'; size.max(HEADER)];
    p[..4].copy_from_slice(MAGIC);
    p[4..8].fill(0);
    p[8..16].copy_from_slice(&now_micros().to_le_bytes());
    p[16..24].copy_from_slice(&seq.to_le_bytes());
    p
}

/// (send time in µs since the epoch, sequence number) of a perf payload.
pub fn read_header(p: &[u8]) -> Option<(u64, u64)> {
    if p.len() < HEADER || &p[..4] != MAGIC {
        return None;
    }
    let t = u64::from_le_bytes(p[8..16].try_into().ok()?);
    let seq = u64::from_le_bytes(p[16..24].try_into().ok()?);
    Some((t, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let p = make_payload(100, 42);
        assert_eq!(p.len(), 100);
        let (t, seq) = read_header(&p).expect("header");
        assert_eq!(seq, 42);
        assert!(now_micros() >= t);
        assert!(read_header(b"plain text payload, no header").is_none());
        assert_eq!(make_payload(1, 0).len(), HEADER);
    }
}
