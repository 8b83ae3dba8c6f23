//! Partitioned topics on the broker, through raw gRPC: creating one makes
//! its partitions as ordinary topics and stores the count durably (it
//! survives a restart); the count can be raised, never lowered; the base
//! name refuses producers and consumers with a clear message; stats, lists,
//! policies and deletes on the base name cover every partition.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::partitions_client::PartitionsClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::time::Duration;
use tonic::Code;

const T: &str = "persistent://acme/eu/orders";

async fn admin(url: &str) -> AdminClient<tonic::transport::Channel> {
    AdminClient::new(channel(url).await)
}

async fn parts(url: &str) -> PartitionsClient<tonic::transport::Channel> {
    PartitionsClient::new(channel(url).await)
}

async fn create(
    url: &str,
    topic: &str,
    partitions: u32,
) -> Result<PartitionedTopicMetadata, tonic::Status> {
    parts(url)
        .await
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: topic.into(),
            partitions,
            replicas: 0,
        })
        .await
        .map(|r| r.into_inner())
}

async fn count(url: &str, topic: &str) -> u32 {
    parts(url)
        .await
        .get_partitions(PartitionsRequest {
            topic: topic.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .partitions
}

async fn update(url: &str, topic: &str, partitions: u32) -> Result<u32, tonic::Status> {
    parts(url)
        .await
        .update_partitions(UpdatePartitionsRequest {
            topic: topic.into(),
            partitions,
            replicas: 0,
        })
        .await
        .map(|r| r.into_inner().partitions)
}

#[tokio::test]
async fn create_raise_never_lower_and_survive_a_restart() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    let info = create(&url, "acme/eu/orders", 4).await.unwrap();
    assert_eq!((info.topic.as_str(), info.partitions), (T, 4));
    assert_eq!(count(&url, T).await, 4);
    assert_eq!(count(&url, "acme/eu/other").await, 0);
    let listed = admin(&url)
        .await
        .list_topics(ListTopicsRequest {
            namespace: "acme/eu".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let want: Vec<String> = (0..4).map(|i| format!("{T}-partition-{i}")).collect();
    assert_eq!(listed.topics, want);
    assert_eq!(listed.partitioned.len(), 1);
    assert_eq!(listed.partitioned[0].partitions, 4);

    // Twice, or over an ordinary topic: already exists.
    assert_eq!(
        create(&url, T, 2).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    let plain = |topic: &str| CreateTopicRequest {
        topic: topic.into(),
        replicas: 0,
    };
    let e = admin(&url).await.create_topic(plain(T)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    admin(&url)
        .await
        .create_topic(plain("plain"))
        .await
        .unwrap();
    assert_eq!(
        create(&url, "plain", 3).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    // Bad counts and names.
    for n in [0, 5000] {
        let e = create(&url, "bad-count", n).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    let e = create(&url, "x-partition-1", 2).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Lowering is refused and changes nothing; the same count is a no-op.
    let e = update(&url, T, 2).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("cannot lower"), "{}", e.message());
    assert_eq!(update(&url, T, 4).await.unwrap(), 4);
    assert_eq!(
        update(&url, "nope", 4).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(update(&url, T, 6).await.unwrap(), 6);
    assert_eq!(count(&url, T).await, 6);

    let dir = b.shutdown().await;
    let b = InProcessBroker::start_in(dir, |_| {}).await;
    let url = b.url();
    assert_eq!(count(&url, T).await, 6, "the count is durable");
    let e = update(&url, T, 5).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn the_base_name_refuses_producers_and_consumers() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    create(&url, T, 3).await.unwrap();
    let e = RawProducer::open(&url, T, "p").await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("partitioned topic (3 partitions)"),
        "{}",
        e.message()
    );
    assert!(
        e.message().contains(&format!("{T}-partition-0")),
        "{}",
        e.message()
    );
    // A partition takes producers like any topic.
    let mut p = RawProducer::open(&url, &format!("{T}-partition-2"), "p")
        .await
        .unwrap();
    let ids = p.send(&["a", "b"]).await;
    assert_eq!(ids[0].topic, format!("{T}-partition-2"));
    let e = RawConsumer::subscribe(&url, T, "s", SubOpts::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

#[tokio::test]
async fn stats_policies_and_delete_cover_every_partition() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    create(&url, T, 3).await.unwrap();
    for i in 0..3u32 {
        let topic = format!("{T}-partition-{i}");
        let mut p = RawProducer::open(&url, &topic, "p").await.unwrap();
        let payloads: Vec<String> = (0..=i).map(|n| format!("m{n}")).collect();
        let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
        p.send(&refs).await;
        let _c = RawConsumer::simple(&url, &topic, "billing", SubscriptionType::Shared).await;
    }
    let mut a = admin(&url).await;
    let stats = a
        .topic_stats(TopicRequest { topic: T.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.partition_count, 3);
    assert_eq!(stats.message_count, 1 + 2 + 3);
    assert_eq!(stats.messages_in, 6);
    assert_eq!(stats.partitions.len(), 3);
    assert_eq!(stats.partitions[2].message_count, 3);
    assert_eq!(stats.subscriptions.len(), 1);
    assert_eq!(stats.subscriptions[0].subscription, "billing");
    assert_eq!(stats.subscriptions[0].backlog, 6);
    let subs = a
        .list_subscriptions(TopicRequest { topic: T.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(subs.subscriptions, vec!["billing".to_string()]);

    // A policy set on the partitioned name reaches every partition.
    let policy = DeadLetterPolicyConfig::from(&ricochet_policy::PolicySpec::fixed_backoff(
        Duration::from_secs(1),
        3,
    ));
    a.set_policy(SetPolicyRequest {
        topic: T.into(),
        subscription: "billing".into(),
        policy: Some(policy),
    })
    .await
    .unwrap();
    for i in 0..3 {
        let got = a
            .get_policy(SubscriptionRequest {
                topic: format!("{T}-partition-{i}"),
                subscription: "billing".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.source, "admin", "partition {i}");
    }
    // Partitions added later get the subscriptions (and the operator's
    // policy), from the earliest entry.
    update(&url, T, 4).await.unwrap();
    let got = a
        .get_policy(SubscriptionRequest {
            topic: format!("{T}-partition-3"),
            subscription: "billing".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.source, "admin");

    // Without force a subscription refuses the delete; with it, every
    // partition goes with the count.
    let del = |force| DeleteTopicRequest {
        topic: T.into(),
        force,
    };
    let e = a.delete_topic(del(false)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(count(&url, T).await, 4);
    a.delete_topic(del(true)).await.unwrap();
    assert_eq!(count(&url, T).await, 0);
    let listed = a
        .list_topics(ListTopicsRequest {
            namespace: "acme/eu".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.topics.is_empty() && listed.partitioned.is_empty(),
        "{listed:?}"
    );
}
