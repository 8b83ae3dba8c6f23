//! Small helpers shared across the broker: poison-free locking, stable
//! hashing, quoting client input in error messages, and the test
//! failpoints (`RICOCHET_FAILPOINT`).

use std::borrow::Cow;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Characters of client input an error message repeats at most.
pub(crate) const ECHO_CHARS: usize = 100;

/// `s` cut to `max` characters, with `…` when something was cut.
pub(crate) fn truncate(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((end, _)) => Cow::Owned(format!("{}…", &s[..end])),
    }
}

/// Client input quoted for an error message: escaped like `{:?}` (control
/// characters stay visible), cut to [`ECHO_CHARS`] characters, and followed
/// by its size when cut. A client that sends a megabyte of name gets a
/// short message back, not a megabyte of `grpc-message` header.
pub(crate) fn echo(input: &str) -> String {
    match input.char_indices().nth(ECHO_CHARS) {
        None => format!("{input:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &input[..end], input.len()),
    }
}

/// Locks a mutex, recovering the guard if a panicking thread poisoned it: the
/// broker's short critical sections leave consistent state behind, and
/// refusing service for ever after one panic would be worse.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads an `RwLock`, recovering from poison as [`lock`] does.
pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes an `RwLock`, recovering from poison as [`lock`] does.
pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// Wall-clock milliseconds since the Unix epoch (for registration times
/// only; the broker's own timing uses [`crate::clock`]).
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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

/// The failpoint named by `RICOCHET_FAILPOINT`, read once.
fn armed_failpoint() -> Option<&'static str> {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var("RICOCHET_FAILPOINT").ok())
        .as_deref()
}

/// Whether `RICOCHET_FAILPOINT` names `name` (a step that must prepare its
/// crash, e.g. flush what is written so far, before [`failpoint`]).
pub(crate) fn failpoint_armed(name: &str) -> bool {
    armed_failpoint() == Some(name)
}

/// Aborts the process when `RICOCHET_FAILPOINT` equals `name`: a test's way
/// to crash the broker at an exact step (as a SIGKILL would, without
/// flushing). Unset (always, outside tests), it does nothing.
pub(crate) fn failpoint(name: &str) {
    if failpoint_armed(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn echoed_input_is_quoted_and_cut() {
        assert_eq!(super::echo("a\u{1}b"), "\"a\\u{1}b\"");
        let long = "é".repeat(1000);
        let e = super::echo(&long);
        assert!(e.starts_with(&format!("\"{}", "é".repeat(100))), "{e}");
        assert!(e.ends_with("\"… (2000 bytes)"), "{e}");
        assert_eq!(super::truncate("abc", 3), "abc");
        assert_eq!(super::truncate("abcd", 3), "abc…");
    }

    #[test]
    fn similar_keys_spread_over_high_bits() {
        let tops: std::collections::HashSet<u64> = (0..10)
            .map(|i| super::stable_hash(format!("k{i}").as_bytes()) >> 60)
            .collect();
        assert!(tops.len() >= 5, "{tops:?}");
    }
}
