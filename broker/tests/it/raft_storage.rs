//! `ReplicatedStorage` (issue 22, step 4's interception point) on three
//! in-process replicas: a write through it returns only once the group
//! committed it (a queued append or cursor: its `flush` returns only then,
//! and many queued at once commit in their order), every replica's store
//! then holds it, a leader without a
//! majority answers an error (never `Ok`) and applies nothing, a replay
//! job's id raises every replica's id counter, and a mutating method no
//! command replicates fails instead of writing one replica.

use crate::raft::cluster::{Cluster, TOPIC, subscription};
use ricochet_broker::replication::ReplicatedStorage;
use ricochet_broker::storage::prelude::*;
use ricochet_broker::storage::{
    FailureRecord, ReplayJobRecord, ReplayOrder, ReplayTarget, Storage, StorageError, SubMessage,
    TierId,
};
use std::sync::Arc;
use std::time::Duration;

fn entries(from: u64, n: u64) -> Vec<Vec<u8>> {
    (from..from + n)
        .map(|i| {
            use prost::Message as _;
            ricochet_proto::Message {
                payload: format!("m{i}").into_bytes(),
                producer_name: "p".into(),
                sequence_id: i,
                ..Default::default()
            }
            .encode_to_vec()
        })
        .collect()
}

fn replay_job(id: u64) -> ReplayJobRecord {
    ReplayJobRecord {
        id,
        topic: TOPIC.to_owned(),
        subscription: "s".to_owned(),
        dead_letter_ids: vec![1, 2],
        total: 2,
        cursor: 0,
        replayed: 0,
        rate_per_second: 1,
        order: ReplayOrder {
            target: ReplayTarget::Topic,
            reset_count: false,
            edit: None,
            by: "test".to_owned(),
        },
        created_ms: 1,
    }
}

