//! A burst of held nacks staged for its due instant (the subscription's
//! staging, see `subscription/stage.rs`), on virtual time with the harness
//! of [`super::actor_tests`]: staged a few milliseconds ahead, sent when the
//! entries fire and never before; an ack, a consumer leaving or permits
//! taken in between win; nothing is written, so
//! a restart in between loses nothing.

use super::actor_tests::{Harness, TestConsumer, harness, harness_on, receive, text};
use crate::clock::Clock;
use crate::storage::TierEntry;
use crate::storage::prelude::*;
use crate::subscription::ConsumerRequest;
use ricochet_proto::{Message, SubscriptionType};
use std::time::Duration;

/// Messages staged for their due instant now.
async fn staged(h: &Harness, c: &TestConsumer) -> u64 {
    c.handle
        .stats(h.storage.clone())
        .await
        .unwrap()
        .staged_for_due
}

/// Nacks `msgs` held for 1 s; their due time in µs (virtual time does not
/// move while the request is handled) and ms (as stored, rounded up).
async fn nack_for_a_second(h: &Harness, c: &mut TestConsumer, msgs: &[Message]) -> (u64, u64) {
    let due_us = h.clock.now_us() + 1_000_000;
    let rid = c.nack_all_held(msgs, Duration::from_secs(1));
    assert!(c.done(rid).await.is_ok());
    let stored = h
        .storage
        .failure(TierEntry::main(0).of(c.handle.id()), None)
        .unwrap()
        .expect("a held nack's record")
        .hold_until_ms;
    assert_eq!(stored, due_us.div_ceil(1000));
    (due_us, stored)
}

/// Waits until 2 ms before `due_ms` (past the staging lead), asserting
/// nothing arrives.
async fn wait_to_just_before(h: &Harness, c: &mut TestConsumer, due_ms: u64) {
    let wait = due_ms - 2 - h.clock.now_ms();
    assert!(
        c.messages_within(Duration::from_millis(wait))
            .await
            .is_none(),
        "out before its due time"
    );
}

/// `n` messages to the only consumer of a Shared subscription, all nacked
/// for a second and staged by 2 ms before their due time (nothing out
/// before it): the consumer and the due time (µs).
async fn staged_burst(h: &Harness, n: usize) -> (TestConsumer, u64) {
    let (mut c, first) = h.shared_burst(n, 2 * n as u32).await;
    let (due_us, due_ms) = nack_for_a_second(h, &mut c, &first).await;
    wait_to_just_before(h, &mut c, due_ms).await;
    assert_eq!(staged(h, &c).await, n as u64, "staged before its due time");
    (c, due_us)
}

