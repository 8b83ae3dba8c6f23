//! RocketMQ-style delay levels: the [`LevelTable`] (parsed from and printed
//! as RocketMQ's `messageDelayLevel` string, `"1s 5s 10s … 2h"`) and the
//! [`DelayLevelPolicy`] that walks it, one level per retry, through the
//! subscription's retry tier until `max_reconsume_times` is exceeded.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{DeadLetterPolicy, Decision, FailureContext, PolicyError, PolicySpec, Tier};

/// RocketMQ's default `messageDelayLevel`: 18 levels, level 1 = 1 s.
pub const DEFAULT_LEVELS: &str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

/// The level used by the first retry (RocketMQ's `3 + reconsumeTimes`).
pub const DEFAULT_START_LEVEL: u32 = 3;

/// Retries before the dead-letter tier (RocketMQ's `maxReconsumeTimes`).
pub const DEFAULT_MAX_RECONSUME_TIMES: u32 = 16;

const DEFAULT_LEVEL_SECS: [u64; 18] = [
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
];

/// A non-empty table of delay levels; level 1 is the first entry.
///
/// Every level is longer than zero and a whole number of milliseconds (the
/// wire form carries milliseconds). The text form is RocketMQ's: levels
/// separated by whitespace, each a whole number followed by one of the units
/// `ms`, `s`, `m`, `h`, `d`:
///
/// ```
/// use ricochet_policy::LevelTable;
/// let t: LevelTable = "100ms 1s 90s 2h".parse()?;
/// assert_eq!(t.len(), 4);
/// assert_eq!(t.to_string(), "100ms 1s 90s 2h");
/// assert!("1s 5x".parse::<LevelTable>().is_err());
/// # Ok::<(), ricochet_policy::PolicyError>(())
/// ```
///
/// In serde it is that string (an array of such strings is accepted too).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LevelTable(Vec<Duration>);

impl LevelTable {
    /// A table from explicit delays. Errors when `levels` is empty, or a
    /// level is zero or not a whole number of milliseconds.
    pub fn new(levels: Vec<Duration>) -> Result<Self, PolicyError> {
        if levels.is_empty() {
            return Err(PolicyError::EmptyLevelTable);
        }
        if levels.len() > crate::MAX_LEVELS {
            return Err(PolicyError::TooManyLevels {
                count: levels.len(),
                max: crate::MAX_LEVELS,
            });
        }
        for (i, d) in levels.iter().enumerate() {
            let reason = if d.is_zero() {
                "a delay level must be longer than zero"
            } else if d.subsec_nanos() % 1_000_000 != 0 {
                "a delay level must be a whole number of milliseconds"
            } else if *d > crate::MAX_POLICY_DELAY {
                "a delay level must be at most 365 days"
            } else {
                continue;
            };
            return Err(PolicyError::InvalidLevel {
                index: i + 1,
                token: format!("{d:?}"),
                reason: reason.to_owned(),
            });
        }
        Ok(LevelTable(levels))
    }

    /// RocketMQ's 18 default levels ([`DEFAULT_LEVELS`]).
    pub fn rocketmq_default() -> Self {
        LevelTable(
            DEFAULT_LEVEL_SECS
                .iter()
                .map(|&s| Duration::from_secs(s))
                .collect(),
        )
    }

    /// Number of levels (at least 1).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always `false`: a table has at least one level.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The levels, level 1 first.
    pub fn as_slice(&self) -> &[Duration] {
        &self.0
    }

    /// The number of the last level.
    pub fn last_level(&self) -> u32 {
        u32::try_from(self.0.len()).unwrap_or(u32::MAX)
    }

    /// The delay of `level`, clamped to `1 ..= len` (level 0 reads as level 1,
    /// levels past the end as the last level, like RocketMQ).
    pub fn delay(&self, level: u32) -> Duration {
        let idx = level.clamp(1, self.last_level()) - 1;
        // `idx < len` by the clamp; the fallback is unreachable.
        self.0.get(idx as usize).copied().unwrap_or_default()
    }

    /// The longest level.
    pub fn max_delay(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }
}

impl Default for LevelTable {
    fn default() -> Self {
        LevelTable::rocketmq_default()
    }
}

