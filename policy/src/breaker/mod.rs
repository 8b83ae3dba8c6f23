//! The outage breaker: [`BreakerSpec`], a subscription's breaker settings
//! as a value (serde, a compact one-line form, validation, a description for
//! `ricochet policy explain`), and [`Breaker`], the pure state machine the
//! broker drives with settles and the clock. No I/O: time is a parameter
//! (milliseconds), state is a serializable [`BreakerSnapshot`].
//!
//! A dead-letter policy answers "this message failed; what now?". When a
//! downstream dependency is down, every message fails and burns its attempts;
//! the breaker watches all settles of a subscription together and, when they
//! fail too often, stops dispatching and stops counting attempts, probing
//! with one message at a growing interval until one succeeds.
//!
//! # The compact form
//!
//! ```text
//! breaker[:KEY=VALUE{,KEY=VALUE}]
//! ```
//!
//! | key (aliases) | meaning | default |
//! |---|---|---|
//! | `ratio` (`failure-ratio`) | trip when this fraction (0 < r ≤ 1) of the last `window` settles failed… | 0.5 when `failures` is not given |
//! | `window` | …counted over the last N settles (1 ..= 10000)… | 200 |
//! | `min` (`min-settles`) | …once at least this many settles are in the window | 20 |
//! | `failures` | and/or trip on this many failures (1 ..= 10000)… | off |
//! | `within` | …within this time | 10s |
//! | `probe` (`probe-interval`) | first wait before a probe, doubled after each failed probe… | 5s |
//! | `max-probe` (`max-probe-interval`) | …up to this | 5m |
//!
//! ```
//! use ricochet_policy::BreakerSpec;
//! let spec: BreakerSpec = "breaker:ratio=0.5,window=200,min=20,probe=5s,max-probe=5m".parse()?;
//! assert_eq!(spec.to_string().parse::<BreakerSpec>()?, spec);
//! assert_eq!("breaker".parse::<BreakerSpec>()?, BreakerSpec::default());
//! assert!("breaker:ratio=1.5".parse::<BreakerSpec>().is_err());
//! # Ok::<(), ricochet_policy::PolicyError>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::PolicyError;
use crate::spec::{Args, parse_error};

mod machine;
#[cfg(test)]
mod tests;

pub use machine::{
    Breaker, BreakerMode, BreakerPhase, BreakerSnapshot, Gate, Settle, Transition, TripCause,
};

/// The most settles a ratio window, or failures a burst, may count.
pub const MAX_BREAKER_WINDOW: u32 = 10_000;
/// The shortest probe interval.
pub const MIN_PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// The longest probe interval (a day).
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(24 * 3600);

fn default_window() -> u32 {
    200
}
fn default_min_settles() -> u32 {
    20
}
fn default_within() -> Duration {
    Duration::from_secs(10)
}
fn default_probe() -> Duration {
    Duration::from_secs(5)
}
fn default_max_probe() -> Duration {
    Duration::from_secs(300)
}

/// A subscription's outage-breaker settings. In serde (TOML, JSON) durations
/// are humantime strings:
///
/// ```toml
/// ratio = 0.5          # trip at 50% failures…
/// window = 200         # …of the last 200 settles…
/// min_settles = 20     # …once 20 are counted
/// failures = 50        # and/or 50 failures…
/// within = "10s"       # …within 10 s
/// probe_interval = "5s"
/// max_probe_interval = "5m"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSpec {
    /// Trip when at least this fraction of the window failed (0 < r ≤ 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The ratio's window: the last N settles.
    #[serde(default = "default_window")]
    pub window: u32,
    /// The ratio is only judged once the window holds this many settles.
    #[serde(default = "default_min_settles")]
    pub min_settles: u32,
    /// Trip on this many failures within `within`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<u32>,
    /// The time `failures` must fall within.
    #[serde(default = "default_within", with = "humantime_serde")]
    pub within: Duration,
    /// The wait before the first probe; doubled after each failed probe.
    #[serde(default = "default_probe", with = "humantime_serde")]
    pub probe_interval: Duration,
    /// The cap of the probe interval.
    #[serde(default = "default_max_probe", with = "humantime_serde")]
    pub max_probe_interval: Duration,
}

