//! Cost of the policy math the broker runs on its hot path: one `decide` per
//! failed delivery, for each built-in policy at a few attempt numbers, and
//! `explain` for RocketMQ's 16-step default schedule (what an admin tool
//! prints).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ricochet_policy::{
    BackoffPolicy, DeadLetterPolicy, DelayLevelPolicy, FailureContext, FailureReason,
    MultiplierBackoff, PolicySpec, explain, jitter_seed,
};

fn policies() -> Vec<(&'static str, Arc<dyn DeadLetterPolicy>)> {
    let jittered = MultiplierBackoff {
        jitter: 0.2,
        ..MultiplierBackoff::default()
    };
    let build = |r: Result<BackoffPolicy, _>| -> Arc<dyn DeadLetterPolicy> {
        match r {
            Ok(p) => Arc::new(p),
            Err(e) => panic!("benchmark policy is invalid: {e}"),
        }
    };
    vec![
        ("delay_levels", Arc::new(DelayLevelPolicy::default())),
        (
            "backoff_fixed",
            build(BackoffPolicy::fixed(Duration::from_secs(60), 16)),
        ),
        (
            "backoff_multiplier",
            build(BackoffPolicy::pulsar_multiplier(16)),
        ),
        (
            "backoff_multiplier_jitter",
            build(BackoffPolicy::multiplier(jittered, 16)),
        ),
    ]
}

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for (name, policy) in policies() {
        // 1: first failure; 8: mid-schedule; 16: last redelivery; 17: dead letter.
        for attempt in [1u32, 8, 16, 17] {
            let ctx = FailureContext::new(attempt, FailureReason::Nack).with_jitter_seed(
                jitter_seed(b"persistent://public/default/orders:42", attempt),
            );
            group.bench_function(format!("{name}/attempt_{attempt}"), |b| {
                b.iter(|| policy.decide(black_box(&ctx)))
            });
        }
    }
    group.finish();
}

fn build_and_explain(c: &mut Criterion) {
    let rocketmq = DelayLevelPolicy::default();
    c.bench_function("explain/delay_levels_default_16_steps", |b| {
        b.iter(|| explain(black_box(&rocketmq), FailureReason::ReconsumeLater))
    });
    c.bench_function("spec/parse_and_build_backoff", |b| {
        b.iter(|| {
            black_box("backoff:min=10s,max-delay=10m,multiplier=2,jitter=0.1,max=3")
                .parse::<PolicySpec>()
                .and_then(|s| s.build())
        })
    });
}

criterion_group!(benches, decide, build_and_explain);
criterion_main!(benches);
