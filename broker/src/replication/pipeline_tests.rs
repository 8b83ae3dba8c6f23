//! The leader's write queue on a one-member group (a real Raft node, its
//! log in a temp dir, applying to a memory store): the commands queued
//! together are one entry each below the coalescing level and share
//! entries at it, with the same replies and the same store; a refused
//! command fails its own caller and poisons the queue in both modes; a
//! `Publish` is proposed alone.

use super::pipeline::{Outcome, Pipeline};
use super::*;
use crate::storage::{MemoryStorage, TopicKind};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::sync::oneshot;

const T: &str = "persistent://public/default/pipe";

/// A started one-member group leading, with `T` created.
async fn leader(dir: &Path) -> Arc<ReplicatedPartition> {
    let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
    let registry = GroupRegistry::default();
    let part = ReplicatedPartition::start(1, T, dir, &NodeSettings::default(), storage, &registry)
        .await
        .unwrap();
    part.node()
        .initialize(BTreeMap::from([(1, "http://127.0.0.1:9".to_owned())]))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while part.node().leader() != Some(1) {
        assert!(std::time::Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let create = PartitionCommand::CreateTopic(TopicRecord {
        name: T.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 1,
        trimmed_below: 0,
    });
    assert_eq!(part.propose(&create).await.unwrap(), PartitionReply::Done);
    Arc::new(part)
}

fn last_index(part: &ReplicatedPartition) -> u64 {
    part.node()
        .raft()
        .metrics()
        .borrow()
        .last_log_index
        .unwrap_or(0)
}

fn append(first: u64, fill: u8) -> PartitionCommand {
    PartitionCommand::Append(AppendBatch {
        topic: T.to_owned(),
        first_id: first,
        entries: (0..2)
            .map(|i| serde_bytes::ByteBuf::from(vec![fill.wrapping_add(i); 20]))
            .collect(),
        producer: None,
    })
}

/// Queues every command at once (the proposing task runs only once this
/// test's thread awaits), then waits for each outcome.
async fn run(
    pipeline: &Pipeline,
    commands: &[PartitionCommand],
) -> (Vec<u64>, Vec<Result<PartitionReply, String>>) {
    let mut waits = Vec::new();
    let mut seqs = Vec::new();
    for c in commands {
        let (tx, rx) = oneshot::channel::<Outcome>();
        seqs.push(pipeline.submit(c, Some(tx), None).unwrap());
        waits.push(rx);
    }
    let mut outcomes = Vec::new();
    for rx in waits {
        outcomes.push(rx.await.unwrap());
    }
    (seqs, outcomes)
}

/// 100 commands queued together: 100 entries while coalescing is off (a
/// member below the level), a few entries once on; each command answered
/// on its own, the store the same.
#[tokio::test]
async fn queued_commands_are_one_entry_each_below_the_level_and_share_entries_at_it() {
    let commands: Vec<_> = (0..100u64).map(|i| append(i * 2, i as u8)).collect();
    let mut stores = Vec::new();
    for coalesce in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let part = leader(dir.path()).await;
        let pipeline = Pipeline::new(
            part.clone(),
            Duration::from_secs(20),
            Arc::new(AtomicBool::new(false)),
        );
        pipeline.set_coalescing(coalesce);
        let before = last_index(&part);
        let (seqs, outcomes) = run(&pipeline, &commands).await;
        assert!(
            outcomes.iter().all(|o| o == &Ok(PartitionReply::Done)),
            "{outcomes:?}"
        );
        pipeline.wait_for(*seqs.last().unwrap()).await.unwrap();
        let entries = last_index(&part) - before;
        if coalesce {
            assert!(
                (2..=10).contains(&entries),
                "{entries} entries for 100 commands"
            );
        } else {
            assert_eq!(entries, 100);
        }
        stores.push(part.storage().read(T, 0, 1000, usize::MAX).unwrap());
    }
    assert_eq!(stores[0].len(), 200);
    assert_eq!(stores[0], stores[1]);
}

/// A command the group refuses (other bytes at taken ids) fails its own
/// caller only; the commands coalesced with it into its entry are applied
/// and answered, as commands already in flight behind it are without
/// coalescing (there, whether the later ones were proposed before the
/// refusal came back depends on timing: each is either stored and
/// answered, or failed unproposed). The queue is poisoned in both modes: a
/// later submit fails, and waiting for the last command fails.
#[tokio::test]
async fn a_refused_command_fails_its_own_caller_and_poisons_the_queue_in_both_modes() {
    let commands = [append(0, 1), append(0, 99), append(2, 3), append(4, 5)];
    for coalesce in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let part = leader(dir.path()).await;
        let poisoned = Arc::new(AtomicBool::new(false));
        let pipeline = Pipeline::new(part.clone(), Duration::from_secs(20), poisoned.clone());
        pipeline.set_coalescing(coalesce);
        let before = last_index(&part);
        let (seqs, outcomes) = run(&pipeline, &commands).await;
        assert!(outcomes[0].is_ok(), "{outcomes:?}");
        let why = outcomes[1].clone().unwrap_err();
        assert!(why.contains("refused") && why.contains("taken"), "{why}");
        assert!(poisoned.load(std::sync::atomic::Ordering::Acquire));
        assert!(pipeline.wait_for(seqs[3]).await.is_err());
        assert!(pipeline.submit(&append(6, 7), None, None).is_err());
        let entries = last_index(&part) - before;
        let stored: Vec<u64> = part
            .storage()
            .read(T, 0, 100, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        if coalesce {
            assert!(outcomes[2].is_ok() && outcomes[3].is_ok(), "{outcomes:?}");
            assert_eq!(entries, 1);
        } else {
            assert_eq!(outcomes[2].is_ok(), entries >= 3, "{outcomes:?}");
        }
        // What was answered stored is stored, nothing else.
        let answered: Vec<u64> = [0u64, 2, 4]
            .into_iter()
            .zip([&outcomes[0], &outcomes[2], &outcomes[3]])
            .filter(|(_, o)| o.is_ok())
            .flat_map(|(first, _)| [first, first + 1])
            .collect();
        assert_eq!(stored, answered, "coalesce {coalesce}: {outcomes:?}");
    }
}

/// A `Publish` (its anonymous sequence ids derive from its entry's index)
/// is proposed alone even while coalescing: queued between two appends,
/// it is an entry of its own, the appends around it too, and each is
/// stored with its receipt.
#[tokio::test]
async fn a_publish_is_proposed_alone_while_coalescing() {
    let dir = tempfile::tempdir().unwrap();
    let part = leader(dir.path()).await;
    let pipeline = Pipeline::new(
        part.clone(),
        Duration::from_secs(20),
        Arc::new(AtomicBool::new(false)),
    );
    pipeline.set_coalescing(true);
    let publish = PartitionCommand::Publish(PublishBatch {
        topic: T.to_owned(),
        producer: String::new(),
        publish_time_ms: 5,
        messages: vec![PublishMessage {
            payload: b"anonymous".to_vec(),
            ..Default::default()
        }],
    });
    let before = last_index(&part);
    // Ids 0-3, the publish's at 4, then 5-8: two coalesced entries around
    // the publish's own.
    let commands = [
        append(0, 1),
        append(2, 3),
        publish,
        append(5, 4),
        append(7, 6),
    ];
    let (_, outcomes) = run(&pipeline, &commands).await;
    match &outcomes[2] {
        Ok(PartitionReply::Published(r)) => assert_eq!(r[0].entry_id, Some(4)),
        other => panic!("the publish: {other:?}"),
    }
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(last_index(&part) - before, 3, "{outcomes:?}");
    let ids: Vec<u64> = part
        .storage()
        .read(T, 0, 100, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, (0..9).collect::<Vec<_>>());
}