/// Parses one `<number><unit>` token; `index` is 1-based, for errors.
fn parse_level(index: usize, token: &str) -> Result<Duration, PolicyError> {
    let err = |reason: String| PolicyError::InvalidLevel {
        index,
        token: token.to_owned(),
        reason,
    };
    let split = token
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(token.len());
    let (digits, unit) = token.split_at(split);
    if digits.is_empty() {
        return Err(err(
            "expected a whole number followed by a unit (ms, s, m, h or d), e.g. `10s`".to_owned(),
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| err("number is too large".to_owned()))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => {
            return Err(err(
                "missing unit; expected ms, s, m, h or d (e.g. `10s`)".to_owned()
            ));
        }
        other => {
            return Err(err(format!(
                "unknown unit `{other}`; expected ms, s, m, h or d"
            )));
        }
    };
    let ms = n
        .checked_mul(unit_ms)
        .ok_or_else(|| err("delay is too large".to_owned()))?;
    if ms == 0 {
        return Err(err("a delay level must be longer than zero".to_owned()));
    }
    Ok(Duration::from_millis(ms))
}

impl FromStr for LevelTable {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let levels = s
            .split_whitespace()
            .enumerate()
            .map(|(i, tok)| parse_level(i + 1, tok))
            .collect::<Result<Vec<_>, _>>()?;
        LevelTable::new(levels)
    }
}

/// Writes `d` in the largest unit that divides it (`2h`, `90s`, `100ms`).
fn write_level(f: &mut fmt::Formatter<'_>, d: Duration) -> fmt::Result {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return write!(f, "{}{unit}", ms / size);
        }
    }
    write!(f, "{ms}ms")
}

impl fmt::Display for LevelTable {
    /// RocketMQ's form, which [`FromStr`] reads back exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write_level(f, *d)?;
        }
        Ok(())
    }
}

impl Serialize for LevelTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LevelTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TableVisitor;

        impl<'de> Visitor<'de> for TableVisitor {
            type Value = LevelTable;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a delay-level string such as \"1s 5s 10s\" or an array of levels")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<LevelTable, E> {
                v.parse().map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LevelTable, A::Error> {
                let mut levels = Vec::new();
                while let Some(tok) = seq.next_element::<String>()? {
                    let index = levels.len() + 1;
                    levels.push(parse_level(index, tok.trim()).map_err(de::Error::custom)?);
                }
                LevelTable::new(levels).map_err(de::Error::custom)
            }
        }

        deserializer.deserialize_any(TableVisitor)
    }
}

/// RocketMQ's retry policy: the n-th failure waits level
/// `start_level + n - 1` of the table (clamped to the last level), always in
/// the retry tier, and the failure after `max_reconsume_times` retries goes to
/// the dead-letter tier.
///
/// With the defaults (18 RocketMQ levels, start level 3, 16 retries) attempt 1
/// waits 10 s, attempt 2 30 s, attempt 3 1 min … attempt 16 2 h, and attempt
/// 17 is dead-lettered.
///
/// Overrides: [`AttemptOverride::Level(k)`](crate::AttemptOverride::Level)
/// uses level `k` clamped to `1 ..= len`;
/// [`AttemptOverride::Delay(d)`](crate::AttemptOverride::Delay) uses `d`.
/// Neither lifts the retry limit. A `start_level` must name a level of the
/// table; attempts past the table's end use its last level.
///
/// ```
/// use std::time::Duration;
/// use ricochet_policy::{
///     DeadLetterPolicy, Decision, DelayLevelPolicy, FailureContext, FailureReason, LevelTable, Tier,
/// };
///
/// // Three retries after 1 s, 2 s and 4 s, then the dead-letter tier.
/// let levels: LevelTable = "1s 2s 4s".parse()?;
/// let policy = DelayLevelPolicy::new(levels, 1, 3)?;
/// let later = |n| policy.decide(&FailureContext::new(n, FailureReason::ReconsumeLater));
/// assert_eq!(later(1), Decision::Redeliver { after: Duration::from_secs(1), tier: Tier::Retry });
/// assert_eq!(later(3).delay(), Some(Duration::from_secs(4)));
/// assert!(later(4).is_dead_letter());
///
/// // RocketMQ's defaults: the first retry at level 3 (10 s), the 17th attempt dead-lettered.
/// let rocketmq = DelayLevelPolicy::rocketmq();
/// let nack = |n| rocketmq.decide(&FailureContext::new(n, FailureReason::Nack));
/// assert_eq!(nack(1).delay(), Some(Duration::from_secs(10)));
/// assert!(nack(17).is_dead_letter());
/// # Ok::<(), ricochet_policy::PolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayLevelPolicy {
    levels: LevelTable,
    start_level: u32,
    max_reconsume_times: u32,
}

