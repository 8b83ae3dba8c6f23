//! One second tier per replication group (issue 22), with three brokers
//! sharing a local-directory object store (etcd only, no S3 server):
//!
//! - a broker restarted with another `[tiered]` store is left out of new
//!   groups: a factor-3 create is FAILED_PRECONDITION naming the
//!   difference, and the group formed before shows the member's health
//!   with the difference in `ricochet cluster` (`ListBrokers`);
//! - an upload cut by a crash after its put (`tiered.offload.after_put`
//!   on the leader) leaves an object no record names, which the next
//!   leader's pass deletes once older than `[tiered] orphan_after`;
//! - with the topic's `delete_lag`, every replica keeps its files of the
//!   recorded ranges for the lag, then drops them;
//! - with each broker's own `[tiered]` default (a lag, none, keep_local),
//!   every replica follows the leader's, stamped in the group's records;
//! - an idle topic's last segment is sealed by `segment_max_age` through
//!   the group and offloaded, and every replica drops it;
//! - an on-demand offload seals the active segment through the group, so
//!   every replica drops its copies of the whole offloaded range.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ricochet_client::ErrorKind;
use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::{OffloadPolicy, TieredOffloadRequest, TieredStatusRequest};
use ricochet_testkit::{SpawnOptions, etcd_or_skip};

use super::replicated::{ONE_CLUSTER, client, led_group_with, next_leader, stable_leader};
use super::replicated_offload::{publish_filled, segment_files, set_topic_policy, stored};

/// Writes the brokers' config at `config`: segments of 10 ids, the tier
/// in directory `tier`, passes every `interval`, and `extra` lines.
fn write_config(config: &Path, tier: &Path, interval: &str, extra: &str) {
    std::fs::write(
        config,
        format!(
            "segment_entries = 10\nretention_interval = \"1h\"\n\n[tiered]\n\
             url = \"file://{}\"\ninterval = \"{interval}\"\n{extra}",
            tier.display()
        ),
    )
    .unwrap();
}

fn with_config(config: &Path) -> SpawnOptions {
    SpawnOptions::new().config(config)
}

