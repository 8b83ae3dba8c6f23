//! The crate's single error type, [`PolicyError`]: every way a policy value
//! can be malformed (level tables, limits, backoff parameters), every way the
//! compact CLI form can fail to parse, and the registry's lookup failures.
//! Messages name the offending field and value so they can be shown to an
//! operator as they are (for example in a gRPC `InvalidArgument` status).

use std::time::Duration;

/// Formats a duration for an error message (`100ms`, `1m 30s`).
fn fmt_duration(d: &Duration) -> humantime::FormattedDuration {
    humantime::format_duration(*d)
}

fn invalid_delay_level(level: i64, levels: Option<u32>) -> String {
    let valid = "-1 (dead-letter now), 0 (the policy decides)";
    match levels {
        Some(0) => format!(
            "delay level {level}: this subscription's policy has no delay levels; use {valid} or an explicit delay"
        ),
        Some(n) => format!(
            "delay level {level} is not a level of this subscription's policy: use {valid} or 1 to {n}"
        ),
        None => format!(
            "delay level {level} means nothing: use {valid} or a level of the table (1 and up)"
        ),
    }
}

/// Everything that can be wrong with a policy or its textual form.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A delay-level table with no levels.
    #[error("the delay-level table is empty; give at least one level, e.g. \"1s 5s 10s\"")]
    EmptyLevelTable,

    /// One entry of a delay-level table is malformed (`index` counts from 1,
    /// like RocketMQ's levels).
    #[error("delay level {index} (`{token}`): {reason}")]
    InvalidLevel {
        /// 1-based position of the level in the table.
        index: usize,
        /// The offending text (or the duration, for tables built from values).
        token: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A delay-level table with more levels than [`MAX_LEVELS`](crate::MAX_LEVELS).
    #[error("the delay-level table has {count} levels; at most {max} are allowed")]
    TooManyLevels {
        /// Levels given.
        count: usize,
        /// The limit.
        max: usize,
    },

    /// `start_level` past the end of the level table.
    #[error("start_level {start_level} is past the end of the {levels}-level table")]
    StartLevelBeyondTable {
        /// The start level asked for.
        start_level: u32,
        /// Levels in the table.
        levels: usize,
    },

    /// A delay longer than [`MAX_POLICY_DELAY`](crate::MAX_POLICY_DELAY).
    #[error("{what} {} is longer than the {} a policy may wait", fmt_duration(.delay), fmt_duration(.max))]
    DelayTooLong {
        /// Which delay (`fixed delay`, `backoff max delay`, ...).
        what: &'static str,
        /// The delay asked for.
        delay: Duration,
        /// The limit.
        max: Duration,
    },

    /// A [`KeyOrder`](crate::KeyOrder) setting out of range.
    #[error("invalid key order: {0}")]
    InvalidKeyOrder(String),

    /// `start_level` of a delay-level policy was 0.
    #[error("start_level must be at least 1 (level 1 is the first entry of the table), got 0")]
    ZeroStartLevel,

    /// A retry limit (`max_reconsume_times`, `max_redeliver_count`) was 0.
    #[error(
        "{field} must be at least 1, got 0; to dead-letter on the first failure, fail the message \
         with FailureReason::Terminate or an AttemptOverride::DeadLetter instead"
    )]
    ZeroMaxAttempts {
        /// The field's name as it appears in the configuration.
        field: &'static str,
    },

    /// A fixed nack delay below [`MIN_FIXED_DELAY`](crate::MIN_FIXED_DELAY).
    #[error("fixed redelivery delay {} is below the minimum of {}", fmt_duration(.delay), fmt_duration(.min))]
    FixedDelayTooShort {
        /// The delay that was asked for.
        delay: Duration,
        /// The smallest delay accepted.
        min: Duration,
    },

    /// A multiplier backoff whose `min` delay is zero (every delay would be zero).
    #[error("backoff min delay must be greater than zero")]
    ZeroMinDelay,

    /// A multiplier backoff whose `max` is below its `min`.
    #[error("backoff max delay ({}) is below its min delay ({})", fmt_duration(.max), fmt_duration(.min))]
    MaxBelowMin {
        /// The configured minimum delay.
        min: Duration,
        /// The configured maximum delay.
        max: Duration,
    },

    /// A multiplier that is not a finite number greater than 1.
    #[error("backoff multiplier must be a finite number greater than 1, got {0}")]
    InvalidMultiplier(f64),

    /// A jitter fraction outside `0.0 ..= 1.0` (or NaN).
    #[error("backoff jitter must be a fraction between 0.0 and 1.0 inclusive, got {0}")]
    InvalidJitter(f64),

    /// A backoff spec that sets both `fixed` and `multiplier`.
    #[error("a backoff policy takes either `fixed` or `multiplier`, not both")]
    ConflictingBackoff,

    /// A `reconsume_later` delay level that means nothing: below `-1`, or
    /// not a level of the policy's table (`levels` of them; `Some(0)` for a
    /// policy without levels, `None` when only the sign was checked).
    #[error("{}", invalid_delay_level(*.level, *.levels))]
    InvalidDelayLevel {
        /// The level asked for.
        level: i64,
        /// The levels of the policy's table, when it was checked against one.
        levels: Option<u32>,
    },

    /// A named policy that no registry knows.
    #[error("unknown policy `{name}`: no policy of that name is registered")]
    UnknownPolicy {
        /// The name that was asked for.
        name: String,
    },

    /// A second registration under a name that is already taken.
    #[error("a policy named `{name}` is already registered")]
    DuplicatePolicy {
        /// The name that was registered twice.
        name: String,
    },

    /// A policy name that is empty or contains whitespace or `:`.
    #[error(
        "invalid policy name {name:?}: a name must be non-empty and contain no whitespace or `:`"
    )]
    InvalidPolicyName {
        /// The rejected name.
        name: String,
    },

    /// A registered policy rejected its parameters.
    #[error("invalid parameters for policy `{name}`: {reason}")]
    InvalidParams {
        /// The policy's registered name.
        name: String,
        /// Why the parameters were rejected.
        reason: String,
    },

    /// The compact CLI form (or the JSON form) of a spec could not be parsed.
    #[error("cannot parse policy `{input}`: {reason}")]
    Parse {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A failure reason name that is not one of the five reasons.
    #[error(
        "unknown failure reason `{0}`; expected one of nack, ack_timeout, consumer_lost, \
         reconsume_later, terminate"
    )]
    UnknownFailureReason(String),

    /// An outage-breaker setting out of range (see
    /// [`BreakerSpec`](crate::BreakerSpec)).
    #[error("breaker: {0}")]
    InvalidBreaker(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_values() {
        let e = PolicyError::FixedDelayTooShort {
            delay: Duration::from_millis(50),
            min: Duration::from_millis(100),
        };
        assert_eq!(
            e.to_string(),
            "fixed redelivery delay 50ms is below the minimum of 100ms"
        );
        let e = PolicyError::ZeroMaxAttempts {
            field: "max_redeliver_count",
        };
        assert!(
            e.to_string()
                .starts_with("max_redeliver_count must be at least 1, got 0")
        );
        let e = PolicyError::MaxBelowMin {
            min: Duration::from_secs(60),
            max: Duration::from_secs(10),
        };
        assert_eq!(
            e.to_string(),
            "backoff max delay (10s) is below its min delay (1m)"
        );
    }
}
