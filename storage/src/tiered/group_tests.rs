//! A replicated topic's offload on two replicas whose segments end at
//! different ids (two stores sharing a local-directory object store, the
//! group's apply played by hand): each drops only its segments wholly
//! inside the recorded ranges and reads every id back across both tiers;
//! a replica's own delete leaves the group's objects, the group's delete
//! removes them; a recorded range missing at open refuses the store.

use super::group::GroupRecorder;
use super::*;
use crate::segments::LogSettings;
use crate::{LogStorage, TopicKind, TopicRecord};
use std::path::Path;
use std::time::{Duration, Instant};

pub(super) const T: &str = "persistent://public/default/g";

pub(super) fn settings() -> LogSettings {
    LogSettings {
        segment_entries: 10,
        max_bytes: 64 << 20,
        max_age: Duration::from_secs(3600),
    }
}

pub(super) fn config(root: &Path) -> TieredConfig {
    TieredConfig {
        url: format!("file://{}", root.display()),
        block_bytes: 4096,
        cache_bytes: 8192,
        interval: Duration::from_secs(3600),
        ..Default::default()
    }
}

pub(super) async fn open(dir: &Path, root: &Path) -> LogStorage {
    std::fs::create_dir_all(root).unwrap();
    let sled = Arc::new(SledStorage::open(dir, 10, 1 << 20).unwrap());
    LogStorage::open(sled, dir, settings(), Some(&config(root)))
        .await
        .unwrap()
}

pub(super) fn entry(i: u64) -> Vec<u8> {
    format!("entry {i} {}", "x".repeat(300)).into_bytes()
}

pub(super) fn append(s: &LogStorage, ids: std::ops::Range<u64>) {
    let batch: Vec<Vec<u8>> = ids.clone().map(entry).collect();
    s.append(T, ids.start, &batch, None).unwrap();
}

/// The `.seg` objects under `root`.
pub(super) fn objects(root: &Path) -> usize {
    let mut n = 0;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "seg") {
                n += 1;
            }
        }
    }
    n
}

/// The group's apply, on both replicas.
struct Both<'a>(&'a LogStorage, &'a LogStorage);

impl GroupRecorder for Both<'_> {
    fn record(&self, state: &SegmentState) -> Result<()> {
        self.0.put_offload_record(state)?;
        self.1.put_offload_record(state)
    }

    fn seal(&self, topic: &str, below: u64) -> Result<()> {
        self.0.seal_segment(topic, below)?;
        self.1.seal_segment(topic, below)
    }
}

