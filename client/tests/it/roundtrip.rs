//! Produce → consume → ack round trips for every subscription type, and
//! what a message carries.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use common::{assert_quiet, recv, start, text, topic};
use futures::StreamExt;
use ricochet_client::{ErrorKind, InitialPosition, OutgoingMessage, SubscriptionType};

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn exclusive_round_trip_keeps_order_and_fields() {
    let env = start().await;
    let t = topic("rt-exclusive");
    let mut consumer = env
        .client
        .consumer(&t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    let event = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    let first = producer
        .send(
            OutgoingMessage::builder("m0")
                .key("k")
                .property("a", "1")
                .event_time(event),
        )
        .await
        .unwrap();
    let mut futs = Vec::new();
    for i in 1..50 {
        futs.push(producer.send_async(format!("m{i}")).await.unwrap());
    }
    let mut last = first.entry_id();
    for f in futs {
        let id = f.await.unwrap();
        assert!(id.entry_id() > last, "ids increase in send order");
        last = id.entry_id();
    }
    let m = recv(&mut consumer, T).await;
    assert_eq!(m.id(), &first);
    assert_eq!(text(&m), "m0");
    assert_eq!(m.key(), Some("k"));
    assert_eq!(m.property("a"), Some("1"));
    assert_eq!(m.event_time(), Some(event));
    assert_eq!(m.delivery_count(), 0);
    assert_eq!(m.producer_name(), producer.name());
    consumer.ack(&m).await.unwrap();
    for i in 1..50 {
        let m = recv(&mut consumer, T).await;
        assert_eq!(text(&m), format!("m{i}"));
        assert_eq!(m.key(), None);
        consumer.ack(&m).await.unwrap();
    }
    consumer.close().await.unwrap();
    producer.close().await.unwrap();
    // A second exclusive consumer is rejected while one is connected.
    let _c1 = env
        .client
        .consumer(&t)
        .subscription("x")
        .subscribe()
        .await
        .unwrap();
    let err = env
        .client
        .consumer(&t)
        .subscription("x")
        .subscribe()
        .await
        .unwrap_err();
    assert_eq!(
        err.grpc_code(),
        Some(tonic::Code::FailedPrecondition as i32),
        "{err}"
    );
}

#[tokio::test]
async fn shared_spreads_and_rejects_cumulative_ack() {
    let env = start().await;
    let t = topic("rt-shared");
    let sub = |name: &str| {
        env.client
            .consumer(&t)
            .subscription("s")
            .subscription_type(SubscriptionType::Shared)
            .consumer_name(name)
            .receiver_queue_size(10)
            .subscribe()
    };
    let mut a = sub("a").await.unwrap();
    let mut b = sub("b").await.unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    for i in 0..100 {
        drop(producer.send_async(format!("m{i}")).await.unwrap());
    }
    producer.flush().await.unwrap();
    let mut seen = HashSet::new();
    let (mut got_a, mut got_b) = (0, 0);
    while seen.len() < 100 {
        tokio::select! {
            m = a.next() => { let m = m.unwrap().unwrap(); got_a += 1; assert!(seen.insert(text(&m))); a.ack(&m).await.unwrap(); }
            m = b.next() => { let m = m.unwrap().unwrap(); got_b += 1; assert!(seen.insert(text(&m))); b.ack(&m).await.unwrap(); }
            _ = tokio::time::sleep(T) => panic!("stalled at {}", seen.len()),
        }
    }
    assert!(
        got_a > 0 && got_b > 0,
        "both consumers got messages: {got_a}/{got_b}"
    );
    // Cumulative ack is refused client-side on Shared.
    producer.send("last").await.unwrap();
    let m = tokio::select! {
        m = a.next() => m.unwrap().unwrap(),
        m = b.next() => m.unwrap().unwrap(),
    };
    let err = a.ack_cumulative(&m).await.unwrap_err();
    assert!(err.kind() == ErrorKind::InvalidArgument, "{err}");
}

#[tokio::test]
async fn failover_delivers_to_the_active_consumer_only() {
    let env = start().await;
    let t = topic("rt-failover");
    let sub = |name: &str| {
        env.client
            .consumer(&t)
            .subscription("s")
            .subscription_type(SubscriptionType::Failover)
            .consumer_name(name)
            .subscribe()
    };
    let mut first = sub("a-first").await.unwrap();
    let mut second = sub("b-second").await.unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    for i in 0..20 {
        producer.send(format!("m{i}")).await.unwrap();
    }
    for i in 0..20 {
        let m = recv(&mut first, T).await;
        assert_eq!(text(&m), format!("m{i}"));
        if i == 19 {
            first.ack_cumulative(&m).await.unwrap();
        }
    }
    assert_eq!(first.is_active(), Some(true));
    // The broker tells a standby that joins after the active consumer
    // nothing (see the report); it must at least not claim to be active.
    assert_ne!(second.is_active(), Some(true));
    assert_quiet(&mut second, Duration::from_millis(200)).await;
    // The active one leaves: the standby takes over.
    first.close().await.unwrap();
    drop(first);
    producer.send("after").await.unwrap();
    let m = recv(&mut second, T).await;
    assert_eq!(text(&m), "after");
    second.ack(&m).await.unwrap();
}

#[tokio::test]
async fn key_shared_keeps_each_key_on_one_consumer() {
    let env = start().await;
    let t = topic("rt-keyshared");
    let sub = |name: &str| {
        env.client
            .consumer(&t)
            .subscription("s")
            .subscription_type(SubscriptionType::KeyShared)
            .consumer_name(name)
            .subscribe()
    };
    let mut a = sub("a").await.unwrap();
    let mut b = sub("b").await.unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    for i in 0..80 {
        drop(
            producer
                .send_async(OutgoingMessage::builder(format!("{i}")).key(keys[i % keys.len()]))
                .await
                .unwrap(),
        );
    }
    producer.flush().await.unwrap();
    let mut owner: HashMap<String, &str> = HashMap::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    for _ in 0..80 {
        let (who, m) = tokio::select! {
            m = a.next() => ("a", m.unwrap().unwrap()),
            m = b.next() => ("b", m.unwrap().unwrap()),
            _ = tokio::time::sleep(T) => panic!("stalled"),
        };
        let key = m.key().unwrap().to_owned();
        assert_eq!(
            *owner.entry(key.clone()).or_insert(who),
            who,
            "key {key} moved"
        );
        let n: u64 = text(&m).parse().unwrap();
        if let Some(prev) = last.insert(key, n) {
            assert!(n > prev, "per-key order");
        }
        if who == "a" {
            a.ack(&m).await.unwrap()
        } else {
            b.ack(&m).await.unwrap()
        }
    }
    assert_eq!(owner.len(), keys.len());
}

#[tokio::test]
async fn delayed_delivery_is_not_early() {
    let env = start().await;
    let t = topic("rt-delayed");
    let mut consumer = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscribe()
        .await
        .unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    let sent = std::time::Instant::now();
    producer
        .send(OutgoingMessage::builder("later").deliver_after(Duration::from_millis(500)))
        .await
        .unwrap();
    producer.send("now").await.unwrap();
    let m = recv(&mut consumer, T).await;
    assert_eq!(text(&m), "now");
    consumer.ack(&m).await.unwrap();
    let m = recv(&mut consumer, T).await;
    assert_eq!(text(&m), "later");
    assert!(
        sent.elapsed() >= Duration::from_millis(490),
        "{:?}",
        sent.elapsed()
    );
    assert!(m.deliver_at().is_some());
    consumer.ack(&m).await.unwrap();
}

#[tokio::test]
async fn bad_input_is_a_typed_error() {
    let env = start_small().await;
    let t = topic("rt-bad");
    let producer = env.client.producer(&t).create().await.unwrap();
    let err = producer.send(vec![0u8; 2048]).await.unwrap_err();
    assert!(err.kind() == ErrorKind::InvalidArgument, "{err}");
    let err = env
        .client
        .producer("bad topic name!")
        .create()
        .await
        .unwrap_err();
    assert_eq!(
        err.grpc_code(),
        Some(tonic::Code::InvalidArgument as i32),
        "{err}"
    );
    let err = env.client.consumer(&t).subscribe().await.unwrap_err();
    assert!(err.kind() == ErrorKind::InvalidArgument, "{err}");
    // After close, sends fail with Closed.
    producer.close().await.unwrap();
}

async fn start_small() -> common::Env {
    common::start_with(|c| c.max_message_size = 1024).await
}

/// A send on an idle connection goes at once: the linger only gathers
/// messages while earlier batches are in flight (a sender waiting on each
/// receipt would otherwise pay the linger every time).
#[tokio::test]
async fn a_send_on_an_idle_producer_does_not_wait_out_the_linger() {
    let env = start().await;
    let producer = env
        .client
        .producer(topic("rt-linger"))
        .batch_linger(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    for i in 0..3 {
        tokio::time::timeout(Duration::from_secs(10), producer.send(format!("m{i}")))
            .await
            .expect("sent long before the 30 s linger")
            .unwrap();
    }
    producer.close().await.unwrap();
}

#[tokio::test]
async fn a_closed_consumer_and_its_ackers_answer_closed() {
    let env = start().await;
    let t = topic("rt-closed");
    let mut consumer = env
        .client
        .consumer(&t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    producer.send("one").await.unwrap();
    let m = recv(&mut consumer, T).await;
    let acker = consumer.acker();
    consumer.close().await.unwrap();
    for e in [
        consumer.receive().await.unwrap_err(),
        consumer.ack(&m).await.unwrap_err(),
        acker.nack(&m).await.unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Closed, "{e}");
    }
    producer.close().await.unwrap();
}

/// Permits come back once the application drains its queue, not only at
/// half the queue: a consumer that took 8 of its 10 (one refill of 5 sent)
/// and waits on an empty queue grants the other 3 (at least a quarter of the
/// queue), so the broker may push a whole queue again; never more than the
/// queue.
#[tokio::test]
async fn a_drained_queue_grants_the_permits_of_what_was_taken() {
    let env = start().await;
    let t = topic("rt-flow-idle");
    let admin = env.client.admin();
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .receiver_queue_size(10)
        .subscribe()
        .await
        .unwrap();
    let producer = env.client.producer(&t).create().await.unwrap();
    for i in 0..8 {
        drop(producer.send_async(format!("m{i}")).await.unwrap());
    }
    producer.flush().await.unwrap();
    for _ in 0..8 {
        let m = recv(&mut c, T).await;
        c.ack(&m).await.unwrap();
    }
    // The queue is empty: waiting on it grants what was taken.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), c.receive())
            .await
            .is_err()
    );
    let permits = || async {
        let s = admin.subscription_stats(&t, "s").await.unwrap();
        s.consumers[0].permits
    };
    let deadline = tokio::time::Instant::now() + T;
    let mut seen = permits().await;
    while seen != 10 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = permits().await;
    }
    assert_eq!(
        seen, 10,
        "permits after the queue was drained (7: not granted)"
    );
    // A burst of 10 now goes out whole.
    for i in 0..10 {
        drop(producer.send_async(format!("b{i}")).await.unwrap());
    }
    producer.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = admin.subscription_stats(&t, "s").await.unwrap();
    assert_eq!(
        (s.consumers[0].permits, s.unacked),
        (0, 10),
        "the whole queue pushed, no more: {s:?}"
    );
}