impl DelayLevelPolicy {
    /// A policy on `levels`. Errors when `start_level` or
    /// `max_reconsume_times` is 0.
    pub fn new(
        levels: LevelTable,
        start_level: u32,
        max_reconsume_times: u32,
    ) -> Result<Self, PolicyError> {
        if start_level == 0 {
            return Err(PolicyError::ZeroStartLevel);
        }
        if start_level > levels.last_level() {
            return Err(PolicyError::StartLevelBeyondTable {
                start_level,
                levels: levels.last_level() as usize,
            });
        }
        if max_reconsume_times == 0 {
            return Err(PolicyError::ZeroMaxAttempts {
                field: "max_reconsume_times",
            });
        }
        Ok(DelayLevelPolicy {
            levels,
            start_level,
            max_reconsume_times,
        })
    }

    /// RocketMQ's defaults: 18 levels, start level 3, 16 retries.
    pub fn rocketmq() -> Self {
        DelayLevelPolicy {
            levels: LevelTable::rocketmq_default(),
            start_level: DEFAULT_START_LEVEL,
            max_reconsume_times: DEFAULT_MAX_RECONSUME_TIMES,
        }
    }

    /// A policy on a custom table in RocketMQ's string form, with the default
    /// start level (3) and retry limit (16).
    pub fn from_levels_str(levels: &str) -> Result<Self, PolicyError> {
        DelayLevelPolicy::new(
            levels.parse()?,
            DEFAULT_START_LEVEL,
            DEFAULT_MAX_RECONSUME_TIMES,
        )
    }

    /// The same policy with another start level (must be at least 1).
    pub fn with_start_level(self, start_level: u32) -> Result<Self, PolicyError> {
        DelayLevelPolicy::new(self.levels, start_level, self.max_reconsume_times)
    }

    /// The same policy with another retry limit (must be at least 1).
    pub fn with_max_reconsume_times(self, max: u32) -> Result<Self, PolicyError> {
        DelayLevelPolicy::new(self.levels, self.start_level, max)
    }

    /// The level table.
    pub fn levels(&self) -> &LevelTable {
        &self.levels
    }

    /// The level of the first retry.
    pub fn start_level(&self) -> u32 {
        self.start_level
    }

    /// Retries before the dead-letter tier.
    pub fn max_reconsume_times(&self) -> u32 {
        self.max_reconsume_times
    }

    /// The level the `attempt`-th failure uses (attempt 0 reads as 1), clamped
    /// to the last level.
    pub fn level_for_attempt(&self, attempt: u32) -> u32 {
        let n = attempt.max(1);
        self.start_level
            .saturating_add(n - 1)
            .min(self.levels.last_level())
    }

    /// The delay of the `attempt`-th failure, ignoring the retry limit.
    pub fn delay_for_attempt(&self, attempt: u32) -> Duration {
        self.levels.delay(self.level_for_attempt(attempt))
    }
}

impl Default for DelayLevelPolicy {
    fn default() -> Self {
        DelayLevelPolicy::rocketmq()
    }
}

impl DeadLetterPolicy for DelayLevelPolicy {
    fn decide(&self, ctx: &FailureContext<'_>) -> Decision {
        if let Some(d) = ctx.mandatory_dead_letter() {
            return d;
        }
        if let Some(d) = ctx.over_limit("max_reconsume_times", self.max_reconsume_times) {
            return d;
        }
        let after = match ctx.overrides {
            crate::AttemptOverride::Level(k) => self.levels.delay(k),
            crate::AttemptOverride::Delay(d) => d,
            crate::AttemptOverride::Policy | crate::AttemptOverride::DeadLetter => {
                self.delay_for_attempt(ctx.attempt)
            }
        };
        Decision::Redeliver {
            after,
            tier: Tier::Retry,
        }
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(self.max_reconsume_times)
    }

    fn delay_levels(&self) -> Option<u32> {
        Some(self.levels.last_level())
    }

    fn spec(&self) -> Option<PolicySpec> {
        let levels = (self.levels != LevelTable::rocketmq_default()).then(|| self.levels.clone());
        Some(PolicySpec::DelayLevels {
            levels,
            start_level: self.start_level,
            max_reconsume_times: self.max_reconsume_times,
        })
    }

    fn name(&self) -> &str {
        "delay_levels"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttemptOverride, FailureReason};

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn decide(p: &DelayLevelPolicy, attempt: u32) -> Decision {
        p.decide(&FailureContext::new(attempt, FailureReason::ReconsumeLater))
    }

    #[test]
    fn default_table_matches_rocketmq_string() {
        let parsed: LevelTable = DEFAULT_LEVELS.parse().expect("default table parses");
        assert_eq!(parsed, LevelTable::rocketmq_default());
        assert_eq!(parsed.len(), 18);
        assert_eq!(parsed.to_string(), DEFAULT_LEVELS);
        assert_eq!(parsed.delay(1), secs(1));
        assert_eq!(parsed.delay(18), secs(7200));
    }

