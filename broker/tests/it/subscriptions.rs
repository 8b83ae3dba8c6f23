//! Publish → consume → ack round trips for every subscription type, consumer
//! loss redelivery with persisted counts, and cumulative acks.

use crate::common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::collections::{HashMap, HashSet};

#[tokio::test]
async fn exclusive_round_trip_and_second_consumer_rejected() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "orders", "p1").await.unwrap();
    let ids = p.send(&["a", "b", "c"]).await;
    assert_eq!(
        ids.iter().map(|i| i.entry_id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(ids[0].topic, "persistent://public/default/orders");

    let mut c = RawConsumer::simple(&b.url(), "orders", "s", SubscriptionType::Exclusive).await;
    c.flow(10).await;
    let got = c.take(3, WAIT).await;
    assert_eq!(
        got.iter().map(text).collect::<Vec<_>>(),
        vec!["a", "b", "c"]
    );
    assert!(got.iter().all(|m| m.delivery_count == 0));
    c.ack(got.iter().map(|m| m.id.clone().unwrap()).collect(), 7)
        .await;
    let r = c.result(WAIT).await.expect("ack result");
    assert_eq!((r.request_id, r.code), (7, 0));

    let err = RawConsumer::subscribe(&b.url(), "orders", "s", SubOpts::default())
        .await
        .expect_err("rejected");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("Exclusive"), "{err}");

    // Acked messages are not redelivered to the next consumer.
    drop(c);
    tokio::time::sleep(QUIET).await;
    let mut c2 = RawConsumer::simple(&b.url(), "orders", "s", SubscriptionType::Exclusive).await;
    c2.flow(10).await;
    assert!(c2.next(QUIET).await.is_none());
    p.send(&["d"]).await;
    assert_eq!(text(&c2.next(WAIT).await.unwrap()), "d");
}

#[tokio::test]
async fn shared_round_robins_between_consumers() {
    let b = InProcessBroker::start().await;
    let mut c1 = RawConsumer::simple(&b.url(), "jobs", "workers", SubscriptionType::Shared).await;
    let mut c2 = RawConsumer::simple(&b.url(), "jobs", "workers", SubscriptionType::Shared).await;
    c1.flow(100).await;
    c2.flow(100).await;
    let mut p = RawProducer::open(&b.url(), "jobs", "p").await.unwrap();
    let payloads: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = payloads.iter().map(|s| s.as_str()).collect();
    p.send(&refs).await;
    let mut seen = HashSet::new();
    let mut per = [0, 0];
    while seen.len() < 20 {
        if let Some(m) = c1.next(QUIET).await {
            per[0] += 1;
            assert!(seen.insert(text(&m)));
        }
        if let Some(m) = c2.next(QUIET).await {
            per[1] += 1;
            assert!(seen.insert(text(&m)));
        }
    }
    assert_eq!(per, [10, 10], "round robin splits evenly");
    // Cumulative ack is refused on Shared.
    c1.ack_cumulative(
        MessageId {
            topic: "persistent://public/default/jobs".into(),
            entry_id: 0,
        },
        3,
    )
    .await;
    let r = c1.result(WAIT).await.unwrap();
    assert_eq!(r.code, tonic::Code::InvalidArgument as i32, "{r:?}");
}

#[tokio::test]
async fn failover_switches_to_standby_when_active_leaves() {
    let b = InProcessBroker::start().await;
    let opts = |name: &str| SubOpts {
        sub_type: SubscriptionType::Failover,
        name: name.into(),
        ..Default::default()
    };
    let mut a = RawConsumer::subscribe(&b.url(), "fo", "s", opts("a"))
        .await
        .unwrap();
    let mut z = RawConsumer::subscribe(&b.url(), "fo", "s", opts("z"))
        .await
        .unwrap();
    a.flow(100).await;
    z.flow(100).await;
    let mut p = RawProducer::open(&b.url(), "fo", "p").await.unwrap();
    p.send(&["1", "2"]).await;
    let got = a.take(2, WAIT).await;
    assert!(z.next(QUIET).await.is_none(), "standby gets nothing");
    // Ack the first only, then the active consumer leaves.
    a.ack(vec![got[0].id.clone().unwrap()], 0).await;
    tokio::time::sleep(QUIET).await;
    drop(a);
    let m = z
        .next(WAIT)
        .await
        .expect("standby takes over with the unacked message");
    assert_eq!(text(&m), "2");
    assert_eq!(m.delivery_count, 1, "consumer loss counts as an attempt");
    p.send(&["3"]).await;
    assert_eq!(text(&z.next(WAIT).await.unwrap()), "3");
    assert!(z.active_changes.contains(&true));
}

