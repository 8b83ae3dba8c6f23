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
//!   recorded ranges for the lag, then drops them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ricochet_client::ErrorKind;
use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::{OffloadPolicy, TieredOffloadRequest, TieredStatusRequest};
use ricochet_testkit::{SpawnOptions, etcd_or_skip};

use super::replicated::{ONE_CLUSTER, client, led_group_with, next_leader};
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
    SpawnOptions::new().args([OsString::from("--config"), config.into()])
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
