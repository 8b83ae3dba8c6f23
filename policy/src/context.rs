//! The vocabulary of a failure: why a delivery failed ([`FailureReason`]),
//! where a message lives and is redelivered ([`Tier`]), what the consumer
//! asked for explicitly ([`AttemptOverride`]), everything a policy is told
//! ([`FailureContext`]), and what it answers ([`Decision`]). Also the stable
//! [`jitter_seed`] hash the broker and the client both use so that a jittered
//! policy makes the same decision on either side.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::PolicyError;

/// Why a delivery attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The consumer negatively acknowledged the message.
    Nack,
    /// The consumer did not acknowledge it within its ack timeout.
    AckTimeout,
    /// The consumer's stream closed while the message was in flight.
    ConsumerLost,
    /// The consumer asked for it to be consumed again later (retry tier).
    ReconsumeLater,
    /// The consumer declared it unprocessable: always dead-lettered.
    Terminate,
}

impl FailureReason {
    /// All five reasons, in protocol order.
    pub const ALL: [FailureReason; 5] = [
        FailureReason::Nack,
        FailureReason::AckTimeout,
        FailureReason::ConsumerLost,
        FailureReason::ReconsumeLater,
        FailureReason::Terminate,
    ];

    /// The snake_case name used in configuration, logs and the CLI.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureReason::Nack => "nack",
            FailureReason::AckTimeout => "ack_timeout",
            FailureReason::ConsumerLost => "consumer_lost",
            FailureReason::ReconsumeLater => "reconsume_later",
            FailureReason::Terminate => "terminate",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailureReason {
    type Err = PolicyError;

    /// Accepts the snake_case names (`ack_timeout`) and their kebab-case
    /// spelling (`ack-timeout`), case-insensitively.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        FailureReason::ALL
            .into_iter()
            .find(|r| r.as_str() == norm)
            .ok_or_else(|| PolicyError::UnknownFailureReason(s.to_owned()))
    }
}

/// Where a redelivery happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Redeliver in place, from the subscription's main topic. For a nack or
    /// an ack timeout the *client* holds the message for the decision's
    /// `after` and then asks the broker to redeliver it at once.
    Main,
    /// The *broker* moves the message to the subscription's retry topic and
    /// schedules it `after` from now.
    Retry,
}

impl Tier {
    /// The snake_case name (`main`, `retry`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Main => "main",
            Tier::Retry => "retry",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the consumer asked for explicitly for this one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AttemptOverride {
    /// No override: the policy decides (the default).
    #[default]
    Policy,
    /// Dead-letter the message now, whatever the attempt count.
    DeadLetter,
    /// Use this delay level (RocketMQ's `delayLevelWhenNextConsume`).
    /// Policies without levels ignore it and decide as usual; the broker
    /// refuses a level its subscription's policy lacks (see
    /// [`AttemptOverride::checked_for`]).
    Level(u32),
    /// Use exactly this delay.
    Delay(Duration),
}

impl AttemptOverride {
    /// Maps RocketMQ's `delayLevelWhenNextConsume`: `-1` means straight to
    /// the dead-letter tier, `0` means "the policy decides" and a positive
    /// level means that level (checked against the policy's table by
    /// [`checked_for`](Self::checked_for)). Any other negative level means
    /// nothing and is refused.
    pub fn from_rocketmq_level(level: i32) -> Result<Self, PolicyError> {
        match level {
            -1 => Ok(AttemptOverride::DeadLetter),
            0 => Ok(AttemptOverride::Policy),
            n => u32::try_from(n).map(AttemptOverride::Level).map_err(|_| {
                PolicyError::InvalidDelayLevel {
                    level: i64::from(n),
                    levels: None,
                }
            }),
        }
    }

