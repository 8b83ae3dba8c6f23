//! Held nacks due beyond the retry window stay out of memory
//! (`docs/src/parked-retries.md`): a subscription keeps the counts and hold
//! ends of those ending within about a window, and only the ids of the
//! rest, loading them from the schedule as they come into the window. Seen
//! from outside nothing changes: a hold crossing into the window while the
//! broker runs, or across a restart, comes back at its due time, never
//! before, with its stored delivery count, and an operator's status of a
//! far one reads its count from the store.

use crate::common::*;
use ricochet_broker::VerifyOnStart;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::{InProcessBroker, now_ms};
use std::time::Duration;

/// A short window, so holds of a few seconds are beyond it.
const WINDOW: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(30);

fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

/// Waits for the results of `ids`, each a success.
async fn confirmed(c: &mut RawConsumer, mut ids: Vec<u64>) {
    while !ids.is_empty() {
        let r = c.result(WAIT).await.expect("a command result");
        assert_eq!(r.code, 0, "{r:?}");
        ids.retain(|i| *i != r.request_id);
    }
}

/// Subscription `s`'s state and delivery count of entry `id` of `topic`.
async fn status(url: &str, topic: &str, id: u64) -> (String, u32) {
    let m = AdminClient::new(channel(url).await)
        .get_message(GetMessageRequest {
            id: Some(MessageId {
                topic: topic.into(),
                entry_id: id,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let s = m
        .subscriptions
        .into_iter()
        .find(|s| s.subscription == "s")
        .expect("subscription s");
    (s.state, s.delivery_count)
}

fn text(m: &Message) -> String {
    String::from_utf8(m.payload.clone()).unwrap()
}

/// The next message, which must come back no earlier than `due_ms`.
async fn back_at(c: &mut RawConsumer, due_ms: u64, what: &str) -> Message {
    let m = c.next(WAIT).await.unwrap_or_else(|| panic!("{what} back"));
    let at = now_ms();
    assert!(at >= due_ms, "{what} came back {} ms early", due_ms - at);
    assert_eq!(text(&m), what);
    m
}

#[tokio::test]
async fn a_hold_beyond_the_window_comes_into_it_while_the_broker_runs() {
    let t = topic("held-window-running");
    let b = InProcessBroker::start_with(|c| c.retry_window = WINDOW).await;
    let mut c = RawConsumer::simple(&b.url(), &t, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), &t, "p").await.unwrap();
    p.send(&["near", "far"]).await;
    let got = c.take(2, WAIT).await;
    let id = |i: usize| got[i].id.clone().unwrap();
    let asked = now_ms();
    c.nack_after(id(0), "inside the window", 1_000, 1).await;
    c.nack_after(id(1), "beyond the window", 6_000, 2).await;
    confirmed(&mut c, vec![1, 2]).await;
    // The far one's count is in the store only; the status reads it there.
    assert_eq!(
        status(&b.url(), &t, id(1).entry_id).await,
        ("scheduled".to_owned(), 1)
    );

    let near = back_at(&mut c, asked + 1_000, "near").await;
    assert_eq!(near.delivery_count, 1);
    c.ack(vec![near.id.clone().unwrap()], 3).await;
    // The far hold crossed into the window while the broker ran: back at
    // its due time with its count.
    let far = back_at(&mut c, asked + 6_000, "far").await;
    assert_eq!(far.delivery_count, 1);
    // It fails again: the count goes on from the stored one.
    let again = now_ms();
    c.nack_after(far.id.clone().unwrap(), "again", 300, 4).await;
    let far = back_at(&mut c, again + 300, "far").await;
    assert_eq!(far.delivery_count, 2, "a delivery count never goes back");
    // And once more beyond the window: held, not dispatched early.
    let last = now_ms();
    c.nack_after(far.id.clone().unwrap(), "far again", 4_000, 5)
        .await;
    confirmed(&mut c, vec![5]).await;
    assert_eq!(
        status(&b.url(), &t, id(1).entry_id).await,
        ("scheduled".to_owned(), 3)
    );
    let far = back_at(&mut c, last + 4_000, "far").await;
    assert_eq!(far.delivery_count, 3);
    c.ack(vec![far.id.clone().unwrap()], 6).await;
    assert!(c.next(Duration::from_millis(500)).await.is_none());
}

// The start gathers the holds beyond the window as ids only on each of its
// paths: the counted inventory's scan (verifying in the background), the
// verify pass (before serving), the first subscription's start (off).

#[tokio::test]
async fn a_restart_keeps_holds_inside_and_beyond_the_window() {
    restart_keeps_holds("held-window-restart", VerifyOnStart::Background).await;
}

#[tokio::test]
async fn a_restart_verifying_before_serving_keeps_holds_inside_and_beyond_the_window() {
    restart_keeps_holds("held-window-restart-before", VerifyOnStart::Before).await;
}

#[tokio::test]
async fn a_restart_not_verifying_keeps_holds_inside_and_beyond_the_window() {
    restart_keeps_holds("held-window-restart-off", VerifyOnStart::Off).await;
}

async fn restart_keeps_holds(name: &str, mode: VerifyOnStart) {
    let t = topic(name);
    let b = InProcessBroker::start_with(|c| c.retry_window = WINDOW).await;
    let mut c = RawConsumer::simple(&b.url(), &t, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), &t, "p").await.unwrap();
    p.send(&["inside", "beyond", "twice"]).await;
    let got = c.take(3, WAIT).await;
    let id = |i: usize| got[i].id.clone().unwrap();
    // "twice" fails once briefly, then is held beyond the window at count 2.
    c.nack_after(id(2), "first", 100, 1).await;
    let twice = c.next(WAIT).await.expect("twice back");
    assert_eq!((text(&twice).as_str(), twice.delivery_count), ("twice", 1));
    let asked = now_ms();
    c.nack_after(id(0), "inside", 3_000, 2).await;
    c.nack_after(id(1), "beyond", 8_000, 3).await;
    c.nack_after(id(2), "second", 9_000, 4).await;
    confirmed(&mut c, vec![1, 2, 3, 4]).await;
    drop(c);

    // Restarted within a second or so: "inside" ends within the new
    // window (and a quarter), the other two beyond it.
    let dir = b.shutdown().await;
    let b = InProcessBroker::start_in(dir, |c| {
        c.retry_window = WINDOW;
        c.verify_on_start = mode;
    })
    .await;
    let mut c = RawConsumer::simple(&b.url(), &t, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    assert_eq!(
        status(&b.url(), &t, id(1).entry_id).await,
        ("scheduled".to_owned(), 1)
    );
    assert_eq!(
        status(&b.url(), &t, id(2).entry_id).await,
        ("scheduled".to_owned(), 2)
    );
    let inside = back_at(&mut c, asked + 3_000, "inside").await;
    assert_eq!(inside.delivery_count, 1);
    let beyond = back_at(&mut c, asked + 8_000, "beyond").await;
    assert_eq!(beyond.delivery_count, 1);
    let twice = back_at(&mut c, asked + 9_000, "twice").await;
    assert_eq!(twice.delivery_count, 2, "a delivery count never goes back");
    let ids = [inside, beyond, twice].map(|m| m.id.unwrap()).to_vec();
    c.ack(ids, 5).await;
    assert!(c.next(Duration::from_millis(500)).await.is_none());
}