#[tokio::test]
async fn key_shared_keeps_each_key_on_one_consumer_in_order() {
    let b = InProcessBroker::start().await;
    let mut c1 = RawConsumer::simple(&b.url(), "ks", "s", SubscriptionType::KeyShared).await;
    let mut c2 = RawConsumer::simple(&b.url(), "ks", "s", SubscriptionType::KeyShared).await;
    c1.flow(1000).await;
    c2.flow(1000).await;
    let mut p = RawProducer::open(&b.url(), "ks", "p").await.unwrap();
    let mut msgs = Vec::new();
    for i in 0..200 {
        let mut m = p.msg(format!("{i}"));
        m.key = format!("k{}", i % 10);
        msgs.push(m);
    }
    p.send_messages(msgs).await;
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut last: HashMap<String, i32> = HashMap::new();
    let mut count = 0;
    while count < 200 {
        for (i, c) in [&mut c1, &mut c2].into_iter().enumerate() {
            while let Some(m) = c.next(std::time::Duration::from_millis(100)).await {
                count += 1;
                let n: i32 = text(&m).parse().unwrap();
                assert_eq!(
                    *owner.entry(m.key.clone()).or_insert(i),
                    i,
                    "key {} moved",
                    m.key
                );
                assert!(
                    last.get(&m.key).is_none_or(|l| *l < n),
                    "key {} out of order",
                    m.key
                );
                last.insert(m.key.clone(), n);
            }
        }
    }
    let used: HashSet<usize> = owner.values().copied().collect();
    assert_eq!(
        used.len(),
        2,
        "10 keys spread over both consumers: {owner:?}"
    );
}

#[tokio::test]
async fn lost_consumer_messages_are_redelivered_with_count_plus_one() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "lost", "p").await.unwrap();
    p.send(&["x", "y"]).await;
    let mut c1 = RawConsumer::simple(&b.url(), "lost", "s", SubscriptionType::Shared).await;
    c1.flow(10).await;
    let got = c1.take(2, WAIT).await;
    c1.ack(vec![got[0].id.clone().unwrap()], 1).await;
    c1.result(WAIT).await.unwrap();
    drop(c1);
    let mut c2 = RawConsumer::simple(&b.url(), "lost", "s", SubscriptionType::Shared).await;
    c2.flow(10).await;
    let m = c2.next(WAIT).await.unwrap();
    assert_eq!((text(&m).as_str(), m.delivery_count), ("y", 1));
    assert!(c2.next(QUIET).await.is_none());
    // And again: the count keeps growing.
    drop(c2);
    let mut c3 = RawConsumer::simple(&b.url(), "lost", "s", SubscriptionType::Shared).await;
    c3.flow(10).await;
    assert_eq!(c3.next(WAIT).await.unwrap().delivery_count, 2);
}

#[tokio::test]
async fn cumulative_ack_on_exclusive_acks_everything_before() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "cum", "p").await.unwrap();
    p.send(&["1", "2", "3", "4"]).await;
    let mut c = RawConsumer::simple(&b.url(), "cum", "s", SubscriptionType::Exclusive).await;
    c.flow(10).await;
    let got = c.take(4, WAIT).await;
    c.ack_cumulative(got[2].id.clone().unwrap(), 5).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    drop(c);
    tokio::time::sleep(QUIET).await;
    let mut c = RawConsumer::simple(&b.url(), "cum", "s", SubscriptionType::Exclusive).await;
    c.flow(10).await;
    let m = c.next(WAIT).await.unwrap();
    assert_eq!(text(&m), "4");
    assert!(c.next(QUIET).await.is_none());
}

