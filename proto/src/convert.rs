//! Conversions between the wire types of `ricochet.v1` and
//! `ricochet-policy`'s types: [`PolicySpec`] ⇄ [`DeadLetterPolicyConfig`],
//! [`FailureReason`](PolicyFailureReason) ⇄ the protobuf `FailureReason`, and
//! a `ReconsumeLater` delay to an [`AttemptOverride`].
//!
//! The wire form carries durations in whole milliseconds (sub-millisecond
//! parts are truncated) and uses proto3 zeros for "default":
//! - `DelayLevelPolicyConfig`: empty `levels_ms` ⇄ `levels: None` (RocketMQ's
//!   18 levels); `start_level` 0 reads as 3 and `max_reconsume_times` 0 as 16;
//! - `MultiplierBackoff`: `min_delay_ms`, `max_delay_ms` or `multiplier` of 0
//!   read as Pulsar's defaults (10 s, 10 min, 2); zero is invalid for each, so
//!   nothing valid is lost;
//! - `BackoffPolicyConfig` without a `backoff` ⇄ neither `fixed` nor
//!   `multiplier` (a fixed 60 s); `max_redeliver_count` is carried as is, so
//!   a 0 is rejected by validation rather than silently defaulted;
//! - `NamedPolicyConfig.params` empty ⇄ `None`.
//!
//! Converting from the wire checks structure only (a missing `kind`, a
//! malformed level table); call [`PolicySpec::validate`] or build the policy
//! to check the rest. The tier topics are not part of a spec: converting a
//! spec leaves them empty (the defaults) for the caller to fill.

use std::time::Duration;

use ricochet_policy::{
    AttemptOverride, FailureReason as PolicyFailureReason, KeyOrder, LevelTable, MultiplierBackoff,
    PolicyError, PolicySpec,
};

use crate::v1::{
    self, BackoffPolicyConfig, DeadLetterPolicyConfig, DelayLevelPolicyConfig, KeyOrderConfig,
    NamedPolicyConfig, backoff_policy_config, dead_letter_policy_config, reconsume_later,
};

/// Why a wire value does not convert.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// A `DeadLetterPolicyConfig` with no `kind` set.
    #[error("dead-letter policy config has no kind set; expected delay_levels, backoff or named")]
    MissingKind,
    /// A failure reason that is `FAILURE_REASON_UNSPECIFIED` or not a known value.
    #[error("failure reason {0} is unspecified or unknown; expected 1 (nack) to 5 (terminate)")]
    InvalidFailureReason(i32),
    /// A value the policy crate rejects (e.g. a zero delay level).
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

