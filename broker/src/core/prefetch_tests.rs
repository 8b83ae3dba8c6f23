//! A burst of held nacks read before it is due (the subscription's
//! prefetch, see `subscription/prefetch.rs`), on virtual time with the
//! harness of [`super::actor_tests`]: the messages are read from the log
//! within the scheduler's prefetch lead, none is handed out before its due
//! time, none is read again when it fires, and one settled in between is
//! not handed out.

use super::actor_tests::{TestConsumer, harness, receive, reconsume_all, text};
use crate::clock::Clock;
use crate::scheduler::PREFETCH_LEAD;
use crate::storage::TierEntry;
use crate::storage::prelude::*;
use ricochet_proto::SubscriptionType;
use std::time::Duration;

/// A held nack's due time, from its stored failure record.
fn due_of(h: &super::actor_tests::Harness, c: &TestConsumer, entry_id: u64) -> u64 {
    h.storage
        .failure(TierEntry::main(entry_id).of(c.handle.id()), None)
        .unwrap()
        .expect("a held nack's record")
        .hold_until_ms
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_held_nacks_is_read_before_it_is_due_not_when_it_fires() {
    // More than one step of the read ahead.
    const N: usize = 600;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let rid = c.nack_all_held(&first, Duration::from_secs(1));
    assert!(c.done(rid).await.is_ok());
    let due = due_of(&h, &c, 0);
    let reads_at_nack = h.storage.entries_read_by_id();
    // Up to 5 ms before the due time: past the prefetch lead, nothing out.
    let lead = PREFETCH_LEAD.as_millis() as u64;
    assert!(lead > 5);
    let wait = due - h.clock.now_ms() - 5;
    assert!(
        c.messages_within(Duration::from_millis(wait))
            .await
            .is_none(),
        "nothing before its due time"
    );
    let reads_ahead = h.storage.entries_read_by_id();
    assert_eq!(
        reads_ahead - reads_at_nack,
        N as u64,
        "the burst is read within the prefetch lead"
    );
    let again = receive(&mut c, N).await;
    assert!(
        h.clock.now_ms() >= due,
        "out at {} ms, due at {due}",
        h.clock.now_ms()
    );
    let mut texts: Vec<&str> = again.iter().map(text).collect();
    texts.sort_unstable();
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    let mut want: Vec<&str> = payloads.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(texts, want);
    assert!(again.iter().all(|m| m.delivery_count == 1));
    assert_eq!(
        h.storage.entries_read_by_id(),
        reads_ahead,
        "no message read from storage when the burst fired"
    );
}

/// Held nacks due a few milliseconds apart (several within one prefetch
/// lead, read together) each go out at its own due time, not with the
/// first of them nor when it was read.
#[tokio::test(start_paused = true)]
async fn held_nacks_read_together_each_go_out_at_their_own_due_time() {
    const N: usize = 12;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 0).await;
    for (i, m) in first.iter().enumerate() {
        let rid = c.nack_all_held(
            std::slice::from_ref(m),
            Duration::from_millis(500 + 3 * i as u64),
        );
        assert!(c.done(rid).await.is_ok());
    }
    let dues: Vec<u64> = (0..N as u64).map(|id| due_of(&h, &c, id)).collect();
    assert!(
        dues[N - 1] - dues[0] < PREFETCH_LEAD.as_millis() as u64 * 2,
        "spread over about one lead: {dues:?}"
    );
    let mut out = 0;
    while out < N {
        for m in c.messages().await {
            let id = m.id.as_ref().unwrap().entry_id as usize;
            let now = h.clock.now_ms();
            assert!(
                now >= dues[id],
                "{} out at {now}, {} ms before its due time",
                text(&m),
                dues[id] - now
            );
            out += 1;
        }
    }
}

/// A held nack settled after it was read ahead (here by a cumulative ack
/// past it) is not handed out when its schedule entry fires.
#[tokio::test(start_paused = true)]
async fn a_held_nack_acked_after_it_was_read_ahead_is_not_delivered() {
    let h = harness().await;
    h.publish(&["a", "b", "c"]).await;
    let mut c = h.consumer(SubscriptionType::Exclusive, None).await;
    let first = receive(&mut c, 3).await;
    let rid = c.nack_all_held(&first[..1], Duration::from_secs(1));
    assert!(c.done(rid).await.is_ok());
    let due = due_of(&h, &c, 0);
    let reads_at_nack = h.storage.entries_read_by_id();
    let wait = due - h.clock.now_ms() - 5;
    assert!(
        c.messages_within(Duration::from_millis(wait))
            .await
            .is_none()
    );
    assert_eq!(
        h.storage.entries_read_by_id() - reads_at_nack,
        1,
        "read ahead"
    );
    // Acks "a" too: the cursor moves past it.
    let rid = c.ack_through(&first[2]);
    assert!(c.done(rid).await.is_ok());
    let late = c.messages_within(Duration::from_secs(2)).await;
    assert!(
        late.is_none(),
        "an acked message went out: {:?}",
        late.map(|m| m.iter().map(|m| text(m).to_owned()).collect::<Vec<_>>())
    );
    assert!(h.clock.now_ms() > due);
}

