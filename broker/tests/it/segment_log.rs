//! The segment-file log against the real binary: kill -9 at failpoints in
//! append, roll and trim (`RICOCHET_FAILPOINT` aborts the broker at that
//! step) loses no receipted message and serves no torn one; a store
//! written with the old layout (`log_engine = "sled"`) is converted once at
//! start and `ricochet-broker check` passes after; retention deletes whole
//! segment files, so the log's disk follows the limit.

use crate::common;
use common::*;
use ricochet_proto::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ricochet-broker");
const TOPIC: &str = "seglog";

/// A config file in `dir` (beside the data directory): segments of 10
/// entries, plus `extra`.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join(format!("broker-{}.toml", extra.len()));
    std::fs::write(&path, format!("segment_entries = 10\n{extra}\n")).unwrap();
    path
}

fn opts(config: &Path) -> ricochet_testkit::SpawnOptions {
    options().args(["--config".as_ref(), config.as_os_str()])
}

/// Publishes `n` messages `tag-i` in batches of 10; every one receipted.
async fn publish(url: &str, tag: &str, n: usize) -> Vec<String> {
    let mut p = RawProducer::open(url, TOPIC, "p").await.unwrap();
    let texts: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    for chunk in texts.chunks(10) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        p.send(&refs).await;
    }
    texts
}

/// Every message of the topic, from the earliest, through a new
/// subscription `sub`.
async fn read_all(url: &str, sub: &str, n: usize) -> Vec<String> {
    let mut c = RawConsumer::subscribe(
        url,
        TOPIC,
        sub,
        SubOpts {
            sub_type: SubscriptionType::Exclusive,
            initial: InitialPosition::Earliest,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    c.flow(n as u32 + 100).await;
    let got: Vec<String> = c.take(n, WAIT).await.iter().map(text).collect();
    assert!(c.next(QUIET).await.is_none(), "nothing more than expected");
    got
}

fn check(data: &Path, config: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["check", "--data-dir"])
        .arg(data)
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "error")
        .output()
        .expect("run check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Waits until the broker process `pid` has exited (a zombie until reaped).
async fn exited(pid: u32) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name in parentheses.
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .chars()
            .next();
        if matches!(state, None | Some('Z') | Some('X')) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broker did not die"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Round 1 publishes 100 receipted messages and is killed; round 2 runs
/// with the failpoint and publishes (or acks everything, for the trim)
/// until the broker aborts there; round 3 finds exactly round 1's messages
/// (for the trim: whole segments fewer), takes new ones, and `check`
/// passes after a clean stop.
#[tokio::test]
async fn kill_9_at_append_roll_and_trim_failpoints_loses_no_receipted_message() {
    for failpoint in [
        "log.append.mid_record",
        "log.roll.before_header",
        "log.roll.after_create",
        "log.trim.after_start",
    ] {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        let conf = config(root.path(), "");
        let trimmed = failpoint == "log.trim.after_start";
        let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts(&conf)).await;
        // The subscription that acks everything in round 2.
        drop(RawConsumer::simple(broker.url(), TOPIC, "acker", SubscriptionType::Shared).await);
        let first = publish(broker.url(), "a", 100).await;
        broker.kill9();
        assert_eq!(segment_files(&data).len(), 10, "one file per 10 entries");

        let broker = ricochet_testkit::BrokerProcess::spawn(
            &data,
            &opts(&conf).env("RICOCHET_FAILPOINT", failpoint),
        )
        .await;
        let url = broker.url().to_owned();
        let mut confirmed = false;
        if trimmed {
            let mut c = RawConsumer::simple(&url, TOPIC, "acker", SubscriptionType::Shared).await;
            c.flow(200).await;
            let got = c.take(100, WAIT).await;
            c.ack(got.iter().map(|m| m.id.clone().unwrap()).collect(), 1)
                .await;
            // The trim's files go at the flush after the cursor's write;
            // the failpoint may stop the broker before the ack's answer.
            confirmed = c.result(WAIT).await.is_some_and(|r| r.code == 0);
        } else {
            let mut p = RawProducer::open(&url, TOPIC, "p").await.unwrap();
            let m = p.msg("never-receipted");
            let answer = p.try_send_batch(vec![m]).await;
            assert!(answer.is_none(), "{failpoint}: no receipt: {answer:?}");
        }
        exited(broker.pid()).await;
        broker.kill9(); // reaps it
        if trimmed {
            assert_eq!(
                segment_files(&data).len(),
                10,
                "{failpoint}: aborted after the start file, before any file went"
            );
        }

        let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts(&conf)).await;
        let url = broker.url().to_owned();
        if trimmed {
            assert_eq!(segment_files(&data).len(), 1, "the trim finished at start");
            // Every message was acked. The acks whose answer the abort
            // may have cut come back, but only from the segment the trim
            // kept (90..100): what was trimmed had durably acked cursors.
            // Once the answer came, nothing of round 1 comes back.
            let second = publish(&url, "b", 5).await;
            let mut c = RawConsumer::simple(&url, TOPIC, "acker", SubscriptionType::Shared).await;
            c.flow(500).await;
            let mut got: Vec<String> = Vec::new();
            while let Some(m) = c.next(QUIET).await {
                got.push(text(&m));
            }
            let back = got.len().checked_sub(5).expect("the new messages came");
            assert_eq!(got[back..], second[..], "{failpoint}");
            assert!(back <= 10, "{failpoint}: only the kept segment returns");
            assert_eq!(got[..back], first[100 - back..], "{failpoint}");
            if confirmed {
                assert_eq!(back, 0, "{failpoint}: confirmed acks stay acked");
            }
        } else {
            let second = publish(&url, "b", 15).await;
            let all = read_all(&url, "reader", 115).await;
            assert_eq!(all[..100], first[..], "{failpoint}: round 1 whole");
            assert_eq!(all[100..], second[..], "{failpoint}: no torn batch served");
        }
        assert!(broker.stop().await.success());
        let (ok, out) = check(&data, &conf);
        assert!(ok, "{failpoint}: check passes after:\n{out}");
    }
}