impl From<ConvertError> for tonic::Status {
    /// Every conversion error is the caller's bad input: `InvalidArgument`.
    fn from(e: ConvertError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

fn to_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn or_default_ms(ms: u64, default: Duration) -> Duration {
    if ms == 0 {
        default
    } else {
        Duration::from_millis(ms)
    }
}

impl From<&MultiplierBackoff> for v1::MultiplierBackoff {
    fn from(m: &MultiplierBackoff) -> Self {
        v1::MultiplierBackoff {
            min_delay_ms: to_ms(m.min),
            max_delay_ms: to_ms(m.max),
            multiplier: m.multiplier,
            jitter: m.jitter,
        }
    }
}

impl From<&v1::MultiplierBackoff> for MultiplierBackoff {
    fn from(m: &v1::MultiplierBackoff) -> Self {
        let d = MultiplierBackoff::default();
        MultiplierBackoff {
            min: or_default_ms(m.min_delay_ms, d.min),
            max: or_default_ms(m.max_delay_ms, d.max),
            multiplier: if m.multiplier == 0.0 {
                d.multiplier
            } else {
                m.multiplier
            },
            jitter: m.jitter,
        }
    }
}

impl From<&PolicySpec> for DeadLetterPolicyConfig {
    fn from(spec: &PolicySpec) -> Self {
        let kind = match spec {
            PolicySpec::DelayLevels {
                levels,
                start_level,
                max_reconsume_times,
            } => dead_letter_policy_config::Kind::DelayLevels(DelayLevelPolicyConfig {
                levels_ms: levels
                    .as_ref()
                    .map(|t| t.as_slice().iter().map(|d| to_ms(*d)).collect())
                    .unwrap_or_default(),
                start_level: *start_level,
                max_reconsume_times: *max_reconsume_times,
            }),
            PolicySpec::Backoff {
                fixed,
                multiplier,
                max_redeliver_count,
            } => {
                // A spec with both is invalid; the fixed delay wins on the wire.
                let backoff = match (fixed, multiplier) {
                    (Some(d), _) => Some(backoff_policy_config::Backoff::FixedDelayMs(to_ms(*d))),
                    (None, Some(m)) => Some(backoff_policy_config::Backoff::Multiplier(m.into())),
                    (None, None) => None,
                };
                dead_letter_policy_config::Kind::Backoff(BackoffPolicyConfig {
                    max_redeliver_count: *max_redeliver_count,
                    backoff,
                })
            }
            PolicySpec::Named { name, params } => {
                dead_letter_policy_config::Kind::Named(NamedPolicyConfig {
                    name: name.clone(),
                    params: params.clone().unwrap_or_default(),
                })
            }
        };
        DeadLetterPolicyConfig {
            kind: Some(kind),
            ..Default::default()
        }
    }
}

impl From<&KeyOrder> for KeyOrderConfig {
    fn from(k: &KeyOrder) -> Self {
        KeyOrderConfig {
            poison_after_ms: k.poison_after.map_or(0, to_ms),
        }
    }
}

impl From<&KeyOrderConfig> for KeyOrder {
    /// `poison_after_ms` 0 reads as no limit; call [`KeyOrder::validate`].
    fn from(c: &KeyOrderConfig) -> Self {
        KeyOrder {
            poison_after: (c.poison_after_ms > 0).then(|| Duration::from_millis(c.poison_after_ms)),
        }
    }
}

impl From<PolicySpec> for DeadLetterPolicyConfig {
    fn from(spec: PolicySpec) -> Self {
        DeadLetterPolicyConfig::from(&spec)
    }
}

impl TryFrom<&DeadLetterPolicyConfig> for PolicySpec {
    type Error = ConvertError;

    fn try_from(config: &DeadLetterPolicyConfig) -> Result<Self, Self::Error> {
        use ricochet_policy::{DEFAULT_MAX_RECONSUME_TIMES, DEFAULT_START_LEVEL};
        let nonzero = |v: u32, default: u32| if v == 0 { default } else { v };
        match config.kind.as_ref().ok_or(ConvertError::MissingKind)? {
            dead_letter_policy_config::Kind::DelayLevels(c) => Ok(PolicySpec::DelayLevels {
                levels: if c.levels_ms.is_empty() {
                    None
                } else {
                    Some(LevelTable::new(
                        c.levels_ms
                            .iter()
                            .map(|&ms| Duration::from_millis(ms))
                            .collect(),
                    )?)
                },
                start_level: nonzero(c.start_level, DEFAULT_START_LEVEL),
                max_reconsume_times: nonzero(c.max_reconsume_times, DEFAULT_MAX_RECONSUME_TIMES),
            }),
            dead_letter_policy_config::Kind::Backoff(c) => {
                let (fixed, multiplier) = match &c.backoff {
                    Some(backoff_policy_config::Backoff::FixedDelayMs(ms)) => {
                        (Some(Duration::from_millis(*ms)), None)
                    }
                    Some(backoff_policy_config::Backoff::Multiplier(m)) => (None, Some(m.into())),
                    None => (None, None),
                };
                Ok(PolicySpec::Backoff {
                    fixed,
                    multiplier,
                    max_redeliver_count: c.max_redeliver_count,
                })
            }
            dead_letter_policy_config::Kind::Named(c) => Ok(PolicySpec::Named {
                name: c.name.clone(),
                params: (!c.params.is_empty()).then(|| c.params.clone()),
            }),
        }
    }
}

impl TryFrom<DeadLetterPolicyConfig> for PolicySpec {
    type Error = ConvertError;

    fn try_from(config: DeadLetterPolicyConfig) -> Result<Self, Self::Error> {
        PolicySpec::try_from(&config)
    }
}

impl From<PolicyFailureReason> for v1::FailureReason {
    fn from(r: PolicyFailureReason) -> Self {
        match r {
            PolicyFailureReason::Nack => v1::FailureReason::Nack,
            PolicyFailureReason::AckTimeout => v1::FailureReason::AckTimeout,
            PolicyFailureReason::ConsumerLost => v1::FailureReason::ConsumerLost,
            PolicyFailureReason::ReconsumeLater => v1::FailureReason::ReconsumeLater,
            PolicyFailureReason::Terminate => v1::FailureReason::Terminate,
        }
    }
}

impl TryFrom<v1::FailureReason> for PolicyFailureReason {
    type Error = ConvertError;

    /// Fails for `FAILURE_REASON_UNSPECIFIED`.
    fn try_from(r: v1::FailureReason) -> Result<Self, Self::Error> {
        match r {
            v1::FailureReason::Unspecified => Err(ConvertError::InvalidFailureReason(r as i32)),
            v1::FailureReason::Nack => Ok(PolicyFailureReason::Nack),
            v1::FailureReason::AckTimeout => Ok(PolicyFailureReason::AckTimeout),
            v1::FailureReason::ConsumerLost => Ok(PolicyFailureReason::ConsumerLost),
            v1::FailureReason::ReconsumeLater => Ok(PolicyFailureReason::ReconsumeLater),
            v1::FailureReason::Terminate => Ok(PolicyFailureReason::Terminate),
        }
    }
}

/// The policy's reason for a raw protobuf enum field (`i32`), as prost
/// stores it: fails for 0 (unspecified) and unknown values.
pub fn failure_reason_from_i32(value: i32) -> Result<PolicyFailureReason, ConvertError> {
    v1::FailureReason::try_from(value)
        .map_err(|_| ConvertError::InvalidFailureReason(value))
        .and_then(PolicyFailureReason::try_from)
}

/// The raw protobuf enum value (`i32`) of a policy reason.
pub fn failure_reason_to_i32(reason: PolicyFailureReason) -> i32 {
    v1::FailureReason::from(reason) as i32
}

impl TryFrom<reconsume_later::Delay> for AttemptOverride {
    type Error = ConvertError;

    /// An explicit delay, or RocketMQ's level semantics: `-1` dead-letter now,
    /// `0` the policy decides, `> 0` that level; any other level is refused.
    fn try_from(d: reconsume_later::Delay) -> Result<Self, ConvertError> {
        Ok(match d {
            reconsume_later::Delay::DelayMs(ms) => {
                AttemptOverride::Delay(Duration::from_millis(ms))
            }
            reconsume_later::Delay::DelayLevel(level) => {
                AttemptOverride::from_rocketmq_level(level)?
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn round_trip(spec: &PolicySpec) -> PolicySpec {
        let wire = DeadLetterPolicyConfig::from(spec);
        assert!(wire.retry_topic.is_empty() && wire.dead_letter_topic.is_empty());
        // Through bytes too, as it travels.
        let bytes = prost::Message::encode_to_vec(&wire);
        let decoded: DeadLetterPolicyConfig =
            prost::Message::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(decoded, wire);
        PolicySpec::try_from(&decoded).expect("converts back")
    }

    #[test]
    fn specs_round_trip() {
        let specs = [
            PolicySpec::delay_levels_default(),
            "delay-levels:start=1,max=4,levels=100ms 1s 1m 2h 1d"
                .parse()
                .expect("valid"),
            PolicySpec::fixed_backoff(secs(60), 5),
            PolicySpec::Backoff {
                fixed: None,
                multiplier: None,
                max_redeliver_count: 2,
            },
            PolicySpec::multiplier_backoff(MultiplierBackoff::default(), 3),
            "backoff:min=250ms,max-delay=1h,multiplier=1.5,jitter=0.2,max=7"
                .parse()
                .expect("valid"),
            PolicySpec::named("poison", Some("{\"keys\":[\"a\"]}".into())),
            PolicySpec::named("plain", None),
        ];
        for spec in specs {
            assert_eq!(round_trip(&spec), spec, "{spec}");
        }
    }

    #[test]
    fn wire_shape() {
        let wire = DeadLetterPolicyConfig::from(&PolicySpec::fixed_backoff(secs(60), 5));
        assert_eq!(
            wire.kind,
            Some(dead_letter_policy_config::Kind::Backoff(
                BackoffPolicyConfig {
                    max_redeliver_count: 5,
                    backoff: Some(backoff_policy_config::Backoff::FixedDelayMs(60_000)),
                }
            ))
        );
        let wire = DeadLetterPolicyConfig::from(PolicySpec::delay_levels_default());
        assert_eq!(
            wire.kind,
            Some(dead_letter_policy_config::Kind::DelayLevels(
                DelayLevelPolicyConfig {
                    levels_ms: vec![],
                    start_level: 3,
                    max_reconsume_times: 16,
                }
            ))
        );
    }

    #[test]
    fn wire_zeros_mean_defaults() {
        let c = DeadLetterPolicyConfig {
            kind: Some(dead_letter_policy_config::Kind::DelayLevels(
                DelayLevelPolicyConfig::default(),
            )),
            ..Default::default()
        };
        assert_eq!(
            PolicySpec::try_from(&c),
            Ok(PolicySpec::delay_levels_default())
        );
        let c = DeadLetterPolicyConfig {
            kind: Some(dead_letter_policy_config::Kind::Backoff(
                BackoffPolicyConfig {
                    max_redeliver_count: 3,
                    backoff: Some(backoff_policy_config::Backoff::Multiplier(
                        v1::MultiplierBackoff::default(),
                    )),
                },
            )),
            ..Default::default()
        };
        assert_eq!(
            PolicySpec::try_from(c),
            Ok(PolicySpec::multiplier_backoff(
                MultiplierBackoff::default(),
                3
            ))
        );
    }

    #[test]
    fn wire_errors() {
        assert_eq!(
            PolicySpec::try_from(&DeadLetterPolicyConfig::default()),
            Err(ConvertError::MissingKind)
        );
        let c = DeadLetterPolicyConfig {
            kind: Some(dead_letter_policy_config::Kind::DelayLevels(
                DelayLevelPolicyConfig {
                    levels_ms: vec![1000, 0],
                    ..Default::default()
                },
            )),
            ..Default::default()
        };
        assert!(matches!(
            PolicySpec::try_from(&c),
            Err(ConvertError::Policy(PolicyError::InvalidLevel {
                index: 2,
                ..
            }))
        ));
        // A zero redelivery count converts but does not validate.
        let c = DeadLetterPolicyConfig {
            kind: Some(dead_letter_policy_config::Kind::Backoff(
                BackoffPolicyConfig {
                    max_redeliver_count: 0,
                    backoff: None,
                },
            )),
            ..Default::default()
        };
        let spec = PolicySpec::try_from(&c).expect("structurally fine");
        assert_eq!(
            spec.validate(),
            Err(PolicyError::ZeroMaxAttempts {
                field: "max_redeliver_count"
            })
        );
        let status = tonic::Status::from(ConvertError::MissingKind);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn failure_reasons_both_ways() {
        for r in PolicyFailureReason::ALL {
            let wire = v1::FailureReason::from(r);
            assert_eq!(PolicyFailureReason::try_from(wire), Ok(r));
            assert_eq!(failure_reason_from_i32(failure_reason_to_i32(r)), Ok(r));
        }
        assert_eq!(failure_reason_to_i32(PolicyFailureReason::Nack), 1);
        assert_eq!(failure_reason_to_i32(PolicyFailureReason::Terminate), 5);
        assert_eq!(
            PolicyFailureReason::try_from(v1::FailureReason::Unspecified),
            Err(ConvertError::InvalidFailureReason(0))
        );
        assert_eq!(
            failure_reason_from_i32(0),
            Err(ConvertError::InvalidFailureReason(0))
        );
        assert_eq!(
            failure_reason_from_i32(42),
            Err(ConvertError::InvalidFailureReason(42))
        );
    }

    #[test]
    fn reconsume_later_delays() {
        let from = |d| AttemptOverride::try_from(d);
        assert_eq!(
            from(reconsume_later::Delay::DelayMs(1500)),
            Ok(AttemptOverride::Delay(Duration::from_millis(1500)))
        );
        assert_eq!(
            from(reconsume_later::Delay::DelayLevel(-1)),
            Ok(AttemptOverride::DeadLetter)
        );
        assert_eq!(
            from(reconsume_later::Delay::DelayLevel(0)),
            Ok(AttemptOverride::Policy)
        );
        assert_eq!(
            from(reconsume_later::Delay::DelayLevel(4)),
            Ok(AttemptOverride::Level(4))
        );
        for meaningless in [-7, i32::MIN] {
            assert!(matches!(
                from(reconsume_later::Delay::DelayLevel(meaningless)),
                Err(ConvertError::Policy(PolicyError::InvalidDelayLevel { .. }))
            ));
        }
    }
}
