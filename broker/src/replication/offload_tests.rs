//! The group's offload records through the replication layer: the
//! command's encoding, its apply (recorded and the local copy dropped on a
//! store with a tier, the apply failed on one without), and a snapshot
//! that carries the records instead of their entries.

use super::snapshot;
use super::*;
use crate::storage::tiered::group::GroupRecorder;
use crate::storage::tiered::{SegmentState, TieredConfig};
use crate::storage::{StorageResult, TopicKind};
use ricochet_replication::Apply as _;
use std::time::Duration;

const T: &str = "persistent://public/default/off";

fn record() -> TopicRecord {
    TopicRecord {
        name: T.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 3,
        trimmed_below: 0,
    }
}

async fn open(dir: &Path, tier: &Path) -> Arc<LogStorage> {
    open_aged(dir, tier, Duration::from_secs(3600)).await
}

/// [`open`] with segments `max_age` old rolled by age.
async fn open_aged(dir: &Path, tier: &Path, max_age: Duration) -> Arc<LogStorage> {
    std::fs::create_dir_all(tier).unwrap();
    let mut config = BrokerConfig::for_dir(dir.to_path_buf());
    config.segment_entries = 10;
    config.segment_max_age = max_age;
    let sled = Arc::new(SledStorage::open(dir, 10, 1 << 20).unwrap());
    let tiered = TieredConfig {
        url: format!("file://{}", tier.display()),
        interval: Duration::from_secs(3600),
        ..Default::default()
    };
    Arc::new(
        LogStorage::open(sled, dir, config.log_settings(), Some(&tiered))
            .await
            .unwrap(),
    )
}

fn entry(i: u64) -> Vec<u8> {
    format!("entry {i}").into_bytes()
}

/// Applies each record through `applier` as the group's command.
struct ThroughApplier<'a>(&'a StorageApplier, std::sync::atomic::AtomicU64);

impl GroupRecorder for ThroughApplier<'_> {
    fn record(&self, state: &SegmentState) -> StorageResult<()> {
        let index = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let command = encode(&PartitionCommand::Offloaded(state.clone())).unwrap();
        let reply = self
            .0
            .apply(index, &command)
            .map_err(|e| crate::storage::StorageError::Replication(e.to_string()))?;
        assert_eq!(
            decode::<PartitionReply>(&reply).unwrap(),
            PartitionReply::Done
        );
        Ok(())
    }

    fn seal(&self, topic: &str, below: u64) -> StorageResult<()> {
        let index = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let command = PartitionCommand::SealBelow {
            topic: topic.to_owned(),
            below,
        };
        apply(self.0, index, &command);
        Ok(())
    }
}