fn entry_ids(msgs: &[Message]) -> Vec<u64> {
    msgs.iter()
        .map(|m| m.id.as_ref().unwrap().entry_id)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_staged_burst_goes_out_when_it_fires_never_before() {
    const N: usize = 300;
    let h = harness().await;
    let (mut c, due_us) = staged_burst(&h, N).await;
    let reads = h.storage.entries_read_by_id();
    let mut got = Vec::new();
    while got.len() < N {
        let msgs = c.messages().await;
        let now = h.clock.now_us();
        assert!(now >= due_us, "out at {now} µs, due at {due_us}");
        got.extend(msgs);
    }
    // Dispatch's order and counts, no read at the fire.
    assert_eq!(entry_ids(&got), (0..N as u64).collect::<Vec<_>>());
    assert!(got.iter().all(|m| m.delivery_count == 1));
    assert_eq!(text(&got[7]), "m7");
    assert_eq!(h.storage.entries_read_by_id(), reads);
    let stats = c.handle.stats(h.storage.clone()).await.unwrap();
    assert_eq!((stats.staged_for_due, stats.unacked), (0, N as u64));
    assert_eq!(stats.consumers[0].unacked, N as u64);
}

/// A cumulative ack that lands between staging and the instant wins: the
/// messages it acks are not sent, the others are (Exclusive: staged for the
/// active consumer). A held nack cannot be moved to the dead-letter tier
/// while it waits (a terminate needs the message in flight), so the ack is
/// the way a staged message leaves.
#[tokio::test(start_paused = true)]
async fn an_ack_after_staging_wins() {
    const N: usize = 10;
    let h = harness().await;
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    h.publish(&payloads.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let mut c = h.consumer(SubscriptionType::Exclusive, None).await;
    let first = receive(&mut c, N).await;
    // All but entry 4 held; 4 stays in flight for the cumulative ack.
    let nacked: Vec<Message> = first.iter().filter(|m| text(m) != "m4").cloned().collect();
    let (due_us, due_ms) = nack_for_a_second(&h, &mut c, &nacked).await;
    wait_to_just_before(&h, &mut c, due_ms).await;
    assert_eq!(staged(&h, &c).await, N as u64 - 1);
    // Entries 0..=4 acked while 0..=3 are staged.
    let ack = c.ack_through(&first[4]);
    let outcome = c.done(ack).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    let got = tokio::time::timeout(Duration::from_secs(10), receive(&mut c, 5))
        .await
        .expect("the rest of the burst goes out");
    assert!(h.clock.now_us() >= due_us);
    assert_eq!(entry_ids(&got), vec![5, 6, 7, 8, 9]);
    assert!(
        c.messages_within(Duration::from_secs(5)).await.is_none(),
        "an acked message went out"
    );
}

/// Staged for a consumer that leaves before the instant (another one
/// joined): the burst goes to the one still there.
#[tokio::test(start_paused = true)]
async fn a_consumer_leaving_after_staging_gets_nothing() {
    const N: usize = 10;
    let h = harness().await;
    let (c1, due_us) = staged_burst(&h, N).await;
    let mut c2 = h.consumer(SubscriptionType::Shared, None).await;
    c1.handle.request(c1.id(), ConsumerRequest::Close).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), receive(&mut c2, N))
        .await
        .expect("the burst goes to the consumer still there");
    assert!(h.clock.now_us() >= due_us);
    assert_eq!(entry_ids(&got), (0..N as u64).collect::<Vec<_>>());
}

/// Staged for the only consumer of a Shared subscription; a second one
/// joins before the instant: the burst is shared round-robin between the
/// two, as dispatch shares it, not sent to the first alone.
#[tokio::test(start_paused = true)]
async fn a_consumer_joining_after_staging_shares_the_burst() {
    const N: usize = 10;
    let h = harness().await;
    let (mut c1, due_us) = staged_burst(&h, N).await;
    let mut c2 = h.consumer(SubscriptionType::Shared, None).await;
    let wait = Duration::from_secs(10);
    let one = c1.messages_within(wait).await.expect("some for the first");
    let two = c2.messages_within(wait).await.expect("some for the second");
    assert!(h.clock.now_us() >= due_us);
    assert_eq!((one.len(), two.len()), (N / 2, N / 2));
}

/// Permits taken between staging and the instant (new messages went out
/// meanwhile) are respected: as many of the burst go out as permits are
/// left, in order, and the rest once permits come.
#[tokio::test(start_paused = true)]
async fn permits_taken_after_staging_are_respected() {
    // The harness's consumer starts with 100 permits; 90 go to the first
    // delivery, 10 are left: room for the 10 nacked.
    const N: usize = 10;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(90, 0).await;
    let (due_us, due_ms) = nack_for_a_second(&h, &mut c, &first[..N]).await;
    wait_to_just_before(&h, &mut c, due_ms).await;
    assert_eq!(staged(&h, &c).await, N as u64);
    h.publish(&["n0", "n1", "n2", "n3"]).await;
    let fresh = receive(&mut c, 4).await;
    assert!(h.clock.now_us() < due_us);
    assert_eq!(entry_ids(&fresh), vec![90, 91, 92, 93]);
    let got = c.messages().await;
    assert!(h.clock.now_us() >= due_us);
    assert_eq!(entry_ids(&got), (0..6).collect::<Vec<_>>());
    assert!(
        c.messages_within(Duration::from_secs(1)).await.is_none(),
        "more out than permits"
    );
    c.flow(4);
    assert_eq!(entry_ids(&receive(&mut c, 4).await), vec![6, 7, 8, 9]);
}

