//! A failure event's payload excerpt is shown only to a role that may read
//! the failed message's topic: a role allowed to read the events topic
//! alone gets the event without it (on its consumer stream and through
//! `GetMessage`), a role with consume on the topic's namespace and the
//! superuser get it whole.

use crate::admin::{as_role, secured};
use crate::common::recv;
use ricochet_client::{Client, InitialPosition, Message};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const TOPIC: &str = "persistent://a/ns/payments";
const EVENTS: &str = "persistent://a/ns/__failure_events";

/// The first event on the events topic, as `client` sees it, and its JSON.
async fn first_event(client: &Client, subscription: &str) -> (Message, serde_json::Value) {
    let mut events = client
        .consumer(EVENTS)
        .subscription(subscription)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let ev = recv(&mut events, T).await;
    let body = serde_json::from_slice(ev.payload()).unwrap();
    events.ack(&ev).await.unwrap();
    (ev, body)
}

#[tokio::test]
async fn the_payload_excerpt_of_an_event_needs_a_grant_on_the_failed_topic() {
    let broker = secured().await;
    let url = broker.url();
    let root = as_role(&url, Some("root")).await;
    let admin = root.admin();
    admin.grant("watcher", EVENTS, &["consume"]).await.unwrap();
    admin.grant("reader", "a/ns", &["consume"]).await.unwrap();

    let producer = root.producer(TOPIC).create().await.unwrap();
    let mut consumer = root
        .consumer(TOPIC)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    producer.send("card 4111-1111").await.unwrap();
    let m = recv(&mut consumer, T).await;
    consumer.terminate(&m, "declined").await.unwrap();

    // The events topic alone: the event, its reason, not the payload.
    let watcher = as_role(&url, Some("watcher")).await;
    let (ev, body) = first_event(&watcher, "w").await;
    assert_eq!(ev.property("kind"), Some("dead_lettered"));
    assert_eq!(body["cause"], "declined", "{body}");
    assert_eq!(body["origin_id"], m.id().to_string(), "{body}");
    assert!(body.get("payload_excerpt").is_none(), "{body}");
    let got = watcher.admin().message(ev.id()).await.unwrap();
    let looked_up: serde_json::Value =
        serde_json::from_slice(&got.message.unwrap().payload).unwrap();
    assert_eq!(looked_up["cause"], "declined", "{looked_up}");
    assert!(looked_up.get("payload_excerpt").is_none(), "{looked_up}");

    // Consume on the namespace (so on the topic too), and the superuser:
    // the excerpt.
    let reader = as_role(&url, Some("reader")).await;
    let (_, body) = first_event(&reader, "r").await;
    assert_eq!(body["payload_excerpt"], "card 4111-1111", "{body}");
    let got = root.admin().message(ev.id()).await.unwrap();
    let looked_up: serde_json::Value =
        serde_json::from_slice(&got.message.unwrap().payload).unwrap();
    assert_eq!(looked_up["payload_excerpt"], "card 4111-1111");
}
