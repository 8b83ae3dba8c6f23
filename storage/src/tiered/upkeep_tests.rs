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
    /// The seals' `below`, applied by the follower before the records.
    seals: std::sync::Mutex<Vec<u64>>,
}

impl GroupRecorder for Late<'_> {
    fn record(&self, state: &SegmentState) -> Result<()> {
        self.leader.put_offload_record(state)?;
        self.kept.lock().unwrap().push(state.clone());
        Ok(())
    }

    fn seal(&self, topic: &str, below: u64) -> Result<()> {
        self.leader.seal_segment(topic, below)?;
        self.seals.lock().unwrap().push(below);
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
        seals: Default::default(),
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
    for below in late.seals.lock().unwrap().iter() {
        b.seal_segment(T, *below).unwrap();
    }
    for s in late.kept.lock().unwrap().iter() {
        b.put_offload_record(s).unwrap();
    }
    assert_eq!(
        b.log().segment_starts(T),
        [40],
        "sealed at 40 as the leader"
    );
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

    fn seal(&self, topic: &str, below: u64) -> Result<()> {
        self.0.seal_segment(topic, below)
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
    // The topic's policy cleared: the records keep their stamp until the
    // leader's next pass stamps the default in force (none), which lets
    // them go.
    ta.set_policy(T, OffloadPolicy::default()).unwrap();
    assert_eq!(ta.drop_due_group(T, crate::util::wall_ms()).unwrap(), 0);
    let done = ta.offload_due_through(T, &One(&a)).await.unwrap();
    assert_eq!(done.segments, 0, "{done:?}");
    assert_eq!(a.log().segment_starts(T), [40]);
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

    fn seal(&self, topic: &str, below: u64) -> Result<()> {
        self.replica.seal_segment(topic, below)
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

/// A replica whose `[tiered]` section sets `default` as its default
/// policy (each broker's own), with `T` as [`replica`]'s.
async fn replica_defaulting(dir: &Path, root: &Path, default: TieredConfig) -> LogStorage {
    std::fs::create_dir_all(root).unwrap();
    let sled = Arc::new(SledStorage::open(dir, 10, 1 << 20).unwrap());
    let s = LogStorage::open(sled, dir, settings(), Some(&default))
        .await
        .unwrap();
    s.put_topic(&replicated()).unwrap();
    for first in (0..40).step_by(10) {
        append(&s, first..first + 10);
    }
    s
}

/// The group's apply on every replica given.
struct All<'a>(Vec<&'a LogStorage>);

impl GroupRecorder for All<'_> {
    fn record(&self, state: &SegmentState) -> Result<()> {
        for r in &self.0 {
            r.put_offload_record(state)?;
        }
        Ok(())
    }

    fn seal(&self, topic: &str, below: u64) -> Result<()> {
        for r in &self.0 {
            r.seal_segment(topic, below)?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_drops_its_copies_at_the_leaders_stamped_lag_whatever_its_own_default() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let with = |lag: Option<u64>| TieredConfig {
        local_delete_lag: lag.map(Duration::from_millis),
        ..config(&root)
    };
    // The leader's default lag 1.5 s; b's none (at once); c's a minute.
    let a = replica_defaulting(&dir.path().join("a"), &root, with(Some(1500))).await;
    let b = replica_defaulting(&dir.path().join("b"), &root, with(None)).await;
    let c = replica_defaulting(&dir.path().join("c"), &root, with(Some(60_000))).await;
    let ta = a.tiered().unwrap().clone();
    let group = All(vec![&a, &b, &c]);
    let done = ta.offload_through(T, &group).await.unwrap();
    assert_eq!((done.segments, done.local_deleted), (4, 0), "{done:?}");
    let stamped = a.offload_records(T).unwrap();
    assert!(
        stamped.iter().all(|s| s.local
            == Some(policy::LocalCopies {
                keep_local: false,
                delete_lag_ms: Some(1500)
            })),
        "{stamped:?}"
    );
    // Within the leader's lag: b keeps its copies too (its own default
    // would have dropped them at the apply). (The group's seal ended
    // every replica's [30,40) at 40.)
    for r in [&a, &b, &c] {
        assert_eq!(r.log().segment_starts(T), [0, 10, 20, 30, 40]);
    }
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // Past it: c drops them too (its own default would keep them a minute).
    let now = crate::util::wall_ms();
    for (r, sealed, active) in [(&a, 4, 40), (&b, 4, 40), (&c, 4, 40)] {
        assert_eq!(r.tiered().unwrap().drop_due_group(T, now).unwrap(), sealed);
        assert_eq!(r.log().segment_starts(T), [active]);
        r.flush().await.unwrap();
        assert_eq!(all_ids(r), (0..40).collect::<Vec<_>>());
    }
    // A record without a stamp (an older leader's) follows the replica's
    // own policy in force, as before: d's minute keeps its copies.
    let d = replica_defaulting(&dir.path().join("d"), &root, with(Some(60_000))).await;
    for mut s in stamped {
        s.local = None;
        d.put_offload_record(&s).unwrap();
    }
    let td = d.tiered().unwrap();
    assert_eq!(td.drop_due_group(T, crate::util::wall_ms()).unwrap(), 0);
    assert_eq!(
        td.drop_due_group(T, crate::util::wall_ms() + 60_000)
            .unwrap(),
        3,
        "d applied no seal: [30,40) is its active one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_namespace_policy_drives_the_pass_and_the_replicas_copies() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let a = replica_defaulting(&dir.path().join("a"), &root, config(&root)).await;
    let b = replica_defaulting(&dir.path().join("b"), &root, config(&root)).await;
    let ta = a.tiered().unwrap().clone();
    let group = All(vec![&a, &b]);
    // No policy anywhere: the leader's pass offloads nothing.
    let done = ta.offload_due_through(T, &group).await.unwrap();
    assert_eq!(done.segments, 0, "{done:?}");
    // A namespace policy set on the leader (b has none): its next pass
    // follows it, and b keeps its copies as the leader's policy says.
    let ns = OffloadPolicy {
        offload_after_ms: Some(0),
        keep_local: true,
        ..Default::default()
    };
    ta.set_policy("public/default", ns).unwrap();
    let done = ta.offload_due_through(T, &group).await.unwrap();
    assert_eq!((done.segments, done.local_deleted), (3, 0), "{done:?}");
    let far = crate::util::wall_ms() + 3_600_000;
    for r in [&a, &b] {
        assert_eq!(r.tiered().unwrap().drop_due_group(T, far).unwrap(), 0);
        assert_eq!(r.log().segment_starts(T), [0, 10, 20, 30]);
    }
    // The namespace's policy changed on the leader: its next pass stamps
    // the new rule (at once) on the records whose copies it still holds,
    // and on the segment it offloads now; every replica drops its copies.
    let ns = OffloadPolicy {
        offload_after_ms: Some(0),
        ..Default::default()
    };
    ta.set_policy("public/default", ns).unwrap();
    append(&a, 40..50);
    append(&b, 40..50);
    let done = ta.offload_due_through(T, &group).await.unwrap();
    assert_eq!(done.segments, 1, "{done:?}");
    let records = b.offload_records(T).unwrap();
    assert_eq!(records.len(), 4);
    assert!(
        records
            .iter()
            .all(|s| s.local == Some(policy::LocalCopies::default())),
        "{records:?}"
    );
    for r in [&a, &b] {
        assert_eq!(r.log().segment_starts(T), [40]);
        r.flush().await.unwrap();
        assert_eq!(all_ids(r), (0..50).collect::<Vec<_>>());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topics_own_policy_decides_over_the_stamps_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let keep = TieredConfig {
        keep_local: true,
        ..config(&root)
    };
    let a = replica_defaulting(&dir.path().join("a"), &root, keep).await;
    let b = replica_defaulting(&dir.path().join("b"), &root, config(&root)).await;
    let ta = a.tiered().unwrap().clone();
    let done = ta.offload_through(T, &All(vec![&a, &b])).await.unwrap();
    assert_eq!((done.segments, done.local_deleted), (4, 0), "{done:?}");
    assert_eq!(
        b.log().segment_starts(T),
        [0, 10, 20, 30, 40],
        "stamped keep_local"
    );
    // The group's command sets the topic's own policy on every replica:
    // it decides at once, before any pass restamps.
    let own = OffloadPolicy {
        delete_lag_ms: Some(0),
        ..Default::default()
    };
    for r in [&a, &b] {
        r.put_offload_policy(T, &own).unwrap();
    }
    let now = crate::util::wall_ms();
    assert_eq!(ta.drop_due_group(T, now).unwrap(), 4);
    assert_eq!(b.tiered().unwrap().drop_due_group(T, now).unwrap(), 4);
}
