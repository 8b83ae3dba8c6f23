//! Wall-clock time for tests and benches: Unix-epoch milliseconds, the unit
//! the broker stamps on messages (`publish_time_ms`, `deliver_at_ms`), and
//! microseconds for lateness measured below a millisecond. The broker and the
//! CLI keep their own clocks (product code); these are for checking them.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// Milliseconds since the Unix epoch (truncated, like the broker's).
pub fn now_ms() -> u64 {
    now_us() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_are_the_microseconds_truncated() {
        let us = now_us();
        let ms = now_ms();
        let after = now_us();
        assert!(us / 1000 <= ms && ms <= after / 1000, "{us} {ms} {after}");
    }
}
