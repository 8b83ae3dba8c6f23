//! Property tests for the built-in policies: delays are never negative and
//! never above the cap or the longest level, they do not decrease with the
//! attempt number (without jitter), the dead-letter tier comes exactly after
//! the configured number of retries, `Terminate` and a dead-letter override
//! always dead-letter, and every spec survives its text and serde forms.

use std::time::Duration;

use proptest::prelude::*;
use ricochet_policy::{
    AttemptOverride, BackoffPolicy, DeadLetterPolicy, DelayLevelPolicy, FailureContext,
    FailureReason, LevelTable, MultiplierBackoff, PolicySpec, explain,
};

fn reason() -> impl Strategy<Value = FailureReason> {
    prop::sample::select(FailureReason::ALL.to_vec())
}

fn retry_reason() -> impl Strategy<Value = FailureReason> {
    prop::sample::select(vec![
        FailureReason::Nack,
        FailureReason::AckTimeout,
        FailureReason::ConsumerLost,
        FailureReason::ReconsumeLater,
    ])
}

fn level_table() -> impl Strategy<Value = LevelTable> {
    prop::collection::vec(1u64..=10 * 86_400_000, 1..40).prop_map(|ms| {
        LevelTable::new(ms.into_iter().map(Duration::from_millis).collect())
            .expect("generated levels are valid")
    })
}

/// A table with a start level that names one of its levels.
fn table_and_start() -> impl Strategy<Value = (LevelTable, u32)> {
    level_table().prop_flat_map(|t| {
        let n = t.len() as u32;
        (Just(t), 1u32..=n)
    })
}

fn delay_level_policy() -> impl Strategy<Value = DelayLevelPolicy> {
    (table_and_start(), 1u32..100).prop_map(|((t, start), max)| {
        DelayLevelPolicy::new(t, start, max).expect("generated policy is valid")
    })
}

/// A policy on a non-decreasing table (RocketMQ's and any sensible one; a
/// custom table may go down, and then so do its delays).
fn sorted_delay_level_policy() -> impl Strategy<Value = DelayLevelPolicy> {
    (table_and_start(), 1u32..100).prop_map(|((t, start), max)| {
        let mut levels = t.as_slice().to_vec();
        levels.sort();
        let t = LevelTable::new(levels).expect("still valid");
        DelayLevelPolicy::new(t, start, max).expect("generated policy is valid")
    })
}

fn multiplier(jitter: bool) -> impl Strategy<Value = MultiplierBackoff> {
    let jitter = if jitter {
        (0.0f64..=1.0).boxed()
    } else {
        Just(0.0).boxed()
    };
    (1u64..=60_000, 0u64..=86_400_000, 1.0001f64..10.0, jitter).prop_map(
        |(min_ms, extra_ms, multiplier, jitter)| MultiplierBackoff {
            min: Duration::from_millis(min_ms),
            max: Duration::from_millis(min_ms + extra_ms),
            multiplier,
            jitter,
        },
    )
}

fn backoff_policy(jitter: bool) -> impl Strategy<Value = BackoffPolicy> {
    let fixed = (100u64..=3_600_000, 1u32..100)
        .prop_map(|(ms, max)| BackoffPolicy::fixed(Duration::from_millis(ms), max).expect("valid"));
    let mult = (multiplier(jitter), 1u32..100)
        .prop_map(|(m, max)| BackoffPolicy::multiplier(m, max).expect("valid"));
    prop_oneof![fixed, mult]
}

fn spec() -> impl Strategy<Value = PolicySpec> {
    let own_table = (table_and_start(), 1u32..100).prop_map(|((t, start_level), max)| {
        PolicySpec::DelayLevels {
            levels: Some(t),
            start_level,
            max_reconsume_times: max,
        }
    });
    let default_table = (1u32..=18, 1u32..100).prop_map(|(start_level, max_reconsume_times)| {
        PolicySpec::DelayLevels {
            levels: None,
            start_level,
            max_reconsume_times,
        }
    });
    let levels = prop_oneof![own_table, default_table];
    let backoff = backoff_policy(true).prop_map(|p| p.spec().expect("built-in"));
    let named = ("[a-z][a-z0-9_-]{0,15}", prop::option::of("[ -~]{0,20}"))
        .prop_map(|(name, params)| PolicySpec::named(name, params));
    prop_oneof![levels, backoff, named]
}

fn ctx(attempt: u32, reason: FailureReason, seed: u64) -> FailureContext<'static> {
    FailureContext::new(attempt, reason).with_jitter_seed(seed)
}