    #[test]
    fn default_schedule_is_10s_to_2h_then_dlq() {
        let p = DelayLevelPolicy::default();
        let expected = [
            10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
        ];
        for (i, want) in expected.iter().enumerate() {
            let attempt = i as u32 + 1;
            assert_eq!(
                decide(&p, attempt),
                Decision::Redeliver {
                    after: secs(*want),
                    tier: Tier::Retry
                },
                "attempt {attempt}"
            );
        }
        assert_eq!(
            decide(&p, 17),
            Decision::DeadLetter {
                reason: "attempt 17 exceeds max_reconsume_times 16".into()
            }
        );
        assert!(decide(&p, u32::MAX).is_dead_letter());
    }

    #[test]
    fn attempt_zero_is_attempt_one() {
        let p = DelayLevelPolicy::default();
        assert_eq!(decide(&p, 0), decide(&p, 1));
        assert_eq!(p.level_for_attempt(0), 3);
    }

    #[test]
    fn tier_is_always_retry() {
        let p = DelayLevelPolicy::default();
        for reason in [
            FailureReason::Nack,
            FailureReason::AckTimeout,
            FailureReason::ConsumerLost,
            FailureReason::ReconsumeLater,
        ] {
            let d = p.decide(&FailureContext::new(1, reason).with_tier(Tier::Main));
            assert_eq!(d.tier(), Some(Tier::Retry), "{reason}");
        }
    }

    #[test]
    fn levels_clamp_to_last() {
        let p = DelayLevelPolicy::from_levels_str("1s 2s 3s")
            .and_then(|p| p.with_start_level(1))
            .and_then(|p| p.with_max_reconsume_times(100))
            .expect("valid");
        assert_eq!(p.delay_for_attempt(1), secs(1));
        assert_eq!(p.delay_for_attempt(3), secs(3));
        assert_eq!(p.delay_for_attempt(4), secs(3));
        assert_eq!(p.delay_for_attempt(u32::MAX), secs(3));
        // A start level must name a level of the table.
        assert_eq!(
            p.clone().with_start_level(4),
            Err(PolicyError::StartLevelBeyondTable {
                start_level: 4,
                levels: 3
            })
        );
        let p = p.with_start_level(3).expect("valid");
        assert_eq!(p.delay_for_attempt(1), secs(3));
        assert_eq!(p.level_for_attempt(u32::MAX), 3);
    }

    #[test]
    fn overrides() {
        let p = DelayLevelPolicy::default();
        let ctx = |o: AttemptOverride| FailureContext::new(1, FailureReason::Nack).with_override(o);
        assert!(
            p.decide(&ctx(AttemptOverride::from_rocketmq_level(-1).unwrap()))
                .is_dead_letter()
        );
        assert_eq!(
            p.decide(&ctx(AttemptOverride::from_rocketmq_level(0).unwrap()))
                .delay(),
            Some(secs(10))
        );
        assert_eq!(
            p.decide(&ctx(AttemptOverride::from_rocketmq_level(5).unwrap()))
                .delay(),
            Some(secs(60))
        );
        assert_eq!(
            p.decide(&ctx(AttemptOverride::Level(0))).delay(),
            Some(secs(1))
        );
        assert_eq!(
            p.decide(&ctx(AttemptOverride::Level(99))).delay(),
            Some(secs(7200))
        );
        assert_eq!(
            p.decide(&ctx(AttemptOverride::Delay(Duration::from_millis(1500))))
                .delay(),
            Some(Duration::from_millis(1500))
        );
        // An override does not lift the retry limit.
        let late =
            FailureContext::new(17, FailureReason::Nack).with_override(AttemptOverride::Level(1));
        assert!(p.decide(&late).is_dead_letter());
        // Terminate wins over everything.
        let t = FailureContext::new(1, FailureReason::Terminate)
            .with_override(AttemptOverride::Level(1));
        assert!(p.decide(&t).is_dead_letter());
    }

    #[test]
    fn lowering_the_limit_applies_at_once() {
        let p = DelayLevelPolicy::default()
            .with_max_reconsume_times(3)
            .expect("valid");
        assert!(!decide(&p, 3).is_dead_letter());
        assert!(decide(&p, 4).is_dead_letter());
        assert!(decide(&p, 10).is_dead_letter());
    }

