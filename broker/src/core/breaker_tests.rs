//! The outage breaker in the subscription actor, on virtual time (the
//! harness of [`super::actor_tests`]): a 30-second outage of a consumer's
//! dependency takes 30 s of virtual time and no real time.

use super::actor_tests::{Harness, TestConsumer, harness, text};
use crate::clock::Clock;
use crate::storage::Storage;
use crate::subscription::*;
use ricochet_policy::{BreakerMode, BreakerPhase, BreakerSpec, PolicySpec};
use ricochet_proto::SubscriptionType;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Dead-letters on the 4th failure of a message.
const POLICY: &str = "backoff:fixed=100ms,max=3";
const BREAKER: &str = "breaker:ratio=0.5,window=20,min=10,probe=1s,max-probe=8s";

/// What a consumer saw through an outage.
#[derive(Debug)]
struct Seen {
    acked: BTreeSet<String>,
    /// The highest delivery count each message was delivered with.
    max_count: BTreeMap<String, u32>,
    dead_lettered: u64,
    breaker: Option<BreakerStats>,
}

async fn setup(n: usize, breaker: Option<&str>) -> (Harness, TestConsumer, Vec<String>) {
    let h = harness().await;
    let payloads: Vec<String> = (0..n).map(|i| format!("m{i:02}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    let c = h.consumer(SubscriptionType::Shared, None).await;
    c.handle
        .set_policy(
            Some(POLICY.parse::<PolicySpec>().unwrap()),
            None,
            breaker.map(|b| b.parse::<BreakerSpec>().unwrap()),
        )
        .await
        .unwrap();
    h.publish(&refs).await;
    (h, c, payloads)
}

async fn stats(h: &Harness, c: &TestConsumer) -> SubscriptionStats {
    let storage: Arc<dyn Storage> = h.storage.clone();
    c.handle.stats(storage).await.unwrap()
}

/// A consumer that nacks everything while its dependency is down (for
/// `outage`), then acks; each message takes 100 ms to process.
async fn consume_through_outage(n: usize, breaker: Option<&str>, outage: Duration) -> Seen {
    let (h, mut c, payloads) = setup(n, breaker).await;
    let recovers_at = h.clock.now_ms() + outage.as_millis() as u64;
    let mut acked = BTreeSet::new();
    let mut max_count = BTreeMap::new();
    while acked.len() < payloads.len() {
        let Some(msgs) = c.messages_within(Duration::from_secs(300)).await else {
            break;
        };
        c.flow(msgs.len() as u32);
        for m in msgs {
            let t = text(&m).to_owned();
            let e = max_count.entry(t.clone()).or_insert(0);
            *e = (*e).max(m.delivery_count);
            tokio::time::sleep(Duration::from_millis(100)).await;
            if h.clock.now_ms() < recovers_at {
                c.nack(&m);
            } else {
                c.ack(&m);
                acked.insert(t);
            }
        }
    }
    let s = stats(&h, &c).await;
    Seen {
        acked,
        max_count,
        dead_lettered: s.dead_lettered,
        breaker: s.breaker,
    }
}

#[tokio::test(start_paused = true)]
async fn a_30s_outage_sends_nothing_to_the_dlq_and_everything_is_delivered_after() {
    let seen = consume_through_outage(40, Some(BREAKER), Duration::from_secs(30)).await;
    assert_eq!(seen.dead_lettered, 0, "{seen:?}");
    assert_eq!(
        seen.acked.len(),
        40,
        "every message acked after recovery: {seen:?}"
    );
    // Attempts were spent only before the breaker opened: at most one each,
    // and the policy would dead-letter at the fourth.
    let worst = seen.max_count.values().max().copied().unwrap_or(0);
    assert!(worst <= 1, "delivery counts burned while open: {seen:?}");
    let b = seen.breaker.expect("the subscription has a breaker");
    assert_eq!(b.snapshot.phase, BreakerPhase::Closed, "{b:?}");
    assert_eq!(b.snapshot.trips, 1, "{b:?}");
}

/// The same outage without the breaker: what the breaker prevents.
#[tokio::test(start_paused = true)]
async fn without_the_breaker_the_same_outage_dead_letters_and_burns_attempts() {
    let seen = consume_through_outage(40, None, Duration::from_secs(30)).await;
    assert_eq!(seen.dead_lettered, 40, "{seen:?}");
    assert!(seen.acked.is_empty(), "{seen:?}");
    assert!(seen.breaker.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_poison_message_still_dead_letters_while_the_breaker_stays_closed() {
    let (h, mut c, _) = setup(30, Some(BREAKER)).await;
    let mut acked = 0;
    // Until nothing comes for 10 s: the poison message is gone.
    while let Some(msgs) = c.messages_within(Duration::from_secs(10)).await {
        c.flow(msgs.len() as u32);
        for m in msgs {
            if text(&m) == "m07" {
                c.nack(&m);
            } else {
                c.ack(&m);
                acked += 1;
            }
        }
    }
    assert_eq!(acked, 29);
    let s = stats(&h, &c).await;
    assert_eq!(s.dead_lettered, 1, "the poison message is dead-lettered");
    let b = s.breaker.unwrap();
    assert_eq!(b.snapshot.phase, BreakerPhase::Closed, "{b:?}");
    assert_eq!(b.snapshot.trips, 0, "{b:?}");
}

#[tokio::test(start_paused = true)]
async fn an_operator_forces_it_open_and_closed() {
    let (h, mut c, _) = setup(3, Some(BREAKER)).await;
    // Forced open before anything is dispatched... (the harness already
    // dispatched on publish: drain and give them back first).
    let first = c.messages().await;
    let forced = c.handle.set_breaker(BreakerMode::ForcedOpen).await.unwrap();
    assert_eq!(forced.snapshot.phase, BreakerPhase::Open);
    assert_eq!(forced.snapshot.trips, 1);
    // A nack while forced open spends no attempt, and nothing comes back,
    // not even a probe, for an hour.
    for m in &first {
        c.nack(m);
    }
    assert!(
        c.messages_within(Duration::from_secs(3600)).await.is_none(),
        "forced open: nothing dispatched"
    );
    let s = stats(&h, &c).await;
    assert_eq!(s.breaker.unwrap().snapshot.mode, BreakerMode::ForcedOpen);
    let closed = c
        .handle
        .set_breaker(BreakerMode::ForcedClosed)
        .await
        .unwrap();
    assert_eq!(closed.snapshot.phase, BreakerPhase::Closed);
    let again = c.messages().await;
    assert_eq!(again.len(), 3);
    assert!(again.iter().all(|m| m.delivery_count == 0), "{again:?}");
    // Back to auto; a subscription without a breaker refuses to be forced.
    c.handle.set_breaker(BreakerMode::Auto).await.unwrap();
    c.handle
        .set_policy(Some(POLICY.parse().unwrap()), None, None)
        .await
        .unwrap();
    let e = c
        .handle
        .set_breaker(BreakerMode::ForcedOpen)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("has no breaker"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_probes_at_a_doubling_interval_and_a_probe_ack_closes_it() {
    let (h, mut c, _) = setup(12, Some(BREAKER)).await;
    // Ten nacks trip it (ratio 1.0 over the minimum of 10 settles).
    let first = c.messages().await;
    for m in &first {
        c.nack(m);
    }
    let t0 = h.clock.now_ms();
    let mut probes = Vec::new();
    for _ in 0..4 {
        let p = c.messages().await;
        assert_eq!(p.len(), 1, "one probe at a time");
        probes.push(h.clock.now_ms() - t0);
        c.nack(&p[0]);
    }
    // Waits of 1 s, 2 s, 4 s, 8 s (cumulative 1, 3, 7, 15).
    let gaps: Vec<u64> = probes.iter().map(|ms| ms / 1000).collect();
    assert_eq!(gaps, [1, 3, 7, 15], "{probes:?}");
    let p = c.messages().await;
    assert_eq!(p.len(), 1);
    c.ack(&p[0]);
    let rest = c.messages().await;
    assert!(!rest.is_empty(), "closed: dispatch resumes");
    let s = stats(&h, &c).await;
    assert_eq!(s.breaker.unwrap().snapshot.phase, BreakerPhase::Closed);
}
