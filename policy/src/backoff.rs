//! Pulsar-style negative-ack backoff: a [`Backoff`] curve (a fixed delay, as
//! Pulsar's `negativeAckRedeliveryDelay`, or [`MultiplierBackoff`], as
//! Pulsar's `MultiplierRedeliveryBackoff`, with optional deterministic
//! jitter) and the [`BackoffPolicy`] that applies it until
//! `max_redeliver_count` is exceeded.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::context::mix64;
use crate::{
    AttemptOverride, DeadLetterPolicy, Decision, FailureContext, FailureReason, PolicyError,
    PolicySpec, Tier,
};

/// Pulsar's default `negativeAckRedeliveryDelay`: 1 minute.
pub const DEFAULT_NACK_DELAY: Duration = Duration::from_secs(60);

/// The shortest fixed delay accepted (Pulsar's nack tracker does not go
/// below 100 ms either; shorter delays are a redelivery storm).
pub const MIN_FIXED_DELAY: Duration = Duration::from_millis(100);

/// `min * multiplier^(n-1)` capped at `max`, for the n-th failure, with an
/// optional jitter.
///
/// Defaults are Pulsar's: 10 s, 10 min, ×2, no jitter. In serde the
/// durations are humantime strings and every field is optional:
/// `{ "min": "10s", "max": "10m", "multiplier": 2.0, "jitter": 0.1 }`.
///
/// Jitter `j` scales the capped delay by a factor in `[1 - j, 1 + j)` drawn
/// from [`FailureContext::jitter_seed`]; the result is then capped at `max`
/// again, so it is never above `max` and never negative.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultiplierBackoff {
    /// Delay of the first failure. Must be greater than zero.
    #[serde(with = "humantime_serde")]
    pub min: Duration,
    /// Cap on every delay. Must be at least `min`.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Growth factor per failure: finite and greater than 1.
    pub multiplier: f64,
    /// Fraction of the delay randomised, `0.0 ..= 1.0`.
    pub jitter: f64,
}

impl Default for MultiplierBackoff {
    fn default() -> Self {
        MultiplierBackoff {
            min: Duration::from_secs(10),
            max: Duration::from_secs(600),
            multiplier: 2.0,
            jitter: 0.0,
        }
    }
}

impl MultiplierBackoff {
    /// Checks `min > 0`, `max >= min`, `multiplier > 1` (finite) and
    /// `0 <= jitter <= 1`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.min.is_zero() {
            return Err(PolicyError::ZeroMinDelay);
        }
        if self.max < self.min {
            return Err(PolicyError::MaxBelowMin {
                min: self.min,
                max: self.max,
            });
        }
        if !(self.multiplier.is_finite() && self.multiplier > 1.0) {
            return Err(PolicyError::InvalidMultiplier(self.multiplier));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(PolicyError::InvalidJitter(self.jitter));
        }
        if self.max > crate::MAX_POLICY_DELAY {
            return Err(PolicyError::DelayTooLong {
                what: "backoff max delay",
                delay: self.max,
                max: crate::MAX_POLICY_DELAY,
            });
        }
        Ok(())
    }

    /// The delay of the `attempt`-th failure without jitter (attempt 0 reads
    /// as 1): `min * multiplier^(attempt-1)`, capped at `max`.
    pub fn nominal_delay(&self, attempt: u32) -> Duration {
        let exp = attempt.max(1) - 1;
        if exp == 0 {
            return self.min.min(self.max);
        }
        let secs = self.min.as_secs_f64() * self.multiplier.powf(f64::from(exp));
        if secs.is_nan() || secs >= self.max.as_secs_f64() {
            return self.max;
        }
        Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The delay of the `attempt`-th failure with jitter drawn from `seed`.
    pub fn delay(&self, attempt: u32, seed: u64) -> Duration {
        let nominal = self.nominal_delay(attempt);
        if self.jitter.is_nan() || self.jitter <= 0.0 {
            return nominal;
        }
        // Validation keeps jitter <= 1; clamp anyway so an unvalidated value
        // can never make the factor negative.
        let jitter = self.jitter.min(1.0);
        // 53 random bits -> u in [0, 1) -> factor in [1 - j, 1 + j).
        let u = (mix64(seed) >> 11) as f64 / (1u64 << 53) as f64;
        let factor = 1.0 + jitter * (2.0 * u - 1.0);
        let secs = (nominal.as_secs_f64() * factor).max(0.0);
        Duration::try_from_secs_f64(secs)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// The delay curve of a [`BackoffPolicy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backoff {
    /// The same delay for every failure (Pulsar's `negativeAckRedeliveryDelay`);
    /// at least [`MIN_FIXED_DELAY`].
    Fixed(Duration),
    /// An exponential curve (Pulsar's `MultiplierRedeliveryBackoff`).
    Multiplier(MultiplierBackoff),
}

impl Default for Backoff {
    /// A fixed delay of [`DEFAULT_NACK_DELAY`], as Pulsar without a backoff.
    fn default() -> Self {
        Backoff::Fixed(DEFAULT_NACK_DELAY)
    }
}

impl Backoff {
    /// Checks the fixed delay's minimum or the multiplier's parameters.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            Backoff::Fixed(d) if *d < MIN_FIXED_DELAY => Err(PolicyError::FixedDelayTooShort {
                delay: *d,
                min: MIN_FIXED_DELAY,
            }),
            Backoff::Fixed(d) if *d > crate::MAX_POLICY_DELAY => Err(PolicyError::DelayTooLong {
                what: "fixed delay",
                delay: *d,
                max: crate::MAX_POLICY_DELAY,
            }),
            Backoff::Fixed(_) => Ok(()),
            Backoff::Multiplier(m) => m.validate(),
        }
    }

    /// The delay of the `attempt`-th failure, with jitter drawn from `seed`.
    pub fn delay(&self, attempt: u32, seed: u64) -> Duration {
        match self {
            Backoff::Fixed(d) => *d,
            Backoff::Multiplier(m) => m.delay(attempt, seed),
        }
    }

    /// The longest delay the curve produces.
    pub fn max_delay(&self) -> Duration {
        match self {
            Backoff::Fixed(d) => *d,
            Backoff::Multiplier(m) => m.max,
        }
    }
}

