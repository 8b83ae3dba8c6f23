//! Snapshots of a replicated partition (issue 22) on three in-process
//! replicas: a group that snapshots every few entries purges its log, a
//! replica that was down past the purge catches up from a snapshot (the
//! entries and every piece of subscription state), and a replica killed
//! part-way through installing one comes back with the same store once
//! it restarts.

use crate::raft::cluster::{
    Cluster, TOPIC, batch, publish_within, settings, stored, subscription, topic_record,
};
use ricochet_broker::replication::{NodeSettings, PartitionCommand, PartitionReply};
use ricochet_broker::storage::{
    Arrival, DeadLetterRecord, FailureRecord, MoveItem, ReplayJobRecord, ReplayOrder, ReplayTarget,
    RetentionRecord, Storage, SubMessage, TierId, TierMove, TopicKind,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RETRY: &str = "persistent://public/default/replicated-partition-0-sub-RETRY";
const DLQ: &str = "persistent://public/default/replicated-partition-0-sub-DLQ";

/// Snapshots every 20 entries, 5 kept behind each.
fn snapshotting() -> NodeSettings {
    NodeSettings {
        snapshot_every: 20,
        snapshot_keep: 5,
        ..settings()
    }
}

fn move_item(entry_id: u64, payload: &[u8], count: u32, arrival: Arrival) -> MoveItem {
    MoveItem {
        from: SubMessage {
            sub_id: 7,
            tier: TierId::Main,
            entry_id,
        },
        from_schedule: None,
        source: None,
        payload: payload.to_vec(),
        target_entry_id: 0,
        failures: FailureRecord {
            count,
            ..FailureRecord::default()
        },
        arrival,
    }
}

/// 50 batches of 4 from producer `p`, then a subscription's state: acks,
/// a nack's count, a retry move, a dead-letter move and a replay job,
/// all through `leader`.
async fn history(c: &Cluster, leader: u64) {
    let part = c.node(leader).part();
    for b in 0..50 {
        let r = publish_within(part, batch("p", 1 + b * 4, 4), Duration::from_secs(5)).await;
        assert!(matches!(r, Some(Ok(_))), "batch {b}: {r:?}");
    }
    let dead = DeadLetterRecord {
        origin_topic: TOPIC.to_owned(),
        origin_entry_id: 11,
        reason: "max redeliveries".to_owned(),
        at_ms: 1,
        failures: FailureRecord {
            count: 3,
            ..FailureRecord::default()
        },
        replay: None,
    };
    let commands = vec![
        PartitionCommand::PutRetention(RetentionRecord {
            target: TOPIC.to_owned(),
            backlog_quota_bytes: Some(4096),
            ..RetentionRecord::default()
        }),
        PartitionCommand::CreateTopic(topic_record(RETRY, TopicKind::Retry)),
        PartitionCommand::CreateTopic(topic_record(DLQ, TopicKind::DeadLetter)),
        PartitionCommand::PutSubscription(subscription(7, 10)),
        PartitionCommand::PutFailures(vec![(
            SubMessage {
                sub_id: 7,
                tier: TierId::Main,
                entry_id: 12,
            },
            Some(FailureRecord {
                count: 2,
                ..FailureRecord::default()
            }),
        )]),
        PartitionCommand::MoveMessages(TierMove {
            target_topic: RETRY.to_owned(),
            subscription: subscription(7, 11),
            items: vec![move_item(
                10,
                b"retry me",
                1,
                Arrival::Retry { due_ms: 5_000 },
            )],
        }),
        PartitionCommand::MoveMessages(TierMove {
            target_topic: DLQ.to_owned(),
            subscription: subscription(7, 12),
            items: vec![move_item(11, b"dead", 3, Arrival::DeadLetter(dead))],
        }),
        PartitionCommand::PutReplayJob(ReplayJobRecord {
            id: 9_000,
            topic: TOPIC.to_owned(),
            subscription: "sub".to_owned(),
            dead_letter_ids: vec![0],
            total: 1,
            cursor: 0,
            replayed: 0,
            rate_per_second: 1,
            order: ReplayOrder {
                target: ReplayTarget::Topic,
                reset_count: false,
                edit: None,
                by: "anonymous".to_owned(),
            },
            created_ms: 1,
        }),
    ];
    for cmd in commands {
        let reply = part.propose(&cmd).await.expect("proposed");
        assert_eq!(reply, PartitionReply::Done, "{cmd:?}");
    }
}

/// The group's trim point of the partition's log in `s`, and the entries
/// at or above it (what a leader serves; a replica may hold a few more
/// below it, in a segment it kept).
fn served(s: &Arc<dyn Storage>) -> (u64, Vec<(u64, String, u64)>) {
    let point = s
        .list_topics()
        .expect("topics")
        .into_iter()
        .find(|t| t.name == TOPIC)
        .map_or(0, |t| t.trimmed_below);
    let mut entries = stored(s);
    entries.retain(|(id, _, _)| *id >= point);
    (point, entries)
}

/// Everything a replica holds of the partition, to compare two replicas.
fn holdings(s: &Arc<dyn Storage>) -> String {
    let subs = s.list_subscriptions(TOPIC).expect("subscriptions");
    let states: Vec<_> = subs
        .iter()
        .map(|r| {
            (
                r.id,
                r.main.clone(),
                s.subscription_state(r.id).expect("state"),
            )
        })
        .collect();
    let jobs: Vec<_> = s
        .replay_jobs(true)
        .expect("jobs")
        .into_iter()
        .filter(|j| j.topic == TOPIC)
        .collect();
    let tier = |t: &str| {
        let (first, next) = s.entry_range(t).expect("range");
        (
            first,
            next,
            s.read(t, first, 100, usize::MAX).expect("read"),
        )
    };
    format!(
        "served {:?}\nsequences {:?}\nsubscriptions {states:?}\njobs {jobs:?}\nretention {:?}\nretry {:?}\ndlq {:?}\ndead letters {}",
        served(s),
        s.producer_sequences(TOPIC).expect("sequences"),
        s.retention_policies().expect("retention"),
        tier(RETRY),
        tier(DLQ),
        s.count_dead_letters(7).expect("dead letters"),
    )
}

/// Waits until the leader purged its log past `index`.
async fn purged_past(c: &Cluster, leader: u64, index: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let node = c.node(leader).part().node();
        if node.purged_index().is_some_and(|p| p > index) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the leader's log is not purged past {index}: snapshot {:?}, purged {:?}",
            node.snapshot_index(),
            node.purged_index()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_the_purged_log_catches_up_from_a_snapshot() {
    let mut c = Cluster::start_with(false, snapshotting()).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    let down = (1..=3).find(|id| *id != leader).expect("a follower");
    let had = c.node(down).part().node().applied_index().unwrap_or(0);
    c.node_mut(down).kill();
    history(&c, leader).await;
    // The group trims the log below id 40 (every replica's segments hold
    // 16 384 ids, so none is dropped from disk: the trim point alone hides
    // them), and batches follow until a snapshot after it purged the log.
    let trim = PartitionCommand::trim_log(&topic_record(TOPIC, TopicKind::Normal), 40);
    let reply = c.node(leader).part().propose(&trim).await.expect("trim");
    assert_eq!(reply, PartitionReply::Done);
    let trimmed_at = c.node(leader).part().node().applied_index().unwrap_or(0);
    let mut more = 0;
    while c
        .node(leader)
        .part()
        .node()
        .purged_index()
        .is_none_or(|p| p <= trimmed_at)
    {
        assert!(more < 40, "no purge past the trim at {trimmed_at}");
        let r = publish_within(
            c.node(leader).part(),
            batch("r", 1 + more * 4, 4),
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(r, Some(Ok(_))), "batch {more}: {r:?}");
        more += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    purged_past(&c, leader, had + 1).await;
    let sent = 200 + 4 * more as usize;

    c.restart(down).await;
    c.caught_up(down, leader).await;
    let installed = c.node(down).part().node().snapshot_index();
    assert!(
        installed.is_some_and(|i| i > had),
        "the replica caught up without a snapshot: {installed:?}"
    );
    let (want, have) = (
        c.node(leader).part().storage().clone(),
        c.node(down).part().storage().clone(),
    );
    // The snapshot carried the trim point, and no entry below it.
    let (point, entries) = served(&have);
    assert_eq!((point, entries.len()), (40, sent - 40));
    assert_eq!(entries.len(), stored(&have).len());
    assert_eq!(holdings(&have), holdings(&want));
    assert!(
        have.list_subscriptions(TOPIC).expect("subs")[0]
            .main
            .is_acked(11)
    );

    // The group goes on with the installed replica: later writes reach
    // it, and a resend of an early batch is a duplicate there too (its
    // producer sequences came with the snapshot).
    let r = publish_within(
        c.node(leader).part(),
        batch("p", 201, 4),
        Duration::from_secs(5),
    )
    .await;
    assert!(matches!(r, Some(Ok(_))), "{r:?}");
    c.node_mut(leader).kill();
    let next = c.leader_except(Some(leader)).await;
    let resent = publish_within(
        c.node(next).part(),
        batch("p", 1, 4),
        Duration::from_secs(5),
    )
    .await
    .expect("answered")
    .expect("published");
    assert!(
        resent.iter().all(|r| r.entry_id.is_none()),
        "a resend after the snapshot was stored again: {resent:?}"
    );
    for id in (1..=3).filter(|id| *id != leader) {
        c.caught_up(id, next).await;
        let (point, entries) = served(c.node(id).part().storage());
        assert_eq!((point, entries.len()), (40, sent + 4 - 40), "node {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_install_comes_back_consistent() {
    let mut c = Cluster::start_with(false, snapshotting()).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    // The replica holds something of its own before it goes down: 10
    // batches of producer q.
    for b in 0..10 {
        let r = publish_within(
            c.node(leader).part(),
            batch("q", 1 + b * 4, 4),
            Duration::from_secs(5),
        )
        .await;
        assert!(matches!(r, Some(Ok(_))), "batch {b}: {r:?}");
    }
    let down = (1..=3).find(|id| *id != leader).expect("a follower");
    c.caught_up(down, leader).await;
    let had = c.node(down).part().node().applied_index().unwrap_or(0);
    c.node_mut(down).kill();
    history(&c, leader).await;
    purged_past(&c, leader, had + 1).await;

    // Back with a fault: its install stops after 8 KiB of the snapshot
    // (about a quarter of it), as a kill -9 part-way would stop it.
    c.settings.cut_installs_after = Some(8 << 10);
    c.restart(down).await;
    c.settings.cut_installs_after = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = c.node(down).part().node().raft().metrics().borrow().clone();
        if m.running_state.is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cut install did not stop the replica: applied {:?}",
            m.last_applied
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let partial = stored(c.node(down).part().storage()).len();
    // Neither its old copy (40 entries) nor the snapshot's (240): the
    // old copy was deleted and the new one not written whole.
    assert!(
        partial != 40 && partial < 240,
        "the install was not cut part-way: {partial} entries there"
    );
    c.node_mut(down).kill();

    // At its start, before its Raft runs, the replica finishes the
    // install it began: the snapshot's entries (those up to its index;
    // the log after it brings the rest) are there at once, read as soon
    // as the node is back, before a leader could send it anything.
    c.restart(down).await;
    let at_start = stored(c.node(down).part().storage()).len();
    assert!(
        at_start > partial && at_start != 40,
        "the cut install was not finished at the start: {at_start} entries, {partial} after the cut"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .node(down)
        .part()
        .node()
        .snapshot_index()
        .is_none_or(|i| i <= had)
    {
        assert!(Instant::now() < deadline, "no snapshot after the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.caught_up(down, leader).await;
    let (want, have) = (
        c.node(leader).part().storage().clone(),
        c.node(down).part().storage().clone(),
    );
    assert_eq!(holdings(&have), holdings(&want));
    assert_eq!(stored(&have).len(), 240);
    // And it follows on from there.
    let r = publish_within(
        c.node(leader).part(),
        batch("p", 201, 4),
        Duration::from_secs(5),
    )
    .await;
    assert!(matches!(r, Some(Ok(_))), "{r:?}");
    c.caught_up(down, leader).await;
    assert_eq!(stored(c.node(down).part().storage()).len(), 244);
}
