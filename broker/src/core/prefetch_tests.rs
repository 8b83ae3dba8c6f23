//! A burst of held nacks read before it is due (the subscription's
//! prefetch, see `subscription/prefetch.rs`), on virtual time with the
//! harness of [`super::actor_tests`]: the messages are read from the log
//! within the scheduler's prefetch lead, none is handed out before its due
//! time, none is read again when it fires, and one settled in between is
//! not handed out.

use super::actor_tests::{TestConsumer, harness, text};
use crate::clock::Clock;
use crate::scheduler::PREFETCH_LEAD;
use crate::storage::TierEntry;
use crate::storage::prelude::*;
use ricochet_proto::{Message, SubscriptionType};
use std::time::Duration;

/// Receives `n` messages.
async fn receive(c: &mut TestConsumer, n: usize) -> Vec<Message> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        got.extend(c.messages().await);
    }
    got
}

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
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    h.publish(&payloads.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    c.flow(2 * N as u32);
    let first = receive(&mut c, N).await;
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
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    h.publish(&payloads.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let first = receive(&mut c, N).await;
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