/// Pulsar's redelivery policy: the n-th failure waits the [`Backoff`] curve's
/// delay, and the failure after `max_redeliver_count` redeliveries goes to the
/// dead-letter tier.
///
/// Tier: [`Tier::Main`] for nacks, ack timeouts and lost consumers (the client
/// holds a nacked message for the delay, then asks for an immediate
/// redelivery; for [`FailureReason::ConsumerLost`] no client served the delay,
/// and it is the broker's choice to redeliver at once, as Pulsar does, or to
/// honour `after`), and [`Tier::Retry`] for `reconsume_later`.
///
/// Overrides: [`AttemptOverride::Delay(d)`](AttemptOverride::Delay) uses `d`;
/// [`AttemptOverride::Level`] has no meaning for a backoff curve and is
/// ignored (the policy decides, no error). Neither lifts the limit.
///
/// ```
/// use std::time::Duration;
/// use ricochet_policy::{
///     BackoffPolicy, DeadLetterPolicy, Decision, FailureContext, FailureReason, MultiplierBackoff,
///     Tier,
/// };
///
/// // 1 s, 2 s, 4 s, 8 s, capped at 5 s; the 5th failure is dead-lettered.
/// let curve = MultiplierBackoff {
///     min: Duration::from_secs(1),
///     max: Duration::from_secs(5),
///     ..MultiplierBackoff::default()
/// };
/// let policy = BackoffPolicy::multiplier(curve, 4)?;
/// let nack = |n| policy.decide(&FailureContext::new(n, FailureReason::Nack));
/// assert_eq!(nack(1), Decision::Redeliver { after: Duration::from_secs(1), tier: Tier::Main });
/// assert_eq!(nack(3).delay(), Some(Duration::from_secs(4)));
/// assert_eq!(nack(4).delay(), Some(Duration::from_secs(5)));
/// assert!(nack(5).is_dead_letter());
///
/// // A terminated message is dead-lettered whatever the attempt.
/// let fixed = BackoffPolicy::fixed(Duration::from_secs(1), 3)?;
/// assert!(fixed.decide(&FailureContext::new(1, FailureReason::Terminate)).is_dead_letter());
/// # Ok::<(), ricochet_policy::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffPolicy {
    backoff: Backoff,
    max_redeliver_count: u32,
}

impl BackoffPolicy {
    /// A policy on `backoff`. Errors when the curve is invalid or
    /// `max_redeliver_count` is 0.
    pub fn new(backoff: Backoff, max_redeliver_count: u32) -> Result<Self, PolicyError> {
        backoff.validate()?;
        if max_redeliver_count == 0 {
            return Err(PolicyError::ZeroMaxAttempts {
                field: "max_redeliver_count",
            });
        }
        Ok(BackoffPolicy {
            backoff,
            max_redeliver_count,
        })
    }

    /// A fixed delay (at least 100 ms) for every failure.
    pub fn fixed(delay: Duration, max_redeliver_count: u32) -> Result<Self, PolicyError> {
        BackoffPolicy::new(Backoff::Fixed(delay), max_redeliver_count)
    }

    /// An exponential curve.
    pub fn multiplier(
        backoff: MultiplierBackoff,
        max_redeliver_count: u32,
    ) -> Result<Self, PolicyError> {
        BackoffPolicy::new(Backoff::Multiplier(backoff), max_redeliver_count)
    }

