//! Listing dead letters page by page (issue #10, item 10): `total` is the
//! number of dead letters matching the filter, on every page, not the
//! number left after the paging cursor.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;

#[tokio::test]
async fn total_counts_every_match_on_every_page() {
    let b = InProcessBroker::start().await;
    let topic = "persistent://public/default/paged";
    let mut c = RawConsumer::simple(&b.url(), topic, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), topic, "p").await.unwrap();
    p.send(&["a", "b", "c", "d", "e"]).await;
    let got = c.take(5, WAIT).await;
    for (i, m) in got.iter().enumerate() {
        let why = if i % 2 == 0 { "even" } else { "odd" };
        c.terminate(m.id.clone().unwrap(), why, i as u64 + 1).await;
        assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    }
    let admin = AdminClient::new(channel(&b.url()).await);
    let list = |after: Option<u64>, reason: &str| {
        let req = ListDeadLettersRequest {
            topic: topic.into(),
            subscription: "s".into(),
            limit: 2,
            after_entry_id: after,
            filter: (!reason.is_empty()).then(|| DeadLetterFilter {
                reason_contains: reason.into(),
                ..Default::default()
            }),
        };
        let mut admin = admin.clone();
        async move { admin.list_dead_letters(req).await.unwrap().into_inner() }
    };
    let first = list(None, "").await;
    assert_eq!((first.dead_letters.len(), first.total), (2, 5));
    let last_id = |r: &ListDeadLettersResponse| {
        r.dead_letters
            .last()
            .unwrap()
            .message
            .as_ref()
            .unwrap()
            .id
            .as_ref()
            .unwrap()
            .entry_id
    };
    let second = list(Some(last_id(&first)), "").await;
    assert_eq!((second.dead_letters.len(), second.total), (2, 5));
    let third = list(Some(last_id(&second)), "").await;
    assert_eq!((third.dead_letters.len(), third.total), (1, 5));
    // With a filter, the total is that of the filter.
    let even = list(None, "even").await;
    assert_eq!((even.dead_letters.len(), even.total), (2, 3));
    let even2 = list(Some(last_id(&even)), "even").await;
    assert_eq!((even2.dead_letters.len(), even2.total), (1, 3));
}
