//! Deleting topics and subscriptions (issue #10, item 6): dead letters are
//! only ever removed by an explicit purge or a forced delete, a tier topic
//! cannot be deleted behind its subscription's back, `force` disconnects
//! clients as the proto says, and stats and lists agree afterwards.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use tonic::Code;

const TOPIC: &str = "persistent://public/default/del";
const DLQ: &str = "persistent://public/default/del-s-DLQ";
const RETRY: &str = "persistent://public/default/del-s-RETRY";

async fn admin(b: &InProcessBroker) -> AdminClient<tonic::transport::Channel> {
    AdminClient::new(channel(&b.url()).await)
}

async fn delete_topic(b: &InProcessBroker, topic: &str, force: bool) -> Result<(), tonic::Status> {
    admin(b)
        .await
        .delete_topic(DeleteTopicRequest {
            topic: topic.into(),
            force,
        })
        .await
        .map(drop)
}

async fn delete_sub(b: &InProcessBroker, force: bool) -> Result<(), tonic::Status> {
    admin(b)
        .await
        .delete_subscription(DeleteSubscriptionRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            force,
        })
        .await
        .map(drop)
}

async fn topics(b: &InProcessBroker) -> Vec<String> {
    admin(b)
        .await
        .list_topics(ListTopicsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .topics
}

async fn dead_letter_count(b: &InProcessBroker) -> Result<(usize, u64), tonic::Status> {
    let listed = admin(b)
        .await
        .list_dead_letters(ListDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            limit: 100,
            ..Default::default()
        })
        .await?
        .into_inner();
    let stats = admin(b)
        .await
        .subscription_stats(SubscriptionRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
        })
        .await?
        .into_inner();
    assert_eq!(listed.total, stats.dead_lettered, "list and stats agree");
    Ok((listed.dead_letters.len(), stats.dead_lettered))
}

/// Whether the consumer's stream ends within a second (a live stream would
/// only time out after `WAIT`).
async fn stream_ends(c: &mut RawConsumer) -> bool {
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(1), c.next(WAIT)).await,
        Ok(None)
    )
}

/// A subscription `s` on TOPIC holding one dead letter and one scheduled
/// retry, with its consumer gone.
async fn holding_tiers(b: &InProcessBroker) {
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["dead", "later"]).await;
    let got = c.take(2, WAIT).await;
    c.terminate(got[0].id.clone().unwrap(), "poison", 1).await;
    c.reconsume_later(
        got[1].id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(3_600_000),
        2,
    )
    .await;
    for _ in 0..2 {
        assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    }
    drop(c);
    tokio::time::sleep(QUIET).await;
    assert_eq!(dead_letter_count(b).await.unwrap(), (1, 1));
}

#[tokio::test]
async fn a_tier_topic_cannot_be_deleted_behind_its_subscription() {
    let b = InProcessBroker::start().await;
    holding_tiers(&b).await;
    for tier in [DLQ, RETRY] {
        for force in [false, true] {
            let err = delete_topic(&b, tier, force).await.expect_err("refused");
            assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
            assert!(err.message().contains("tier of subscription s"), "{err}");
        }
    }
    // Nothing changed: the dead letter is listed and counted.
    assert_eq!(dead_letter_count(&b).await.unwrap(), (1, 1));
    let t = topics(&b).await;
    assert!(
        t.contains(&DLQ.to_owned()) && t.contains(&RETRY.to_owned()),
        "{t:?}"
    );
}

#[tokio::test]
async fn deletes_without_force_refuse_what_holds_data() {
    let b = InProcessBroker::start().await;
    holding_tiers(&b).await;
    let err = delete_topic(&b, TOPIC, false)
        .await
        .expect_err("a topic with a subscription");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let err = delete_sub(&b, false)
        .await
        .expect_err("a subscription with a dead letter");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("1 dead letter"), "{err}");
    assert_eq!(dead_letter_count(&b).await.unwrap(), (1, 1));

    // Purged, it still holds a scheduled retry.
    admin(&b)
        .await
        .purge_dead_letters(PurgeDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            filter: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let err = delete_sub(&b, false)
        .await
        .expect_err("a subscription with a scheduled retry");
    assert!(err.message().contains("scheduled retr"), "{err}");
}

#[tokio::test]
async fn a_forced_subscription_delete_takes_its_tiers_and_disconnects_consumers() {
    let b = InProcessBroker::start().await;
    holding_tiers(&b).await;
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    delete_sub(&b, true).await.unwrap();
    // The consumer's stream ends (at once, not after the wait runs out).
    assert!(stream_ends(&mut c).await);
    let err = dead_letter_count(&b).await.expect_err("gone");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let t = topics(&b).await;
    assert_eq!(t, vec![TOPIC.to_owned()], "the tiers went with it");
}

#[tokio::test]
async fn a_forced_topic_delete_disconnects_clients_and_survives_a_restart() {
    let b = InProcessBroker::start().await;
    holding_tiers(&b).await;
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p2").await.unwrap();
    delete_topic(&b, TOPIC, true).await.unwrap();
    assert!(stream_ends(&mut c).await, "the consumer is disconnected");
    let after = p.msg("after");
    match p.send_batch(vec![after]).await {
        produce_response::Response::Error(e) => {
            assert_eq!(e.code, Code::NotFound as i32, "{e:?}")
        }
        other => panic!("a publish to a deleted topic: {other:?}"),
    }
    assert!(topics(&b).await.is_empty());
    let dir = b.shutdown().await;
    let b = InProcessBroker::start_in(dir, |_| {}).await;
    assert!(topics(&b).await.is_empty(), "still gone after a restart");
}