fn apply(applier: &StorageApplier, index: u64, command: &PartitionCommand) {
    let reply = applier.apply(index, &encode(command).unwrap()).unwrap();
    assert_eq!(
        decode::<PartitionReply>(&reply).unwrap(),
        PartitionReply::Done
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_offload_record_drops_the_copy_and_a_snapshot_carries_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let tier = dir.path().join("tier");
    let source = open(&dir.path().join("a"), &tier).await;
    let storage: Arc<dyn Storage> = source.clone();
    let applier = StorageApplier::for_partition(storage.clone(), T);
    apply(&applier, 1, &PartitionCommand::CreateTopic(record()));
    for (i, first) in (0..40).step_by(10).enumerate() {
        let batch = AppendBatch {
            topic: T.to_owned(),
            first_id: first,
            entries: (first..first + 10)
                .map(|i| serde_bytes::ByteBuf::from(entry(i)))
                .collect(),
            producer: None,
        };
        apply(&applier, 2 + i as u64, &PartitionCommand::Append(batch));
    }
    // The leader's pass: the records go through the applier (the group).
    let t = source.tiered().unwrap().clone();
    let recorder = ThroughApplier(&applier, std::sync::atomic::AtomicU64::new(10));
    let done = t.offload_through(T, &recorder).await.unwrap();
    assert_eq!(done.segments, 4);
    assert_eq!(source.log().segment_starts(T), [40]);
    let records = storage.offload_records(T).unwrap();
    assert_eq!(records.len(), 4);
    storage.flush().await.unwrap();

    // A snapshot of it, installed on a fresh replica sharing the tier.
    let mut bytes = Vec::new();
    snapshot::capture(&storage, T)
        .unwrap()
        .write_to(&mut bytes)
        .unwrap();
    let target: Arc<dyn Storage> = open(&dir.path().join("b"), &tier).await;
    snapshot::install(&target, T, &mut bytes.as_slice()).unwrap();
    let installed = target.offload_records(T).unwrap();
    assert_eq!(
        installed
            .iter()
            .map(|s| (s.first, s.next, &s.key))
            .collect::<Vec<_>>(),
        records
            .iter()
            .map(|s| (s.first, s.next, &s.key))
            .collect::<Vec<_>>()
    );
    assert_eq!(target.entry_range(T).unwrap(), (0, 40));
    let read = target.read(T, 0, 100, usize::MAX).unwrap();
    assert_eq!(read.len(), 40);
    assert!(read.iter().all(|(id, e)| *e == entry(*id)));

    // The group's trim below 20: the records of [0,10) and [10,20) go,
    // with their objects (the snapshot install deleted none).
    let objects = |tier: &Path| -> usize {
        std::fs::read_dir(tier)
            .unwrap()
            .flatten()
            .filter_map(|d| std::fs::read_dir(d.path()).ok())
            .map(|r| r.count())
            .sum()
    };
    assert_eq!(objects(&tier), 4);
    apply(&applier, 29, &PartitionCommand::trim_log(&record(), 20));
    let left = storage.offload_records(T).unwrap();
    assert_eq!(
        left.iter().map(|s| s.first).collect::<Vec<_>>(),
        [20, 30],
        "records after the trim"
    );
    storage.flush().await.unwrap();
    let start = std::time::Instant::now();
    while objects(&tier) > 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the group's trim left the objects below it"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        target.offload_records(T).unwrap().len(),
        4,
        "not applied there"
    );

    // The group's delete deletes the objects.
    apply(&applier, 30, &PartitionCommand::DeleteTopic(T.to_owned()));
    let start = std::time::Instant::now();
    while std::fs::read_dir(&tier)
        .unwrap()
        .flatten()
        .any(|d| std::fs::read_dir(d.path()).is_ok_and(|mut r| r.next().is_some()))
    {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the group's delete left objects"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The command round-trips through its encoding; a store without a tier
/// fails the apply (its group stops on that member, rather than drift
/// from the others); a record of a log deleted before it does nothing.
#[test]
fn an_offload_record_on_a_store_without_a_tier_fails_the_apply() {
    // An older leader's record (no stamp) decodes without one.
    let unstamped = PartitionCommand::Offloaded(state(0, 10));
    match decode::<PartitionCommand>(&encode(&unstamped).unwrap()).unwrap() {
        PartitionCommand::Offloaded(s) => assert_eq!(s.local, None),
        other => panic!("decoded as {other:?}"),
    }
    let stamp = crate::storage::tiered::policy::LocalCopies {
        keep_local: false,
        delete_lag_ms: Some(1500),
    };
    let state = SegmentState {
        local: Some(stamp),
        ..state(0, 10)
    };
    let command = PartitionCommand::Offloaded(state.clone());
    match decode::<PartitionCommand>(&encode(&command).unwrap()).unwrap() {
        PartitionCommand::Offloaded(s) => {
            assert_eq!(
                (s.first, s.next, s.key, s.object_size, s.object_crc, s.group),
                (0, 10, state.key.clone(), 260, 42, true)
            );
            assert_eq!(s.local, Some(stamp), "the leader's stamp travels");
        }
        other => panic!("decoded as {other:?}"),
    }
    let applier = StorageApplier::new(Arc::new(crate::storage::MemoryStorage::new()));
    // Not held: nothing to record.
    apply(&applier, 1, &command);
    apply(&applier, 2, &PartitionCommand::CreateTopic(record()));
    match applier.apply(3, &encode(&command).unwrap()) {
        Err(ReplicationError::Apply(why)) => assert!(why.contains("no [tiered]"), "{why}"),
        other => panic!("applied without a tier: {other:?}"),
    }
}

fn state(first: u64, next: u64) -> SegmentState {
    SegmentState {
        topic: T.to_owned(),
        first,
        next,
        first_entry: Some(first),
        entries: next - first,
        seq: 0,
        prev_next: 0,
        created_ms: 5,
        file_len: 200,
        phase: crate::storage::tiered::Phase::Offloaded,
        key: format!("off/{first:020}-5.seg"),
        object_size: 260,
        object_crc: 42,
        offloaded_ms: 9,
        group: true,
        local: None,
    }
}

/// A snapshot sends the entries from the first hole in the recorded
/// ranges on: a range past a hole (its leader kept a segment straddling
/// the recorded end) does not stand for the hole's ids.
#[test]
fn a_snapshot_sends_the_entries_from_the_first_hole_in_the_ranges() {
    assert_eq!(snapshot::contiguous_end(&[]), 0);
    assert_eq!(snapshot::contiguous_end(&[state(0, 10), state(10, 20)]), 20);
    assert_eq!(
        snapshot::contiguous_end(&[state(0, 10), state(10, 20), state(25, 30)]),
        20
    );
    // Overlapping ranges cover their union.
    assert_eq!(snapshot::contiguous_end(&[state(0, 12), state(10, 20)]), 20);
}

/// The leader's age roll of an idle partition is a command of the group:
/// every replica applying the same commands seals its active segment at
/// the same id (an empty active segment is left alone), so the segments
/// of all replicas end at the same ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_groups_seal_ends_every_replicas_segment_at_the_same_id() {
    let dir = tempfile::tempdir().unwrap();
    let tier = dir.path().join("tier");
    let seal = PartitionCommand::Seal(T.to_owned());
    match decode::<PartitionCommand>(&encode(&seal).unwrap()).unwrap() {
        PartitionCommand::Seal(t) => assert_eq!(t, T),
        other => panic!("decoded as {other:?}"),
    }
    let append = |first: u64, next: u64| {
        PartitionCommand::Append(AppendBatch {
            topic: T.to_owned(),
            first_id: first,
            entries: (first..next)
                .map(|i| serde_bytes::ByteBuf::from(entry(i)))
                .collect(),
            producer: None,
        })
    };
    let commands = [
        PartitionCommand::CreateTopic(record()),
        append(0, 5),
        seal.clone(),
        append(5, 8),
        seal.clone(),
        // Nothing in the active segment: nothing sealed.
        seal.clone(),
        append(8, 9),
    ];
    for name in ["a", "b"] {
        let replica = open(&dir.path().join(name), &tier).await;
        let applier = StorageApplier::for_partition(replica.clone() as Arc<dyn Storage>, T);
        for (i, c) in commands.iter().enumerate() {
            apply(&applier, 1 + i as u64, c);
        }
        assert_eq!(replica.log().segment_starts(T), [0, 5, 8], "replica {name}");
        let ids: Vec<u64> = crate::storage::LogStore::read(&*replica, T, 0, 100, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, (0..9).collect::<Vec<_>>(), "replica {name}");
    }
}

fn append(first: u64, next: u64) -> PartitionCommand {
    PartitionCommand::Append(AppendBatch {
        topic: T.to_owned(),
        first_id: first,
        entries: (first..next)
            .map(|i| serde_bytes::ByteBuf::from(entry(i)))
            .collect(),
        producer: None,
    })
}

/// The group of `replicas`' appliers: each command applied by every one,
/// at the same index.
struct Group<'a> {
    appliers: Vec<&'a StorageApplier>,
    index: std::sync::atomic::AtomicU64,
}

