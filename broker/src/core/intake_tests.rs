//! A burst of failures taken in by the subscription actor (its intake, see
//! `subscription/intake.rs`), on virtual time with the harness of
//! [`super::actor_tests`]: the failed messages' stored records are read
//! together, and the burst's answers wait for the flush together, not one
//! read and one waiting task per message.

use super::actor_tests::{harness, receive, reconsume_all};
use ricochet_proto::SubscriptionType;
use std::time::Duration;

/// A burst of `reconsume_later`s looks up the failed messages' records in
/// batched reads (a few, one per batch of moves), none one at a time.
#[tokio::test(start_paused = true)]
async fn a_burst_of_reconsume_laters_reads_the_failed_records_together() {
    const N: usize = 500;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let (one, batches) = (h.storage.failure_reads(), h.storage.failure_batches());
    let early = reconsume_all(&mut c, &first, Duration::from_secs(60)).await;
    assert!(early.is_empty(), "nothing comes back before its delay");
    assert_eq!(
        h.storage.failure_reads() - one,
        0,
        "records read one at a time at the intake"
    );
    let batches = h.storage.failure_batches() - batches;
    assert!(
        (1..=N as u64 / 16).contains(&batches),
        "{batches} batched reads for {N} moves"
    );
}

/// The answers to a burst of `reconsume_later`s (and to a round's acks)
/// wait for the flush together: a few waits on the flusher, not one per
/// request.
#[tokio::test(start_paused = true)]
async fn a_burst_of_moves_and_acks_waits_for_the_flush_together() {
    const N: usize = 500;
    let h = harness().await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let waits = h.core.flusher.waits();
    let early = reconsume_all(&mut c, &first, Duration::from_millis(10)).await;
    assert!(early.is_empty(), "nothing comes back before its delay");
    let moved = h.core.flusher.waits() - waits;
    assert!(moved <= N as u64 / 16, "{moved} flush waits for {N} moves");
    let again = receive(&mut c, N).await;
    let waits = h.core.flusher.waits();
    let rids: Vec<u64> = again.iter().map(|m| c.ack(m)).collect();
    let mut kept = Vec::new();
    c.all_done_keeping(&rids, &mut kept).await;
    assert!(kept.is_empty());
    let acked = h.core.flusher.waits() - waits;
    assert!(acked <= N as u64 / 16, "{acked} flush waits for {N} acks");
}

/// A broker-held nack's hold runs to the microsecond from when its request
/// reached the broker: its failure record and schedule entry keep that
/// microsecond rounded up to a whole millisecond (never early after a
/// restart, never rounded down), and it comes back at or after that
/// microsecond, never before.
#[tokio::test(start_paused = true)]
async fn a_held_nacks_hold_runs_to_the_microsecond_and_is_stored_rounded_up() {
    use crate::clock::Clock;
    use crate::storage::TierEntry;
    use crate::storage::prelude::*;
    let h = harness().await;
    h.publish(&["a"]).await;
    let mut c = h.consumer(SubscriptionType::Exclusive, None).await;
    let first = c.messages().await;
    let hold = Duration::from_micros(1_000_300);
    // Off the millisecond, so rounding up and down differ.
    if (h.clock.now_us() + 300) % 1000 == 0 {
        tokio::time::advance(Duration::from_micros(1)).await;
    }
    let asked_us = h.clock.now_us();
    let rid = c.nack_held(&first[0], hold);
    let due_us = asked_us + 1_000_300;
    assert!(c.done(rid).await.is_ok());
    let stored = h
        .storage
        .failure(TierEntry::main(0).of(c.handle.id()), None)
        .unwrap()
        .unwrap();
    assert_eq!(stored.hold_until_ms, due_us.div_ceil(1000), "rounded up");
    let dues: Vec<u64> = h
        .storage
        .scheduled(None, u64::MAX, 10)
        .unwrap()
        .into_iter()
        .map(|k| k.due_ms)
        .collect();
    assert_eq!(dues, vec![due_us.div_ceil(1000)]);
    let again = c.messages().await.remove(0);
    let at = h.clock.now_us();
    assert_eq!(again.delivery_count, 1);
    assert!(at >= due_us, "{} µs early", due_us - at);
}
