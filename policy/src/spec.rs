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

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::delay_levels::{DEFAULT_MAX_RECONSUME_TIMES, DEFAULT_START_LEVEL};
use crate::{
    Backoff, BackoffPolicy, DeadLetterPolicy, DelayLevelPolicy, LevelTable, MultiplierBackoff,
    PolicyError,
};

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

/// Checks a registered policy name: non-empty, no whitespace, no `:`.
pub(crate) fn validate_name(name: &str) -> Result<(), PolicyError> {
    if name.is_empty() || name.contains(|c: char| c == ':' || c.is_whitespace()) {
        return Err(PolicyError::InvalidPolicyName {
            name: name.to_owned(),
        });
    }
    Ok(())
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

    /// Checks every rule a built-in policy enforces, without building it.
    /// For `Named` only the name's syntax is checked.
    pub fn validate(&self) -> Result<(), PolicyError> {
        match self {
            PolicySpec::DelayLevels { .. } | PolicySpec::Backoff { .. } => {
                self.build_builtin().map(|_| ())
            }
            PolicySpec::Named { name, .. } => validate_name(name),
        }
    }

    /// Builds the policy. `Named` specs fail with
    /// [`PolicyError::UnknownPolicy`] here; resolve them with a
    /// [`PolicyRegistry`](crate::PolicyRegistry).
    pub fn build(&self) -> Result<Arc<dyn DeadLetterPolicy>, PolicyError> {
        match self.build_builtin()? {
            Some(p) => Ok(p),
            None => Err(PolicyError::UnknownPolicy {
                name: match self {
                    PolicySpec::Named { name, .. } => name.clone(),
                    _ => String::new(),
                },
            }),
        }
    }

    /// Builds a built-in policy; `Ok(None)` for a (syntactically valid) `Named`.
    pub(crate) fn build_builtin(&self) -> Result<Option<Arc<dyn DeadLetterPolicy>>, PolicyError> {
        match self {
            PolicySpec::DelayLevels {
                levels,
                start_level,
                max_reconsume_times,
            } => Ok(Some(Arc::new(DelayLevelPolicy::new(
                levels.clone().unwrap_or_default(),
                *start_level,
                *max_reconsume_times,
            )?))),
            PolicySpec::Backoff {
                fixed,
                multiplier,
                max_redeliver_count,
            } => {
                let backoff = match (fixed, multiplier) {
                    (Some(_), Some(_)) => return Err(PolicyError::ConflictingBackoff),
                    (Some(d), None) => Backoff::Fixed(*d),
                    (None, Some(m)) => Backoff::Multiplier(*m),
                    (None, None) => Backoff::default(),
                };
                Ok(Some(Arc::new(BackoffPolicy::new(
                    backoff,
                    *max_redeliver_count,
                )?)))
            }
            PolicySpec::Named { name, .. } => validate_name(name).map(|()| None),
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

impl fmt::Display for PolicySpec {
    /// The canonical compact form (see the [module docs](self)).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicySpec::DelayLevels {
                levels,
                start_level,
                max_reconsume_times,
            } => {
                write!(
                    f,
                    "delay-levels:start={start_level},max={max_reconsume_times}"
                )?;
                if let Some(levels) = levels {
                    write!(f, ",levels={levels}")?;
                }
                Ok(())
            }
            PolicySpec::Backoff {
                fixed,
                multiplier,
                max_redeliver_count,
            } => {
                f.write_str("backoff:")?;
                if let Some(d) = fixed {
                    write!(f, "fixed={},", humantime::format_duration(*d))?;
                }
                if let Some(m) = multiplier {
                    write!(
                        f,
                        "min={},max-delay={},multiplier={},jitter={},",
                        humantime::format_duration(m.min),
                        humantime::format_duration(m.max),
                        m.multiplier,
                        m.jitter
                    )?;
                }
                write!(f, "max={max_redeliver_count}")
            }
            PolicySpec::Named { name, params } => {
                write!(f, "named:{name}")?;
                if let Some(p) = params {
                    write!(f, ":{p}")?;
                }
                Ok(())
            }
        }
    }
}

