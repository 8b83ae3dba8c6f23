//! A replicated topic's upkeep on its replicas (local-directory object
//! store, the group's apply played by hand): local copies wait for the
//! policy's lag counted from the offload time in the group's record (a
//! replica applying late drops at once, one restarted within the lag drops
//! at a later pass of its background offloader), never go with
//! `keep_local`; the offload lag counts the topic on its leader only; the
//! leader's sweep deletes an upload no record names once old enough, and
//! nothing a record names or another topic's.

use super::group::GroupRecorder;
use super::group_tests::{T, all_ids, append, config, entry, objects, open, settings};
use super::policy::OffloadPolicy;
use super::*;
use crate::{LogStorage, TopicKind, TopicRecord};
use std::path::Path;
use std::time::{Duration, Instant};

fn replicated() -> TopicRecord {
    TopicRecord {
        name: T.to_owned(),
        created_ms: 1,
        kind: TopicKind::Normal,
        replicas: 3,
        trimmed_below: 0,
    }
}

/// A replica with `T` holding ids 0..40 in segments of 10 (the last one
/// active) and its own policy `policy` (the group's command, applied).
async fn replica(dir: &Path, root: &Path, policy: Option<OffloadPolicy>) -> LogStorage {
    let s = open(dir, root).await;
    s.put_topic(&replicated()).unwrap();
    for first in (0..40).step_by(10) {
        append(&s, first..first + 10);
    }
    if let Some(p) = policy {
        s.tiered().unwrap().set_policy(T, p).unwrap();
    }
    s
}

/// The group's apply on the leader at once; the records are kept for a
/// follower that applies them later.
struct Late<'a> {
    leader: &'a LogStorage,
    kept: std::sync::Mutex<Vec<SegmentState>>,
}

impl GroupRecorder for Late<'_> {
    fn record(&self, state: &SegmentState) -> Result<()> {
        self.leader.put_offload_record(state)?;
        self.kept.lock().unwrap().push(state.clone());
        Ok(())
    }
}