    #[test]
    fn validation() {
        assert_eq!(
            DelayLevelPolicy::default().with_start_level(0),
            Err(PolicyError::ZeroStartLevel)
        );
        assert_eq!(
            DelayLevelPolicy::default().with_max_reconsume_times(0),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_reconsume_times"
            })
        );
        assert_eq!(LevelTable::new(vec![]), Err(PolicyError::EmptyLevelTable));
        assert!(matches!(
            LevelTable::new(vec![secs(1), Duration::ZERO]),
            Err(PolicyError::InvalidLevel { index: 2, .. })
        ));
        assert!(matches!(
            LevelTable::new(vec![Duration::from_micros(1500)]),
            Err(PolicyError::InvalidLevel { index: 1, .. })
        ));
        // Absurd tables: a level of u64::MAX ms, or a million levels.
        assert!(matches!(
            LevelTable::new(vec![secs(1), Duration::from_millis(u64::MAX)]),
            Err(PolicyError::InvalidLevel { index: 2, .. })
        ));
        assert!(LevelTable::new(vec![crate::MAX_POLICY_DELAY]).is_ok());
        assert_eq!(
            LevelTable::new(vec![secs(1); 1_000_000]),
            Err(PolicyError::TooManyLevels {
                count: 1_000_000,
                max: crate::MAX_LEVELS
            })
        );
    }

    #[test]
    fn parse_errors() {
        let cases = [
            ("", PolicyError::EmptyLevelTable),
            ("   \t ", PolicyError::EmptyLevelTable),
        ];
        for (input, want) in cases {
            assert_eq!(input.parse::<LevelTable>(), Err(want), "{input:?}");
        }
        let invalid = |input: &str, index: usize, token: &str, reason_part: &str| match input
            .parse::<LevelTable>(
        ) {
            Err(PolicyError::InvalidLevel {
                index: i,
                token: t,
                reason,
            }) => {
                assert_eq!((i, t.as_str()), (index, token), "{input:?}");
                assert!(reason.contains(reason_part), "{input:?}: {reason}");
            }
            other => panic!("{input:?}: unexpected {other:?}"),
        };
        invalid("1s 0s", 2, "0s", "longer than zero");
        invalid("1s 0ms", 2, "0ms", "longer than zero");
        invalid("1s 5x", 2, "5x", "unknown unit `x`");
        invalid("1s 5", 2, "5", "missing unit");
        invalid("s", 1, "s", "whole number");
        invalid("-1s", 1, "-1s", "whole number");
        invalid("1.5s", 1, "1.5s", "unknown unit `.5s`");
        invalid("1S", 1, "1S", "unknown unit `S`");
        invalid(
            "99999999999999999999s",
            1,
            "99999999999999999999s",
            "too large",
        );
        invalid("999999999999999999d", 1, "999999999999999999d", "too large");
    }

    #[test]
    fn parse_units_and_whitespace() {
        let t: LevelTable = " 100ms\t1s  2m\n3h 1d ".parse().expect("valid");
        assert_eq!(
            t.as_slice(),
            &[
                Duration::from_millis(100),
                secs(1),
                secs(120),
                secs(3 * 3600),
                secs(86_400)
            ]
        );
        assert_eq!(t.to_string(), "100ms 1s 2m 3h 1d");
        let t: LevelTable = "1500ms 60s 120m 48h".parse().expect("valid");
        assert_eq!(t.to_string(), "1500ms 1m 2h 2d");
        assert_eq!(t.max_delay(), secs(48 * 3600));
    }

    #[test]
    fn serde_string_and_array() {
        let t: LevelTable = serde_json::from_str("\"1s 5s\"").expect("string form");
        assert_eq!(t.as_slice(), &[secs(1), secs(5)]);
        let t: LevelTable = serde_json::from_str("[\"1s\", \"5s\"]").expect("array form");
        assert_eq!(t.as_slice(), &[secs(1), secs(5)]);
        assert_eq!(serde_json::to_string(&t).expect("serialize"), "\"1s 5s\"");
        assert!(serde_json::from_str::<LevelTable>("[]").is_err());
        assert!(serde_json::from_str::<LevelTable>("\"1q\"").is_err());
        assert!(serde_json::from_str::<LevelTable>("5").is_err());
    }

    #[test]
    fn spec_of_default_omits_levels() {
        let spec = DelayLevelPolicy::default().spec().expect("built-in");
        assert_eq!(
            spec,
            PolicySpec::DelayLevels {
                levels: None,
                start_level: 3,
                max_reconsume_times: 16
            }
        );
        let custom = DelayLevelPolicy::from_levels_str("1s 2s 3s").expect("valid");
        assert!(matches!(
            custom.spec(),
            Some(PolicySpec::DelayLevels {
                levels: Some(_),
                ..
            })
        ));
    }
}