/// A burst of retries read ahead of its due time reads the retries'
/// failure records together (one batched read per step of the read-ahead),
/// not one at a time, and they go out with the counts those records hold.
#[tokio::test(start_paused = true)]
async fn a_burst_of_retries_read_ahead_reads_its_failure_records_together() {
    const N: usize = 600;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let early = reconsume_all(&mut c, &first, Duration::from_secs(1)).await;
    assert!(early.is_empty());
    let (one, batches) = (h.storage.failure_reads(), h.storage.failure_batches());
    let again = receive(&mut c, N).await;
    let mut texts: Vec<&str> = again.iter().map(text).collect();
    texts.sort_unstable();
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    let mut want: Vec<&str> = payloads.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(texts, want);
    assert!(
        again.iter().all(|m| m.delivery_count == 1),
        "counts {:?}",
        again.iter().map(|m| m.delivery_count).collect::<Vec<_>>()
    );
    assert_eq!(
        h.storage.failure_reads() - one,
        0,
        "no failure record read one at a time"
    );
    let batches = h.storage.failure_batches() - batches;
    let steps = N.div_ceil(crate::subscription::PREFETCH_STEP) as u64;
    assert!(
        (1..=steps).contains(&batches),
        "{batches} batched reads for {N} retries"
    );
}

/// Retries that fire before they could be read ahead (due at once) read
/// their failure records together too, when they are loaded.
#[tokio::test(start_paused = true)]
async fn retries_loaded_when_they_fire_read_their_failure_records_together() {
    const N: usize = 300;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let (one, batches) = (h.storage.failure_reads(), h.storage.failure_batches());
    let mut again = reconsume_all(&mut c, &first, Duration::ZERO).await;
    while again.len() < N {
        again.extend(c.messages().await);
    }
    assert_eq!(again.len(), N);
    assert!(again.iter().all(|m| m.delivery_count == 1));
    // The intake looks up the failed messages' records together (see
    // `intake_tests`); the fire reads none of the retries' records one at
    // a time either.
    assert_eq!(
        h.storage.failure_reads() - one,
        0,
        "failure records read one at a time"
    );
    assert!(h.storage.failure_batches() > batches);
}

/// A message read ahead whose entry never fires (here taken off the
/// scheduler behind the subscription's back, as a move or a new hold takes
/// an entry off when it schedules the message anew) leaves the read-ahead
/// buffer by itself once stale, without another burst to sweep it.
#[tokio::test(start_paused = true)]
async fn a_message_read_ahead_that_never_fires_leaves_the_buffer_by_itself() {
    let h = harness().await;
    h.publish(&["a", "b"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let first = receive(&mut c, 2).await;
    let early = reconsume_all(&mut c, &first[..1], Duration::from_secs(1)).await;
    assert!(early.is_empty());
    let read_ahead = |h: &super::actor_tests::Harness, c: &TestConsumer| {
        let (storage, handle) = (h.storage.clone(), c.handle.clone());
        async move { handle.stats(storage).await.unwrap().read_ahead_of_due }
    };
    let keys = h.storage.scheduled(None, u64::MAX, 10).unwrap();
    assert_eq!(keys.len(), 1);
    let due = keys[0].due_ms;
    // Past the prefetch lead, 5 ms before the due time: read ahead.
    let wait = due - h.clock.now_ms() - 5;
    assert!(
        c.messages_within(Duration::from_millis(wait))
            .await
            .is_none()
    );
    assert_eq!(read_ahead(&h, &c).await, 1, "read ahead");
    h.core.scheduler.remove(keys);
    let stale = crate::subscription::STALE_AFTER_MS;
    assert!(
        c.messages_within(Duration::from_millis(stale + 100))
            .await
            .is_none(),
        "an unscheduled entry went out"
    );
    assert!(h.clock.now_ms() > due + stale);
    assert_eq!(read_ahead(&h, &c).await, 0, "dropped once stale");
}

/// Entries that fire while acks are queued go out before the acks' round is
/// written (the actor takes what fired ahead of its queue, see
/// `FIRED_TURNS_AHEAD`): here an ack is queued in the same timer turn as a
/// held nack fires, and the acked message's failure record (dropped by the
/// round's write) is still stored when the fired one arrives. Repeated, as
/// an unordered choice between the two would pass now and then.
#[tokio::test(start_paused = true)]
async fn fired_entries_go_out_before_a_pending_ack_round_is_written() {
    const TRIALS: usize = 16;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(2 * TRIALS, 4 * TRIALS as u32).await;
    // Even entries: nacked and redelivered at once, so each is in flight
    // with a failure record that its ack's write drops.
    let even: Vec<_> = first.iter().step_by(2).cloned().collect();
    let rid = c.nack_all_held(&even, Duration::ZERO);
    let mut again = Vec::new();
    c.all_done_keeping(&[rid], &mut again).await;
    again.extend(receive(&mut c, TRIALS - again.len()).await);
    assert!(again.iter().all(|m| m.delivery_count == 1));
    for (i, acked_msg) in even.iter().enumerate() {
        let (acked, short) = (2 * i as u64, 2 * i as u64 + 1);
        let rid = c.nack_held(&first[short as usize], Duration::from_millis(10));
        assert!(c.done(rid).await.is_ok());
        let due = due_of(&h, &c, short);
        // Woken at the due time, with the scheduler's timer.
        tokio::time::sleep(Duration::from_micros(due * 1000 - h.clock.now_us())).await;
        let ack = c.ack(acked_msg);
        let again = c.messages().await;
        assert_eq!(again.len(), 1);
        assert_eq!(text(&again[0]), text(&first[short as usize]));
        let record = TierEntry::main(acked).of(c.handle.id());
        assert!(
            h.storage.failure(record, None).unwrap().is_some(),
            "trial {i}: the ack's round was written before the fired entry went out"
        );
        assert!(c.done(ack).await.is_ok());
        assert!(
            h.storage.failure(record, None).unwrap().is_none(),
            "trial {i}: the ack's write drops the record"
        );
    }
}