fn lag(ms: u64) -> Option<OffloadPolicy> {
    Some(OffloadPolicy {
        delete_lag_ms: Some(ms),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_copies_wait_for_the_lag_from_the_records_time_on_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let a = replica(&dir.path().join("a"), &root, lag(1500)).await;
    let b = replica(&dir.path().join("b"), &root, lag(1500)).await;
    let late = Late {
        leader: &a,
        kept: Default::default(),
    };
    let ta = a.tiered().unwrap().clone();
    let done = ta.offload_through(T, &late).await.unwrap();
    assert_eq!(done.segments, 4, "{done:?}");
    assert_eq!(done.local_deleted, 0, "{done:?}");
    // Recorded, but within the lag: the leader keeps its copies.
    assert_eq!(a.log().segment_starts(T), [0, 10, 20, 30, 40]);
    assert_eq!(ta.drop_due_group(T, crate::util::wall_ms()).unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // The follower applies the records only now, past their time plus the
    // lag: it drops its sealed copies at the apply (its own clock at the
    // apply would have kept them another 1.5 s).
    for s in late.kept.lock().unwrap().iter() {
        b.put_offload_record(s).unwrap();
    }
    assert_eq!(b.log().segment_starts(T), [30], "[30,40) is b's active one");
    // The leader's next pass drops its own.
    assert_eq!(ta.drop_due_group(T, crate::util::wall_ms()).unwrap(), 4);
    assert_eq!(a.log().segment_starts(T), [40]);
    a.flush().await.unwrap();
    b.flush().await.unwrap();
    for s in [&a, &b] {
        assert_eq!(all_ids(s), (0..40).collect::<Vec<_>>());
    }
}

/// The group's apply on one replica.
struct One<'a>(&'a LogStorage);

impl GroupRecorder for One<'_> {
    fn record(&self, state: &SegmentState) -> Result<()> {
        self.0.put_offload_record(state)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_within_the_lag_drops_its_copies_at_a_later_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (root, da) = (dir.path().join("tier"), dir.path().join("a"));
    {
        let a = replica(&da, &root, lag(1500)).await;
        let ta = a.tiered().unwrap().clone();
        assert_eq!(ta.offload_through(T, &One(&a)).await.unwrap().segments, 4);
        assert_eq!(a.log().segment_starts(T), [0, 10, 20, 30, 40]);
        a.flush().await.unwrap();
    }
    // Reopened within the lag, its background offloader every 200 ms.
    std::fs::create_dir_all(&root).unwrap();
    let sled = Arc::new(SledStorage::open(&da, 10, 1 << 20).unwrap());
    let quick = TieredConfig {
        interval: Duration::from_millis(200),
        ..config(&root)
    };
    let a = LogStorage::open(sled, &da, settings(), Some(&quick))
        .await
        .unwrap();
    assert_eq!(a.log().segment_starts(T), [0, 10, 20, 30, 40]);
    let stop = tokio_util::sync::CancellationToken::new();
    a.tiered().unwrap().spawn(stop.clone());
    let start = Instant::now();
    while a.log().segment_starts(T) != [40] {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the copies past their lag after 10 s: {:?}",
            a.log().segment_starts(T)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    assert_eq!(all_ids(&a), (0..40).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_local_keeps_a_replicas_copies_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let keep = OffloadPolicy {
        keep_local: true,
        ..Default::default()
    };
    let a = replica(&dir.path().join("a"), &root, Some(keep)).await;
    let ta = a.tiered().unwrap().clone();
    let done = ta.offload_through(T, &One(&a)).await.unwrap();
    assert_eq!((done.segments, done.local_deleted), (4, 0), "{done:?}");
    assert_eq!(ta.drop_due_group(T, u64::MAX).unwrap(), 0);
    assert_eq!(a.log().segment_starts(T), [0, 10, 20, 30, 40]);
    assert_eq!(objects(&root), 4);
    // The topic's policy cleared: the default (none) lets them go.
    ta.set_policy(T, OffloadPolicy::default()).unwrap();
    assert_eq!(ta.drop_due_group(T, crate::util::wall_ms()).unwrap(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offload_lag_counts_a_replicated_topic_on_its_leader_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let due = OffloadPolicy {
        offload_after_ms: Some(0),
        ..Default::default()
    };
    let a = replica(&dir.path().join("a"), &root, Some(due)).await;
    let ta = a.tiered().unwrap().clone();
    // Three sealed segments are due ([30,40) is active).
    assert_eq!(ta.offload_lag(), (0, 0), "a follower counts nothing");
    ta.set_leading([T.to_owned()]);
    let (_, pending) = ta.offload_lag();
    let sealed: u64 = a
        .log()
        .segment_infos(T)
        .iter()
        .filter(|s| !s.active)
        .map(|s| s.len)
        .sum();
    assert!(sealed > 0);
    assert_eq!(pending, sealed, "the leader counts its due segments");
    ta.offload_through(T, &One(&a)).await.unwrap();
    assert_eq!(ta.offload_lag(), (0, 0), "nothing due once offloaded");
    ta.set_leading(Vec::new());
    assert!(!ta.leads(T));
}

/// Records the first `ok` offloads through the group, then fails (a lost
/// leadership after the put: the object stays, no record names it).
struct LosesLeadership<'a> {
    replica: &'a LogStorage,
    ok: std::sync::atomic::AtomicUsize,
}

impl GroupRecorder for LosesLeadership<'_> {
    fn record(&self, state: &SegmentState) -> Result<()> {
        use std::sync::atomic::Ordering;
        if self.ok.load(Ordering::SeqCst) == 0 {
            return Err(StorageError::Replication("not the leader any more".into()));
        }
        self.ok.fetch_sub(1, Ordering::SeqCst);
        self.replica.put_offload_record(state)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_sweep_deletes_only_old_objects_no_record_names() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let a = replica(&dir.path().join("a"), &root, None).await;
    let ta = a.tiered().unwrap().clone();
    let cut = LosesLeadership {
        replica: &a,
        ok: 1.into(),
    };
    assert!(ta.offload_through(T, &cut).await.is_err());
    assert_eq!(a.offload_records(T).unwrap().len(), 1);
    assert_eq!(objects(&root), 2, "one recorded, one orphan");
    // Another topic's stray object is not this topic's to sweep.
    let other = root.join(object_dir("persistent://public/default/other"));
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("00000000000000000000-1.seg"), b"x").unwrap();
    assert_eq!(
        ta.sweep_orphans(T, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(objects(&root), 3, "too young: kept");
    assert_eq!(ta.sweep_orphans(T, Duration::ZERO).await.unwrap(), 1);
    assert_eq!(objects(&root), 2, "the orphan went, the rest stayed");
    // The recorded object still serves its ids.
    a.flush().await.unwrap();
    assert_eq!(a.log().segment_starts(T)[0], 10);
    let first = a.read(T, 0, 10, usize::MAX).unwrap();
    assert_eq!(first.len(), 10);
    assert_eq!(first[3].1, entry(3));
    assert_eq!(ta.sweep_orphans(T, Duration::ZERO).await.unwrap(), 0);
}
