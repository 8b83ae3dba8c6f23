//! [`PolicySpec`]: a policy as a value. It is what configuration files, the
//! admin API and subscribing clients carry (serde: TOML, JSON…), what the
//! wire form converts to and from, and what tools print. This module owns its
//! validation, building a [`DeadLetterPolicy`] from it, and its compact
//! command-line form.
//!
//! # The compact form
//!
//! `FromStr` reads, and `Display` writes, a one-line form meant for command
//! lines and environment variables:
//!
//! ```text
//! SPEC := KIND [ ":" ARGS ]  |  a JSON object (anything starting with `{`)
//! ARGS := KEY "=" VALUE { "," KEY "=" VALUE }
//! ```
//!
//! | kind (aliases) | keys (aliases) |
//! |---|---|
//! | `delay-levels` (`delay_levels`, `rocketmq`) | `start` (`start-level`): first retry's level, default 3; `max` (`max-reconsume-times`): retries, default 16; `levels`: a RocketMQ level string, default the 18 RocketMQ levels |
//! | `backoff` (`pulsar`) | `max` (`max-redeliver-count`): redeliveries, **required**; either `fixed` (`fixed-delay`): a duration, or any of `min` (`min-delay`), `max-delay`: durations, `multiplier`, `jitter`: numbers (unset ones take Pulsar's defaults 10s, 10m, 2, 0); with neither, a fixed 60 s |
//! | `named` | `named:NAME` or `named:NAME:PARAMS`, where `PARAMS` is everything after the second colon, verbatim |
//!
//! Keys are case-sensitive; `_` and `-` are interchangeable in kinds and
//! keys. Durations are humantime strings (`100ms`, `10s`, `1m 30s`, `2h`).
//! Values are trimmed and may not contain `,` (`named` PARAMS excepted). Parsing validates the result,
//! so a parsed spec always builds (except `named`, which needs a registry).
//!
//! ```
//! use ricochet_policy::PolicySpec;
//! for s in [
//!     "delay-levels",
//!     "delay-levels:start=3,max=16,levels=1s 5s 10s",
//!     "backoff:fixed=60s,max=5",
//!     "backoff:min=10s,max-delay=10m,multiplier=2,jitter=0.1,max=3",
//!     "named:poison-keys:{\"keys\":[\"a\",\"b\"]}",
//!     r#"{"type":"backoff","fixed":"1m","max_redeliver_count":5}"#,
//! ] {
//!     let spec: PolicySpec = s.parse()?;
//!     // Display writes the canonical compact form, which reads back the same.
//!     assert_eq!(spec.to_string().parse::<PolicySpec>()?, spec);
//! }
//! assert!("backoff:fixed=60s".parse::<PolicySpec>().is_err()); // max is required
//! # Ok::<(), ricochet_policy::PolicyError>(())
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::delay_levels::{DEFAULT_MAX_RECONSUME_TIMES, DEFAULT_START_LEVEL};
#[cfg(doc)]
use crate::{BackoffPolicy, DeadLetterPolicy, DelayLevelPolicy};
use crate::{LevelTable, MultiplierBackoff};

mod build;
mod compact;
#[cfg(test)]
mod tests;

pub(crate) use build::validate_name;
pub(crate) use compact::{Args, parse_error};

fn default_start_level() -> u32 {
    DEFAULT_START_LEVEL
}

fn default_max_reconsume_times() -> u32 {
    DEFAULT_MAX_RECONSUME_TIMES
}

