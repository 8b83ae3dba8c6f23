//! Crash tests for producer de-duplication (issue #28): the broker runs as a
//! child process (in `sync` durability, and again in `interval`) and dies between the writes of a
//! publish — inside the batch's split across segment trees, after its
//! entries and before the producer's sequence state, after both and before
//! the flush, after the flush and before the receipt, around the id
//! reservation — then restarts on the same directory, and the producer
//! resends the batch it has no receipt for (as the client does on
//! reconnect). Every message must then be stored exactly once, and a batch
//! never half: its messages sit at consecutive entry ids.
//!
//! A failpoint (`RICOCHET_FAILPOINT=<step>`, see `crate::util::failpoint`)
//! aborts the broker exactly there; the steps inside a storage write first
//! flush what sled holds so far, the worst a concurrent writer's flush could
//! leave at that instant.

use crate::common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::BrokerProcess;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const TOPIC: &str = "dedup";
/// Small segments, so the batch below spans three segment trees.
const SEGMENT_ENTRIES: u64 = 8;
const FIRST: usize = 5;
const BATCH: usize = 12;

async fn spawn_with(dir: &Path, mode: &str, failpoint: Option<&str>) -> BrokerProcess {
    let config = dir.join("dedup.toml");
    std::fs::write(
        &config,
        format!("durability = \"{mode}\"\nsegment_entries = {SEGMENT_ENTRIES}\n"),
    )
    .unwrap();
    let data = dir.join("data");
    let mut o = options()
        .rust_log("error")
        .args(["--config".as_ref(), config.as_os_str()]);
    if let Some(f) = failpoint {
        o = o.env("RICOCHET_FAILPOINT", f);
    }
    BrokerProcess::spawn(&data, &o).await
}

fn batch(prefix: &str, first_seq: u64, n: usize) -> Vec<OutboundMessage> {
    (0..n)
        .map(|i| OutboundMessage {
            payload: format!("{prefix}{i}").into_bytes(),
            sequence_id: first_seq + i as u64,
            ..Default::default()
        })
        .collect()
}

/// Payload -> entry ids of every message the `check` subscription holds.
async fn stored(url: &str) -> BTreeMap<String, Vec<u64>> {
    let mut c = RawConsumer::simple(url, TOPIC, "check", SubscriptionType::Exclusive).await;
    c.flow(10_000).await;
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    while let Some(m) = c.next(QUIET * 3).await {
        out.entry(text(&m))
            .or_default()
            .push(m.id.as_ref().unwrap().entry_id);
    }
    out
}

/// Stores a first batch durably, dies at `failpoint` while storing a
/// second one (spanning three segment trees), restarts, resends the second
/// batch and sends a third; returns what is stored, and the resend's
/// receipts. `mode` is the durability (`sync` or `interval`).
async fn die_at(mode: &str, failpoint: &str) -> (BTreeMap<String, Vec<u64>>, Vec<SendReceipt>) {
    let dir = tempfile::tempdir().unwrap();
    let b = spawn_with(dir.path(), mode, None).await;
    // The subscription exists before anything is published: it holds all.
    drop(RawConsumer::simple(b.url(), TOPIC, "check", SubscriptionType::Exclusive).await);
    let mut p = RawProducer::open(b.url(), TOPIC, "p").await.unwrap();
    p.send_messages(batch("a", 0, FIRST)).await;
    if mode == "sync" {
        b.kill9();
    } else {
        // A clean stop: in `interval` mode a receipt is not durable.
        b.stop().await;
    }

    let b = spawn_with(dir.path(), mode, Some(failpoint)).await;
    let mut p = RawProducer::open(b.url(), TOPIC, "p").await.unwrap();
    assert_eq!(p.last_sequence_id, Some(FIRST as u64 - 1), "{failpoint}");
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        p.send_batch_result(batch("b", FIRST as u64, BATCH)),
    )
    .await
    .unwrap_or_else(|_| panic!("{failpoint}: the broker hung"));
    assert!(
        r.is_err(),
        "{failpoint}: the broker should have died: {r:?}"
    );
    b.kill9(); // reaps it (it is already gone)

    let b = spawn_with(dir.path(), mode, None).await;
    let mut p = RawProducer::open(b.url(), TOPIC, "p").await.unwrap();
    let receipts = match p.send_batch(batch("b", FIRST as u64, BATCH)).await {
        produce_response::Response::Receipts(r) => r.receipts,
        other => panic!("{failpoint}: resend failed: {other:?}"),
    };
    p.send_messages(batch("c", (FIRST + BATCH) as u64, 1)).await;
    let held = stored(b.url()).await;
    b.kill9();
    (held, receipts)
}

