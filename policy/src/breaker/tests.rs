use super::*;

fn spec(s: &str) -> BreakerSpec {
    s.parse().unwrap()
}

#[test]
fn compact_form_defaults_aliases_and_round_trip() {
    let d = BreakerSpec::default();
    assert_eq!(spec("breaker"), d);
    assert_eq!(
        d.to_string(),
        "breaker:ratio=0.5,window=200,min=20,within=10s,probe=5s,max-probe=5m"
    );
    let s = spec("breaker:failures=5,within=2s,probe-interval=1s,max_probe_interval=8s");
    assert_eq!(s.ratio, None, "a burst rule alone has no ratio");
    assert_eq!(s.failures, Some(5));
    assert_eq!(s.to_string().parse::<BreakerSpec>().unwrap(), s);
    // min defaults to the window when the window is smaller than 20.
    assert_eq!(spec("breaker:window=10").min_settles, 10);
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(json.parse::<BreakerSpec>().unwrap(), s);
}

#[test]
fn bad_values_are_refused_with_the_field_named() {
    for (input, needle) in [
        ("breaker:ratio=0", "ratio must be above 0"),
        ("breaker:ratio=1.5", "ratio must be above 0"),
        ("breaker:ratio=NaN", "ratio must be above 0"),
        ("breaker:window=0", "window must be"),
        ("breaker:window=10,min=11", "min_settles must be"),
        ("breaker:failures=0", "failures must be"),
        ("breaker:failures=3,within=0s", "within must be"),
        ("breaker:probe=10ms", "probe_interval must be"),
        (
            "breaker:probe=1m,max-probe=10s",
            "max_probe_interval (10s) is below",
        ),
        ("breaker:speed=3", "unknown key `speed`"),
        ("backoff:max=3", "starts with `breaker`"),
        (r#"{"window": 5}"#, "give a trip rule"),
    ] {
        let e = input.parse::<BreakerSpec>().unwrap_err().to_string();
        assert!(e.contains(needle), "{input}: {e}");
    }
}

#[test]
fn describe_names_the_rules_and_the_probe_schedule() {
    let text = spec("breaker:ratio=0.5,window=200,min=20,failures=50,within=10s").describe();
    assert!(
        text.contains("50% or more of the last 200 settles failed"),
        "{text}"
    );
    assert!(text.contains("50 failures within 10s"), "{text}");
    assert!(
        text.contains("5s, 10s, 20s, 40s, 1m 20s, 2m 40s, 5m, 5m"),
        "{text}"
    );
}

const T0: u64 = 1_000_000;

#[test]
fn ratio_trips_only_from_min_settles() {
    let mut b = Breaker::new(spec("breaker:ratio=0.5,window=10,min=4"), T0);
    assert_eq!(b.record(Settle::Failure, T0), None);
    assert_eq!(b.record(Settle::Failure, T0), None);
    assert_eq!(b.record(Settle::Failure, T0), None, "3 settles < min 4");
    assert_eq!(
        b.record(Settle::Failure, T0 + 1),
        Some(Transition::Opened(TripCause::Ratio { failed: 4, of: 4 }))
    );
    assert_eq!(b.phase(), BreakerPhase::Open);
    assert!(!b.counts_attempts());
    assert_eq!(b.snapshot().trips, 1);
}

#[test]
fn successes_never_trip_and_the_window_slides() {
    let mut b = Breaker::new(spec("breaker:ratio=0.5,window=4,min=4"), T0);
    // F S S S → 1/4; then S slides the F out; then F F → 2/4 trips.
    for s in [
        Settle::Failure,
        Settle::Success,
        Settle::Success,
        Settle::Success,
        Settle::Success,
    ] {
        assert_eq!(b.record(s, T0), None);
    }
    assert_eq!(b.failure_ratio(), 0.0);
    assert_eq!(b.record(Settle::Failure, T0), None);
    assert!(matches!(
        b.record(Settle::Failure, T0),
        Some(Transition::Opened(TripCause::Ratio { failed: 2, of: 4 }))
    ));
}

#[test]
fn burst_trips_on_n_failures_within_t_only() {
    let mut b = Breaker::new(spec("breaker:failures=3,within=1s"), T0);
    assert_eq!(b.record(Settle::Failure, T0), None);
    assert_eq!(b.record(Settle::Failure, T0 + 600), None);
    // The third is 1.2 s after the first: not within 1 s.
    assert_eq!(b.record(Settle::Failure, T0 + 1200), None);
    assert!(matches!(
        b.record(Settle::Failure, T0 + 1500),
        Some(Transition::Opened(TripCause::Burst { failures: 3, .. }))
    ));
}

#[test]
fn probes_double_to_the_cap_and_an_ack_closes() {
    let mut b = Breaker::new(spec("breaker:failures=1,probe=1s,max-probe=3s"), T0);
    assert!(b.record(Settle::Failure, T0).is_some());
    assert_eq!(b.gate(T0 + 999), Gate::Nothing);
    assert_eq!(b.next_wakeup(), Some(T0 + 1000));
    let mut now = T0 + 1000;
    for expected in [2, 3, 3] {
        assert_eq!(b.gate(now), Gate::Probe);
        assert_eq!(b.probe_sent(now), Some(Transition::Probing));
        assert_eq!(b.gate(now), Gate::Nothing, "one probe at a time");
        assert_eq!(b.record(Settle::Failure, now), None, "open: not counted");
        assert_eq!(
            b.probe_settled(Settle::Failure, now),
            Some(Transition::ProbeFailed(Duration::from_secs(expected)))
        );
        now += expected * 1000;
    }
    assert_eq!(b.probe_sent(now), Some(Transition::Probing));
    assert_eq!(
        b.probe_settled(Settle::Success, now),
        Some(Transition::Closed { forced: false })
    );
    assert_eq!(b.gate(now), Gate::All);
    assert_eq!(
        b.snapshot().probe_interval_ms,
        1000,
        "interval reset on close"
    );
}

#[test]
fn a_returned_probe_is_sent_again_at_once() {
    let mut b = Breaker::new(spec("breaker:failures=1,probe=1s"), T0);
    b.record(Settle::Failure, T0);
    b.probe_sent(T0 + 1000);
    b.probe_returned(T0 + 1100);
    assert_eq!(b.gate(T0 + 1100), Gate::Probe);
}

#[test]
fn forced_modes_override_the_rules() {
    let mut b = Breaker::new(spec("breaker:failures=1"), T0);
    assert_eq!(
        b.force(BreakerMode::ForcedOpen, T0),
        Some(Transition::Opened(TripCause::Forced))
    );
    assert_eq!(
        b.gate(T0 + 3_600_000),
        Gate::Nothing,
        "forced open never probes"
    );
    assert_eq!(
        b.force(BreakerMode::ForcedClosed, T0),
        Some(Transition::Closed { forced: true })
    );
    assert_eq!(
        b.record(Settle::Failure, T0),
        None,
        "forced closed never trips"
    );
    assert_eq!(b.gate(T0), Gate::All);
    assert_eq!(b.force(BreakerMode::Auto, T0), None);
    assert!(b.record(Settle::Failure, T0).is_some(), "auto trips again");
    // Auto from forced open: probes after the first interval.
    b.force(BreakerMode::ForcedOpen, T0);
    b.force(BreakerMode::Auto, T0 + 10);
    assert_eq!(b.next_wakeup(), Some(T0 + 10 + 5000));
}

#[test]
fn a_snapshot_restores_an_open_breaker_and_a_lost_probe() {
    let s = spec("breaker:failures=1,probe=1s");
    let mut b = Breaker::new(s.clone(), T0);
    b.record(Settle::Failure, T0);
    let open = Breaker::restore(s.clone(), b.snapshot());
    assert_eq!(open.phase(), BreakerPhase::Open);
    assert_eq!(open.gate(T0 + 500), Gate::Nothing);
    b.probe_sent(T0 + 1000);
    let json = serde_json::to_string(&b.snapshot()).unwrap();
    let back: BreakerSnapshot = serde_json::from_str(&json).unwrap();
    let r = Breaker::restore(s, back);
    assert_eq!(
        r.phase(),
        BreakerPhase::Open,
        "the probe was lost with the restart"
    );
    assert_eq!(r.gate(T0 + 1000), Gate::Probe);
}
