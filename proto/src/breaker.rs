//! Conversions between the outage breaker's wire types and
//! `ricochet-policy`'s: [`BreakerSpec`] ⇄ [`BreakerConfig`] (durations in
//! whole milliseconds; zero is the default, or "rule off" for `ratio` and
//! `failures`), and [`PolicyBreakerMode`] ⇄ the protobuf `BreakerMode`.
//! Converting from the wire validates the spec.

use std::time::Duration;

use ricochet_policy::{BreakerMode as PolicyBreakerMode, BreakerSpec, PolicyError};

use crate::v1::{self, BreakerConfig};

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<&BreakerSpec> for BreakerConfig {
    fn from(s: &BreakerSpec) -> Self {
        BreakerConfig {
            ratio: s.ratio.unwrap_or(0.0),
            window: s.window,
            min_settles: s.min_settles,
            failures: s.failures.unwrap_or(0),
            within_ms: ms(s.within),
            probe_interval_ms: ms(s.probe_interval),
            max_probe_interval_ms: ms(s.max_probe_interval),
        }
    }
}

impl TryFrom<&BreakerConfig> for BreakerSpec {
    type Error = PolicyError;

    /// Zeros take the defaults; the result is validated.
    fn try_from(c: &BreakerConfig) -> Result<Self, Self::Error> {
        let d = BreakerSpec::default();
        let or = |v: u64, dflt: Duration| {
            if v == 0 {
                dflt
            } else {
                Duration::from_millis(v)
            }
        };
        let window = if c.window == 0 { d.window } else { c.window };
        let spec = BreakerSpec {
            ratio: (c.ratio != 0.0).then_some(c.ratio),
            window,
            min_settles: if c.min_settles == 0 {
                d.min_settles.min(window)
            } else {
                c.min_settles
            },
            failures: (c.failures != 0).then_some(c.failures),
            within: or(c.within_ms, d.within),
            probe_interval: or(c.probe_interval_ms, d.probe_interval),
            max_probe_interval: or(c.max_probe_interval_ms, d.max_probe_interval),
        };
        spec.validate()?;
        Ok(spec)
    }
}

impl From<PolicyBreakerMode> for v1::BreakerMode {
    fn from(m: PolicyBreakerMode) -> Self {
        match m {
            PolicyBreakerMode::Auto => v1::BreakerMode::Auto,
            PolicyBreakerMode::ForcedOpen => v1::BreakerMode::ForcedOpen,
            PolicyBreakerMode::ForcedClosed => v1::BreakerMode::ForcedClosed,
        }
    }
}

/// The mode a raw protobuf enum field names; `None` for unspecified or
/// unknown values.
pub fn breaker_mode_from_i32(value: i32) -> Option<PolicyBreakerMode> {
    match v1::BreakerMode::try_from(value).ok()? {
        v1::BreakerMode::Unspecified => None,
        v1::BreakerMode::Auto => Some(PolicyBreakerMode::Auto),
        v1::BreakerMode::ForcedOpen => Some(PolicyBreakerMode::ForcedOpen),
        v1::BreakerMode::ForcedClosed => Some(PolicyBreakerMode::ForcedClosed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_and_zeros_take_defaults() {
        for s in [
            "breaker",
            "breaker:failures=5,within=2s,probe=1s,max-probe=1m",
        ] {
            let spec: BreakerSpec = s.parse().unwrap();
            assert_eq!(BreakerSpec::try_from(&BreakerConfig::from(&spec)), Ok(spec));
        }
        let c = BreakerConfig {
            failures: 3,
            ..Default::default()
        };
        let spec = BreakerSpec::try_from(&c).unwrap();
        assert_eq!((spec.ratio, spec.failures), (None, Some(3)));
        assert!(
            BreakerSpec::try_from(&BreakerConfig::default()).is_err(),
            "no rule"
        );
        assert_eq!(breaker_mode_from_i32(0), None);
        assert_eq!(
            breaker_mode_from_i32(2),
            Some(PolicyBreakerMode::ForcedOpen)
        );
        assert_eq!(breaker_mode_from_i32(9), None);
    }
}
