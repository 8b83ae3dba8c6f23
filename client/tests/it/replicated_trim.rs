//! A replicated topic's trims are the group's (issue 22): the segments its
//! leader's retention drops are dropped from every replica's disk, and
//! after a `kill -9` of the leader the member that leads next serves none
//! of the ids the old leader dropped. Etcd and three brokers as child
//! processes, with segments of 10 ids and a size retention on the topic.
//!
//! Also: a busy replicated topic's age rolls are the group's (its leader
//! seals through the group, no `[tiered]` needed), at the same ids on
//! every replica.
//!
//! Both trim tests fail against a broker whose trims are the leader's alone
//! (`RICOCHET_BROKER_BIN` naming a build from before the group's trims:
//! the followers keep every segment, and the new leader serves from id 0).

use std::path::Path;
use std::time::{Duration, Instant};

use ricochet_broker::storage::segments::dir_name;
use ricochet_client::admin::{RetentionPolicy, RetentionTarget};
use ricochet_client::{Client, ErrorKind, InitialPosition, MessageId};
use ricochet_testkit::{ClusterBroker, SpawnOptions, etcd_or_skip};

use super::replicated::{ONE_CLUSTER, client, led_group_with, next_leader};

/// Ids per segment (the brokers' `segment_entries`).
const ENTRIES: u64 = 10;
/// Messages published, 1 KiB each: ten segments.
const SENT: u64 = 100;
/// The topic's size limit: about two segments and a half.
const MAX_SIZE: i64 = 25_000;

/// Brokers with segments of [`ENTRIES`] ids, whose retention runs only
/// when a segment rolls (the periodic pass an hour apart, so a new leader
/// does not trim on its own within the test).
fn options(root: &Path) -> SpawnOptions {
    let config = root.join("broker.toml");
    std::fs::write(
        &config,
        format!("segment_entries = {ENTRIES}\nretention_interval = \"1h\"\n"),
    )
    .unwrap();
    SpawnOptions::new().config(config)
}

fn stored(topic: &str) -> String {
    format!("persistent://public/default/{topic}")
}

/// The segment files of `topic`'s log on `broker`'s disk: first id and
/// bytes of each, by first id.
pub(crate) fn segments(broker: &ClusterBroker, topic: &str) -> Vec<(u64, u64)> {
    let dir = broker.dir.join("log").join(dir_name(&stored(topic)));
    let Ok(read) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut segments: Vec<(u64, u64)> = read
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let first = name.strip_suffix(".seg")?.parse().ok()?;
            Some((first, e.metadata().ok()?.len()))
        })
        .collect();
    segments.sort_unstable();
    segments
}