/// Each message is stored once, the second batch at consecutive ids, and
/// its resend recognised whole or not at all; otherwise what is wrong.
fn check(held: &BTreeMap<String, Vec<u64>>, receipts: &[SendReceipt]) -> Result<(), String> {
    let want: Vec<String> = (0..FIRST)
        .map(|i| format!("a{i}"))
        .chain((0..BATCH).map(|i| format!("b{i}")))
        .chain(["c0".to_owned()])
        .collect();
    for w in &want {
        let ids = held.get(w).map(Vec::as_slice).unwrap_or_default();
        if ids.len() != 1 {
            return Err(format!("{w} stored at ids {ids:?}"));
        }
    }
    if held.len() != want.len() {
        return Err(format!("extra payloads: {held:?}"));
    }
    let b: Vec<u64> = (0..BATCH).map(|i| held[&format!("b{i}")][0]).collect();
    if b.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(format!("the batch was stored in pieces: {b:?}"));
    }
    // The resend is either all new (nothing of the batch was kept) or all
    // recognised (all of it was): never a mix.
    let dups = receipts.iter().filter(|r| r.duplicate).count();
    if receipts.len() != BATCH || (dups != 0 && dups != BATCH) {
        return Err(format!(
            "{dups} of {} resent messages recognised",
            receipts.len()
        ));
    }
    Ok(())
}

/// Dies at each step of the publish path in `mode`; every step's failure.
async fn every_step(mode: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    for step in [
        "publish.reserve.before",
        "publish.reserve.after",
        "publish.append.first_segment",
        "publish.append.entries",
        "publish.append.sequence",
        "publish.after_flush",
    ] {
        let (held, receipts) = die_at(mode, step).await;
        if let Err(e) = check(&held, &receipts) {
            wrong.push(format!("{mode}, {step}: {e}"));
        }
    }
    wrong
}

#[tokio::test]
async fn a_publish_cut_between_its_writes_is_stored_exactly_once_after_the_resend() {
    let wrong = every_step("sync").await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// In `interval` mode a receipt comes before the flush, but a batch and
/// its sequence id still survive a crash together or not at all: the
/// steps flush what they hold before dying, so whatever is kept is kept
/// whole and its resend is recognised.
#[tokio::test]
async fn in_interval_mode_a_batch_and_its_sequence_id_survive_a_crash_together() {
    let wrong = every_step("interval").await;
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A 1 KiB message with sequence id `seq`.
fn kib(seq: u64) -> OutboundMessage {
    OutboundMessage {
        payload: vec![b'x'; 1024],
        sequence_id: seq,
        ..Default::default()
    }
}

/// Producer sequence ids live in the log between sled's checkpoints,
/// which are written every 8 MiB (or 64k entries) of a topic's appends,
/// not per publish (issue #21): `p` sends past one checkpoint's worth of
/// 1 KiB messages, then `q` and `p` a batch each after it; the broker is
/// killed (-9) and restarted, and both producers' last ids are known and
/// their last batches, resent, recognised as duplicates. Then `p` crosses
/// the bound again in the restarted broker and, after another kill -9,
/// `q`'s id (read back from the log at the restart) is still known.
#[tokio::test]
async fn sequence_ids_past_the_last_checkpoint_survive_kill_9() {
    const T: &str = "checkpointed";
    const PER_BATCH: u64 = 64;
    // 140 x 64 KiB: past the 8 MiB bound once.
    const BATCHES: u64 = 140;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let o = options().rust_log("error").args(["--durability", "sync"]);
    let b = BrokerProcess::spawn(&data, &o).await;
    let mut p = RawProducer::open(b.url(), T, "p").await.unwrap();
    let mut q = RawProducer::open(b.url(), T, "q").await.unwrap();
    for n in 0..BATCHES {
        p.send_messages((0..PER_BATCH).map(|i| kib(n * PER_BATCH + i)).collect())
            .await;
    }
    let q_last = vec![kib(7), kib(8)];
    q.send_messages(q_last.clone()).await;
    let first = BATCHES * PER_BATCH;
    let p_last: Vec<_> = (first..first + 3).map(kib).collect();
    p.send_messages(p_last.clone()).await;
    b.kill9();

    let b = BrokerProcess::spawn(&data, &o).await;
    for (name, last, batch) in [("p", first + 2, p_last), ("q", 8, q_last)] {
        let mut again = RawProducer::open(b.url(), T, name).await.unwrap();
        assert_eq!(again.last_sequence_id, Some(last), "{name}'s last id");
        let receipts = match again.send_batch(batch).await {
            produce_response::Response::Receipts(r) => r.receipts,
            other => panic!("{name}'s resend failed: {other:?}"),
        };
        assert!(
            !receipts.is_empty() && receipts.iter().all(|r| r.duplicate),
            "{name}'s resend stored again: {receipts:?}"
        );
    }
    // This start read `q`'s id back from the log; `p` now crosses the
    // bound again, and that checkpoint must still name `q`.
    let mut p = RawProducer::open(b.url(), T, "p").await.unwrap();
    let from = first + 3;
    for n in 0..BATCHES {
        let at = from + n * PER_BATCH;
        p.send_messages((at..at + PER_BATCH).map(kib).collect())
            .await;
    }
    b.kill9();
    let b = BrokerProcess::spawn(&data, &o).await;
    let q = RawProducer::open(b.url(), T, "q").await.unwrap();
    assert_eq!(
        q.last_sequence_id,
        Some(8),
        "q's id after a checkpoint made past its entries"
    );
    let p = RawProducer::open(b.url(), T, "p").await.unwrap();
    assert_eq!(p.last_sequence_id, Some(from + BATCHES * PER_BATCH - 1));
    b.kill9();
}
