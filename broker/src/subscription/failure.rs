//! The heart of failure handling, as a pure function: a delivery failed
//! (nack, ack timeout, consumer lost, `reconsume_later`, terminate); record
//! the attempt and decide its next step: redeliver in place at once,
//! schedule it in the retry tier after a delay, or dead-letter it.
//!
//! The subscription's [`DeadLetterPolicy`] decides. Without one, a failure
//! is redelivered in place (Pulsar without a DLQ policy), a terminate is
//! dead-lettered, and a `reconsume_later` uses RocketMQ's defaults. A
//! `reconsume_later` always goes through the retry tier, whatever tier the
//! policy prefers. Time is a parameter, so every case is tested without
//! waiting.

use crate::storage::{AttemptRecord, FailureRecord, TierEntry, TierId};
use ricochet_policy::{
    AttemptOverride, DeadLetterPolicy, Decision, FailureContext, FailureReason, Tier,
};
use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

/// One failed delivery, gathered from a consumer's request.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub entry: TierEntry,
    pub reason: FailureReason,
    pub detail: String,
    /// The consumer's name, for the failure history.
    pub consumer: String,
    /// What the consumer asked for explicitly.
    pub overrides: AttemptOverride,
    /// Properties to add to the message if it moves to another tier.
    pub extra_props: HashMap<String, String>,
    /// How long the broker holds it before redelivering it in place (a
    /// nack's delay the broker serves); zero: at once.
    pub hold: Duration,
    /// When the request reached the subscription (broker clock, µs): a
    /// hold or a retry's delay runs from then; `None`: from when handled.
    pub since_us: Option<u64>,
    /// How long the request waited in the client before it was sent (what
    /// the client reports): a retry's delay starts that much before
    /// `since_us`, by at most the whole delay.
    pub waited: Duration,
}

impl Failure {
    /// A failure with no explicit request beyond its reason.
    pub fn new(entry: TierEntry, reason: FailureReason, consumer: String) -> Self {
        Self {
            entry,
            reason,
            detail: String::new(),
            consumer,
            overrides: AttemptOverride::Policy,
            extra_props: HashMap::new(),
            hold: Duration::ZERO,
            since_us: None,
            waited: Duration::ZERO,
        }
    }
}

/// What happens next to a failed message.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    /// Dispatch again in the tier it is in, after this hold (zero: at once).
    InPlace(Duration),
    /// Move into the retry tier, due after this delay.
    Retry(Duration),
    /// Move into the dead-letter tier, with this reason.
    DeadLetter(String),
}

/// What the planner needs to know besides the failure.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules<'a> {
    /// The subscription's policy.
    pub policy: Option<&'a dyn DeadLetterPolicy>,
    /// Used by `reconsume_later` when there is no policy.
    pub fallback: Option<&'a dyn DeadLetterPolicy>,
    /// Now, ms since the epoch.
    pub now_ms: u64,
    /// The longest delay scheduled: a longer one a policy asks for is
    /// shortened to it (requests asking for more are refused before this).
    pub max_delay: Duration,
}

