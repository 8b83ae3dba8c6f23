//! Wall-clock time, injected: due times, publish times and failure records
//! are wall-clock milliseconds, and tests drive them with virtual time.
//!
//! [`SystemClock`] is the real clock. [`TokioClock`] derives wall time from
//! tokio's clock, so under `tokio::time::pause()` (or
//! `#[tokio::test(start_paused = true)]`) every timer *and* every due time
//! the broker computes advance together, and a test of an hour-long retry
//! runs in microseconds.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Microseconds since the Unix epoch.
    fn now_us(&self) -> u64;

    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    /// Whether this is the system's clock, whose time moves by itself: a
    /// wait may then be served by an OS timer (a thread's sleep) as well as
    /// by tokio's. A virtual clock's time moves only through tokio's
    /// timers.
    fn is_system(&self) -> bool {
        false
    }
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    fn is_system(&self) -> bool {
        true
    }
}

/// Wall time that moves with tokio's clock: the wall time at creation plus
/// the tokio time elapsed since. Paused tokio time makes it virtual.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base_us: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Starts at the current wall time.
    pub fn new() -> Self {
        Self::starting_at_us(SystemClock.now_us())
    }

    /// Starts at `base_us` microseconds since the epoch.
    pub fn starting_at_us(base_us: u64) -> Self {
        Self {
            base_us,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_us(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.base_us.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::starting_at_us(1_000_000);
        assert_eq!(c.now_ms(), 1_000);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(c.now_ms(), 1_000 + 3_600_000);
    }
}