/// A dead-letter policy as a serializable value.
///
/// In serde it is tagged by `type`, and durations are humantime strings:
///
/// ```toml
/// type = "delay_levels"
/// levels = "1s 5s 10s 30s 1m"   # optional, default: RocketMQ's 18 levels
/// start_level = 3               # optional
/// max_reconsume_times = 16      # optional
/// ```
///
/// ```toml
/// type = "backoff"
/// max_redeliver_count = 3       # required
/// fixed = "1m"                  # either this...
/// [multiplier]                  # ...or this (each field optional)
/// min = "10s"
/// max = "10m"
/// multiplier = 2.0
/// jitter = 0.1
/// ```
///
/// ```toml
/// type = "named"
/// name = "poison-keys"
/// params = '{"keys": ["a"]}'    # optional, for the named policy
/// ```
///
/// Deserializing does not validate beyond the level table: call
/// [`validate`](Self::validate) or [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use ricochet_policy::{FailureContext, FailureReason, PolicySpec};
///
/// // The same policy from a config file (TOML), a command line and code.
/// let from_toml: PolicySpec =
///     toml::from_str("type = \"backoff\"\nfixed = \"30s\"\nmax_redeliver_count = 5\n")?;
/// let from_line: PolicySpec = "backoff:fixed=30s,max=5".parse()?;
/// let from_code = PolicySpec::fixed_backoff(Duration::from_secs(30), 5);
/// assert_eq!(from_toml, from_line);
/// assert_eq!(from_line, from_code);
/// assert_eq!(from_code.to_string(), "backoff:fixed=30s,max=5");
///
/// let policy = from_code.build()?;
/// let sixth = policy.decide(&FailureContext::new(6, FailureReason::Nack));
/// assert!(sixth.is_dead_letter());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicySpec {
    /// RocketMQ delay levels ([`DelayLevelPolicy`]).
    DelayLevels {
        /// The level table; `None` means RocketMQ's 18 default levels.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        levels: Option<LevelTable>,
        /// The level of the first retry (at least 1, default 3).
        #[serde(default = "default_start_level")]
        start_level: u32,
        /// Retries before the dead-letter tier (at least 1, default 16).
        #[serde(default = "default_max_reconsume_times")]
        max_reconsume_times: u32,
    },
    /// Pulsar negative-ack backoff ([`BackoffPolicy`]). With neither `fixed`
    /// nor `multiplier`, a fixed delay of 60 s (Pulsar's default).
    Backoff {
        /// A fixed delay (at least 100 ms). Exclusive with `multiplier`.
        #[serde(
            default,
            with = "humantime_serde",
            skip_serializing_if = "Option::is_none"
        )]
        fixed: Option<Duration>,
        /// An exponential curve. Exclusive with `fixed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        multiplier: Option<MultiplierBackoff>,
        /// Redeliveries before the dead-letter tier (at least 1; required).
        max_redeliver_count: u32,
    },
    /// A policy registered by name (see [`PolicyRegistry`](crate::PolicyRegistry)).
    Named {
        /// The registered name.
        name: String,
        /// Parameters for the policy, interpreted by its factory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        params: Option<String>,
    },
}

impl PolicySpec {
    /// RocketMQ's defaults: 18 levels, start level 3, 16 retries.
    pub fn delay_levels_default() -> Self {
        PolicySpec::DelayLevels {
            levels: None,
            start_level: DEFAULT_START_LEVEL,
            max_reconsume_times: DEFAULT_MAX_RECONSUME_TIMES,
        }
    }

    /// A fixed backoff.
    pub fn fixed_backoff(delay: Duration, max_redeliver_count: u32) -> Self {
        PolicySpec::Backoff {
            fixed: Some(delay),
            multiplier: None,
            max_redeliver_count,
        }
    }

    /// A multiplier backoff.
    pub fn multiplier_backoff(backoff: MultiplierBackoff, max_redeliver_count: u32) -> Self {
        PolicySpec::Backoff {
            fixed: None,
            multiplier: Some(backoff),
            max_redeliver_count,
        }
    }

    /// A named policy.
    pub fn named(name: impl Into<String>, params: Option<String>) -> Self {
        PolicySpec::Named {
            name: name.into(),
            params,
        }
    }

    /// The serde tag: `delay_levels`, `backoff` or `named`.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicySpec::DelayLevels { .. } => "delay_levels",
            PolicySpec::Backoff { .. } => "backoff",
            PolicySpec::Named { .. } => "named",
        }
    }
}

impl Default for PolicySpec {
    /// RocketMQ's delay levels at their defaults (16 retries, 10 s … 2 h,
    /// then the DLQ): the policy of a subscription nobody configured.
    fn default() -> Self {
        PolicySpec::delay_levels_default()
    }
}