/// Records the attempt on `record` (its count goes up by one) and decides
/// the next step. `origin` names the message for the jitter seed, so the
/// client and broker jitter the same way. `reconsume` forces the retry tier.
pub(super) fn plan(
    rules: Rules<'_>,
    failure: &Failure,
    record: &mut FailureRecord,
    origin: &str,
    reconsume: bool,
) -> Step {
    let attempt = record.count.saturating_add(1);
    record.push(AttemptRecord {
        time_ms: rules.now_ms,
        delivery_count: attempt,
        consumer: failure.consumer.clone(),
        reason: failure.reason,
        detail: failure.detail.clone(),
    });
    let policy = match (rules.policy, reconsume) {
        (Some(p), _) => Some(p),
        (None, true) => rules.fallback,
        (None, false) => None,
    };
    let decision = match policy {
        Some(p) => {
            let tier = match failure.entry.tier {
                TierId::Main => Tier::Main,
                TierId::Retry => Tier::Retry,
            };
            let mut ctx = FailureContext::new(attempt, failure.reason)
                .with_tier(tier)
                .with_override(failure.overrides)
                .with_jitter_seed(ricochet_policy::jitter_seed(origin.as_bytes(), attempt))
                .with_first_failure(UNIX_EPOCH + Duration::from_millis(record.first_failure_ms));
            if !failure.detail.is_empty() {
                ctx = ctx.with_detail(&failure.detail);
            }
            p.decide(&ctx)
        }
        None if failure.reason == FailureReason::Terminate => Decision::DeadLetter {
            reason: format!("terminated: {}", failure.detail),
        },
        None => Decision::Redeliver {
            after: Duration::ZERO,
            tier: Tier::Main,
        },
    };
    let step = match decision {
        Decision::DeadLetter { reason } => Step::DeadLetter(reason),
        Decision::Redeliver { after, .. } if reconsume => Step::Retry(after),
        Decision::Redeliver {
            after,
            tier: Tier::Retry,
        } => Step::Retry(after),
        Decision::Redeliver {
            tier: Tier::Main, ..
        } => Step::InPlace(failure.hold),
    };
    match step {
        Step::Retry(d) if d > rules.max_delay => {
            tracing::warn!(delay = ?d, max_delay = ?rules.max_delay, "a policy asked for a delay above max_delay; shortened");
            Step::Retry(rules.max_delay)
        }
        Step::InPlace(d) => Step::InPlace(d.min(rules.max_delay)),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_policy::{MultiplierBackoff, PolicySpec};
    use std::sync::Arc;

    const NOW: u64 = 1_700_000_000_000;
    const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn build(spec: &str) -> Arc<dyn DeadLetterPolicy> {
        spec.parse::<PolicySpec>().unwrap().build().unwrap()
    }

    fn failure(reason: FailureReason, overrides: AttemptOverride) -> Failure {
        Failure {
            overrides,
            detail: "boom".into(),
            ..Failure::new(TierEntry::main(7), reason, "c1".into())
        }
    }

    /// A record that has already failed `count` times.
    fn failed(count: u32) -> FailureRecord {
        let mut r = FailureRecord::default();
        for n in 1..=count {
            r.push(AttemptRecord {
                time_ms: NOW - 60_000 + u64::from(n),
                delivery_count: n,
                consumer: "c0".into(),
                reason: FailureReason::Nack,
                detail: String::new(),
            });
        }
        r
    }

    struct Case {
        name: &'static str,
        policy: Option<&'static str>,
        reason: FailureReason,
        overrides: AttemptOverride,
        failed_before: u32,
        reconsume: bool,
        expect: Step,
    }

    #[test]
    fn failure_table() {
        use AttemptOverride as O;
        use FailureReason as R;
        let dl = |s: &str| Step::DeadLetter(s.to_owned());
        let cases = vec![
            Case {
                name: "no policy: a nack redelivers in place, for ever",
                policy: None,
                reason: R::Nack,
                overrides: O::Policy,
                failed_before: 500,
                reconsume: false,
                expect: Step::InPlace(Duration::ZERO),
            },
            Case {
                name: "no policy: terminate dead-letters with the consumer's text",
                policy: None,
                reason: R::Terminate,
                overrides: O::DeadLetter,
                failed_before: 0,
                reconsume: false,
                expect: dl("terminated: boom"),
            },
            Case {
                name: "no policy: reconsume_later uses RocketMQ's level 3 (10 s)",
                policy: None,
                reason: R::ReconsumeLater,
                overrides: O::Policy,
                failed_before: 0,
                reconsume: true,
                expect: Step::Retry(secs(10)),
            },
            Case {
                name: "no policy: reconsume_later's 17th attempt dead-letters (16 retries)",
                policy: None,
                reason: R::ReconsumeLater,
                overrides: O::Policy,
                failed_before: 16,
                reconsume: true,
                expect: dl("attempt 17 exceeds max_reconsume_times 16"),
            },
            Case {
                name: "delay levels: attempt n uses level start + n - 1",
                policy: Some("delay-levels:levels=1s 2s 4s,start=1,max=3"),
                reason: R::Nack,
                overrides: O::Policy,
                failed_before: 1,
                reconsume: false,
                expect: Step::Retry(secs(2)),
            },
            Case {
                name: "delay levels: past max, dead-letter",
                policy: Some("delay-levels:levels=1s 2s 4s,start=1,max=3"),
                reason: R::Nack,
                overrides: O::Policy,
                failed_before: 3,
                reconsume: false,
                expect: dl("attempt 4 exceeds max_reconsume_times 3"),
            },
            Case {
                name: "explicit delay overrides the level",
                policy: Some("delay-levels:levels=1s 2s 4s,start=1,max=3"),
                reason: R::ReconsumeLater,
                overrides: O::Delay(secs(90)),
                failed_before: 0,
                reconsume: true,
                expect: Step::Retry(secs(90)),
            },
            Case {
                name: "explicit level overrides the schedule",
                policy: Some("delay-levels:levels=1s 2s 4s,start=1,max=3"),
                reason: R::ReconsumeLater,
                overrides: O::Level(3),
                failed_before: 0,
                reconsume: true,
                expect: Step::Retry(secs(4)),
            },
            Case {
                name: "level -1 dead-letters at once",
                policy: Some("delay-levels:levels=1s 2s 4s,start=1,max=3"),
                reason: R::ReconsumeLater,
                overrides: O::DeadLetter,
                failed_before: 0,
                reconsume: true,
                expect: dl("dead-letter requested by the consumer (level -1)"),
            },
            Case {
                name: "backoff: a nack redelivers in place (the client served the delay)",
                policy: Some("backoff:fixed=100ms,max=3"),
                reason: R::Nack,
                overrides: O::Policy,
                failed_before: 0,
                reconsume: false,
                expect: Step::InPlace(Duration::ZERO),
            },
            Case {
                name: "backoff: reconsume_later still goes through the retry tier",
                policy: Some("backoff:fixed=100ms,max=3"),
                reason: R::ReconsumeLater,
                overrides: O::Policy,
                failed_before: 0,
                reconsume: true,
                expect: Step::Retry(Duration::from_millis(100)),
            },
            Case {
                name: "backoff: the ack timeout counts like a nack",
                policy: Some("backoff:fixed=100ms,max=3"),
                reason: R::AckTimeout,
                overrides: O::Policy,
                failed_before: 3,
                reconsume: false,
                expect: dl("attempt 4 exceeds max_redeliver_count 3"),
            },
            Case {
                name: "a lost consumer counts an attempt too",
                policy: Some("backoff:fixed=100ms,max=1"),
                reason: R::ConsumerLost,
                overrides: O::Policy,
                failed_before: 1,
                reconsume: false,
                expect: dl("attempt 2 exceeds max_redeliver_count 1"),
            },
        ];
        let fallback = PolicySpec::delay_levels_default().build().unwrap();
        for case in cases {
            let policy = case.policy.map(build);
            let rules = Rules {
                policy: policy.as_deref(),
                fallback: Some(fallback.as_ref()),
                now_ms: NOW,
                max_delay: WEEK,
            };
            let mut record = failed(case.failed_before);
            let step = plan(
                rules,
                &failure(case.reason, case.overrides),
                &mut record,
                "t:7",
                case.reconsume,
            );
            assert_eq!(step, case.expect, "{}", case.name);
            assert_eq!(record.count, case.failed_before + 1, "{}: count", case.name);
            let last = record.attempts.last().unwrap();
            assert_eq!(
                (last.time_ms, last.delivery_count, last.reason),
                (NOW, record.count, case.reason),
                "{}",
                case.name
            );
            assert_eq!(last.consumer, "c1");
        }
    }

    #[test]
    fn multiplier_backoff_grows_with_the_persisted_count_and_jitters_deterministically() {
        let spec = PolicySpec::multiplier_backoff(
            MultiplierBackoff {
                min: secs(1),
                max: secs(60),
                multiplier: 2.0,
                jitter: 0.2,
            },
            10,
        );
        let policy = spec.build().unwrap();
        let rules = Rules {
            policy: Some(policy.as_ref()),
            fallback: None,
            now_ms: NOW,
            max_delay: WEEK,
        };
        let f = failure(FailureReason::ReconsumeLater, AttemptOverride::Policy);
        let mut delays = Vec::new();
        for n in 0..5 {
            let Step::Retry(d) = plan(rules, &f, &mut failed(n), "t:7", true) else {
                panic!("attempt {} dead-lettered", n + 1)
            };
            // The same message and attempt always get the same jitter.
            assert_eq!(plan(rules, &f, &mut failed(n), "t:7", true), Step::Retry(d));
            delays.push(d);
        }
        for (n, d) in delays.iter().enumerate() {
            let base = secs(1 << n);
            assert!(
                *d >= base.mul_f64(0.8) && *d <= base.mul_f64(1.2),
                "attempt {}: {d:?} vs {base:?}",
                n + 1
            );
        }
    }

    #[test]
    fn holds_and_policy_delays_never_exceed_max_delay() {
        let rules = Rules {
            policy: None,
            fallback: None,
            now_ms: NOW,
            max_delay: secs(3600),
        };
        let held = Failure {
            hold: secs(60),
            ..failure(FailureReason::Nack, AttemptOverride::Policy)
        };
        assert_eq!(
            plan(rules, &held, &mut FailureRecord::default(), "t:7", false),
            Step::InPlace(secs(60)),
            "a nack the broker holds stays in place, after its delay"
        );
        let long = Failure {
            hold: secs(7200),
            ..held.clone()
        };
        assert_eq!(
            plan(rules, &long, &mut FailureRecord::default(), "t:7", false),
            Step::InPlace(secs(3600))
        );
        // A policy step above the limit (only a custom policy can have one:
        // built-in ones are checked when set) is shortened to it.
        let two_hours = build("delay-levels:levels=2h,start=1,max=3");
        let rules = Rules {
            policy: Some(two_hours.as_ref()),
            ..rules
        };
        let f = failure(FailureReason::Nack, AttemptOverride::Policy);
        assert_eq!(
            plan(rules, &f, &mut FailureRecord::default(), "t:7", false),
            Step::Retry(secs(3600))
        );
        // A hold means nothing when the policy moves the message.
        let held = Failure { hold: secs(5), ..f };
        assert_eq!(
            plan(rules, &held, &mut FailureRecord::default(), "t:7", false),
            Step::Retry(secs(3600))
        );
    }

    #[test]
    fn the_history_keeps_the_first_failure_time_and_only_the_last_64_attempts() {
        let rules = Rules {
            policy: None,
            fallback: None,
            now_ms: NOW,
            max_delay: WEEK,
        };
        let f = failure(FailureReason::Nack, AttemptOverride::Policy);
        let mut record = FailureRecord::default();
        for _ in 0..70 {
            plan(rules, &f, &mut record, "t:7", false);
        }
        assert_eq!(record.count, 70);
        assert_eq!(record.first_failure_ms, NOW);
        assert_eq!(record.attempts.len(), crate::storage::MAX_ATTEMPTS_KEPT);
        assert_eq!(record.attempts[0].delivery_count, 7);
    }
}