/// A key=value list being parsed, for one kind with its allowed keys.
struct Args<'a> {
    input: &'a str,
    kind: &'static str,
    pairs: Vec<(&'static str, &'a str)>,
}

impl<'a> Args<'a> {
    /// Splits `args` and maps every key through `keys` (alias → canonical).
    fn parse(
        input: &'a str,
        kind: &'static str,
        args: Option<&'a str>,
        keys: &[(&str, &'static str)],
    ) -> Result<Self, PolicyError> {
        let mut pairs: Vec<(&'static str, &'a str)> = Vec::new();
        for piece in args.unwrap_or("").split(',') {
            if piece.trim().is_empty() {
                continue;
            }
            let Some((key, value)) = piece.split_once('=') else {
                return Err(parse_error(
                    input,
                    format!("expected KEY=VALUE, got `{}`", piece.trim()),
                ));
            };
            let key_norm = key.trim().replace('_', "-");
            let Some(&(_, canonical)) = keys.iter().find(|(alias, _)| *alias == key_norm) else {
                let mut known: Vec<&str> = keys.iter().map(|(_, c)| *c).collect();
                known.dedup();
                return Err(parse_error(
                    input,
                    format!(
                        "unknown key `{}` for {kind}; expected one of: {}",
                        key.trim(),
                        known.join(", ")
                    ),
                ));
            };
            if pairs.iter().any(|(k, _)| *k == canonical) {
                return Err(parse_error(
                    input,
                    format!("key `{canonical}` is given twice"),
                ));
            }
            pairs.push((canonical, value.trim()));
        }
        Ok(Args { input, kind, pairs })
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn u32(&self, key: &str) -> Result<Option<u32>, PolicyError> {
        self.get(key)
            .map(|v| {
                v.parse::<u32>().map_err(|_| {
                    parse_error(
                        self.input,
                        format!("`{key}` must be a whole number (0 ..= 4294967295), got `{v}`"),
                    )
                })
            })
            .transpose()
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, PolicyError> {
        self.get(key)
            .map(|v| {
                v.parse::<f64>().map_err(|_| {
                    parse_error(self.input, format!("`{key}` must be a number, got `{v}`"))
                })
            })
            .transpose()
    }

    fn duration(&self, key: &str) -> Result<Option<Duration>, PolicyError> {
        self.get(key)
            .map(|v| {
                humantime::parse_duration(v).map_err(|e| {
                    parse_error(
                        self.input,
                        format!(
                            "`{key}` must be a duration such as `10s` or `1m 30s`, got `{v}`: {e}"
                        ),
                    )
                })
            })
            .transpose()
    }

    fn required_u32(&self, key: &str, what: &str) -> Result<u32, PolicyError> {
        self.u32(key)?.ok_or_else(|| {
            parse_error(
                self.input,
                format!("{} needs `{key}=N` ({what})", self.kind),
            )
        })
    }
}

fn parse_error(input: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::Parse {
        input: input.to_owned(),
        reason: reason.into(),
    }
}

const DELAY_LEVEL_KEYS: &[(&str, &str)] = &[
    ("start", "start"),
    ("start-level", "start"),
    ("max", "max"),
    ("max-reconsume-times", "max"),
    ("levels", "levels"),
];

const BACKOFF_KEYS: &[(&str, &str)] = &[
    ("fixed", "fixed"),
    ("fixed-delay", "fixed"),
    ("min", "min"),
    ("min-delay", "min"),
    ("max-delay", "max-delay"),
    ("multiplier", "multiplier"),
    ("jitter", "jitter"),
    ("max", "max"),
    ("max-redeliver-count", "max"),
];

fn parse_compact(input: &str) -> Result<PolicySpec, PolicyError> {
    let (kind, args) = match input.split_once(':') {
        Some((k, a)) => (k.trim(), Some(a)),
        None => (input.trim(), None),
    };
    match kind.to_ascii_lowercase().replace('_', "-").as_str() {
        "delay-levels" | "rocketmq" => {
            let a = Args::parse(input, "delay-levels", args, DELAY_LEVEL_KEYS)?;
            let levels = a
                .get("levels")
                .map(|v| {
                    v.parse::<LevelTable>()
                        .map_err(|e| parse_error(input, format!("`levels`: {e}")))
                })
                .transpose()?;
            Ok(PolicySpec::DelayLevels {
                levels,
                start_level: a.u32("start")?.unwrap_or(DEFAULT_START_LEVEL),
                max_reconsume_times: a.u32("max")?.unwrap_or(DEFAULT_MAX_RECONSUME_TIMES),
            })
        }
        "backoff" | "pulsar" => {
            let a = Args::parse(input, "backoff", args, BACKOFF_KEYS)?;
            let max_redeliver_count = a.required_u32("max", "max_redeliver_count, at least 1")?;
            let curve_keys = ["min", "max-delay", "multiplier", "jitter"];
            let multiplier = if curve_keys.iter().any(|k| a.has(k)) {
                let d = MultiplierBackoff::default();
                Some(MultiplierBackoff {
                    min: a.duration("min")?.unwrap_or(d.min),
                    max: a.duration("max-delay")?.unwrap_or(d.max),
                    multiplier: a.f64("multiplier")?.unwrap_or(d.multiplier),
                    jitter: a.f64("jitter")?.unwrap_or(d.jitter),
                })
            } else {
                None
            };
            Ok(PolicySpec::Backoff {
                fixed: a.duration("fixed")?,
                multiplier,
                max_redeliver_count,
            })
        }
        "named" => {
            let Some(rest) = args else {
                return Err(parse_error(
                    input,
                    "`named` needs a name: named:NAME or named:NAME:PARAMS",
                ));
            };
            let (name, params) = match rest.split_once(':') {
                Some((n, p)) => (n.trim(), Some(p.to_owned())),
                None => (rest.trim(), None),
            };
            Ok(PolicySpec::Named {
                name: name.to_owned(),
                params,
            })
        }
        "" => Err(parse_error(
            input,
            "empty policy; expected delay-levels, backoff or named (or a JSON object)",
        )),
        _ => Err(parse_error(
            input,
            format!(
                "unknown policy kind `{kind}`; expected delay-levels, backoff or named (or a JSON object)"
            ),
        )),
    }
}

impl FromStr for PolicySpec {
    type Err = PolicyError;

    /// Parses the compact form, or JSON when the text starts with `{`, and
    /// validates the result (see the [module docs](self)).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Only the start is trimmed: a named policy's PARAMS are verbatim.
        let input = s.trim_start();
        let spec = if input.starts_with('{') {
            serde_json::from_str::<PolicySpec>(input)
                .map_err(|e| parse_error(input, format!("invalid JSON policy: {e}")))?
        } else {
            parse_compact(input)?
        };
        spec.validate()?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn parse(s: &str) -> Result<PolicySpec, PolicyError> {
        s.parse()
    }

    fn parse_reason(s: &str) -> String {
        match parse(s) {
            Err(PolicyError::Parse { reason, .. }) => reason,
            other => panic!("{s:?}: expected a parse error, got {other:?}"),
        }
    }

    #[test]
    fn compact_delay_levels() {
        assert_eq!(
            parse("delay-levels"),
            Ok(PolicySpec::delay_levels_default())
        );
        assert_eq!(parse(" rocketmq "), Ok(PolicySpec::delay_levels_default()));
        assert_eq!(
            parse("delay_levels:"),
            Ok(PolicySpec::delay_levels_default())
        );
        assert_eq!(
            parse("delay-levels:start=3,max=16,levels=1s 5s 10s"),
            Ok(PolicySpec::DelayLevels {
                levels: Some("1s 5s 10s".parse().expect("valid")),
                start_level: 3,
                max_reconsume_times: 16
            })
        );
        assert_eq!(
            parse("delay-levels: start_level = 1 , max-reconsume-times=2"),
            Ok(PolicySpec::DelayLevels {
                levels: None,
                start_level: 1,
                max_reconsume_times: 2
            })
        );
    }

    #[test]
    fn compact_backoff() {
        assert_eq!(
            parse("backoff:fixed=60s,max=5"),
            Ok(PolicySpec::fixed_backoff(secs(60), 5))
        );
        assert_eq!(
            parse("backoff:min=10s,max-delay=10m,multiplier=2,jitter=0.1,max=3"),
            Ok(PolicySpec::multiplier_backoff(
                MultiplierBackoff {
                    jitter: 0.1,
                    ..MultiplierBackoff::default()
                },
                3
            ))
        );
        assert_eq!(
            parse("pulsar:multiplier=3,max_redeliver_count=2"),
            Ok(PolicySpec::multiplier_backoff(
                MultiplierBackoff {
                    multiplier: 3.0,
                    ..MultiplierBackoff::default()
                },
                2
            ))
        );
        assert_eq!(
            parse("backoff:max=1"),
            Ok(PolicySpec::Backoff {
                fixed: None,
                multiplier: None,
                max_redeliver_count: 1
            })
        );
    }

    #[test]
    fn compact_named() {
        assert_eq!(parse("named:poison"), Ok(PolicySpec::named("poison", None)));
        assert_eq!(
            parse("named:poison:{\"a\":1,\"b\":\"x:y\"}"),
            Ok(PolicySpec::named(
                "poison",
                Some("{\"a\":1,\"b\":\"x:y\"}".into())
            ))
        );
        assert!(parse_reason("named").contains("needs a name"));
        assert_eq!(
            parse("named: "),
            Err(PolicyError::InvalidPolicyName {
                name: String::new()
            })
        );
    }

    #[test]
    fn compact_errors() {
        assert!(parse_reason("").contains("empty policy"));
        assert!(parse_reason("exponential").contains("unknown policy kind `exponential`"));
        assert!(parse_reason("backoff:fixed=60s").contains("backoff needs `max=N`"));
        assert!(parse_reason("backoff:max=3,maxx=4").contains("unknown key `maxx` for backoff"));
        assert!(parse_reason("backoff:max=3,max-redeliver-count=4").contains("given twice"));
        assert!(parse_reason("backoff:max").contains("expected KEY=VALUE"));
        assert!(parse_reason("backoff:max=-1").contains("whole number"));
        assert!(parse_reason("backoff:max=3,fixed=soon").contains("`fixed` must be a duration"));
        assert!(
            parse_reason("backoff:max=3,multiplier=x").contains("`multiplier` must be a number")
        );
        assert!(parse_reason("delay-levels:levels=1s 2q").contains("unknown unit `q`"));
        assert!(parse_reason("delay-levels:levels=").contains("empty"));
        assert!(parse_reason("{\"type\":\"bogus\"}").starts_with("invalid JSON policy"));
        assert!(parse_reason("{not json").starts_with("invalid JSON policy"));
    }

    #[test]
    fn parsing_validates() {
        assert_eq!(
            parse("backoff:fixed=50ms,max=3"),
            Err(PolicyError::FixedDelayTooShort {
                delay: Duration::from_millis(50),
                min: crate::MIN_FIXED_DELAY
            })
        );
        assert_eq!(
            parse("backoff:fixed=60s,max=0"),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_redeliver_count"
            })
        );
        assert_eq!(
            parse("backoff:fixed=60s,multiplier=2,max=3"),
            Err(PolicyError::ConflictingBackoff)
        );
        assert_eq!(
            parse("backoff:min=1m,max-delay=10s,max=3"),
            Err(PolicyError::MaxBelowMin {
                min: secs(60),
                max: secs(10)
            })
        );
        assert_eq!(
            parse("backoff:multiplier=1,max=3"),
            Err(PolicyError::InvalidMultiplier(1.0))
        );
        assert_eq!(
            parse("backoff:jitter=2,max=3"),
            Err(PolicyError::InvalidJitter(2.0))
        );
        assert_eq!(
            parse("delay-levels:start=0"),
            Err(PolicyError::ZeroStartLevel)
        );
        assert_eq!(
            parse("delay-levels:max=0"),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_reconsume_times"
            })
        );
        assert_eq!(
            parse(r#"{"type":"backoff","max_redeliver_count":0}"#),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_redeliver_count"
            })
        );
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        let cases = [
            ("delay-levels", "delay-levels:start=3,max=16"),
            (
                "delay-levels:levels=1s 90s 2h",
                "delay-levels:start=3,max=16,levels=1s 90s 2h",
            ),
            ("backoff:fixed=60s,max=5", "backoff:fixed=1m,max=5"),
            ("backoff:max=5", "backoff:max=5"),
            (
                "backoff:jitter=0.25,max=3",
                "backoff:min=10s,max-delay=10m,multiplier=2,jitter=0.25,max=3",
            ),
            ("named:x:a=b,c", "named:x:a=b,c"),
        ];
        for (input, canonical) in cases {
            let spec = parse(input).expect(input);
            assert_eq!(spec.to_string(), canonical);
            assert_eq!(parse(canonical), Ok(spec));
        }
    }

    #[test]
    fn json_round_trip() {
        let specs = [
            PolicySpec::delay_levels_default(),
            PolicySpec::DelayLevels {
                levels: Some("1s 5s 1h".parse().expect("valid")),
                start_level: 1,
                max_reconsume_times: 3,
            },
            PolicySpec::fixed_backoff(secs(60), 5),
            PolicySpec::multiplier_backoff(
                MultiplierBackoff {
                    jitter: 0.1,
                    ..MultiplierBackoff::default()
                },
                3,
            ),
            PolicySpec::named("poison", Some("{\"k\":1}".into())),
            PolicySpec::named("plain", None),
        ];
        for spec in specs {
            let json = serde_json::to_string(&spec).expect("serialize");
            let back: PolicySpec = serde_json::from_str(&json).expect(&json);
            assert_eq!(back, spec, "{json}");
            assert_eq!(json.parse::<PolicySpec>(), Ok(spec));
        }
    }

    #[test]
    fn json_shape() {
        let json = serde_json::to_value(PolicySpec::fixed_backoff(secs(60), 5)).expect("serialize");
        assert_eq!(
            json,
            serde_json::json!({"type": "backoff", "fixed": "1m", "max_redeliver_count": 5})
        );
        let json = serde_json::to_value(PolicySpec::multiplier_backoff(
            MultiplierBackoff::default(),
            3,
        ))
        .expect("serialize");
        assert_eq!(
            json,
            serde_json::json!({
                "type": "backoff",
                "multiplier": {"min": "10s", "max": "10m", "multiplier": 2.0, "jitter": 0.0},
                "max_redeliver_count": 3
            })
        );
        let spec: PolicySpec =
            serde_json::from_str(r#"{"type":"delay_levels"}"#).expect("defaults");
        assert_eq!(spec, PolicySpec::delay_levels_default());
        let spec: PolicySpec = serde_json::from_str(
            r#"{"type":"backoff","multiplier":{"jitter":0.5},"max_redeliver_count":2}"#,
        )
        .expect("partial multiplier");
        assert_eq!(
            spec,
            PolicySpec::multiplier_backoff(
                MultiplierBackoff {
                    jitter: 0.5,
                    ..MultiplierBackoff::default()
                },
                2
            )
        );
    }

    #[test]
    fn serde_rejects_typos_and_missing_limits() {
        for bad in [
            r#"{"type":"delay_levels","start_levle":3}"#,
            r#"{"type":"backoff","fixed":"1m"}"#,
            r#"{"type":"backoff","fixed":"soon","max_redeliver_count":1}"#,
            r#"{"type":"backoff","multiplier":{"factor":3},"max_redeliver_count":1}"#,
            r#"{"type":"delay_levels","levels":""}"#,
            r#"{"type":"delay_levels","levels":"1s 0s"}"#,
            r#"{"type":"nope"}"#,
            r#"{"name":"x"}"#,
        ] {
            assert!(serde_json::from_str::<PolicySpec>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn toml_round_trip() {
        let specs = [
            PolicySpec::delay_levels_default(),
            PolicySpec::DelayLevels {
                levels: Some("1s 5s 1h".parse().expect("valid")),
                start_level: 2,
                max_reconsume_times: 4,
            },
            PolicySpec::fixed_backoff(Duration::from_millis(1500), 5),
            PolicySpec::multiplier_backoff(
                MultiplierBackoff {
                    jitter: 0.1,
                    ..MultiplierBackoff::default()
                },
                3,
            ),
            PolicySpec::named("poison", Some("{\"k\":1}".into())),
        ];
        for spec in specs {
            let text = toml::to_string(&spec).expect("serialize");
            let back: PolicySpec = toml::from_str(&text).expect(&text);
            assert_eq!(back, spec, "{text}");
        }
    }

    #[test]
    fn toml_hand_written() {
        #[derive(Deserialize)]
        struct Config {
            policy: PolicySpec,
        }
        let text = r#"
            [policy]
            type = "backoff"
            max_redeliver_count = 3

            [policy.multiplier]
            min = "1s"
            max = "1m 30s"
            multiplier = 1.5
        "#;
        let cfg: Config = toml::from_str(text).expect("valid TOML");
        assert_eq!(
            cfg.policy,
            PolicySpec::multiplier_backoff(
                MultiplierBackoff {
                    min: secs(1),
                    max: secs(90),
                    multiplier: 1.5,
                    jitter: 0.0
                },
                3
            )
        );
        let text = r#"
            [policy]
            type = "delay_levels"
            levels = "5s 10s 1m"
            start_level = 1
        "#;
        let cfg: Config = toml::from_str(text).expect("valid TOML");
        assert_eq!(
            cfg.policy.to_string(),
            "delay-levels:start=1,max=16,levels=5s 10s 1m"
        );
    }

    #[test]
    fn build_and_validate() {
        assert!(PolicySpec::delay_levels_default().build().is_ok());
        let p = PolicySpec::fixed_backoff(secs(60), 5)
            .build()
            .expect("valid");
        assert_eq!(p.name(), "backoff");
        assert_eq!(p.max_attempts(), Some(5));
        assert_eq!(
            PolicySpec::named("poison", None).build().err(),
            Some(PolicyError::UnknownPolicy {
                name: "poison".into()
            })
        );
        assert_eq!(PolicySpec::named("poison", None).validate(), Ok(()));
        assert_eq!(
            PolicySpec::named("a b", None).validate(),
            Err(PolicyError::InvalidPolicyName { name: "a b".into() })
        );
        assert_eq!(
            PolicySpec::Backoff {
                fixed: Some(secs(1)),
                multiplier: Some(MultiplierBackoff::default()),
                max_redeliver_count: 1
            }
            .validate(),
            Err(PolicyError::ConflictingBackoff)
        );
        // Default backoff (neither fixed nor multiplier) is Pulsar's 60 s.
        let p = PolicySpec::Backoff {
            fixed: None,
            multiplier: None,
            max_redeliver_count: 2,
        }
        .build()
        .expect("valid");
        assert_eq!(
            p.decide(&crate::FailureContext::new(1, crate::FailureReason::Nack))
                .delay(),
            Some(secs(60))
        );
    }

    #[test]
    fn default_is_rocketmq() {
        assert_eq!(PolicySpec::default(), PolicySpec::delay_levels_default());
        assert_eq!(
            PolicySpec::default().to_string(),
            "delay-levels:start=3,max=16"
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(PolicySpec::delay_levels_default().kind(), "delay_levels");
        assert_eq!(PolicySpec::fixed_backoff(secs(1), 1).kind(), "backoff");
        assert_eq!(PolicySpec::named("x", None).kind(), "named");
    }
}