fn held(storage: &Arc<dyn Storage>) -> (u64, u64) {
    storage.entry_range(TOPIC).expect("entry range")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_replicated_storage_are_committed_before_they_return() {
    let mut c = Cluster::start(false).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    let rs = ReplicatedStorage::new(c.node(leader).part_arc(), Duration::from_secs(2));

    let (_, next) = rs.entry_range(TOPIC).unwrap();
    // An append is queued, not awaited: `flush` waits for its commit.
    rs.append(TOPIC, next, &entries(next, 5), Some(("p", 4)))
        .expect("append queued");
    rs.flush().await.expect("append committed");
    rs.put_subscription(&subscription(7, 3)).expect("acks");
    let nacked = SubMessage {
        sub_id: 7,
        tier: TierId::Main,
        entry_id: 3,
    };
    let count2 = FailureRecord {
        count: 2,
        ..FailureRecord::default()
    };
    rs.put_failures(&[(nacked, Some(count2.clone()))])
        .expect("failure record");
    // Read back through the wrapper: the leader's local store.
    assert_eq!(rs.entry_range(TOPIC).unwrap(), (next, next + 5));
    assert_eq!(rs.producer_sequences(TOPIC).unwrap(), [("p".into(), 4)]);

    // Every replica applied the same.
    for id in (1..=3).filter(|id| *id != leader) {
        c.caught_up(id, leader).await;
        let s = c.node(id).part().storage();
        assert_eq!(held(s), (next, next + 5), "node {id}");
        let subs = s.list_subscriptions(TOPIC).unwrap();
        assert_eq!(subs.len(), 1, "node {id}");
        assert!(subs[0].main.is_acked(2) && !subs[0].main.is_acked(3));
        let f = s.failure(nacked, None).unwrap().expect("failure record");
        assert_eq!(f.count, 2, "node {id}");
    }

    // A replay job is stored on every replica, and every replica's id
    // counter passes its id (a later leader never hands it out again).
    let mut above = 0;
    for id in 1..=3 {
        above = above.max(c.node(id).part().storage().next_id().unwrap());
    }
    let job = replay_job(above + 1000);
    rs.put_replay_job(&job).expect("replay job committed");
    for id in 1..=3 {
        c.caught_up(id, leader).await;
        let s = c.node(id).part().storage();
        assert_eq!(
            s.replay_jobs(true).unwrap(),
            std::slice::from_ref(&job),
            "node {id}"
        );
        let next = s.next_id().unwrap();
        assert!(next > job.id, "node {id}: next id {next}, job {}", job.id);
    }
    rs.remove_replay_job(job.id).expect("removal committed");
    for id in 1..=3 {
        c.caught_up(id, leader).await;
        let jobs = c.node(id).part().storage().replay_jobs(false).unwrap();
        assert!(jobs.is_empty(), "node {id}: {jobs:?}");
    }

    // A method without a replicated command fails and writes nothing.
    let e = rs
        .restore_producer_sequences(TOPIC, &[("q".into(), 9)])
        .unwrap_err();
    assert!(
        matches!(&e, StorageError::Replication(m) if m.contains("restore_producer_sequences")),
        "{e:?}"
    );
    assert_eq!(rs.producer_sequences(TOPIC).unwrap(), [("p".into(), 4)]);

    // Many appends queued at once, none awaited: one flush waits for all,
    // and every replica holds them in the order they were queued.
    // (Each batch's id is its last message's, as a publish's is: the log's
    // messages are what the ids past sled's checkpoint are read back from.)
    let mut at = next + 5;
    for _ in 0..50u64 {
        rs.append(TOPIC, at, &entries(at, 3), Some(("p", at + 2)))
            .expect("append queued");
        at += 3;
    }
    rs.put_subscription_queued(&subscription(7, 100))
        .expect("cursor queued");
    rs.flush().await.expect("every queued write committed");
    for id in 1..=3 {
        c.caught_up(id, leader).await;
        let s = c.node(id).part().storage();
        assert_eq!(held(s), (next, at), "node {id}");
        for probe in [next + 5, next + 80, at - 1] {
            let e = s.read_one(TOPIC, probe).unwrap().expect("entry");
            assert_eq!(e, entries(probe, 1)[0], "node {id}, entry {probe}");
        }
        let subs = s.list_subscriptions(TOPIC).unwrap();
        assert!(subs[0].main.is_acked(99), "node {id}");
    }
    assert_eq!(
        rs.producer_sequences(TOPIC).unwrap(),
        [("p".into(), at - 1)]
    );

    // Both followers down: the appends are queued but never committed:
    // the flush fails, the leader applied nothing, and the storage refuses
    // every later write (its topic is reopened from what the group applied).
    for id in (1..=3).filter(|id| *id != leader) {
        c.node_mut(id).kill();
    }
    rs.append(TOPIC, at, &entries(at, 5), Some(("p", 60)))
        .expect("queued");
    rs.append(TOPIC, at + 5, &entries(at + 5, 5), Some(("p", 61)))
        .expect("queued behind it");
    let e = rs.flush().await.unwrap_err();
    assert!(matches!(e, StorageError::Replication(_)), "{e:?}");
    assert_eq!(held(c.node(leader).part().storage()), (next, at));
    assert!(rs.is_poisoned());
    let e = rs
        .append(TOPIC, at + 10, &entries(at + 10, 1), Some(("p", 62)))
        .unwrap_err();
    assert!(matches!(e, StorageError::Replication(_)), "{e:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_replicated_write_on_a_current_thread_runtime_is_an_error_not_a_panic() {
    let c = Cluster::start(false).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    let rs = ReplicatedStorage::new(c.node(leader).part_arc(), Duration::from_secs(2));
    let e = rs.put_subscription(&subscription(1, 0)).unwrap_err();
    assert!(
        matches!(&e, StorageError::Replication(m) if m.contains("multi-thread")),
        "{e:?}"
    );
}