/// The `.seg` objects under `dir`.
fn objects(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(read) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in read.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "seg") {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_with_another_tier_is_left_out_of_groups_and_shown_in_the_existing_one() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_broker_with_another_tier_is_left_out").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("broker.toml");
    write_config(&config, &root.path().join("tier"), "1h", "");
    let t = "shared";
    let (mut brokers, _, _, _) =
        led_group_with(&etcd, "rtier", root.path(), t, &with_config(&config)).await;

    // b2 comes back with another store.
    let elsewhere = root.path().join("elsewhere");
    write_config(&config, &elsewhere, "1h", "");
    brokers[2].restart().await;
    let start = Instant::now();
    loop {
        let reg = etcd.get("/ricochet/rtier/brokers/b2").await;
        if reg.as_ref().is_some_and(|(v, _)| v.contains("elsewhere")) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "b2's registration: {reg:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A new group of three would need b2: refused, naming the stores.
    let admin = client(&brokers[0].url()).await.admin();
    let e = admin.create_replicated_topic("split", 3).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("[tiered] store is file://")
            && text.contains(&elsewhere.display().to_string()),
        "{text}"
    );
    assert!(text.contains("left out: broker b"), "{text}");
    assert_eq!(
        etcd.get("/ricochet/rtier/groups/persistent://public/default/split")
            .await,
        None
    );

    // The group formed before: its leader shows the member that differs.
    let start = Instant::now();
    loop {
        let listed = admin.brokers(false).await.unwrap();
        let g = listed
            .groups
            .iter()
            .find(|g| g.topic == stored(t))
            .cloned()
            .expect("the group is listed");
        let differs: Vec<String> = g
            .member_status
            .iter()
            .filter(|m| m.health.contains("[tiered] differs"))
            .map(|m| m.broker_id.clone())
            .collect();
        // b2 differs from the leader, or (b2 leading) both others do.
        let want: Vec<String> = if g.leader == "b2" {
            vec!["b0".into(), "b1".into()]
        } else {
            vec!["b2".into()]
        };
        if differs == want {
            let line = &g
                .member_status
                .iter()
                .find(|m| m.broker_id == want[0])
                .unwrap()
                .health;
            assert!(line.contains("file://"), "{line}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "member health after 20 s: {:?}",
            g.member_status
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_by_the_leaders_crash_is_swept_by_the_next_leader() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("an_upload_cut_by_the_leaders_crash").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (config, tier) = (root.path().join("broker.toml"), root.path().join("tier"));
    // Passes every second and no offload policy: only the call uploads;
    // every broker dies right after an upload's put.
    write_config(&config, &tier, "1s", "orphan_after = \"3s\"\n");
    let options = with_config(&config).env("RICOCHET_FAILPOINT", "tiered.offload.after_put");
    let t = "cut";
    let (mut brokers, ids, leader, victim) =
        led_group_with(&etcd, "rorph", root.path(), t, &options).await;
    publish_filled(&brokers[victim].url(), t, 0..30, 512).await;
    let cut = TieredClient::connect(brokers[victim].url())
        .await
        .unwrap()
        .offload(TieredOffloadRequest { topic: stored(t) })
        .await;
    assert!(
        cut.is_err(),
        "the leader {leader} should have died: {cut:?}"
    );
    brokers[victim].kill9();
    let orphans = objects(&tier);
    assert_eq!(orphans.len(), 1, "the cut upload's object: {orphans:?}");

    let (next, next_url) = next_leader(&brokers[(victim + 1) % 3].url(), t, &ids, &leader).await;
    let start = Instant::now();
    while !objects(&tier).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the orphan {orphans:?} 30 s after {next} took over"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Nothing was recorded: every id is still local on the new leader.
    let stats = client(&next_url)
        .await
        .admin()
        .topic_stats(t)
        .await
        .unwrap();
    assert_eq!((stats.first_entry_id, stats.next_entry_id), (0, 30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_keeps_its_copies_for_the_delete_lag_then_drops_them() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("every_replica_keeps_its_copies_for_the_delete_lag").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (config, tier) = (root.path().join("broker.toml"), root.path().join("tier"));
    write_config(&config, &tier, "1s", "");
    let t = "lagged";
    let (brokers, _, leader, victim) =
        led_group_with(&etcd, "rlag", root.path(), t, &with_config(&config)).await;
    // Sealed segments are due at once; local copies go 8 s after.
    let policy = OffloadPolicy {
        offload_after_ms: Some(0),
        delete_lag_ms: Some(8000),
        ..Default::default()
    };
    set_topic_policy(&brokers[victim].url(), t, policy).await;
    publish_filled(&brokers[victim].url(), t, 0..30, 512).await;
    // The leader's pass offloads [0,10) and [10,20) and the group records
    // them; within the lag every replica still holds their files.
    let start = Instant::now();
    loop {
        let st = TieredClient::connect(brokers[victim].url())
            .await
            .unwrap()
            .offload_status(TieredStatusRequest { topic: stored(t) })
            .await
            .unwrap()
            .into_inner();
        if st.offloaded_segments >= 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the leader {leader}'s status after 20 s: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let recorded = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for b in &brokers {
        let files = segment_files(b, t);
        assert!(
            files.starts_with(&[0, 10]),
            "{}'s files {files:?} {:?} after the record (lag 8 s)",
            b.id,
            recorded.elapsed()
        );
    }
    // Past the lag, each replica's own pass drops them.
    for b in &brokers {
        let start = Instant::now();
        loop {
            let files = segment_files(b, t);
            if files.first().is_some_and(|f| *f >= 20) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{}'s files 30 s past the lag: {files:?}",
                b.id
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// Each broker's segment files of `t`, once every broker's first is at
/// least `below` (its copies below gone), else after `within`.
/// Whether every replica's local segments start at `below` or later
/// (none holds an id below it).
fn all_below_gone(files: &[(String, Vec<u64>)], below: u64) -> bool {
    files
        .iter()
        .all(|(_, f)| f.first().is_some_and(|f| *f >= below))
}

async fn files_of_all(
    brokers: &[ricochet_testkit::ClusterBroker],
    t: &str,
    below: u64,
    within: Duration,
) -> Vec<(String, Vec<u64>)> {
    let start = Instant::now();
    loop {
        let files: Vec<(String, Vec<u64>)> = brokers
            .iter()
            .map(|b| (b.id.clone(), segment_files(b, t)))
            .collect();
        if all_below_gone(&files, below) || start.elapsed() >= within {
            return files;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn offloaded_at_least(url: &str, t: &str, n: u32, within: Duration) {
    let start = Instant::now();
    loop {
        let st = TieredClient::connect(url.to_owned())
            .await
            .unwrap()
            .offload_status(TieredStatusRequest { topic: stored(t) })
            .await
            .unwrap()
            .into_inner();
        if st.offloaded_segments >= n {
            return;
        }
        assert!(
            start.elapsed() < within,
            "the leader's status after {within:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_follows_the_leaders_default_lag_not_its_own() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("every_replica_follows_the_leaders_default_lag").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (config, tier) = (root.path().join("broker.toml"), root.path().join("tier"));
    // Each broker's own default: b0 a 6 s lag, b1 none (at once), b2
    // keep_local; sealed segments are due at once on all.
    let defaults = ["local_delete_lag = \"6s\"\n", "", "keep_local = true\n"];
    let section = |i: usize| format!("offload_after = \"0s\"\n{}", defaults[i]);
    write_config(&config, &tier, "1s", &section(0));
    let t = "stamped";
    let (mut brokers, ids, _, _) =
        led_group_with(&etcd, "rstamp", root.path(), t, &with_config(&config)).await;
    for (i, b) in brokers.iter_mut().enumerate().skip(1) {
        write_config(&config, &tier, "1s", &section(i));
        b.restart().await;
    }
    let (leader, _) = stable_leader(&brokers[0].url(), t, &ids, Duration::from_secs(30))
        .await
        .expect("a leader after the restarts");
    let at = ids.iter().position(|m| *m == leader).unwrap();
    publish_filled(&brokers[at].url(), t, 0..30, 512).await;
    // [0,10) and [10,20) offloaded and recorded by the leader's pass.
    offloaded_at_least(&brokers[at].url(), t, 2, Duration::from_secs(30)).await;
    let recorded = Instant::now();
    match at {
        // The leader's 6 s: kept 2 s on, by b1 too; then dropped, by b2 too.
        0 => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            for b in &brokers {
                let files = segment_files(b, t);
                assert!(
                    files.starts_with(&[0, 10]),
                    "{}'s files {files:?} {:?} after the record (leader b0, lag 6 s)",
                    b.id,
                    recorded.elapsed()
                );
            }
            let files = files_of_all(&brokers, t, 20, Duration::from_secs(30)).await;
            assert!(all_below_gone(&files, 20), "30 s past b0's lag: {files:?}");
        }
        // The leader's none: dropped at once, by b2 (keep_local) too.
        1 => {
            let files = files_of_all(&brokers, t, 20, Duration::from_secs(20)).await;
            assert!(
                all_below_gone(&files, 20),
                "20 s after the record (leader b1, at once): {files:?}"
            );
        }
        // The leader's keep_local: kept, by b1 (at once) too.
        _ => {
            let files = files_of_all(&brokers, t, 10, Duration::from_secs(8)).await;
            assert!(
                files.iter().all(|(_, f)| f.starts_with(&[0, 10])),
                "8 s after the record (leader b2, keep_local): {files:?}"
            );
        }
    }
    eprintln!("every_replica_follows_the_leaders_default_lag: leader {leader}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_topics_last_segment_is_sealed_by_the_group_and_offloaded() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("an_idle_topics_last_segment_is_sealed").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (config, tier) = (root.path().join("broker.toml"), root.path().join("tier"));
    std::fs::write(
        &config,
        format!(
            "segment_entries = 10\nsegment_max_age = \"3s\"\nretention_interval = \"1h\"\n\n\
             [tiered]\nurl = \"file://{}\"\ninterval = \"1s\"\noffload_after = \"0s\"\n",
            tier.display()
        ),
    )
    .unwrap();
    let t = "idle";
    let (brokers, _, leader, at) =
        led_group_with(&etcd, "ridle", root.path(), t, &with_config(&config)).await;
    publish_filled(&brokers[at].url(), t, 0..15, 512).await;
    // [0,10) rolls at its block; [10,15) only by age, idle: the leader's
    // pass seals it through the group and offloads it.
    offloaded_at_least(&brokers[at].url(), t, 2, Duration::from_secs(30)).await;
    let files = files_of_all(&brokers, t, 15, Duration::from_secs(20)).await;
    assert!(
        all_below_gone(&files, 15),
        "every replica's copies of [0,15) gone (leader {leader}): {files:?}"
    );
    // Every id still reads, across the tiers.
    let admin = client(&brokers[at].url()).await.admin();
    let stats = admin.topic_stats(t).await.unwrap();
    assert_eq!((stats.first_entry_id, stats.next_entry_id), (0, 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_offload_seals_through_the_group_and_every_replica_drops_the_range() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("an_on_demand_offload_seals_through_the_group").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let (config, tier) = (root.path().join("broker.toml"), root.path().join("tier"));
    // No policy and passes every hour: only the call offloads.
    write_config(&config, &tier, "1h", "");
    let t = "ondemand";
    let (brokers, _, leader, at) =
        led_group_with(&etcd, "rdemand", root.path(), t, &with_config(&config)).await;
    // [0,10) and [10,20) roll at their blocks; [20,25) is every replica's
    // active segment.
    publish_filled(&brokers[at].url(), t, 0..25, 512).await;
    let done = TieredClient::connect(brokers[at].url())
        .await
        .unwrap()
        .offload(TieredOffloadRequest { topic: stored(t) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.offloaded_segments, 3, "leader {leader}: {done:?}");
    // The group sealed [20,25) on every replica: each drops its copy of
    // all 25 ids (before, a follower kept [20,25), its active segment).
    let files = files_of_all(&brokers, t, 25, Duration::from_secs(20)).await;
    assert!(
        all_below_gone(&files, 25),
        "every replica's copies of [0,25) gone (leader {leader}): {files:?}"
    );
    let stats = client(&brokers[at].url())
        .await
        .admin()
        .topic_stats(t)
        .await
        .unwrap();
    assert_eq!((stats.first_entry_id, stats.next_entry_id), (0, 25));
}