    /// Pulsar's `MultiplierRedeliveryBackoff` defaults (10 s, ×2, capped at
    /// 10 min, no jitter).
    pub fn pulsar_multiplier(max_redeliver_count: u32) -> Result<Self, PolicyError> {
        BackoffPolicy::multiplier(MultiplierBackoff::default(), max_redeliver_count)
    }

    /// The delay curve.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Redeliveries before the dead-letter tier.
    pub fn max_redeliver_count(&self) -> u32 {
        self.max_redeliver_count
    }

    /// The tier a redelivery for `reason` happens in.
    pub fn tier_for(reason: FailureReason) -> Tier {
        match reason {
            FailureReason::ReconsumeLater => Tier::Retry,
            FailureReason::Nack
            | FailureReason::AckTimeout
            | FailureReason::ConsumerLost
            | FailureReason::Terminate => Tier::Main,
        }
    }
}

impl DeadLetterPolicy for BackoffPolicy {
    fn decide(&self, ctx: &FailureContext<'_>) -> Decision {
        if let Some(d) = ctx.mandatory_dead_letter() {
            return d;
        }
        if let Some(d) = ctx.over_limit("max_redeliver_count", self.max_redeliver_count) {
            return d;
        }
        let after = match ctx.overrides {
            AttemptOverride::Delay(d) => d,
            AttemptOverride::Policy | AttemptOverride::Level(_) | AttemptOverride::DeadLetter => {
                self.backoff.delay(ctx.effective_attempt(), ctx.jitter_seed)
            }
        };
        Decision::Redeliver {
            after,
            tier: BackoffPolicy::tier_for(ctx.reason),
        }
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(self.max_redeliver_count)
    }

    /// None: a level means nothing to a backoff.
    fn delay_levels(&self) -> Option<u32> {
        Some(0)
    }

    fn spec(&self) -> Option<PolicySpec> {
        let (fixed, multiplier) = match self.backoff {
            Backoff::Fixed(d) => (Some(d), None),
            Backoff::Multiplier(m) => (None, Some(m)),
        };
        Some(PolicySpec::Backoff {
            fixed,
            multiplier,
            max_redeliver_count: self.max_redeliver_count,
        })
    }

    fn name(&self) -> &str {
        "backoff"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn nack(attempt: u32) -> FailureContext<'static> {
        FailureContext::new(attempt, FailureReason::Nack)
    }

    #[test]
    fn fixed_delay_and_limit() {
        let p = BackoffPolicy::fixed(DEFAULT_NACK_DELAY, 3).expect("valid");
        for n in [0, 1, 2, 3] {
            assert_eq!(
                p.decide(&nack(n)),
                Decision::Redeliver {
                    after: secs(60),
                    tier: Tier::Main
                },
                "attempt {n}"
            );
        }
        assert_eq!(
            p.decide(&nack(4)),
            Decision::DeadLetter {
                reason: "attempt 4 exceeds max_redeliver_count 3".into()
            }
        );
        assert_eq!(p.max_attempts(), Some(3));
    }

    #[test]
    fn multiplier_defaults_double_and_cap() {
        let p = BackoffPolicy::pulsar_multiplier(100).expect("valid");
        let got: Vec<_> = (1..=8).map(|n| p.decide(&nack(n)).delay()).collect();
        let want: Vec<_> = [10, 20, 40, 80, 160, 320, 600, 600]
            .into_iter()
            .map(|s| Some(secs(s)))
            .collect();
        assert_eq!(got, want);
        assert_eq!(p.decide(&nack(0)).delay(), Some(secs(10)));
        assert_eq!(p.decide(&nack(100)).delay(), Some(secs(600)));
        assert!(p.decide(&nack(101)).is_dead_letter());
    }

    #[test]
    fn huge_attempts_do_not_overflow() {
        let m = MultiplierBackoff {
            min: Duration::from_millis(1),
            max: crate::MAX_POLICY_DELAY,
            multiplier: 10.0,
            jitter: 1.0,
        };
        m.validate().expect("valid");
        assert_eq!(m.nominal_delay(u32::MAX), crate::MAX_POLICY_DELAY);
        assert!(m.delay(u32::MAX, 42) <= crate::MAX_POLICY_DELAY);
        assert_eq!(m.nominal_delay(2), Duration::from_millis(10));
        // An absurd cap is refused rather than computed with.
        let absurd = MultiplierBackoff {
            max: Duration::MAX,
            ..m
        };
        assert!(matches!(
            absurd.validate(),
            Err(PolicyError::DelayTooLong {
                what: "backoff max delay",
                ..
            })
        ));
        assert!(matches!(
            BackoffPolicy::fixed(Duration::from_millis(u64::MAX), 3),
            Err(PolicyError::DelayTooLong {
                what: "fixed delay",
                ..
            })
        ));
    }

