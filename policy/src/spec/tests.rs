//! Tests of [`PolicySpec`]: the compact form (parsing, its errors, the
//! validation it runs, canonical printing), the serde forms (JSON, TOML),
//! building and the defaults.

use std::time::Duration;

use serde::Deserialize;

use crate::{MultiplierBackoff, PolicyError, PolicySpec};

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
    assert!(parse_reason("backoff:max=3,multiplier=x").contains("`multiplier` must be a number"));
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
    let spec: PolicySpec = serde_json::from_str(r#"{"type":"delay_levels"}"#).expect("defaults");
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
