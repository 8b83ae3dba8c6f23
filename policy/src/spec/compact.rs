//! The compact one-line form of a [`PolicySpec`] (grammar in the
//! [`spec` module docs](crate::spec)): `Display` writes it, `FromStr` reads
//! it (or JSON, for text starting with `{`) and validates the result.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::delay_levels::{DEFAULT_MAX_RECONSUME_TIMES, DEFAULT_START_LEVEL};
use crate::{LevelTable, MultiplierBackoff, PolicyError, PolicySpec};

impl fmt::Display for PolicySpec {
    /// The canonical compact form (see the [module docs](crate::spec)).
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
pub(crate) struct Args<'a> {
    input: &'a str,
    kind: &'static str,
    pairs: Vec<(&'static str, &'a str)>,
}

impl<'a> Args<'a> {
    /// Splits `args` and maps every key through `keys` (alias → canonical).
    pub(crate) fn parse(
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

    pub(crate) fn get(&self, key: &str) -> Option<&'a str> {
        self.pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>, PolicyError> {
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

    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>, PolicyError> {
        self.get(key)
            .map(|v| {
                v.parse::<f64>().map_err(|_| {
                    parse_error(self.input, format!("`{key}` must be a number, got `{v}`"))
                })
            })
            .transpose()
    }

    pub(crate) fn duration(&self, key: &str) -> Result<Option<Duration>, PolicyError> {
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

pub(crate) fn parse_error(input: &str, reason: impl Into<String>) -> PolicyError {
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
    /// validates the result (see the [module docs](crate::spec)).
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