    /// This override, if it means something to `policy`: a
    /// [`Level`](Self::Level) must be one of the policy's
    /// [`delay_levels`](crate::DeadLetterPolicy::delay_levels) (a policy
    /// that does not say takes any level).
    pub fn checked_for(self, policy: &dyn crate::DeadLetterPolicy) -> Result<Self, PolicyError> {
        match (self, policy.delay_levels()) {
            (AttemptOverride::Level(k), Some(n)) if k == 0 || k > n => {
                Err(PolicyError::InvalidDelayLevel {
                    level: i64::from(k),
                    levels: Some(n),
                })
            }
            _ => Ok(self),
        }
    }
}

/// Everything a policy is told about one failure.
///
/// Build it with [`FailureContext::new`] and the `with_*` methods:
///
/// ```
/// use ricochet_policy::{AttemptOverride, FailureContext, FailureReason, Tier};
/// let ctx = FailureContext::new(2, FailureReason::ReconsumeLater)
///     .with_tier(Tier::Retry)
///     .with_override(AttemptOverride::from_rocketmq_level(5).unwrap())
///     .with_jitter_seed(ricochet_policy::jitter_seed(b"orders:42", 2));
/// assert_eq!(ctx.overrides, AttemptOverride::Level(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureContext<'a> {
    /// The n-th failure of this message for this subscription, starting at 1.
    /// `0` is treated as `1` by the built-in policies (see
    /// [`effective_attempt`](Self::effective_attempt)).
    pub attempt: u32,
    /// Why the delivery failed.
    pub reason: FailureReason,
    /// Free text the consumer gave with its nack, if any.
    pub detail: Option<&'a str>,
    /// The tier the message is currently in.
    pub tier: Tier,
    /// When this message first failed for this subscription, if known.
    pub first_failure: Option<SystemTime>,
    /// What the consumer asked for explicitly.
    pub overrides: AttemptOverride,
    /// Deterministic entropy for jitter: the broker and the client pass
    /// [`jitter_seed`]`(message id, attempt)`. Policies must use this, never a
    /// global RNG, so that a decision can be reproduced.
    pub jitter_seed: u64,
}

impl<'a> FailureContext<'a> {
    /// A context for the `attempt`-th failure for `reason`, with no detail,
    /// in [`Tier::Main`], no first-failure time, no override and a jitter seed of 0.
    pub fn new(attempt: u32, reason: FailureReason) -> Self {
        FailureContext {
            attempt,
            reason,
            detail: None,
            tier: Tier::Main,
            first_failure: None,
            overrides: AttemptOverride::Policy,
            jitter_seed: 0,
        }
    }

    /// Sets the consumer's nack text.
    pub fn with_detail(mut self, detail: &'a str) -> Self {
        self.detail = Some(detail);
        self
    }

    /// Sets the tier the message is currently in.
    pub fn with_tier(mut self, tier: Tier) -> Self {
        self.tier = tier;
        self
    }

    /// Sets when the message first failed.
    pub fn with_first_failure(mut self, at: SystemTime) -> Self {
        self.first_failure = Some(at);
        self
    }

    /// Sets the consumer's explicit override.
    pub fn with_override(mut self, overrides: AttemptOverride) -> Self {
        self.overrides = overrides;
        self
    }

    /// Sets the jitter seed (see [`jitter_seed`]).
    pub fn with_jitter_seed(mut self, seed: u64) -> Self {
        self.jitter_seed = seed;
        self
    }

    /// The attempt number with `0` read as `1`: a caller that counts from 0
    /// by mistake gets the first attempt's treatment, never an extra retry
    /// beyond the limit.
    pub fn effective_attempt(&self) -> u32 {
        self.attempt.max(1)
    }

    /// The dead-letter decision every policy must make regardless of its own
    /// rules: for [`FailureReason::Terminate`] and for
    /// [`AttemptOverride::DeadLetter`]. `None` when neither applies.
    ///
    /// Custom policies should start their `decide` with it.
    pub fn mandatory_dead_letter(&self) -> Option<Decision> {
        if self.reason == FailureReason::Terminate {
            Some(Decision::DeadLetter {
                reason: "terminated by the consumer".to_owned(),
            })
        } else if self.overrides == AttemptOverride::DeadLetter {
            Some(Decision::DeadLetter {
                reason: "dead-letter requested by the consumer (level -1)".to_owned(),
            })
        } else {
            None
        }
    }

