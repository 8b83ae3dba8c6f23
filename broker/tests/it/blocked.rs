//! A consumer that holds `max_unacked_per_consumer` unacked messages is sent
//! nothing more until it acks. That must be visible, not look like an idle
//! subscription (issue #12, item 3): subscription stats flag it, and the flag
//! clears once it acks.

use crate::common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;

const TOPIC: &str = "persistent://public/default/capped";
const CAP: usize = 3;

async fn consumer_stats(b: &InProcessBroker) -> Vec<ConsumerStats> {
    sub_stats(&b.url(), TOPIC, "s").await.consumers
}

#[tokio::test]
async fn a_consumer_at_the_unacked_cap_is_flagged_until_it_acks() {
    let b = InProcessBroker::start_with(|c| c.max_unacked_per_consumer = CAP).await;
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(100).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["a", "b", "c", "d", "e"]).await;

    let mut held = Vec::new();
    for _ in 0..CAP {
        held.push(c.next(WAIT).await.expect("delivered").id.unwrap());
    }
    // Permits remain, messages wait, yet nothing more comes: the cap.
    assert!(c.next(QUIET).await.is_none());
    let s = consumer_stats(&b).await;
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].unacked, CAP as u64);
    assert!(s[0].permits > 0, "{s:?}");
    assert!(s[0].blocked_on_unacked, "{s:?}");

    // One ack makes room: the consumer is unblocked and the next arrives.
    c.ack(vec![held.remove(0)], 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let next = c.next(WAIT).await.expect("the fourth message after an ack");
    assert_eq!(next.payload, b"d");
    // At the cap again with the fourth one; ack everything to leave it.
    assert!(consumer_stats(&b).await[0].blocked_on_unacked);
    held.push(next.id.unwrap());
    c.ack(held, 2).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let last = c.next(WAIT).await.expect("the fifth message");
    assert_eq!(last.payload, b"e");
    let s = consumer_stats(&b).await;
    assert_eq!(s[0].unacked, 1);
    assert!(!s[0].blocked_on_unacked, "{s:?}");
}
