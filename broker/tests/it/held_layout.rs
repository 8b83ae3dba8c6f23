//! One stored key per held message (`docs/src/layout.md`): a broker-held
//! nack's failure record is its schedule entry's value. A store written the
//! way the previous release wrote held nacks (the record under its own key
//! in `failures`, written by `put_failures`, then an empty schedule entry by
//! `put_schedule`: the calls that release made) is converted once when the
//! broker opens it, keeps every hold and count, and `ricochet-broker check`
//! passes on it before and after.

use crate::common::*;
use ricochet_broker::storage::prelude::*;
use ricochet_broker::storage::{ScheduleKey, SledStorage, TierId};
use ricochet_proto::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TOPIC: &str = "persistent://public/default/held-layout";
const WAIT: Duration = Duration::from_secs(30);
const BIN: &str = env!("CARGO_BIN_EXE_ricochet-broker");
/// The short hold: long enough to see that nothing comes back early after
/// a restart.
const SHORT_MS: u64 = 20_000;
/// The long hold, still held when the test ends.
const LONG_MS: u64 = 3_600_000;

/// `ricochet-broker check --data-dir dir`: (success, output).
fn check(dir: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["check", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "error")
        .output()
        .expect("run check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

async fn consumer(url: &str) -> RawConsumer {
    RawConsumer::subscribe(
        url,
        TOPIC,
        "s",
        SubOpts {
            sub_type: SubscriptionType::Shared,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Waits for the results of `ids`, each a success.
async fn confirmed(c: &mut RawConsumer, mut ids: Vec<u64>) {
    while !ids.is_empty() {
        let r = c.result(WAIT).await.expect("a command result");
        assert_eq!(r.code, 0, "{r:?}");
        ids.retain(|i| *i != r.request_id);
    }
}

fn open(dir: &Path) -> SledStorage {
    SledStorage::open(dir, 16_384, 8 << 20).unwrap()
}

/// The main-tier schedule entries of the subscription holding a record.
fn held_entries(s: &SledStorage) -> Vec<(ScheduleKey, ricochet_broker::storage::FailureRecord)> {
    let sub = s
        .list_subscriptions(TOPIC)
        .unwrap()
        .pop()
        .expect("the subscription");
    s.subscription_state(sub.id)
        .unwrap()
        .schedule
        .into_iter()
        .filter(|(_, e, _)| e.tier == TierId::Main)
        .filter_map(|(due_ms, e, r)| {
            r.map(|r| {
                (
                    ScheduleKey {
                        due_ms,
                        message: e.of(sub.id),
                    },
                    r,
                )
            })
        })
        .collect()
}

#[tokio::test]
async fn held_nacks_written_in_the_previous_layout_are_converted_once_and_keep_their_holds() {
    let dir = tempfile::tempdir().unwrap();
    // Three messages: m0 held briefly, m1 held for an hour, m2 acked.
    let b = spawn(dir.path()).await;
    let mut c = consumer(b.url()).await;
    c.flow(10).await;
    let mut p = RawProducer::open(b.url(), TOPIC, "p").await.unwrap();
    p.send(&["m0", "m1", "m2"]).await;
    let got = c.take(3, WAIT).await;
    let id = |i: usize| got[i].id.clone().unwrap();
    c.nack_after(id(0), "short", SHORT_MS, 1).await;
    c.nack_after(id(1), "long", LONG_MS, 2).await;
    c.ack(vec![id(2)], 3).await;
    confirmed(&mut c, vec![1, 2, 3]).await;
    drop(c);
    assert!(b.stop().await.success());

    // The broker stored each held nack's record in its schedule entry and
    // nothing under its own key; rewritten here as the previous release
    // wrote them.
    let short_until = {
        let s = open(dir.path());
        let held = held_entries(&s);
        assert_eq!(held.len(), 2, "{held:?}");
        assert_eq!(s.held_under_own_keys(), 0);
        for (key, record) in &held {
            assert_eq!(record.count, 1);
            assert_eq!(record.hold_until_ms, key.due_ms);
            s.put_schedule(&[(*key, false)]).unwrap();
            s.put_failures(&[(key.message, Some(record.clone()))])
                .unwrap();
            s.put_schedule(&[(*key, true)]).unwrap();
        }
        assert_eq!(s.held_under_own_keys(), 2);
        assert!(held_entries(&s).is_empty());
        s.flush().await.unwrap();
        held.iter().map(|(k, _)| k.due_ms).min().unwrap()
    };
    let (ok, out) = check(dir.path());
    assert!(ok, "the previous layout checks clean: {out}");

    // The new broker converts it and serves the holds as they were.
    let b = spawn(dir.path()).await;
    let mut c = consumer(b.url()).await;
    c.flow(10).await;
    // Nothing comes back before the short hold ends (a lost record would
    // make m0 and m1 deliverable at once).
    let left = short_until.saturating_sub(ricochet_testkit::clock::now_ms());
    assert!(
        left > 2_000,
        "the restart took most of the hold ({left} ms left)"
    );
    let early = c.next(Duration::from_millis(left - 500)).await;
    assert!(
        early.is_none(),
        "delivered before its hold ended: {early:?}"
    );
    let back = c.next(WAIT).await.expect("m0 after its hold");
    assert_eq!(text(&back), "m0");
    assert!(ricochet_testkit::clock::now_ms() >= short_until);
    assert_eq!(back.delivery_count, 1, "the count survives the conversion");
    assert!(
        c.next(Duration::from_millis(500)).await.is_none(),
        "m1 stays held"
    );
    c.ack(vec![back.id.clone().unwrap()], 4).await;
    confirmed(&mut c, vec![4]).await;
    drop(c);
    assert!(b.stop().await.success());

    // Converted in place: m1's record is in its schedule entry, none is
    // under its own key, a second conversion finds nothing, and the
    // store checks clean.
    {
        let s = open(dir.path());
        assert_eq!(s.held_under_own_keys(), 0);
        let held = held_entries(&s);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].1.count, 1);
        assert_eq!(s.upgrade_held().unwrap(), 0);
    }
    let (ok, out) = check(dir.path());
    assert!(ok, "the converted store checks clean: {out}");
}