impl Default for BreakerSpec {
    /// 50% of the last 200 settles (at least 20), probes from 5 s doubling
    /// to 5 min.
    fn default() -> Self {
        BreakerSpec {
            ratio: Some(0.5),
            window: default_window(),
            min_settles: default_min_settles(),
            failures: None,
            within: default_within(),
            probe_interval: default_probe(),
            max_probe_interval: default_max_probe(),
        }
    }
}

fn invalid(reason: impl Into<String>) -> PolicyError {
    PolicyError::InvalidBreaker(reason.into())
}

impl BreakerSpec {
    /// Checks every field; the error names the field and its value.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.ratio.is_none() && self.failures.is_none() {
            return Err(invalid(
                "give a trip rule: `ratio` (a failure ratio over a window) and/or `failures` (N failures within a time)",
            ));
        }
        if let Some(r) = self.ratio
            && !(r.is_finite() && r > 0.0 && r <= 1.0)
        {
            return Err(invalid(format!(
                "ratio must be above 0 and at most 1, got {r}"
            )));
        }
        if !(1..=MAX_BREAKER_WINDOW).contains(&self.window) {
            return Err(invalid(format!(
                "window must be 1 ..= {MAX_BREAKER_WINDOW} settles, got {}",
                self.window
            )));
        }
        if !(1..=self.window).contains(&self.min_settles) {
            return Err(invalid(format!(
                "min_settles must be 1 ..= window ({}), got {}",
                self.window, self.min_settles
            )));
        }
        if let Some(n) = self.failures
            && !(1..=MAX_BREAKER_WINDOW).contains(&n)
        {
            return Err(invalid(format!(
                "failures must be 1 ..= {MAX_BREAKER_WINDOW}, got {n}"
            )));
        }
        if self.within.is_zero() || self.within > MAX_PROBE_INTERVAL {
            return Err(invalid(format!(
                "within must be above 0 and at most {}, got {}",
                humantime::format_duration(MAX_PROBE_INTERVAL),
                humantime::format_duration(self.within)
            )));
        }
        for (name, d) in [
            ("probe_interval", self.probe_interval),
            ("max_probe_interval", self.max_probe_interval),
        ] {
            if !(MIN_PROBE_INTERVAL..=MAX_PROBE_INTERVAL).contains(&d) {
                return Err(invalid(format!(
                    "{name} must be {} ..= {}, got {}",
                    humantime::format_duration(MIN_PROBE_INTERVAL),
                    humantime::format_duration(MAX_PROBE_INTERVAL),
                    humantime::format_duration(d)
                )));
            }
        }
        if self.max_probe_interval < self.probe_interval {
            return Err(invalid(format!(
                "max_probe_interval ({}) is below probe_interval ({})",
                humantime::format_duration(self.max_probe_interval),
                humantime::format_duration(self.probe_interval)
            )));
        }
        Ok(())
    }

    /// The waits before successive probes while the breaker stays open:
    /// `probe_interval`, doubled each time, capped (the first `n`).
    pub fn probe_schedule(&self, n: usize) -> Vec<Duration> {
        let mut out = Vec::with_capacity(n);
        let mut d = self.probe_interval;
        for _ in 0..n {
            out.push(d);
            d = next_probe_interval(d, self.max_probe_interval);
        }
        out
    }

    /// A few lines for humans: when it trips, how it probes, what it
    /// spares (for `ricochet policy explain`).
    pub fn describe(&self) -> String {
        let mut rules = Vec::new();
        if let Some(r) = self.ratio {
            rules.push(format!(
                "{}% or more of the last {} settles failed (judged from {} settles)",
                r * 100.0,
                self.window,
                self.min_settles
            ));
        }
        if let Some(n) = self.failures {
            rules.push(format!(
                "{n} failures within {}",
                humantime::format_duration(self.within)
            ));
        }
        let probes: Vec<String> = self
            .probe_schedule(8)
            .iter()
            .map(|d| humantime::format_duration(*d).to_string())
            .collect();
        format!(
            "outage breaker: opens when {}.\n\
             counted: an ack is a success; a nack, an ack timeout or a reconsume_later is a failure \
             (terminate and a lost consumer are not counted).\n\
             while open: nothing is dispatched but one probe message; failures spend no attempt \
             (the message goes back to where it was).\n\
             probes after: {} … (doubling, capped at {}); a probe ack closes it, a probe failure \
             waits longer.",
            rules.join(", or "),
            probes.join(", "),
            humantime::format_duration(self.max_probe_interval)
        )
    }
}