    /// The dead-letter decision for an attempt beyond `max` (compared with
    /// `>`, so lowering a limit takes effect at once), or `None`. `field`
    /// names the limit in the decision's reason.
    pub(crate) fn over_limit(&self, field: &str, max: u32) -> Option<Decision> {
        let n = self.effective_attempt();
        (n > max).then(|| Decision::DeadLetter {
            reason: format!("attempt {n} exceeds {field} {max}"),
        })
    }
}

/// A policy's answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Deliver the message again after `after`, from `tier`.
    Redeliver {
        /// How long to wait before the redelivery.
        after: Duration,
        /// Where the redelivery happens (see [`Tier`]).
        tier: Tier,
    },
    /// Move the message to the subscription's dead-letter topic.
    DeadLetter {
        /// Why, for the message's `DEAD_LETTER_REASON` property and for logs.
        reason: String,
    },
}

impl Decision {
    /// True for [`Decision::DeadLetter`].
    pub fn is_dead_letter(&self) -> bool {
        matches!(self, Decision::DeadLetter { .. })
    }

    /// The redelivery delay, or `None` for a dead letter.
    pub fn delay(&self) -> Option<Duration> {
        match self {
            Decision::Redeliver { after, .. } => Some(*after),
            Decision::DeadLetter { .. } => None,
        }
    }

    /// The redelivery tier, or `None` for a dead letter.
    pub fn tier(&self) -> Option<Tier> {
        match self {
            Decision::Redeliver { tier, .. } => Some(*tier),
            Decision::DeadLetter { .. } => None,
        }
    }
}

