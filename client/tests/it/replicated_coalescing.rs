//! A replicated topic's leader coalesces writes queued behind the entries
//! in flight into one Raft entry (`PartitionCommand::Sequence`) only while
//! every member of its group advertises group commands level 3 in its etcd
//! registration. A member's registration rewritten to level 2 (as a broker
//! from before the coalesced entry registers) stops the coalescing within
//! the level pass's 10 s (`replication::coalescing`, its own clock: the
//! seal pass sleeps a minute at the default `segment_max_age`); the level
//! restored, it resumes. Observed from outside through the leader's
//! `ricochet_raft_coalesced_entries_total` / `_commands_total`. Etcd and
//! three brokers as child processes, each with its own metrics address.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ricochet_client::Client;
use ricochet_testkit::{SpawnOptions, etcd_or_skip, free_addr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::replicated::{ONE_CLUSTER, client, create_r3};
use super::replicated_upgrade::put;

/// Producers writing at once in a burst, and messages each (unbatched:
/// each its own write, up to 128 in flight per producer).
const PRODUCERS: usize = 8;
const EACH: usize = 200;

/// Longest the level pass may take to notice a change (10 s), with room
/// for the bursts that observe it (up to ~1.5 s each uncoalesced, in a
/// debug build) on a loaded machine.
const NOTICED: Duration = Duration::from_secs(30);

/// A broker's `/metrics` text.
pub(super) async fn scrape(addr: SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// `(entries, commands)` the leader at `addr` coalesced for topic `t`
/// (0 before the first: a counter appears at its first increment).
async fn coalesced(addr: SocketAddr, t: &str) -> (u64, u64) {
    let text = scrape(addr).await;
    let label = format!("topic=\"persistent://public/default/{t}\"");
    let value = |name: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    };
    (
        value("ricochet_raft_coalesced_entries_total"),
        value("ricochet_raft_coalesced_commands_total"),
    )
}

/// [`PRODUCERS`] producers each send [`EACH`] messages of 100 B, each
/// its own write, without waiting in between (they queue behind the
/// leader's entries in flight); returns once every receipt came back.
async fn burst(c: &Client, t: &str) {
    let mut tasks = Vec::new();
    for _ in 0..PRODUCERS {
        let p = c.producer(t).batching(false).create().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut receipts = Vec::with_capacity(EACH);
            for i in 0..EACH {
                receipts.push(p.send_async(vec![i as u8; 100]).await.unwrap());
            }
            for r in receipts {
                r.await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Bursts until one coalesces (the counters grow) within [`NOTICED`];
/// returns how long that took.
async fn until_coalescing(c: &Client, t: &str, metrics: SocketAddr, why: &str) -> Duration {
    let start = Instant::now();
    loop {
        let before = coalesced(metrics, t).await;
        burst(c, t).await;
        let after = coalesced(metrics, t).await;
        eprintln!("{why}: {before:?} -> {after:?}");
        if after.0 > before.0 {
            assert!(
                after.1 - before.1 >= 2 * (after.0 - before.0),
                "a coalesced entry carries several commands: {before:?} -> {after:?}"
            );
            return start.elapsed();
        }
        assert!(
            start.elapsed() < NOTICED,
            "{why}: no burst coalesced within {NOTICED:?} ({after:?})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_leader_coalesces_only_while_every_member_registers_the_level() {
    // The series this test reads are in the book's metrics list (where
    // the broker's scripted metrics test exempts them: one broker, no
    // group).
    let book = include_str!("../../../docs/src/configuration.md");
    for name in [
        "ricochet_raft_coalesced_entries_total",
        "ricochet_raft_coalesced_commands_total",
    ] {
        assert!(book.contains(name), "{name} is not documented");
    }
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_leader_coalesces_only_while_every_member").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let metrics: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    // The default `segment_max_age` (an hour): the seal pass runs once a
    // minute, so a re-check riding on it would miss the deadlines below.
    // Leases of 60 s: no broker rewrites its registration within the test
    // (checked below).
    let brokers = ricochet_testkit::spawn_cluster_each(
        &etcd,
        "rcoal",
        3,
        root.path(),
        Duration::from_secs(60),
        &SpawnOptions::new(),
        |i, o| o.metrics_listen(metrics[i]),
    )
    .await;
    let t = "coalesced";
    let (ids, at) = create_r3(&brokers, t).await;
    let leader = &ids[at];
    let c = client(&brokers[at].url()).await;
    let m = metrics[at];

    // Every member at level 3: a burst is coalesced (this also shows the
    // bursts below are able to coalesce).
    until_coalescing(&c, t, m, "every member at level 3").await;

    // A follower's registration at level 2: within the pass's 10 s, the
    // leader proposes one entry per command (the counters stand still
    // over three bursts in a row).
    let old = &ids[(at + 1) % 3];
    let key = format!("/ricochet/rcoal/brokers/{old}");
    let (current, _) = etcd.get(&key).await.expect("registered");
    let mut reg: serde_json::Value = serde_json::from_str(&current).unwrap();
    assert_eq!(reg["group_commands"], 3, "{current}");
    reg["group_commands"] = 2.into();
    let level_two = reg.to_string();
    put(&etcd, &key, &level_two).await;
    let start = Instant::now();
    let mut still = 0;
    // When the first of the bursts that did not coalesce began.
    let mut stopped = Duration::ZERO;
    while still < 3 {
        if still == 0 {
            stopped = start.elapsed();
        }
        let before = coalesced(m, t).await;
        burst(&c, t).await;
        let after = coalesced(m, t).await;
        eprintln!("level 2 for {:?}: {before:?} -> {after:?}", start.elapsed());
        still = if after == before { still + 1 } else { 0 };
        assert!(
            start.elapsed() < NOTICED,
            "{old} registered at level 2 for {NOTICED:?}: its leader still coalesces ({before:?} -> {after:?})"
        );
    }
    let (now, _) = etcd.get(&key).await.unwrap();
    assert_eq!(
        now, level_two,
        "{old} refreshed its registration within the test: the stop above proves nothing"
    );

    // The level restored: coalescing resumes within the pass's 10 s.
    put(&etcd, &key, &current).await;
    let resumed = until_coalescing(&c, t, m, "the level restored").await;
    eprintln!(
        "leader {leader}: stopped coalescing {stopped:?} after {old}'s level 2, resumed {resumed:?} after level 3"
    );
}
