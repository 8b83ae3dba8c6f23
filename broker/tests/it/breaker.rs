//! The outage breaker through the wire, on in-process brokers with a data
//! directory: set with `SetPolicy`, shown by `GetPolicy` and
//! `SubscriptionStats`, forced with `SetBreaker`, tripped by nacks, kept
//! across a restart (an open breaker stays open), probing and closed by a
//! probe's ack, each step announced on the namespace's failure-events topic,
//! and bad input refused with nothing changed. (The outage itself, on
//! virtual time, is tested in the subscription actor's `breaker_tests`.)

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use tonic::Code;

const TOPIC: &str = "persistent://public/default/payments";

async fn admin(b: &InProcessBroker) -> AdminClient<tonic::transport::Channel> {
    AdminClient::new(channel(&b.url()).await)
}

fn policy(breaker: Option<BreakerConfig>) -> DeadLetterPolicyConfig {
    let spec: ricochet_policy::PolicySpec = "backoff:fixed=1s,max=3".parse().unwrap();
    DeadLetterPolicyConfig {
        breaker,
        ..DeadLetterPolicyConfig::from(&spec)
    }
}

/// Trips on 2 failures within 10 s; the first probe waits an hour.
fn burst() -> BreakerConfig {
    BreakerConfig {
        failures: 2,
        within_ms: 10_000,
        probe_interval_ms: 3_600_000,
        max_probe_interval_ms: 3_600_000,
        ..Default::default()
    }
}

async fn set_policy(
    b: &InProcessBroker,
    p: DeadLetterPolicyConfig,
) -> Result<PolicyResponse, tonic::Status> {
    admin(b)
        .await
        .set_policy(SetPolicyRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            policy: Some(p),
        })
        .await
        .map(|r| r.into_inner())
}

async fn set_breaker(b: &InProcessBroker, mode: i32) -> Result<BreakerStatus, tonic::Status> {
    admin(b)
        .await
        .set_breaker(SetBreakerRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            mode,
        })
        .await
        .map(|r| r.into_inner())
}

async fn breaker(b: &InProcessBroker) -> Option<BreakerStatus> {
    sub_stats(&b.url(), TOPIC, "s").await.breaker
}

#[tokio::test]
async fn a_tripped_breaker_stops_dispatch_and_stays_open_across_a_restart() {
    let b = InProcessBroker::start().await;
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    let set = set_policy(&b, policy(Some(burst()))).await.unwrap();
    assert_eq!(set.policy.unwrap().breaker.unwrap().failures, 2);
    let st = breaker(&b).await.expect("stats show the breaker");
    assert_eq!((st.state.as_str(), st.trips), ("closed", 0));

    c.flow(100).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["a", "b", "c"]).await;
    let got = c.take(3, WAIT).await;
    // Two nacks within 10 s trip it; the third is spared (no attempt spent).
    for (i, m) in got.iter().enumerate() {
        c.nack(m.id.clone().unwrap(), "gateway down", i as u64 + 1)
            .await;
    }
    for _ in 0..3 {
        assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    }
    assert!(c.next(QUIET).await.is_none(), "open: nothing dispatched");
    let st = breaker(&b).await.unwrap();
    assert_eq!((st.state.as_str(), st.trips), ("open", 1), "{st:?}");
    assert_eq!(st.mode, BreakerMode::Auto as i32);
    assert!(st.next_probe_ms > st.since_ms, "{st:?}");

    // The event is on the namespace's failure-events topic.
    let mut events = events_consumer(&b.url(), "watch", 10).await;
    let ev = events.next(WAIT).await.expect("a breaker event");
    let ev: serde_json::Value = serde_json::from_slice(&ev.payload).unwrap();
    assert_eq!(ev["kind"], "breaker_opened", "{ev}");
    assert_eq!(ev["cause"], "2 failures within 10s", "{ev}");
    drop((c, events, p));

    // Restarted on the same data: still open, still nothing dispatched.
    let dir = b.shutdown().await;
    let b = InProcessBroker::start_in(dir, |_| {}).await;
    let st = breaker(&b).await.expect("the breaker survives the restart");
    assert_eq!((st.state.as_str(), st.trips), ("open", 1), "{st:?}");
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(100).await;
    assert!(
        c.next(QUIET).await.is_none(),
        "open after restart: nothing dispatched"
    );

    // An operator closes it: everything comes, counts as before the outage
    // (two spent an attempt before it tripped, the third none).
    let st = set_breaker(&b, BreakerMode::ForcedClosed as i32)
        .await
        .unwrap();
    assert_eq!(st.state, "closed");
    let mut counts: Vec<u32> = c
        .take(3, WAIT)
        .await
        .iter()
        .map(|m| m.delivery_count)
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, [0, 1, 1]);
}

