//! Small helpers shared across the broker: poison-free locking and stable hashing.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering the guard if a panicking thread poisoned it: the
/// broker's short critical sections leave consistent state behind, and
/// refusing service for ever after one panic would be worse.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A stable 64-bit hash (same value across runs and builds), used for key
/// routing and policy jitter seeds: FNV-1a followed by the SplitMix64
/// finaliser, so every output bit depends on every input byte (plain FNV-1a
/// barely changes its high bits for keys differing in the last byte).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn similar_keys_spread_over_high_bits() {
        let tops: std::collections::HashSet<u64> = (0..10)
            .map(|i| super::stable_hash(format!("k{i}").as_bytes()) >> 60)
            .collect();
        assert!(tops.len() >= 5, "{tops:?}");
    }
}
