//! A replicated partition on three in-process Raft replicas (issue 22):
//! a publish is acknowledged only once a majority has it; after the
//! leader is killed a new one is elected and holds every acknowledged
//! publish exactly once; a replica that was down catches up, with the
//! subscription state (acks, delivery counts, tier moves) as well as the
//! entries; a leader cut off by the network acknowledges nothing more.

use crate::raft::cluster::{
    Cluster, TOPIC, batch, publish_within, stored, subscription, topic_record,
};
use ricochet_broker::replication::{PartitionCommand, PartitionReply};
use ricochet_broker::storage::{
    Arrival, DeadLetterRecord, FailureRecord, MoveItem, SubMessage, TierId, TierMove, TopicKind,
};
use std::time::Duration;

fn sequences(entries: &[(u64, String, u64)], producer: &str) -> Vec<u64> {
    entries
        .iter()
        .filter(|(_, p, _)| p == producer)
        .map(|(_, _, s)| *s)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_is_acknowledged_only_once_a_majority_has_it() {
    let mut c = Cluster::start(false).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    let first = publish_within(
        c.node(leader).part(),
        batch("p", 1, 10),
        Duration::from_secs(5),
    )
    .await
    .expect("answered")
    .expect("published with all three up");
    assert_eq!(first.len(), 10);

    // Both followers down: the leader alone is no majority.
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for f in &followers {
        c.node_mut(*f).kill();
    }
    let alone = publish_within(
        c.node(leader).part(),
        batch("p", 11, 10),
        Duration::from_secs(3),
    )
    .await;
    assert!(
        !matches!(alone, Some(Ok(_))),
        "a leader without a majority acknowledged a publish: {alone:?}"
    );
    let held = stored(c.node(leader).part().storage());
    assert_eq!(
        sequences(&held, "p"),
        (1..=10).collect::<Vec<_>>(),
        "an uncommitted publish was applied"
    );

    // One follower back: two of three are a majority again.
    c.restart(followers[0]).await;
    let leader = c.leader().await;
    let receipts = publish_within(
        c.node(leader).part(),
        batch("p", 11, 10),
        Duration::from_secs(10),
    )
    .await
    .expect("answered")
    .expect("published with a majority");
    assert_eq!(receipts.len(), 10);
    // The follower that made the majority has the entries too.
    let other = (1..=3)
        .find(|id| *id != leader && c.node(*id).alive())
        .expect("the other live node");
    c.caught_up(other, leader).await;
    let there = stored(c.node(other).part().storage());
    assert_eq!(sequences(&there, "p"), (1..=20).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_leader_is_killed_every_acknowledged_publish_is_there_once() {
    let mut c = Cluster::start(false).await;
    let mut leader = c.leader().await;
    c.create_topic(leader).await;
    let mut acked: Vec<u64> = Vec::new();
    let mut seq = 1u64;
    let mut killed = None;
    let mut resent_duplicates = None;
    // 60 batches of 5. After 20 acknowledged batches, the next one is
    // committed (a follower applied it) and the leader killed before its
    // receipt is read: the producer resends it, with the same sequence ids,
    // to whoever leads next, as it resends any batch left unanswered.
    while acked.len() < 300 {
        if acked.len() == 100 && killed.is_none() {
            let part = c.node(leader).part_arc();
            let unanswered = tokio::spawn(async move { part.publish(batch("p", 101, 5)).await });
            let follower = (1..=3).find(|id| *id != leader).expect("a follower");
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !sequences(&stored(c.node(follower).part().storage()), "p").contains(&101) {
                assert!(std::time::Instant::now() < deadline, "batch not committed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            c.node_mut(leader).kill();
            unanswered.abort();
            killed = Some(leader);
            leader = c.leader_except(killed).await;
        }
        match publish_within(
            c.node(leader).part(),
            batch("p", seq, 5),
            Duration::from_secs(2),
        )
        .await
        {
            Some(Ok(receipts)) => {
                assert_eq!(receipts.len(), 5);
                if seq == 101 {
                    resent_duplicates = Some(receipts.iter().all(|r| r.entry_id.is_none()));
                }
                acked.extend(receipts.iter().map(|r| r.sequence_id));
                seq += 5;
            }
            _ => leader = c.leader_except(killed).await,
        }
    }
    let old = killed.expect("the leader was killed");
    assert_ne!(leader, old, "a new leader was elected");
    assert_eq!(
        resent_duplicates,
        Some(true),
        "the resent committed batch is a duplicate"
    );
    let held = stored(c.node(leader).part().storage());
    let seqs = sequences(&held, "p");
    assert_eq!(seqs, acked, "every acknowledged publish once, in order");
    let ids: Vec<u64> = held.iter().map(|(id, _, _)| *id).collect();
    let dense: Vec<u64> = (ids[0]..ids[0] + 300).collect();
    assert_eq!(ids, dense, "ids dense, no entry twice");
    // The third replica holds the same log.
    let third = (1..=3)
        .find(|id| *id != leader && *id != old)
        .expect("third node");
    c.caught_up(third, leader).await;
    let there = stored(c.node(third).part().storage());
    let differ = there.iter().zip(&held).position(|(a, b)| a != b);
    assert!(
        there == held,
        "node {third} holds {} entries, the leader {}; first difference at {differ:?}: {:?} / {:?}; applied {:?} / {:?}",
        there.len(),
        held.len(),
        differ.map(|i| &there[i]),
        differ.map(|i| &held[i]),
        c.node(third).part().node().applied_index(),
        c.node(leader).part().node().applied_index(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_was_down_catches_up_entries_and_subscription_state() {
    let mut c = Cluster::start(false).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    let down = (1..=3).find(|id| *id != leader).expect("a follower");
    c.node_mut(down).kill();
    let part = c.node(leader).part();
    for b in 0..50 {
        let r = publish_within(part, batch("p", 1 + b * 4, 4), Duration::from_secs(5)).await;
        assert!(matches!(r, Some(Ok(_))), "batch {b}: {r:?}");
    }
    // Subscription state while it is down: acks, a nack's count, a retry
    // move and a dead-letter move.
    let retry = format!("{TOPIC}-sub-RETRY");
    let dlq = format!("{TOPIC}-sub-DLQ");
    let propose =
        |cmd: PartitionCommand| async move { part.propose(&cmd).await.expect("proposed") };
    assert_eq!(
        propose(PartitionCommand::CreateTopic(topic_record(
            &retry,
            TopicKind::Retry
        )))
        .await,
        PartitionReply::Done
    );
    assert_eq!(
        propose(PartitionCommand::CreateTopic(topic_record(
            &dlq,
            TopicKind::DeadLetter
        )))
        .await,
        PartitionReply::Done
    );
    assert_eq!(
        propose(PartitionCommand::PutSubscription(subscription(7, 10))).await,
        PartitionReply::Done
    );
    let nacked = SubMessage {
        sub_id: 7,
        tier: TierId::Main,
        entry_id: 12,
    };
    let count2 = FailureRecord {
        count: 2,
        ..FailureRecord::default()
    };
    assert_eq!(
        propose(PartitionCommand::PutFailures(vec![(
            nacked,
            Some(count2.clone())
        )]))
        .await,
        PartitionReply::Done
    );
    let to_retry = TierMove {
        target_topic: retry.clone(),
        subscription: subscription(7, 11),
        items: vec![MoveItem {
            from: SubMessage {
                sub_id: 7,
                tier: TierId::Main,
                entry_id: 10,
            },
            from_schedule: None,
            source: None,
            payload: b"retry me".to_vec(),
            target_entry_id: 0,
            failures: FailureRecord {
                count: 1,
                ..FailureRecord::default()
            },
            arrival: Arrival::Retry { due_ms: 5_000 },
        }],
    };
    assert_eq!(
        propose(PartitionCommand::MoveMessages(to_retry)).await,
        PartitionReply::Done
    );
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
    let to_dlq = TierMove {
        target_topic: dlq.clone(),
        subscription: subscription(7, 12),
        items: vec![MoveItem {
            from: SubMessage {
                sub_id: 7,
                tier: TierId::Main,
                entry_id: 11,
            },
            from_schedule: None,
            source: None,
            payload: b"dead".to_vec(),
            target_entry_id: 0,
            failures: FailureRecord {
                count: 3,
                ..FailureRecord::default()
            },
            arrival: Arrival::DeadLetter(dead),
        }],
    };
    assert_eq!(
        propose(PartitionCommand::MoveMessages(to_dlq)).await,
        PartitionReply::Done
    );

    c.restart(down).await;
    c.caught_up(down, leader).await;
    let (want, have) = (
        c.node(leader).part().storage(),
        c.node(down).part().storage(),
    );
    assert_eq!(stored(have), stored(want));
    assert_eq!(stored(have).len(), 200);
    let sub = |s: &std::sync::Arc<dyn ricochet_broker::storage::Storage>| {
        let subs = s.list_subscriptions(TOPIC).expect("subscriptions");
        assert_eq!(subs.len(), 1);
        (
            subs[0].main.clone(),
            s.subscription_state(7).expect("state"),
        )
    };
    let (cursor, state) = sub(have);
    assert_eq!((cursor.clone(), state.clone()), sub(want));
    assert!(
        cursor.is_acked(11) && !cursor.is_acked(12),
        "cursor replicated: {cursor:?}"
    );
    assert_eq!(have.failure(nacked, None).expect("failure"), Some(count2));
    assert_eq!(have.entry_range(&retry).expect("retry"), (0, 1));
    assert_eq!(have.entry_range(&dlq).expect("dlq"), (0, 1));
    assert_eq!(have.count_dead_letters(7).expect("dead letters"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_acknowledges_nothing_more() {
    let c = Cluster::start(true).await;
    let old = c.leader().await;
    c.create_topic(old).await;
    let r = publish_within(c.node(old).part(), batch("p", 1, 5), Duration::from_secs(5)).await;
    assert!(matches!(r, Some(Ok(_))), "{r:?}");
    // Cut every link to and from the leader, both directions.
    for ((from, to), proxy) in &c.proxies {
        if *from == old || *to == old {
            proxy.isolate();
        }
    }
    let cut_off = c.node(old).part_arc();
    let pending = tokio::spawn(async move { cut_off.publish(batch("cut", 1, 5)).await });
    let new = c.leader_except(Some(old)).await;
    let r = publish_within(c.node(new).part(), batch("p", 6, 5), Duration::from_secs(5)).await;
    assert!(
        matches!(r, Some(Ok(_))),
        "the majority's leader publishes: {r:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !pending.is_finished(),
        "the cut-off leader answered: {:?}",
        pending.await
    );
    for proxy in c.proxies.values() {
        proxy.heal();
    }
    c.caught_up(old, new).await;
    // Back in the group, the old leader follows; what it took while cut
    // off was never committed and is nowhere.
    let answer = tokio::time::timeout(Duration::from_secs(10), pending).await;
    if let Ok(Ok(Ok(receipts))) = &answer {
        panic!("the cut-off publish was acknowledged: {receipts:?}");
    }
    for id in 1..=3 {
        c.caught_up(id, new).await;
        let held = stored(c.node(id).part().storage());
        assert!(sequences(&held, "cut").is_empty(), "node {id}: {held:?}");
        assert_eq!(sequences(&held, "p"), (1..=10).collect::<Vec<_>>());
    }
    assert_eq!(c.leader().await, new);
}
