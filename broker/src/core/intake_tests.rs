//! A burst of failures taken in by the subscription actor (its intake, see
//! `subscription/intake.rs`), on virtual time with the harness of
//! [`super::actor_tests`]: the failed messages' stored records are read
//! together, and the burst's answers wait for the flush together, not one
//! read and one waiting task per message.

use super::actor_tests::{harness, receive, reconsume_all};
use crate::storage::TierId;
use crate::storage::prelude::*;
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
    let dues = h.due_times();
    assert_eq!(dues, vec![due_us.div_ceil(1000)]);
    let again = c.messages().await.remove(0);
    let at = h.clock.now_us();
    assert_eq!(again.delivery_count, 1);
    assert!(at >= due_us, "{} µs early", due_us - at);
}

/// The sled engine on a fresh directory (kept alive beside it).
fn sled_store() -> (
    tempfile::TempDir,
    std::sync::Arc<crate::storage::SledStorage>,
) {
    let dir = tempfile::tempdir().unwrap();
    let s = crate::storage::SledStorage::open(dir.path(), 16_384, 8 << 20).unwrap();
    (dir, std::sync::Arc::new(s))
}

/// A burst of pipelined nack frames (here 8 messages each, as a client
/// sends one frame per small received batch) with a hold the broker
/// serves is taken in together: each schedule chunk (64 entry ids of one
/// due-time bucket, one sled value) is written about once, not once per
/// frame that adds to it (8 times here, one request at a time).
#[tokio::test(start_paused = true)]
async fn a_burst_of_nack_frames_writes_each_schedule_chunk_about_once() {
    const N: usize = 512;
    const FRAME: usize = 8;
    let (_dir, storage) = sled_store();
    let h = super::actor_tests::harness_on(storage.clone()).await;
    let (mut c, first) = h.shared_burst(N, 2 * N as u32).await;
    let before = storage.schedule_chunk_writes();
    let rids: Vec<u64> = first
        .chunks(FRAME)
        .map(|f| c.nack_all_held(f, Duration::from_secs(3600)))
        .collect();
    let mut early = Vec::new();
    c.all_done_keeping(&rids, &mut early).await;
    assert!(early.is_empty(), "nothing comes back before its hold ends");
    let writes = storage.schedule_chunk_writes() - before;
    // Entry ids 0..512, one due time: 8 chunks.
    let chunks = (N / 64) as u64;
    assert!(
        writes <= 2 * chunks,
        "{writes} chunk writes for {N} held nacks in {chunks} chunks ({} frames)",
        rids.len()
    );
    let held = h.storage.failures_of(c.handle.id(), TierId::Main).unwrap();
    assert_eq!(held.len(), N, "every nack held");
    assert!(held.iter().all(|(_, r)| r.count == 1));
}

/// Nack frames taken in together keep what one frame at a time did: a
/// message named by two frames is failed once (the second finds it no
/// longer in flight), and a frame naming a message never delivered is
/// refused alone while the frames around it are carried out.
#[tokio::test(start_paused = true)]
async fn nack_frames_taken_together_fail_a_message_once_and_refuse_a_bad_frame_alone() {
    let (_dir, storage) = sled_store();
    let h = super::actor_tests::harness_on(storage.clone()).await;
    let (mut c, first) = h.shared_burst(6, 12).await;
    let hold = Duration::from_secs(3600);
    let mut never = first[0].clone();
    never.id.as_mut().unwrap().entry_id = 1_000;
    let a = c.nack_all_held(&first[0..3], hold);
    let bad = c.nack_all_held(&[first[3].clone(), never], hold);
    let b = c.nack_all_held(&first[2..6], hold);
    let refused = c.done(bad).await;
    assert!(
        matches!(
            refused.as_ref().map_err(|e| &**e),
            Err(crate::BrokerError::InvalidArgument(_))
        ),
        "{refused:?}"
    );
    let mut early = Vec::new();
    c.all_done_keeping(&[a, b], &mut early).await;
    assert!(early.is_empty());
    let held = h.storage.failures_of(c.handle.id(), TierId::Main).unwrap();
    let counts: Vec<(u64, u32)> = held.iter().map(|(m, r)| (m.entry_id, r.count)).collect();
    assert_eq!(counts, (0..6).map(|i| (i, 1)).collect::<Vec<_>>());
}

/// A `reconsume_later`'s delay runs from the application's call: what the
/// request waited in the client before it was sent (the client reports it)
/// is taken off, but never more than the whole delay, so a retry is never
/// due before its request reached the broker. Requests that report nothing
/// (older clients) run from the arrival, as before.
#[tokio::test(start_paused = true)]
async fn a_retry_runs_from_the_call_less_the_clients_wait_never_before_its_arrival() {
    use crate::clock::Clock;
    let h = harness().await;
    h.publish(&["old", "waited", "claims"]).await;
    let mut c = h.consumer(SubscriptionType::Shared, None).await;
    let got = c.messages().await;
    // Off the millisecond, so what rounds down and up differs.
    if h.clock.now_us() % 1000 == 0 {
        tokio::time::advance(Duration::from_micros(300)).await;
    }
    let asked_us = h.clock.now_us();
    let delay = Duration::from_millis(200);
    let rids = [
        c.reconsume_waited(&got[0], delay, Duration::ZERO),
        c.reconsume_waited(&got[1], delay, Duration::from_micros(12_300)),
        // More than the delay: clamped to it (due at the arrival).
        c.reconsume_waited(&got[2], delay, Duration::from_secs(3_600)),
    ];
    for rid in rids {
        assert!(c.done(rid).await.is_ok());
    }
    let mut dues = h.due_times();
    dues.sort_unstable();
    let arrival = asked_us.div_ceil(1000);
    assert_eq!(
        dues,
        vec![
            arrival,
            (asked_us - 12_300).div_ceil(1000) + 200,
            arrival + 200,
        ],
        "due times: the clamped claim, the 12.3 ms waited, nothing waited"
    );
    // The clamped one comes back first, not before its arrival.
    let first = c.messages().await;
    assert!(h.clock.now_us() >= asked_us);
    assert_eq!(first.len(), 1);
}