    #[test]
    fn tiers_by_reason() {
        let p = BackoffPolicy::pulsar_multiplier(5).expect("valid");
        let tier = |r| p.decide(&FailureContext::new(1, r)).tier();
        assert_eq!(tier(FailureReason::Nack), Some(Tier::Main));
        assert_eq!(tier(FailureReason::AckTimeout), Some(Tier::Main));
        assert_eq!(tier(FailureReason::ConsumerLost), Some(Tier::Main));
        assert_eq!(tier(FailureReason::ReconsumeLater), Some(Tier::Retry));
        assert_eq!(tier(FailureReason::Terminate), None);
    }

    #[test]
    fn overrides() {
        let p = BackoffPolicy::pulsar_multiplier(5).expect("valid");
        let with = |o| p.decide(&nack(2).with_override(o));
        assert!(with(AttemptOverride::DeadLetter).is_dead_letter());
        assert_eq!(with(AttemptOverride::Level(7)).delay(), Some(secs(20)));
        assert_eq!(with(AttemptOverride::Policy).delay(), Some(secs(20)));
        assert_eq!(with(AttemptOverride::Delay(secs(3))).delay(), Some(secs(3)));
        assert!(
            p.decide(&nack(6).with_override(AttemptOverride::Delay(secs(1))))
                .is_dead_letter()
        );
    }

    #[test]
    fn jitter_is_deterministic_bounded_and_spread() {
        let m = MultiplierBackoff {
            jitter: 0.5,
            ..MultiplierBackoff::default()
        };
        let p = BackoffPolicy::multiplier(m, 10).expect("valid");
        let d = |seed| {
            p.decide(&nack(3).with_jitter_seed(seed))
                .delay()
                .expect("redelivered")
        };
        assert_eq!(d(1), d(1));
        let samples: Vec<_> = (0..200).map(d).collect();
        assert!(samples.iter().all(|s| *s >= secs(20) && *s < secs(60)));
        assert!(samples.iter().any(|s| *s < secs(40)));
        assert!(samples.iter().any(|s| *s > secs(40)));
        // At the cap, jitter never goes above max.
        let capped: Vec<_> = (0..200).map(|seed| m.delay(9, seed)).collect();
        assert!(capped.iter().all(|s| *s <= secs(600)));
        assert!(capped.iter().any(|s| *s < secs(600)));
    }

    #[test]
    fn validation_errors() {
        assert_eq!(
            BackoffPolicy::fixed(Duration::from_millis(99), 3),
            Err(PolicyError::FixedDelayTooShort {
                delay: Duration::from_millis(99),
                min: MIN_FIXED_DELAY
            })
        );
        assert!(BackoffPolicy::fixed(MIN_FIXED_DELAY, 3).is_ok());
        assert_eq!(
            BackoffPolicy::fixed(secs(1), 0),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_redeliver_count"
            })
        );
        let bad = |m: MultiplierBackoff| BackoffPolicy::multiplier(m, 3).err();
        let d = MultiplierBackoff::default();
        assert_eq!(
            bad(MultiplierBackoff {
                min: Duration::ZERO,
                ..d
            }),
            Some(PolicyError::ZeroMinDelay)
        );
        assert_eq!(
            bad(MultiplierBackoff { max: secs(1), ..d }),
            Some(PolicyError::MaxBelowMin {
                min: secs(10),
                max: secs(1)
            })
        );
        for m in [1.0, 0.5, -2.0, f64::INFINITY] {
            assert_eq!(
                bad(MultiplierBackoff { multiplier: m, ..d }),
                Some(PolicyError::InvalidMultiplier(m))
            );
        }
        assert!(matches!(
            bad(MultiplierBackoff {
                multiplier: f64::NAN,
                ..d
            }),
            Some(PolicyError::InvalidMultiplier(_))
        ));
        for j in [-0.1, 1.1] {
            assert_eq!(
                bad(MultiplierBackoff { jitter: j, ..d }),
                Some(PolicyError::InvalidJitter(j))
            );
        }
        assert!(matches!(
            bad(MultiplierBackoff {
                jitter: f64::NAN,
                ..d
            }),
            Some(PolicyError::InvalidJitter(_))
        ));
        // Boundaries that are fine.
        assert!(
            bad(MultiplierBackoff {
                max: d.min,
                jitter: 1.0,
                ..d
            })
            .is_none()
        );
    }

    #[test]
    fn spec_round_trip() {
        let p = BackoffPolicy::pulsar_multiplier(3).expect("valid");
        let spec = p.spec().expect("built-in");
        let rebuilt = spec.build().expect("valid");
        assert_eq!(rebuilt.spec(), Some(spec));
    }
}