/// Publishes a 200 B message every 100 ms for `span` (each awaited to its
/// receipt: committed by the group); returns how many.
pub(crate) async fn trickle(c: &Client, t: &str, span: Duration) -> u64 {
    let p = c.producer(t).create().await.unwrap();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < span {
        p.send(vec![sent as u8; 200]).await.unwrap();
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sent
}

/// Sets the size retention on `t` (answered by its leader), publishes
/// [`SENT`] messages of 1 KiB, and waits until the leader's retention
/// dropped all but the last segments: the leader's first id then.
async fn fill(c: &Client, t: &str) -> u64 {
    let target = RetentionTarget::Topic(t.to_owned());
    let policy = RetentionPolicy {
        max_size_bytes: Some(MAX_SIZE),
        ..Default::default()
    };
    c.admin().set_retention(&target, policy).await.unwrap();
    let p = c.producer(t).create().await.unwrap();
    for i in 0..SENT {
        p.send(vec![i as u8; 1024]).await.unwrap();
    }
    let start = Instant::now();
    loop {
        let first = c.admin().topic_stats(t).await.unwrap().first_entry_id;
        // 1 KiB messages in a 25 000 B limit: at most three segments kept.
        if first >= SENT - 3 * ENTRIES {
            return first;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the leader's retention dropped nothing: first id {first}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_retention_trims_every_followers_segments() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("the_leaders_retention_trims_every_followers").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "trimmed";
    let (brokers, _ids, leader, victim) =
        led_group_with(&etcd, "rtrim", root.path(), t, &options(root.path())).await;
    let c = client(&brokers[victim].url()).await;
    let first = fill(&c, t).await;
    assert_eq!(first % ENTRIES, 0, "a trim drops whole segments: {first}");
    let on_leader = segments(&brokers[victim], t);
    assert!(
        on_leader.first().is_some_and(|(f, _)| *f >= first),
        "the leader {leader}'s files: {on_leader:?}"
    );

    // Each follower's files follow within seconds: its first segment is
    // the leader's first id (segments of 10 ids end at the same ids on
    // every replica), and it holds about what the leader holds.
    for (i, b) in brokers.iter().enumerate().filter(|(i, _)| *i != victim) {
        let start = Instant::now();
        loop {
            let held = segments(b, t);
            if held.first().is_some_and(|(f, _)| *f == first) {
                let bytes: u64 = held.iter().map(|(_, n)| n).sum();
                let kept = (SENT - first) * 1100;
                assert!(
                    bytes <= kept,
                    "follower b{i} holds {bytes} B in {held:?}, more than {kept} B"
                );
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "follower b{i}'s segments 10 s after the leader {leader} trimmed below {first}: \
                 {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_leaders_kill_the_next_leader_serves_no_trimmed_id() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("after_the_leaders_kill_the_next_leader_serves").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "takeover";
    let (mut brokers, ids, leader, victim) =
        led_group_with(&etcd, "rtrimk", root.path(), t, &options(root.path())).await;
    let c = client(&brokers[victim].url()).await;
    let first = fill(&c, t).await;
    drop(c);

    brokers[victim].kill9();
    let follower = (victim + 1) % 3;
    let (next, next_url) = next_leader(&brokers[follower].url(), t, &ids, &leader).await;
    let c2 = client(&next_url).await;

    let stats = c2.admin().topic_stats(t).await.unwrap();
    assert_eq!(
        (stats.first_entry_id, stats.next_entry_id),
        (first, SENT),
        "the new leader {next}'s log (the old one {leader} kept {first}..{SENT})"
    );
    for id in [0, first - 1] {
        let e = c2
            .admin()
            .message(&MessageId::new(stored(t), id))
            .await
            .expect_err("a trimmed id is served");
        assert_eq!(e.kind(), ErrorKind::NotFound, "id {id} on {next}: {e:?}");
    }
    let kept = c2
        .admin()
        .message(&MessageId::new(stored(t), first))
        .await
        .expect("the first kept id");
    assert_eq!(
        kept.message.map(|m| m.payload),
        Some(vec![first as u8; 1024])
    );

    // A subscription from the earliest id starts at the trim point.
    let mut late = c2
        .consumer(t)
        .subscription("late")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), late.receive())
        .await
        .expect("a message within 10 s")
        .unwrap();
    assert_eq!(
        m.id().entry_id(),
        first,
        "the first message {next} delivers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_every_subscription_consumed_leave_every_replica() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("segments_every_subscription_consumed_leave").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "consumed";
    let (brokers, _ids, leader, victim) =
        led_group_with(&etcd, "rtrimc", root.path(), t, &options(root.path())).await;
    let c = client(&brokers[victim].url()).await;
    let mut all = c
        .consumer(t)
        .subscription("all")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let p = c.producer(t).create().await.unwrap();
    for i in 0..SENT {
        p.send(vec![i as u8; 1024]).await.unwrap();
    }
    for _ in 0..SENT {
        let m = tokio::time::timeout(Duration::from_secs(10), all.receive())
            .await
            .expect("a message within 10 s")
            .unwrap();
        all.ack(&m).await.unwrap();
    }

    // No retention: the subscription's acks alone free the nine sealed
    // segments (the tenth is the one written to), on every replica.
    let last = (SENT - 1) / ENTRIES * ENTRIES;
    for (i, b) in brokers.iter().enumerate() {
        let start = Instant::now();
        loop {
            let held = segments(b, t);
            if held.first().is_some_and(|(f, _)| *f == last) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "b{i}'s segments 15 s after every message was acked (leader {leader}): {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A busy topic's segments roll by age through its group: with segments
/// of 100 000 ids (no block roll) and `segment_max_age = "2s"`, a message
/// every 100 ms for 6 s; every replica's segments start at the same ids,
/// with at least one age roll, and its sealed segments have the same
/// sizes (the same records). Without the leader's seal pass (no
/// `[tiered]` here) nothing would roll at all: appends applied from the
/// group's log roll by block and size only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_topics_age_rolls_are_the_groups_at_the_same_ids_on_every_replica() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_busy_topics_age_rolls_are_the_groups").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("broker.toml");
    std::fs::write(
        &config,
        "segment_entries = 100000\nsegment_max_age = \"2s\"\nretention_interval = \"1h\"\n",
    )
    .unwrap();
    let options = SpawnOptions::new().config(&config);
    let t = "busy";
    let (brokers, _ids, leader, at) =
        led_group_with(&etcd, "rbusy", root.path(), t, &options).await;
    let c = client(&brokers[at].url()).await;
    let sent = trickle(&c, t, Duration::from_secs(6)).await;
    // Every replica applied every entry, and holds the same segments.
    let start = Instant::now();
    loop {
        let held: Vec<Vec<(u64, u64)>> = brokers.iter().map(|b| segments(b, t)).collect();
        let firsts: Vec<Vec<u64>> = held
            .iter()
            .map(|h| h.iter().map(|(f, _)| *f).collect())
            .collect();
        let sealed: Vec<&[(u64, u64)]> = held
            .iter()
            .map(|h| &h[..h.len().saturating_sub(1)])
            .collect();
        if firsts.iter().all(|f| *f == firsts[0])
            && sealed.iter().all(|s| *s == sealed[0])
            && firsts[0].len() >= 2
        {
            eprintln!("a_busy_topics_age_rolls: {sent} sent, leader {leader}, segments {held:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{sent} sent (leader {leader}); each replica's segments (first id, bytes): {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