/// Staging writes nothing: the schedule and the failure records are as the
/// nacks left them, and a broker restarted between staging and the instant
/// redelivers the whole burst at its due time.
#[tokio::test(start_paused = true)]
async fn staging_writes_nothing_and_a_restart_loses_nothing() {
    const N: usize = 20;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let (_, due_ms) = nack_for_a_second(&h, &mut c, &first).await;
    let sub = c.handle.id();
    let records = |h: &Harness| -> Vec<_> {
        (0..N as u64)
            .map(|i| h.storage.failure(TierEntry::main(i).of(sub), None).unwrap())
            .collect()
    };
    let schedule = h.storage.scheduled(None, u64::MAX, 100).unwrap();
    let before = records(&h);
    assert_eq!(schedule.len(), N);
    wait_to_just_before(&h, &mut c, due_ms).await;
    assert_eq!(staged(&h, &c).await, N as u64);
    assert_eq!(h.storage.scheduled(None, u64::MAX, 100).unwrap(), schedule);
    assert_eq!(records(&h), before);
    let storage = h.storage.clone();
    h.core.stop_clean().await.unwrap();
    drop((c, h));
    let h = harness_on(storage).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let got = receive(&mut c, N).await;
    assert!(h.clock.now_ms() >= due_ms);
    assert_eq!(entry_ids(&got), (0..N as u64).collect::<Vec<_>>());
    assert!(got.iter().all(|m| m.delivery_count == 1));
}

/// A burst larger than [`STAGE_MAX`] due within the staging lead is not
/// staged: it goes out the ordinary way, at its due time. It is counted
/// once, the staging lead (5 ms) before it is due, not again at every millisecond
/// of the lead (the actor would wake for it and count up to
/// `STAGE_MAX + 1` entries each time).
///
/// [`STAGE_MAX`]: crate::subscription::STAGE_MAX
#[tokio::test(start_paused = true)]
async fn a_burst_larger_than_the_staging_bound_takes_the_ordinary_way() {
    const N: usize = crate::subscription::STAGE_MAX + 1;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let (due_us, due_ms) = nack_for_a_second(&h, &mut c, &first).await;
    wait_to_just_before(&h, &mut c, due_ms).await;
    let stats = c.handle.stats(h.storage.clone()).await.unwrap();
    assert_eq!(stats.staged_for_due, 0, "not staged");
    assert_eq!(stats.stage_counts, 1, "counted once for the burst");
    let got = receive(&mut c, N).await;
    assert!(h.clock.now_us() >= due_us);
    assert_eq!(got.len(), N);
}

/// A fire that holds staged messages and others read ahead after the burst
/// was staged (here nacked since, held to the same instant, their entries
/// between the staged ones; under load,
/// the later part of a piece that fires past the lead the burst was staged
/// with): all go out together in dispatch order, the staged ones as staged
/// and the others built at the fire, not the whole piece the ordinary way.
#[tokio::test(start_paused = true)]
async fn a_fire_of_staged_and_unstaged_messages_sends_them_together() {
    const N: usize = 20;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    // The even entries staged, the odd ones between them nacked later.
    let (even, odd): (Vec<Message>, Vec<Message>) = first
        .iter()
        .cloned()
        .partition(|m| m.id.as_ref().unwrap().entry_id % 2 == 0);
    let (due_us, due_ms) = nack_for_a_second(&h, &mut c, &even).await;
    wait_to_just_before(&h, &mut c, due_ms).await;
    assert_eq!(staged(&h, &c).await, N as u64 / 2);
    let hold = Duration::from_micros(due_us - h.clock.now_us());
    let rid = c.nack_all_held(&odd, hold);
    assert!(c.done(rid).await.is_ok());
    let reads = h.storage.entries_read_by_id();
    let got = c.messages().await;
    assert!(h.clock.now_us() >= due_us);
    assert_eq!(
        entry_ids(&got),
        (0..N as u64).collect::<Vec<_>>(),
        "in one frame, in order"
    );
    assert!(got.iter().all(|m| m.delivery_count == 1));
    assert_eq!(h.storage.entries_read_by_id(), reads, "all read ahead");
    let stats = c.handle.stats(h.storage.clone()).await.unwrap();
    assert_eq!(
        stats.sent_staged,
        N as u64 / 2,
        "the staged half sent as staged"
    );
    assert_eq!(stats.consumers[0].unacked, N as u64);
}
