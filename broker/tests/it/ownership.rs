//! Only the consumer a message was delivered to may settle it (issue #10,
//! item 7): another consumer's ack, nack, `reconsume_later` or terminate of
//! it is refused with FAILED_PRECONDITION and changes nothing; the owner's
//! own settlement then works as if nothing had happened.

use crate::common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;

const TOPIC: &str = "persistent://public/default/owned";

async fn stats(b: &InProcessBroker) -> SubscriptionStatsResponse {
    sub_stats(&b.url(), TOPIC, "s").await
}

#[tokio::test]
async fn another_consumer_cannot_settle_a_message_it_was_not_given() {
    let b = InProcessBroker::start().await;
    let mut owner = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    let mut other = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    owner.flow(1).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["mine"]).await;
    let m = owner.next(WAIT).await.expect("delivered to the owner");
    let id = m.id.clone().unwrap();
    let before = stats(&b).await;
    assert_eq!(before.unacked, 1);

    // Every way of settling it from the other consumer is refused.
    other.ack(vec![id.clone()], 1).await;
    other.nack(id.clone(), "not yours", 2).await;
    other
        .reconsume_later(id.clone(), reconsume_later::Delay::DelayMs(1_000), 3)
        .await;
    other.terminate(id.clone(), "not yours either", 4).await;
    for request_id in 1..=4 {
        let r = other.result(WAIT).await.expect("an answer");
        assert_eq!(r.request_id, request_id);
        assert_eq!(r.code, tonic::Code::FailedPrecondition as i32, "{r:?}");
        assert!(
            r.message.contains("only the consumer it was delivered to"),
            "{r:?}"
        );
    }
    // Nothing changed: still in flight with the owner, no attempt counted,
    // nothing moved to a tier.
    let after = stats(&b).await;
    assert_eq!(after.unacked, 1);
    assert_eq!((after.scheduled_retries, after.dead_lettered), (0, 0));
    let owner_stats = after.consumers.iter().find(|c| c.unacked == 1);
    assert!(owner_stats.is_some(), "{after:?}");

    // The owner's ack is the one that counts.
    owner.ack(vec![id.clone()], 5).await;
    let r = owner.result(WAIT).await.unwrap();
    assert_eq!((r.request_id, r.code), (5, 0), "{r:?}");
    assert_eq!(stats(&b).await.backlog, 0);
    assert!(owner.next(QUIET).await.is_none());
    assert!(other.next(QUIET).await.is_none());

    // Acking it again (by anyone) changes nothing and is not an error.
    other.ack(vec![id], 6).await;
    assert_eq!(other.result(WAIT).await.unwrap().code, 0);
}

#[tokio::test]
async fn a_redelivered_message_belongs_to_its_new_consumer() {
    let b = InProcessBroker::start().await;
    let mut first = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    first.flow(1).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["m"]).await;
    let m = first.next(WAIT).await.unwrap();
    let id = m.id.clone().unwrap();
    // The first consumer gives it back (no policy: redelivered at once)...
    let mut second = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    first.nack(id.clone(), "later", 1).await;
    assert_eq!(first.result(WAIT).await.unwrap().code, 0);
    second.flow(1).await;
    let again = second.next(WAIT).await.expect("redelivered to the second");
    assert_eq!(again.delivery_count, 1);
    // ...so its late ack of the earlier delivery is refused.
    first.ack(vec![id.clone()], 2).await;
    let r = first.result(WAIT).await.unwrap();
    assert_eq!(r.code, tonic::Code::FailedPrecondition as i32, "{r:?}");
    second.ack(vec![id], 3).await;
    assert_eq!(second.result(WAIT).await.unwrap().code, 0);
    assert_eq!(stats(&b).await.backlog, 0);
}
