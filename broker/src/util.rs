//! Small helpers shared across the broker: stable hashing, quoting client
//! input in error messages, a periodic task that warns once per failing
//! streak; poison-free locking and the test failpoints
//! (`RICOCHET_FAILPOINT`) come from the storage crate's `util`.

pub(crate) use ricochet_storage::util::{failpoint, failpoint_armed, lock};
use std::borrow::Cow;

/// Runs `step` every `period` until `stop`. A failure is logged as a WARN
/// (`what`, with the error) once per failing streak, not on every turn.
pub(crate) fn spawn_every<F, Fut>(
    period: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
    what: &'static str,
    mut step: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = crate::error::Result<()>> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => break,
            }
            match step().await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "{what}");
                }
                Err(_) => {}
            }
        }
    });
}

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
