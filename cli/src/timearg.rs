//! Points in time on the command line and in output. `--since`/`--until`
//! take an RFC 3339 time (`2025-06-01T12:00:00Z`, `2025-06-01 12:00:00`,
//! `2025-06-01T14:00:00+02:00`), a duration meaning "that long ago" (`90s`,
//! `1h`, `2days`), or `now`; output shows RFC 3339 UTC with milliseconds.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A time given on the command line, resolved when parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeArg(pub SystemTime);

impl TimeArg {
    /// Milliseconds since the Unix epoch (at least 1, so it never reads as
    /// "unbounded" in a filter).
    pub fn as_ms(self) -> u64 {
        time_to_ms(self.0).max(1)
    }
}

impl FromStr for TimeArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("now") {
            return Ok(TimeArg(SystemTime::now()));
        }
        let relative = t.strip_suffix(" ago").unwrap_or(t);
        if let Ok(d) = humantime::parse_duration(relative) {
            return SystemTime::now()
                .checked_sub(d)
                .map(TimeArg)
                .ok_or_else(|| format!("{s:?} is before the epoch"));
        }
        parse_rfc3339(t).map(TimeArg).map_err(|e| {
            format!("bad time {s:?}: {e} (use RFC 3339 like 2025-06-01T12:00:00Z, or a duration ago like 1h)")
        })
    }
}

/// RFC 3339 with an optional numeric offset (humantime reads UTC only).
fn parse_rfc3339(s: &str) -> Result<SystemTime, String> {
    let (base, offset) = split_offset(s);
    let t = humantime::parse_rfc3339_weak(base).map_err(|e| e.to_string())?;
    let shifted = if offset >= 0 {
        t.checked_sub(Duration::from_secs(offset.unsigned_abs()))
    } else {
        t.checked_add(Duration::from_secs(offset.unsigned_abs()))
    };
    shifted.ok_or_else(|| "time out of range".to_owned())
}

/// Splits a trailing `+HH:MM`/`-HH:MM` offset (seconds east of UTC) from
/// the date-time part; `Z` and no offset are UTC.
fn split_offset(s: &str) -> (&str, i64) {
    let s = s.strip_suffix(['Z', 'z']).unwrap_or(s);
    if s.len() > 6 && s.is_char_boundary(s.len() - 6) {
        let (base, tail) = s.split_at(s.len() - 6);
        let b = tail.as_bytes();
        if (b[0] == b'+' || b[0] == b'-')
            && b[3] == b':'
            && b[1..3].iter().chain(&b[4..6]).all(u8::is_ascii_digit)
        {
            let h = i64::from(b[1] - b'0') * 10 + i64::from(b[2] - b'0');
            let m = i64::from(b[4] - b'0') * 10 + i64::from(b[5] - b'0');
            let secs = h * 3600 + m * 60;
            return (base, if b[0] == b'-' { -secs } else { secs });
        }
    }
    (s, 0)
}

/// Milliseconds since the Unix epoch.
pub fn time_to_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    time_to_ms(SystemTime::now())
}

/// A millisecond timestamp as RFC 3339 UTC, or `-` for 0 (unset).
pub fn fmt_ms(ms: u64) -> String {
    if ms == 0 {
        return "-".to_owned();
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A duration the way people read it: `850ms`, `12.3s`, `4m 10s`.
pub fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// `ms` relative to now: `in 4.2s`, `3m 5s ago`.
pub fn fmt_relative(ms: u64) -> String {
    let now = now_ms();
    if ms >= now {
        format!("in {}", fmt_duration(Duration::from_millis(ms - now)))
    } else {
        format!("{} ago", fmt_duration(Duration::from_millis(now - ms)))
    }
}

/// Wraps a value so it displays as an RFC 3339 time.
#[derive(Debug, Clone, Copy)]
pub struct Ms(pub u64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_ms(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_forms() {
        let utc: TimeArg = "2025-06-01T12:00:00Z".parse().expect("utc");
        assert_eq!(utc.as_ms(), 1_748_779_200_000);
        let offset: TimeArg = "2025-06-01T14:00:00+02:00".parse().expect("offset");
        assert_eq!(offset, utc);
        let west: TimeArg = "2025-06-01T07:00:00-05:00".parse().expect("west");
        assert_eq!(west, utc);
        let spaced: TimeArg = "2025-06-01 12:00:00".parse().expect("weak");
        assert_eq!(spaced, utc);
        let millis: TimeArg = "2025-06-01T12:00:00.250Z".parse().expect("millis");
        assert_eq!(millis.as_ms(), 1_748_779_200_250);
    }

    #[test]
    fn relative_forms() {
        let now = now_ms();
        let hour: TimeArg = "1h".parse().expect("1h");
        let ago = now - hour.as_ms();
        assert!((3_599_000..=3_601_000).contains(&ago), "{ago}");
        let ago2: TimeArg = "90s ago".parse().expect("ago");
        assert!(now - ago2.as_ms() >= 89_000);
        assert!("yesterday-ish".parse::<TimeArg>().is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_ms(0), "-");
        assert_eq!(fmt_ms(1_748_779_200_250), "2025-06-01T12:00:00.250Z");
        assert_eq!(fmt_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(fmt_duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(fmt_duration(Duration::from_secs(250)), "4m 10s");
    }
}