#[tokio::test]
async fn latest_position_skips_old_messages_and_dedup_drops_resends() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "pos", "fixed-name")
        .await
        .unwrap();
    p.send(&["old"]).await;
    let mut c = RawConsumer::subscribe(
        &b.url(),
        "pos",
        "late",
        SubOpts {
            initial: InitialPosition::Latest,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    c.flow(10).await;
    p.send(&["new"]).await;
    assert_eq!(text(&c.next(WAIT).await.unwrap()), "new");
    // A resend with an old sequence id is a duplicate, not a new message.
    let dup = OutboundMessage {
        payload: b"again".to_vec(),
        sequence_id: 0,
        ..Default::default()
    };
    match p.send_batch(vec![dup]).await {
        produce_response::Response::Receipts(r) => assert!(r.receipts[0].duplicate),
        other => panic!("{other:?}"),
    }
    // A reopened producer with the same name learns its last sequence id.
    let p2 = RawProducer::open(&b.url(), "pos", "fixed-name")
        .await
        .unwrap();
    assert_eq!(p2.next_seq, 2);
    assert!(c.next(QUIET).await.is_none());
}

#[tokio::test]
async fn graceful_shutdown_ends_open_streams_without_charging_attempts() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "bye", "p").await.unwrap();
    p.send(&["in-flight"]).await;
    let mut c = RawConsumer::simple(&b.url(), "bye", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    assert_eq!(c.next(WAIT).await.unwrap().delivery_count, 0);
    // Clients stay connected: shutdown must not wait for them.
    let dir = tokio::time::timeout(WAIT, b.shutdown())
        .await
        .expect("shutdown completes with clients connected");
    assert!(c.next(QUIET).await.is_none(), "the consumer stream ended");
    drop((c, p));
    let b = InProcessBroker::start_in(dir, |_| {}).await;
    let mut c = RawConsumer::simple(&b.url(), "bye", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let m = c
        .next(WAIT)
        .await
        .expect("unacked message redelivered after restart");
    assert_eq!(
        m.delivery_count, 0,
        "a broker shutdown is not the message's failure"
    );
}

#[tokio::test]
async fn failover_standby_is_told_it_is_not_active() {
    let b = InProcessBroker::start().await;
    let opts = |name: &str| SubOpts {
        sub_type: SubscriptionType::Failover,
        name: name.into(),
        ..Default::default()
    };
    let mut a = RawConsumer::subscribe(&b.url(), "fo2", "s", opts("a"))
        .await
        .unwrap();
    let mut z = RawConsumer::subscribe(&b.url(), "fo2", "s", opts("z"))
        .await
        .unwrap();
    assert!(a.next(QUIET).await.is_none());
    assert!(z.next(QUIET).await.is_none());
    assert_eq!(a.active_changes, vec![true]);
    assert_eq!(z.active_changes, vec![false]);
}

#[tokio::test]
async fn clean_close_gives_messages_back_without_charging_an_attempt() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "closing", "p").await.unwrap();
    p.send(&["a", "b"]).await;
    let mut c = RawConsumer::simple(&b.url(), "closing", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    c.take(2, WAIT).await;
    c.request(consume_request::Request::Close(CloseConsumer {}))
        .await;
    let mut c2 = RawConsumer::simple(&b.url(), "closing", "s", SubscriptionType::Shared).await;
    c2.flow(10).await;
    let again = c2.take(2, WAIT).await;
    assert!(again.iter().all(|m| m.delivery_count == 0), "{again:?}");
    // The closed consumer gets nothing more, even with permits left.
    p.send(&["c"]).await;
    assert_eq!(text(&c2.next(WAIT).await.unwrap()), "c");
    assert!(c.next(QUIET).await.is_none());
}