impl Group<'_> {
    fn apply(&self, command: &PartitionCommand) {
        let index = self.index.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        for a in &self.appliers {
            apply(a, index, command);
        }
    }
}

impl GroupRecorder for Group<'_> {
    fn record(&self, state: &SegmentState) -> StorageResult<()> {
        self.apply(&PartitionCommand::Offloaded(state.clone()));
        Ok(())
    }

    fn seal(&self, topic: &str, below: u64) -> StorageResult<()> {
        self.apply(&PartitionCommand::SealBelow {
            topic: topic.to_owned(),
            below,
        });
        Ok(())
    }
}

/// An on-demand offload (`Tiered/Offload` on the leader) seals the active
/// segment through the group, not on the leader alone: every replica's
/// segments end at the same id, its copy of the last segment lies inside
/// the recorded ranges, and every replica drops its copies of the whole
/// offloaded range (before, a follower kept its active segment, which
/// straddled the recorded end, and so its copy of those ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_offload_seals_through_the_group_and_every_replica_drops_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let tier = dir.path().join("tier");
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        replicas.push(open(&dir.path().join(name), &tier).await);
    }
    let appliers: Vec<StorageApplier> = replicas
        .iter()
        .map(|r| StorageApplier::for_partition(r.clone() as Arc<dyn Storage>, T))
        .collect();
    let group = Group {
        appliers: appliers.iter().collect(),
        index: 1.into(),
    };
    group.apply(&PartitionCommand::CreateTopic(record()));
    for (first, next) in [(0, 10), (10, 20), (20, 25)] {
        group.apply(&append(first, next));
    }
    for r in &replicas {
        assert_eq!(r.log().segment_starts(T), [0, 10, 20]);
    }
    // The leader (a) offloads on demand.
    let t = replicas[0].tiered().unwrap().clone();
    let done = t.offload_through(T, &group).await.unwrap();
    assert_eq!(done.segments, 3, "{done:?}");
    for (r, name) in replicas.iter().zip(["a", "b", "c"]) {
        let storage: Arc<dyn Storage> = r.clone();
        let ranges: Vec<(u64, u64)> = storage
            .offload_records(T)
            .unwrap()
            .iter()
            .map(|s| (s.first, s.next))
            .collect();
        assert_eq!(ranges, [(0, 10), (10, 20), (20, 25)], "replica {name}");
        assert_eq!(
            r.log().segment_starts(T),
            [25],
            "replica {name}: only its new, empty active segment is local"
        );
        storage.flush().await.unwrap();
        let ids: Vec<u64> = storage
            .read(T, 0, 100, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, (0..25).collect::<Vec<_>>(), "replica {name}");
    }
}