proptest! {
    #[test]
    fn max_delay_bounds_every_decision(spec in spec(), reason in retry_reason(), n in 0u32..200, seed: u64) {
        if let (Ok(p), Some(max)) = (spec.build(), spec.max_delay()) {
            prop_assert!(max <= ricochet_policy::MAX_POLICY_DELAY);
            if let Some(d) = p.decide(&ctx(n, reason, seed)).delay() {
                prop_assert!(d <= max, "{spec}: {d:?} > {max:?}");
            }
        }
    }

    #[test]
    fn delay_levels_bounded(p in delay_level_policy(), reason in retry_reason(), n in 0u32..=u32::MAX, level: u32) {
        if let Some(d) = p.decide(&ctx(n, reason, 0)).delay() {
            prop_assert!(d <= p.levels().max_delay());
            prop_assert!(!d.is_zero());
        }
        let o = ctx(n, reason, 0).with_override(AttemptOverride::Level(level));
        if let Some(d) = p.decide(&o).delay() {
            prop_assert!(d <= p.levels().max_delay());
        }
    }

    #[test]
    fn delay_levels_monotonic(p in sorted_delay_level_policy(), reason in retry_reason(), n in 1u32..200) {
        let a = p.decide(&ctx(n, reason, 0));
        let b = p.decide(&ctx(n + 1, reason, 0));
        if let (Some(da), Some(db)) = (a.delay(), b.delay()) {
            prop_assert!(db >= da, "attempt {n}: {da:?} then {db:?}");
        }
    }

    #[test]
    fn default_delay_levels_monotonic(reason in retry_reason(), n in 1u32..16) {
        let p = DelayLevelPolicy::default();
        let a = p.decide(&ctx(n, reason, 0)).delay();
        let b = p.decide(&ctx(n + 1, reason, 0)).delay();
        prop_assert!(a.is_some() && b.is_some() && b > a);
    }

    #[test]
    fn backoff_bounded(p in backoff_policy(true), reason in retry_reason(), n in 0u32..=u32::MAX, seed: u64) {
        if let Some(d) = p.decide(&ctx(n, reason, seed)).delay() {
            prop_assert!(d <= p.backoff().max_delay());
        }
    }

    #[test]
    fn backoff_monotonic_without_jitter(p in backoff_policy(false), reason in retry_reason(), n in 1u32..500, seed: u64) {
        let a = p.decide(&ctx(n, reason, seed));
        let b = p.decide(&ctx(n + 1, reason, seed));
        if let (Some(da), Some(db)) = (a.delay(), b.delay()) {
            prop_assert!(db >= da, "attempt {n}: {da:?} then {db:?}");
        }
        if let (Some(d), ricochet_policy::Backoff::Multiplier(m)) = (a.delay(), p.backoff()) {
            prop_assert!(d >= m.min && d <= m.max);
        }
    }

    #[test]
    fn multiplier_jitter_stays_near_nominal(m in multiplier(true), n in 1u32..100, seed: u64) {
        let nominal = m.nominal_delay(n);
        let d = m.delay(n, seed);
        prop_assert!(d <= m.max);
        let lo = nominal.as_secs_f64() * (1.0 - m.jitter) - 1e-6;
        prop_assert!(d.as_secs_f64() >= lo, "{d:?} below {lo}");
    }

    #[test]
    fn delay_levels_dlq_exactly_after_max(p in delay_level_policy(), reason in retry_reason(), seed: u64) {
        let max = p.max_reconsume_times();
        for n in 1..=max {
            prop_assert!(!p.decide(&ctx(n, reason, seed)).is_dead_letter(), "attempt {n} of {max}");
        }
        prop_assert!(p.decide(&ctx(max + 1, reason, seed)).is_dead_letter());
        prop_assert_eq!(explain(&p, reason).len() as u32, max + 1);
    }

    #[test]
    fn backoff_dlq_exactly_after_max(p in backoff_policy(true), reason in retry_reason(), seed: u64) {
        let max = p.max_redeliver_count();
        for n in 1..=max {
            prop_assert!(!p.decide(&ctx(n, reason, seed)).is_dead_letter(), "attempt {n} of {max}");
        }
        prop_assert!(p.decide(&ctx(max + 1, reason, seed)).is_dead_letter());
        prop_assert_eq!(explain(&p, reason).len() as u32, max + 1);
    }

    #[test]
    fn terminate_and_dlq_override_always_dead_letter(
        lp in delay_level_policy(), bp in backoff_policy(true),
        n in 0u32..=u32::MAX, reason in reason(), level in i32::MIN..-1, seed: u64,
    ) {
        let t = ctx(n, FailureReason::Terminate, seed);
        prop_assert!(lp.decide(&t).is_dead_letter());
        prop_assert!(bp.decide(&t).is_dead_letter());
        // RocketMQ's -1 is the dead-letter override; other negative levels
        // mean nothing and are refused.
        prop_assert_eq!(AttemptOverride::from_rocketmq_level(-1), Ok(AttemptOverride::DeadLetter));
        prop_assert!(AttemptOverride::from_rocketmq_level(level).is_err());
        let o = ctx(n, reason, seed).with_override(AttemptOverride::DeadLetter);
        prop_assert!(lp.decide(&o).is_dead_letter());
        prop_assert!(bp.decide(&o).is_dead_letter());
    }

    #[test]
    fn decisions_are_reproducible(p in backoff_policy(true), n in 0u32..1000, reason in reason(), seed: u64) {
        prop_assert_eq!(p.decide(&ctx(n, reason, seed)), p.decide(&ctx(n, reason, seed)));
    }

    #[test]
    fn spec_text_and_serde_round_trip(spec in spec()) {
        let text = spec.to_string();
        let parsed: PolicySpec = text.parse().map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(&parsed, &spec);
        let json = serde_json::to_string(&spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&serde_json::from_str::<PolicySpec>(&json).map_err(|e| TestCaseError::fail(e.to_string()))?, &spec);
        let toml_text = toml::to_string(&spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&toml::from_str::<PolicySpec>(&toml_text).map_err(|e| TestCaseError::fail(e.to_string()))?, &spec);
    }

    #[test]
    fn level_table_text_round_trip(t in level_table()) {
        prop_assert_eq!(t.to_string().parse::<LevelTable>(), Ok(t));
    }

    #[test]
    fn parsing_never_panics(s in "\\PC{0,60}") {
        let _ = s.parse::<PolicySpec>();
        let _ = s.parse::<LevelTable>();
    }
}