/// A store written by the old layout (entries in sled trees) is converted
/// at the first start with the segment files, once: every message is
/// served in order with its id, the sled trees are gone, ids go on, and
/// `check` passes; a second start converts nothing.
#[tokio::test]
async fn a_store_written_with_sled_trees_is_converted_once_and_checks() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let old = config(root.path(), "log_engine = \"sled\"");
    let new = config(root.path(), "log_engine = \"segments\"");
    let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts(&old)).await;
    let first = publish(broker.url(), "old", 95).await;
    // A subscription that consumed 30 (so 2 trees of 10 are dropped).
    let mut c = RawConsumer::simple(broker.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(30).await;
    let got = c.take(30, WAIT).await;
    c.ack(got.iter().map(|m| m.id.clone().unwrap()).collect(), 1)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    drop(c);
    assert!(broker.stop().await.success());
    assert!(
        !data.join("log").exists(),
        "the old layout has no segment files"
    );
    let (ok, out) = check(&data, &old);
    assert!(ok, "the old store checks:\n{out}");

    let broker =
        ricochet_testkit::BrokerProcess::spawn(&data, &opts(&new).rust_log("info").echo_log(false))
            .await;
    let url = broker.url().to_owned();
    let mut c = RawConsumer::simple(&url, TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(200).await;
    let rest = c.take(65, WAIT).await;
    assert_eq!(rest.iter().map(text).collect::<Vec<_>>(), first[30..]);
    assert_eq!(rest[0].id.as_ref().unwrap().entry_id, 30, "ids kept");
    drop(c);
    let mut p = RawProducer::open(&url, TOPIC, "p").await.unwrap();
    let receipts = p.send(&["new"]).await;
    assert!(receipts[0].entry_id >= 95, "ids go on");
    drop(p);
    assert!(broker.stop().await.success());
    assert!(
        segment_files(&data).len() >= 7,
        "{:?}",
        segment_files(&data)
    );
    let (ok, out) = check(&data, &new);
    assert!(ok, "check passes after the upgrade:\n{out}");
    assert!(out.contains("segment files:     1 topic(s)"), "{out}");

    // Started again: nothing left to convert, everything still there.
    let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts(&new)).await;
    let mut c = RawConsumer::simple(broker.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(200).await;
    let again: Vec<String> = c.take(66, WAIT).await.iter().map(text).collect();
    assert_eq!(again[..65], first[30..]);
    assert_eq!(again[65], "new");
    drop(c);
    assert!(broker.stop().await.success());
}

/// Every segment file of the one topic in `data`'s log.
fn segment_files(data: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(data.join("log")).unwrap() {
        for f in std::fs::read_dir(dir.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "seg") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Consumed segments and retention delete whole files: after a
/// subscription acks everything, only the active segment file is left.
#[tokio::test]
async fn consumed_segments_are_deleted_as_whole_files() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let conf = config(root.path(), "");
    let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts(&conf)).await;
    let url = broker.url().to_owned();
    let mut c = RawConsumer::simple(&url, TOPIC, "s", SubscriptionType::Shared).await;
    publish(&url, "x", 200).await;
    assert_eq!(segment_files(&data).len(), 20, "one file per 10 entries");
    c.flow(300).await;
    let got = c.take(200, WAIT).await;
    c.ack(got.iter().map(|m| m.id.clone().unwrap()).collect(), 1)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    while segment_files(&data).len() > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            segment_files(&data)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(c);
    assert!(broker.stop().await.success());
}