/// SplitMix64's finaliser: a cheap, well-mixed bijection on `u64`.
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable seed for [`FailureContext::jitter_seed`] from a message's
/// identity (for example `topic:entry_id`, as bytes) and the attempt number.
///
/// The hash (FNV-1a, then a SplitMix64 finaliser) is fixed by this crate and
/// does not depend on the process, the platform or the Rust version, so the
/// broker and the client compute the same seed, and so the same jittered
/// delay, for the same message and attempt.
pub fn jitter_seed(message_key: &[u8], attempt: u32) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in message_key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix64(h ^ mix64(u64::from(attempt)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocketmq_level_overrides() {
        assert_eq!(
            AttemptOverride::from_rocketmq_level(-1),
            Ok(AttemptOverride::DeadLetter)
        );
        for meaningless in [-2, -7, i32::MIN] {
            let e = AttemptOverride::from_rocketmq_level(meaningless).unwrap_err();
            assert!(e.to_string().contains(&meaningless.to_string()), "{e}");
            assert!(e.to_string().contains("-1 (dead-letter now)"), "{e}");
        }
        assert_eq!(
            AttemptOverride::from_rocketmq_level(0),
            Ok(AttemptOverride::Policy)
        );
        assert_eq!(
            AttemptOverride::from_rocketmq_level(1),
            Ok(AttemptOverride::Level(1))
        );
        assert_eq!(
            AttemptOverride::from_rocketmq_level(i32::MAX),
            Ok(AttemptOverride::Level(i32::MAX as u32))
        );
        assert_eq!(AttemptOverride::default(), AttemptOverride::Policy);
    }

    #[test]
    fn a_level_must_be_one_of_the_policys() {
        let levels = crate::PolicySpec::delay_levels_default().build().unwrap();
        let level = |k| AttemptOverride::Level(k).checked_for(levels.as_ref());
        assert_eq!(level(1), Ok(AttemptOverride::Level(1)));
        assert_eq!(level(18), Ok(AttemptOverride::Level(18)));
        for bad in [0, 19, u32::MAX] {
            let e = level(bad).unwrap_err().to_string();
            assert!(e.contains("1 to 18"), "{e}");
        }
        let backoff = "backoff:fixed=1s,max=3"
            .parse::<crate::PolicySpec>()
            .unwrap()
            .build()
            .unwrap();
        let e = AttemptOverride::Level(3)
            .checked_for(backoff.as_ref())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no delay levels"), "{e}");
        for fine in [
            AttemptOverride::Policy,
            AttemptOverride::DeadLetter,
            AttemptOverride::Delay(Duration::from_secs(1)),
        ] {
            assert_eq!(fine.checked_for(backoff.as_ref()), Ok(fine));
            assert_eq!(fine.checked_for(levels.as_ref()), Ok(fine));
        }
    }

    #[test]
    fn reason_names_round_trip() {
        for r in FailureReason::ALL {
            assert_eq!(r.to_string().parse::<FailureReason>(), Ok(r));
            let json = serde_json::to_string(&r).expect("serialize");
            assert_eq!(json, format!("\"{r}\""));
        }
        assert_eq!("Ack-Timeout".parse(), Ok(FailureReason::AckTimeout));
        assert_eq!(
            "later".parse::<FailureReason>(),
            Err(PolicyError::UnknownFailureReason("later".into()))
        );
        assert_eq!(Tier::Retry.to_string(), "retry");
    }

    #[test]
    fn context_defaults_and_builders() {
        let ctx = FailureContext::new(0, FailureReason::Nack);
        assert_eq!(ctx.effective_attempt(), 1);
        assert_eq!(ctx.tier, Tier::Main);
        assert_eq!(ctx.overrides, AttemptOverride::Policy);
        assert_eq!(ctx.detail, None);
        let at = SystemTime::UNIX_EPOCH;
        let ctx = ctx
            .with_detail("boom")
            .with_tier(Tier::Retry)
            .with_first_failure(at)
            .with_jitter_seed(7);
        assert_eq!(ctx.detail, Some("boom"));
        assert_eq!(ctx.tier, Tier::Retry);
        assert_eq!(ctx.first_failure, Some(at));
        assert_eq!(ctx.jitter_seed, 7);
    }

    #[test]
    fn mandatory_dead_letters() {
        let t = FailureContext::new(1, FailureReason::Terminate);
        assert!(
            t.mandatory_dead_letter()
                .is_some_and(|d| d.is_dead_letter())
        );
        let o =
            FailureContext::new(1, FailureReason::Nack).with_override(AttemptOverride::DeadLetter);
        assert!(o.mandatory_dead_letter().is_some());
        let n = FailureContext::new(1, FailureReason::Nack);
        assert_eq!(n.mandatory_dead_letter(), None);
    }

    #[test]
    fn seeds_are_stable_and_spread() {
        // Pinned value: changing the hash would make brokers and clients of
        // different versions disagree on jittered delays.
        assert_eq!(jitter_seed(b"orders:42", 1), jitter_seed(b"orders:42", 1));
        assert_ne!(jitter_seed(b"orders:42", 1), jitter_seed(b"orders:42", 2));
        assert_ne!(jitter_seed(b"orders:42", 1), jitter_seed(b"orders:43", 1));
        assert_eq!(mix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(jitter_seed(b"orders:42", 1), 0xDF27_C00A_6864_7366);
    }

    #[test]
    fn decision_accessors() {
        let d = Decision::Redeliver {
            after: Duration::from_secs(1),
            tier: Tier::Retry,
        };
        assert_eq!(d.delay(), Some(Duration::from_secs(1)));
        assert_eq!(d.tier(), Some(Tier::Retry));
        assert!(!d.is_dead_letter());
        let d = Decision::DeadLetter { reason: "x".into() };
        assert_eq!(d.delay(), None);
        assert_eq!(d.tier(), None);
    }
}