/// The interval after `d`: doubled, capped at `max`.
pub(crate) fn next_probe_interval(d: Duration, max: Duration) -> Duration {
    d.saturating_mul(2).min(max)
}

impl fmt::Display for BreakerSpec {
    /// The canonical compact form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("breaker:")?;
        if let Some(r) = self.ratio {
            write!(f, "ratio={r},")?;
        }
        write!(f, "window={},min={},", self.window, self.min_settles)?;
        if let Some(n) = self.failures {
            write!(f, "failures={n},")?;
        }
        write!(
            f,
            "within={},probe={},max-probe={}",
            humantime::format_duration(self.within),
            humantime::format_duration(self.probe_interval),
            humantime::format_duration(self.max_probe_interval)
        )
    }
}

const BREAKER_KEYS: &[(&str, &str)] = &[
    ("ratio", "ratio"),
    ("failure-ratio", "ratio"),
    ("window", "window"),
    ("min", "min"),
    ("min-settles", "min"),
    ("failures", "failures"),
    ("within", "within"),
    ("probe", "probe"),
    ("probe-interval", "probe"),
    ("max-probe", "max-probe"),
    ("max-probe-interval", "max-probe"),
];

impl FromStr for BreakerSpec {
    type Err = PolicyError;

    /// Parses the compact form (or JSON, for text starting with `{`) and
    /// validates it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let input = s.trim();
        let spec = if input.starts_with('{') {
            serde_json::from_str::<BreakerSpec>(input)
                .map_err(|e| parse_error(input, format!("invalid JSON breaker: {e}")))?
        } else {
            let (kind, args) = match input.split_once(':') {
                Some((k, a)) => (k.trim(), Some(a)),
                None => (input, None),
            };
            if !kind.eq_ignore_ascii_case("breaker") {
                return Err(parse_error(
                    input,
                    "a breaker spec starts with `breaker` (e.g. breaker:ratio=0.5,window=200)",
                ));
            }
            let a = Args::parse(input, "breaker", args, BREAKER_KEYS)?;
            let failures = a.u32("failures")?;
            let ratio = match (a.f64("ratio")?, failures) {
                (Some(r), _) => Some(r),
                // `breaker` alone, or with only window/min: the default ratio.
                (None, None) => BreakerSpec::default().ratio,
                (None, Some(_)) => None,
            };
            let window = a.u32("window")?.unwrap_or_else(default_window);
            BreakerSpec {
                ratio,
                window,
                min_settles: a
                    .u32("min")?
                    .unwrap_or_else(|| default_min_settles().min(window)),
                failures,
                within: a.duration("within")?.unwrap_or_else(default_within),
                probe_interval: a.duration("probe")?.unwrap_or_else(default_probe),
                max_probe_interval: a.duration("max-probe")?.unwrap_or_else(default_max_probe),
            }
        };
        spec.validate()?;
        Ok(spec)
    }
}