/// A busy partition's age roll is the group's: replicas applying the same
/// appends at different moments (each segment's age by its own clock)
/// roll by id block and size only, and all seal at the leader's
/// `SealBelow`, at the same id; the seal applied again after a restart
/// (the store past it) seals nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_partitions_age_roll_is_the_groups_seal_at_the_same_id_on_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let tier = dir.path().join("tier");
    let age = Duration::from_millis(300);
    let a = open_aged(&dir.path().join("a"), &tier, age).await;
    let b = open_aged(&dir.path().join("b"), &tier, age).await;
    let (aa, ab) = (
        StorageApplier::for_partition(a.clone() as Arc<dyn Storage>, T),
        StorageApplier::for_partition(b.clone() as Arc<dyn Storage>, T),
    );
    let create = PartitionCommand::CreateTopic(record());
    apply(&aa, 1, &create);
    apply(&ab, 1, &create);
    // a applies [0,3) 200 ms before b: past the age, a's segment is 200 ms
    // older than b's when both apply [3,6) (a busy topic: appends keep
    // coming).
    apply(&aa, 2, &append(0, 3));
    tokio::time::sleep(Duration::from_millis(200)).await;
    apply(&ab, 2, &append(0, 3));
    tokio::time::sleep(Duration::from_millis(150)).await;
    apply(&aa, 3, &append(3, 6));
    apply(&ab, 3, &append(3, 6));
    for (r, name) in [(&a, "a"), (&b, "b")] {
        assert_eq!(
            r.log().segment_starts(T),
            [0],
            "replica {name}: no age roll"
        );
    }
    // The leader (a) finds its active segment due and seals it through the
    // group at its end.
    let below = crate::storage::LogStore::seal_due(&*a, T).unwrap();
    assert_eq!(below, Some(6));
    let seal = PartitionCommand::SealBelow {
        topic: T.to_owned(),
        below: 6,
    };
    match decode::<PartitionCommand>(&encode(&seal).unwrap()).unwrap() {
        PartitionCommand::SealBelow { topic, below } => assert_eq!((topic.as_str(), below), (T, 6)),
        other => panic!("decoded as {other:?}"),
    }
    apply(&aa, 4, &seal);
    apply(&ab, 4, &seal);
    apply(&aa, 5, &append(6, 8));
    apply(&ab, 5, &append(6, 8));
    assert_eq!(crate::storage::LogStore::seal_due(&*a, T).unwrap(), None);
    // b restarts with its applied mark before the seal: Raft applies the
    // seal and the append again.
    drop(ab);
    let ab = StorageApplier::for_partition(b.clone() as Arc<dyn Storage>, T);
    apply(&ab, 4, &seal);
    apply(&ab, 5, &append(6, 8));
    for (r, name) in [(&a, "a"), (&b, "b")] {
        assert_eq!(r.log().segment_starts(T), [0, 6], "replica {name}");
        let ids: Vec<u64> = crate::storage::LogStore::read(&**r, T, 0, 100, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(ids, (0..8).collect::<Vec<_>>(), "replica {name}");
    }
}
