//! Failure events in a cluster: etcd (Debian's `etcd-server`) and two
//! brokers as child processes (skipped with a printed line when `etcd` is
//! missing, unless `RICOCHET_REQUIRE_ETCD=1`). The namespace's events topic
//! is placed on the other broker than the topic whose message is
//! dead-lettered, so the event must travel to its owner; a reader of the
//! events topic (through either broker) sees it.

use std::time::Duration;

use crate::common::recv;
use ricochet_client::{Client, InitialPosition, SubscriptionType};
use ricochet_testkit::{SpawnOptions, etcd_or_skip, spawn_cluster};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_dead_letter_event_reaches_the_events_topic_on_another_broker() {
    let Some(etcd) = etcd_or_skip("a_dead_letter_event_reaches_the_events_topic").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        &etcd,
        "events",
        2,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let c = Client::builder(brokers[0].url())
        .request_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let t = "persistent://public/default/orders";
    let events_topic = "persistent://public/default/__failure_events";
    // Placed one after the other, each on the broker with fewer topics:
    // the two end up on different brokers.
    let source_owner = c.lookup(t).await.unwrap().url;
    let events_owner = c.lookup(events_topic).await.unwrap().url;
    assert_ne!(
        source_owner, events_owner,
        "the test needs the events topic on another broker than the topic"
    );

    let mut events = c
        .consumer(events_topic)
        .subscription("watch")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = c.producer(t).create().await.unwrap();
    producer.send("poison").await.unwrap();
    let m = recv(&mut consumer, LONG).await;
    consumer
        .terminate(&m, "schema validation failed")
        .await
        .unwrap();

    let ev = recv(&mut events, LONG).await;
    assert_eq!(ev.property("kind"), Some("dead_lettered"));
    assert_eq!(ev.property("topic"), Some(t));
    assert_eq!(ev.property("subscription"), Some("s"));
    let body: serde_json::Value = serde_json::from_slice(ev.payload()).unwrap();
    assert_eq!(body["origin_id"], m.id().to_string(), "{body}");
    assert_eq!(body["cause"], "schema validation failed", "{body}");
    events.ack(&ev).await.unwrap();
}