pub(super) fn all_ids(s: &LogStorage) -> Vec<u64> {
    let read = s.read(T, 0, 1000, usize::MAX).unwrap();
    for (id, e) in &read {
        assert_eq!(e, &entry(*id), "entry {id}");
    }
    read.into_iter().map(|(id, _)| id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_drops_only_its_segments_inside_the_groups_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    let record = TopicRecord {
        name: T.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 3,
        trimmed_below: 0,
    };
    {
        let a = open(&da, &root).await;
        let b = open(&db, &root).await;
        a.put_topic(&record).unwrap();
        b.put_topic(&record).unwrap();
        // a: [0,10) [10,20) [20,30) [30,40); b: [0,5) [5,15) .. [35,40).
        for first in (0..40).step_by(10) {
            append(&a, first..first + 10);
        }
        // (A batch is never split: one crossing a block of 10 ids makes a
        // segment straddle it.)
        append(&b, 0..5);
        assert!(b.log().seal_active(T, None).unwrap());
        for (from, to) in [(5, 15), (15, 25), (25, 35), (35, 40)] {
            append(&b, from..to);
        }
        assert_eq!(b.log().segment_starts(T), [0, 5, 15, 25, 35]);

        let ta = a.tiered().unwrap().clone();
        // The background offloader's path refuses a replicated topic.
        assert!(ta.offload_topic(T, true).await.is_err());
        let done = ta.offload_through(T, &Both(&a, &b)).await.unwrap();
        assert_eq!(done.segments, 4, "{done:?}");
        assert_eq!(objects(&root), 4);
        // Each kept only the segment it writes to: the group's seal ended
        // b's active [35,40) at 40 too, inside the recorded ranges.
        assert_eq!(a.log().segment_starts(T), [40]);
        assert_eq!(b.log().segment_starts(T), [40]);
        a.flush().await.unwrap();
        b.flush().await.unwrap();
        for s in [&a, &b] {
            assert_eq!(all_ids(s), (0..40).collect::<Vec<_>>());
            assert_eq!(s.entry_range(T).unwrap(), (0, 40));
            let many = s.read_many(T, &[3, 17, 36, 39, 40]).unwrap();
            assert_eq!(many[1].as_deref(), Some(&entry(17)[..]));
            assert_eq!(many[2].as_deref(), Some(&entry(36)[..]));
            assert!(many[4].is_none());
        }
        // A second pass finds nothing new (the recorded end is 40).
        let again = ta.offload_through(T, &Both(&a, &b)).await.unwrap();
        assert_eq!(again.segments, 0);
        assert_eq!(b.offload_records(T).unwrap().len(), 4);
    }
    {
        // Reopened: the ranges and the local tail cover every id.
        let b = open(&db, &root).await;
        assert_eq!(all_ids(&b), (0..40).collect::<Vec<_>>());
        // This replica drops its copy on its own: the objects stay.
        b.delete_topic(T).unwrap();
        b.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(objects(&root), 4, "a replica deleted the group's objects");
        assert!(b.offload_records(T).unwrap().is_empty());
    }
    {
        // The group's delete: the objects of the records go.
        let a = open(&da, &root).await;
        let keys: Vec<String> = a
            .offload_records(T)
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(keys.len(), 4);
        a.delete_topic(T).unwrap();
        a.delete_offloaded_objects(keys).unwrap();
        let start = Instant::now();
        while objects(&root) > 0 {
            assert!(start.elapsed() < Duration::from_secs(5), "objects left");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_range_missing_at_open_refuses_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let record = TopicRecord {
        name: T.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 3,
        trimmed_below: 0,
    };
    {
        let a = open(dir.path(), &root).await;
        a.put_topic(&record).unwrap();
        for first in (0..30).step_by(10) {
            append(&a, first..first + 10);
        }
        let ta = a.tiered().unwrap().clone();
        let done = ta.offload_through(T, &Both(&a, &a)).await.unwrap();
        assert_eq!(done.segments, 3);
        a.flush().await.unwrap();
        // The middle range's record is lost: ids 10..20 are nowhere.
        a.sled.remove_tiered(&state_key(T, 10)).unwrap();
        a.sled.flush().await.unwrap();
    }
    let sled = Arc::new(SledStorage::open(dir.path(), 10, 1 << 20).unwrap());
    let e = LogStorage::open(sled, dir.path(), settings(), Some(&config(&root)))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StorageError::Corrupt(w) if w.contains("neither local nor offloaded")),
        "{e}"
    );
}

/// An offload record is stored as before for a factor-1 segment (no
/// `group` field) and reads back with the field for a group's.
#[test]
fn a_factor_one_record_encodes_without_the_group_field() {
    let mut s = SegmentState {
        topic: T.to_owned(),
        first: 0,
        next: 10,
        first_entry: Some(0),
        entries: 10,
        seq: 1,
        prev_next: 0,
        created_ms: 5,
        file_len: 100,
        phase: Phase::Offloaded,
        key: "k".into(),
        object_size: 120,
        object_crc: 7,
        offloaded_ms: 9,
        group: false,
        local: None,
    };
    let json = serde_json::to_string(&s).unwrap();
    assert!(!json.contains("group"), "{json}");
    s.group = true;
    let back: SegmentState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert!(back.group);
}
