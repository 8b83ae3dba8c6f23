//! Floods beyond the configured limits: topics (broker-wide and per
//! namespace, by every way of creating one, concurrently), subscriptions
//! per topic. Past a limit every attempt is RESOURCE_EXHAUSTED naming the
//! setting, nothing more is created, and the broker keeps serving.

use super::common::*;
use super::support::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use tonic::Code;

/// Topics: per namespace, then broker-wide, by admin, producer and
/// consumer; a concurrent flood creates exactly up to the limit; tiers do
/// not count (a message can still be dead-lettered at the limit).
#[tokio::test]
async fn topics_beyond_the_limits() {
    let b = InProcessBroker::start_with(|c| {
        c.max_topics_per_namespace = 20;
        c.max_topics = 30;
    })
    .await;
    let url = b.url();
    let mut admin = AdminClient::new(channel(&url).await);
    // The canary topic the checks publish to takes one place in the
    // namespace; a concurrent flood of 200 creations takes the rest.
    assert_serving(&url).await;
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..200 {
        let mut admin = admin.clone();
        flood.spawn(async move {
            admin
                .create_topic(TopicRequest {
                    topic: format!("flood-{i}"),
                })
                .await
                .map_err(|e| e.code())
        });
    }
    let mut codes = std::collections::HashMap::new();
    while let Some(r) = flood.join_next().await {
        *codes.entry(r.unwrap().err()).or_insert(0) += 1;
    }
    assert_eq!(codes.get(&None), Some(&19), "{codes:?}");
    assert_eq!(
        codes.get(&Some(Code::ResourceExhausted)),
        Some(&181),
        "{codes:?}"
    );
    let full = |e: &tonic::Status, setting: &str| {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        assert!(e.message().contains(setting), "{e}");
    };
    unchanged(&url, "a full namespace", async {
        let e = admin
            .create_topic(TopicRequest {
                topic: "one-more".into(),
            })
            .await
            .unwrap_err();
        full(&e, "max_topics_per_namespace");
        let e = RawProducer::open(&url, "one-more", "p").await.unwrap_err();
        full(&e, "max_topics_per_namespace");
        let e = RawConsumer::subscribe(&url, "one-more", "s", SubOpts::default())
            .await
            .unwrap_err();
        full(&e, "max_topics_per_namespace");
    })
    .await;
    // Dead letters still move at the limit: tier topics do not count.
    let flooded = snapshot(&channel(&url).await).await;
    let one = flooded
        .topics()
        .into_iter()
        .find(|t| t.contains("/flood-"))
        .expect("a flood topic")
        .to_owned();
    let mut c = RawConsumer::simple(&url, &one, "s", SubscriptionType::Shared).await;
    c.flow(1).await;
    let mut p = RawProducer::open(&url, &one, "p").await.unwrap();
    p.send(&["poison"]).await;
    let m = c.next(WAIT).await.unwrap();
    c.terminate(m.id.unwrap(), "poison", 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    // Other namespaces fill the rest of the broker-wide limit.
    for i in 0..10 {
        admin
            .create_topic(TopicRequest {
                topic: format!("t{i}/ns/x"),
            })
            .await
            .unwrap();
    }
    unchanged(&url, "a full broker", async {
        let e = admin
            .create_topic(TopicRequest {
                topic: "elsewhere/ns/x".into(),
            })
            .await
            .unwrap_err();
        full(&e, "(max_topics in");
    })
    .await;
    // Deleting one makes room for one.
    admin
        .delete_topic(DeleteTopicRequest {
            topic: "t0/ns/x".into(),
            force: false,
        })
        .await
        .unwrap();
    admin
        .create_topic(TopicRequest {
            topic: "elsewhere/ns/x".into(),
        })
        .await
        .unwrap();
}

/// Subscriptions on one topic beyond `max_subscriptions_per_topic`.
#[tokio::test]
async fn subscriptions_beyond_the_limit() {
    let b = InProcessBroker::start_with(|c| c.max_subscriptions_per_topic = 5).await;
    let url = b.url();
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(
            RawConsumer::simple(&url, "subs", &format!("s{i}"), SubscriptionType::Shared).await,
        );
    }
    unchanged(&url, "a full topic", async {
        for i in 5..50 {
            let e = RawConsumer::subscribe(&url, "subs", &format!("s{i}"), SubOpts::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            assert!(e.message().contains("max_subscriptions_per_topic"), "{e}");
        }
    })
    .await;
    // An existing subscription still takes more consumers.
    let more = RawConsumer::simple(&url, "subs", "s0", SubscriptionType::Shared).await;
    drop((held, more));
}
