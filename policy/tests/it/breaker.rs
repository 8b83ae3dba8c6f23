//! Property tests for the outage breaker: against random sequences of
//! settles, probes, clock steps and operator decisions it never dispatches
//! freely unless closed, sends one probe at a time, keeps its probe interval
//! within the spec's bounds, never opens when forced closed, counts a trip
//! for every opening, trips exactly when a reference count of the window
//! says so, and every spec survives its compact and serde forms.

use std::time::Duration;

use proptest::prelude::*;
use ricochet_policy::{Breaker, BreakerMode, BreakerPhase, BreakerSpec, Gate, Settle, Transition};

#[derive(Debug, Clone)]
enum Op {
    Settle(bool),
    Advance(u64),
    Probe,
    ProbeSettled(bool),
    ProbeReturned,
    Force(BreakerMode),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => any::<bool>().prop_map(Op::Settle),
        3 => (0u64..20_000).prop_map(Op::Advance),
        2 => Just(Op::Probe),
        2 => any::<bool>().prop_map(Op::ProbeSettled),
        1 => Just(Op::ProbeReturned),
        1 => prop::sample::select(vec![
            BreakerMode::Auto,
            BreakerMode::ForcedOpen,
            BreakerMode::ForcedClosed
        ])
        .prop_map(Op::Force),
    ]
}

fn spec() -> impl Strategy<Value = BreakerSpec> {
    (
        prop::option::of(1u32..=100),
        1u32..=50,
        prop::option::of(1u32..=20),
        100u64..=60_000,
        100u64..=10_000,
        1u64..=64,
    )
        .prop_filter_map(
            "needs a rule",
            |(ratio, window, failures, within, probe, cap)| {
                let s = BreakerSpec {
                    ratio: ratio.map(|r| f64::from(r) / 100.0),
                    window,
                    min_settles: window.div_ceil(2),
                    failures,
                    within: Duration::from_millis(within),
                    probe_interval: Duration::from_millis(probe),
                    max_probe_interval: Duration::from_millis(probe * cap),
                };
                s.validate().ok().map(|()| s)
            },
        )
}

fn settle(ok: bool) -> Settle {
    if ok { Settle::Success } else { Settle::Failure }
}

proptest! {
    #[test]
    fn the_machine_keeps_its_invariants(spec in spec(), ops in prop::collection::vec(op(), 1..300)) {
        let mut now = 1_000_000u64;
        let mut b = Breaker::new(spec.clone(), now);
        let lo = spec.probe_interval.as_millis() as u64;
        let hi = spec.max_probe_interval.as_millis() as u64;
        // A reference count of the ratio window while closed under auto.
        let mut window: Vec<bool> = Vec::new();
        let mut openings = 0u64;
        for op in ops {
            let was_closed_auto = b.mode() == BreakerMode::Auto && b.phase() == BreakerPhase::Closed;
            let t = match op {
                Op::Settle(ok) => {
                    let t = b.record(settle(ok), now);
                    if was_closed_auto {
                        window.push(!ok);
                        if window.len() > spec.window as usize { window.remove(0); }
                        if let (Some(r), false) = (spec.ratio, ok) {
                            let of = window.len() as u32;
                            let failed = window.iter().filter(|f| **f).count() as f64;
                            let ratio_trips = of >= spec.min_settles && failed >= r * f64::from(of);
                            if ratio_trips {
                                prop_assert!(matches!(t, Some(Transition::Opened(_))), "ratio should trip");
                            }
                        }
                        if ok { prop_assert_eq!(t, None, "a success never trips"); }
                    } else {
                        prop_assert_eq!(t, None, "only closed+auto counts");
                    }
                    t
                }
                Op::Advance(ms) => { now += ms; None }
                Op::Probe => {
                    let gate = b.gate(now);
                    let t = b.probe_sent(now);
                    prop_assert_eq!(t.is_some(), gate == Gate::Probe);
                    t
                }
                Op::ProbeSettled(ok) => b.probe_settled(settle(ok), now),
                Op::ProbeReturned => { b.probe_returned(now); None }
                Op::Force(m) => { window.clear(); b.force(m, now) }
            };
            if matches!(t, Some(Transition::Opened(_))) { openings += 1; }
            if matches!(t, Some(Transition::Opened(_)) | Some(Transition::Closed { .. })) || b.phase() != BreakerPhase::Closed || b.mode() != BreakerMode::Auto {
                window.clear();
            }
            let snap = b.snapshot();
            prop_assert_eq!(snap.trips, openings);
            prop_assert!((lo..=hi).contains(&snap.probe_interval_ms), "interval {} outside {lo}..={hi}", snap.probe_interval_ms);
            match b.gate(now) {
                Gate::All => prop_assert!(b.phase() == BreakerPhase::Closed),
                Gate::Probe => prop_assert!(b.phase() == BreakerPhase::Open && b.mode() == BreakerMode::Auto),
                Gate::Nothing => prop_assert!(b.phase() != BreakerPhase::Closed),
            }
            prop_assert_eq!(b.counts_attempts(), b.phase() == BreakerPhase::Closed);
            match b.mode() {
                BreakerMode::ForcedClosed => prop_assert_eq!(b.phase(), BreakerPhase::Closed),
                BreakerMode::ForcedOpen => prop_assert_eq!(b.phase(), BreakerPhase::Open),
                BreakerMode::Auto => {}
            }
            // A restored breaker gates the same way (a probe out is lost: open).
            let r = Breaker::restore(spec.clone(), snap);
            if b.phase() != BreakerPhase::HalfOpen {
                prop_assert_eq!(r.gate(now), b.gate(now));
            } else {
                prop_assert_eq!(r.phase(), BreakerPhase::Open);
            }
        }
    }

    #[test]
    fn specs_survive_text_and_serde(spec in spec()) {
        let text = spec.to_string();
        let back: BreakerSpec = text.parse().unwrap();
        prop_assert_eq!(&back, &spec, "{}", text);
        let json = serde_json::to_string(&spec).unwrap();
        prop_assert_eq!(serde_json::from_str::<BreakerSpec>(&json).unwrap(), spec);
    }
}
