//! Replicated topics (issue 22): a retry scheduled on a leader that is
//! killed fires on the next leader at its due time (the suite's other tests
//! are in `replicated`, whose cluster lock and helpers these share).

use crate::replicated::{ONE_CLUSTER, client, led_group};
use ricochet_client::{InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::etcd_or_skip;
use std::time::{Duration, Instant};

/// A retry scheduled on the leader (a `reconsume_later` into the retry tier
/// and a nack the broker holds) is applied by the followers after their
/// schedulers loaded their windows; the leader is killed before it is due.
/// The new leader fires both at their due time, with the delivery count one
/// higher, once each.
#[tokio::test]
async fn a_retry_scheduled_on_a_killed_leader_fires_on_the_new_one_at_its_due_time() {
    const DELAY: Duration = Duration::from_secs(10);
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_retry_scheduled_on_a_killed_leader_fires").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "later";
    let (mut brokers, _, _, victim) = led_group(&etcd, "due", root.path(), t).await;
    let c = client(&brokers[(victim + 1) % 3].url()).await;
    let producer = c.producer(t).name("p").create().await.unwrap();
    producer.send("retry").await.unwrap();
    producer.send("held").await.unwrap();
    // With ack receipts every nack is held by the broker, for the policy's
    // delay.
    let policy = format!("backoff:fixed={}s,max=50", DELAY.as_secs());
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .policy(policy.parse::<PolicySpec>().unwrap())
        .subscribe()
        .await
        .unwrap();
    let mut first = std::collections::HashMap::new();
    while first.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(20), consumer.receive())
            .await
            .expect("both messages delivered")
            .unwrap();
        first.insert(String::from_utf8_lossy(m.payload()).into_owned(), m);
    }
    let asked = Instant::now();
    consumer
        .reconsume_later(&first["retry"], DELAY)
        .await
        .unwrap();
    consumer.nack(&first["held"]).await.unwrap();
    consumer.flush().await.unwrap();
    let confirmed = Instant::now();
    // Both are committed (ack receipts): kill the leader well before they
    // are due.
    brokers[victim].kill9();
    let killed = confirmed.elapsed();
    assert!(
        killed < DELAY / 2,
        "killed {killed:?} after the confirmations"
    );

    // Due between `asked + DELAY` and `confirmed + DELAY`; the broker never
    // fires early, and late by at most a takeover's worth.
    let mut again: Vec<(String, u32, Duration)> = Vec::new();
    let listen_until = confirmed + DELAY + Duration::from_secs(8);
    while Instant::now() < listen_until {
        let left = listen_until.saturating_duration_since(Instant::now());
        let Ok(got) = tokio::time::timeout(left, consumer.receive()).await else {
            break;
        };
        let Ok(m) = got else { continue };
        let body = String::from_utf8_lossy(m.payload()).into_owned();
        again.push((body, m.delivery_count(), asked.elapsed()));
        consumer.ack(&m).await.unwrap();
    }
    println!(
        "replicated retries after the leader's kill: {again:?} (asked at 0, due at {DELAY:?})"
    );
    for body in ["retry", "held"] {
        let seen: Vec<_> = again.iter().filter(|(b, _, _)| b == body).collect();
        assert_eq!(seen.len(), 1, "{body} delivered once: {again:?}");
        let (_, count, at) = seen[0];
        assert_eq!(
            *count,
            first[body].delivery_count() + 1,
            "{body}: the delivery count one higher"
        );
        assert!(
            *at + Duration::from_millis(5) >= DELAY,
            "{body} came {at:?} after the request, before its delay"
        );
        assert!(
            *at <= confirmed.duration_since(asked) + DELAY + Duration::from_secs(3),
            "{body} came {at:?} after the request: late"
        );
    }
    assert_eq!(again.len(), 2, "nothing else came: {again:?}");
}