/// A tripped breaker sends one probe after its interval; a failed probe
/// keeps it open, an acked one closes it and the rest flow. Each step is an
/// event on the namespace's failure-events topic: opened, probing (naming
/// the probe), opened again (the failed probe), probing, closed.
#[tokio::test]
async fn probes_and_a_probe_ack_are_events() {
    let b = InProcessBroker::start().await;
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    set_policy(
        &b,
        policy(Some(BreakerConfig {
            probe_interval_ms: 300,
            max_probe_interval_ms: 600,
            ..burst()
        })),
    )
    .await
    .unwrap();
    c.flow(100).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["a", "b", "c"]).await;
    let mut rid = 0;
    for m in c.take(3, WAIT).await {
        rid += 1;
        c.nack(m.id.unwrap(), "gateway down", rid).await;
    }
    let probe = c.next(WAIT).await.expect("a first probe");
    assert!(c.next(QUIET).await.is_none(), "one probe at a time");
    rid += 1;
    c.nack(probe.id.clone().unwrap(), "still down", rid).await;
    let second = c.next(WAIT).await.expect("a second probe");
    rid += 1;
    c.ack(vec![second.id.clone().unwrap()], rid).await;
    // Closed: the other two come (the failed probe among them).
    let rest = c.take(2, WAIT).await;
    assert_eq!(rest.len(), 2);
    let st = breaker(&b).await.unwrap();
    assert_eq!((st.state.as_str(), st.trips), ("closed", 1), "{st:?}");

    let mut events = events_consumer(&b.url(), "watch", 100).await;
    let mut got = Vec::new();
    while got.len() < 5 {
        let Some(ev) = events.next(WAIT).await else {
            panic!("events so far: {got:#?}");
        };
        let ev: serde_json::Value = serde_json::from_slice(&ev.payload).unwrap();
        if ev["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("breaker_"))
        {
            got.push(ev);
        }
    }
    got.sort_by_key(|e| e["time_ms"].as_u64());
    let kinds: Vec<&str> = got.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "breaker_opened",
            "breaker_probing",
            "breaker_opened",
            "breaker_probing",
            "breaker_closed"
        ],
        "{got:#?}"
    );
    assert!(got.iter().all(|e| e["subscription"] == "s"), "{got:#?}");
    // Each probing event names the message sent as the probe.
    for (i, m) in [(1, &probe), (3, &second)] {
        assert_eq!(got[i]["cause"], "probe sent", "{got:#?}");
        let id = m.id.as_ref().unwrap();
        assert_eq!(
            got[i]["message_id"],
            format!("{}:{}", id.topic, id.entry_id),
            "{got:#?}"
        );
    }
    assert!(
        got[2]["cause"]
            .as_str()
            .is_some_and(|c| c.starts_with("probe failed; next probe in")),
        "{got:#?}"
    );
    assert_eq!(got[4]["cause"], "probe acked", "{got:#?}");
}

#[tokio::test]
async fn a_forced_open_breaker_stays_forced_across_a_restart() {
    let b = InProcessBroker::start().await;
    let _c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    set_policy(&b, policy(Some(burst()))).await.unwrap();
    let st = set_breaker(&b, BreakerMode::ForcedOpen as i32)
        .await
        .unwrap();
    assert_eq!(
        (st.state.as_str(), st.mode),
        ("open", BreakerMode::ForcedOpen as i32)
    );
    drop(_c);
    let dir = b.shutdown().await;
    let b = InProcessBroker::start_in(dir, |_| {}).await;
    let st = breaker(&b).await.unwrap();
    assert_eq!(
        (st.state.as_str(), st.mode),
        ("open", BreakerMode::ForcedOpen as i32)
    );
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["x"]).await;
    assert!(c.next(QUIET).await.is_none());
    let st = set_breaker(&b, BreakerMode::Auto as i32).await.unwrap();
    assert_eq!(
        (st.state.as_str(), st.mode),
        ("open", BreakerMode::Auto as i32)
    );
    set_breaker(&b, BreakerMode::ForcedClosed as i32)
        .await
        .unwrap();
    assert_eq!(c.next(WAIT).await.map(|m| text(&m)), Some("x".to_owned()));
}

#[tokio::test]
async fn bad_breaker_requests_are_refused_and_change_nothing() {
    let b = InProcessBroker::start().await;
    let _c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    // No breaker yet: forcing one is a precondition failure.
    let e = set_breaker(&b, BreakerMode::ForcedOpen as i32)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("has no breaker"), "{e:?}");

    set_policy(&b, policy(Some(burst()))).await.unwrap();
    for bad in [
        BreakerConfig {
            ratio: 1.5,
            ..burst()
        },
        BreakerConfig {
            failures: 0,
            ..Default::default()
        },
        BreakerConfig {
            probe_interval_ms: 10,
            ..burst()
        },
        BreakerConfig {
            probe_interval_ms: 60_000,
            max_probe_interval_ms: 1_000,
            ..burst()
        },
    ] {
        let e = set_policy(&b, policy(Some(bad))).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(e.message().contains("breaker"), "{e:?}");
    }
    let got = admin(&b)
        .await
        .get_policy(SubscriptionRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.policy.unwrap().breaker,
        Some(BreakerConfig::from(
            &ricochet_policy::BreakerSpec::try_from(&burst()).unwrap()
        )),
        "unchanged"
    );

    for mode in [0, 9] {
        let e = set_breaker(&b, mode).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    let e = admin(&b)
        .await
        .set_breaker(SetBreakerRequest {
            topic: TOPIC.into(),
            subscription: "nobody".into(),
            mode: BreakerMode::ForcedOpen as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(breaker(&b).await.unwrap().state, "closed", "unchanged");

    // A policy set without a breaker removes the operator's breaker.
    set_policy(&b, policy(None)).await.unwrap();
    assert!(breaker(&b).await.is_none());
}
