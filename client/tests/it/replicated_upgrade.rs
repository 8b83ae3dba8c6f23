//! A rolling upgrade of a replicated topic's group: its leader proposes
//! the group's seal (`SealBelow`) only while every member advertises, in
//! its etcd registration, that it applies it (`group_commands` ≥ 2; this build registers 3). A
//! member whose registration has the old form (no field, as a broker from
//! before the level writes it) holds the seal back: the active segment
//! outlives `segment_max_age` on every replica, while the group goes on
//! committing and applying publishes; once the registration advertises
//! the level again, the seal happens. An on-demand offload, which seals
//! through the group first, is refused meanwhile (FAILED_PRECONDITION
//! naming the member). Etcd and three brokers as child processes sharing
//! a `file://` tier with no offload policy (only the call offloads).
//! Also: a broker joining with other segment rolls than a registered one
//! says so (the replicas of a replicated topic would split it at
//! different ids).

use std::time::{Duration, Instant};

use ricochet_proto::TieredOffloadRequest;
use ricochet_proto::tiered_client::TieredClient;
use ricochet_testkit::{SpawnOptions, etcd_or_skip, spawn_cluster};

use super::replicated::{ONE_CLUSTER, client, create_r3};
use super::replicated_trim::{segments, trickle};

/// Writes `value` at `key` (no lease: the broker's next refresh of its
/// registration puts it back under its lease).
pub(crate) async fn put(etcd: &ricochet_testkit::EtcdProcess, key: &str, value: &str) {
    etcd.kv()
        .await
        .put(ricochet_cluster::proto::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_member_registered_without_the_seal_level_holds_the_groups_age_seals_back() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_member_registered_without_the_seal_level").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("broker.toml");
    let tier = root.path().join("tier");
    std::fs::write(
        &config,
        format!(
            "segment_entries = 100000\nsegment_max_age = \"2s\"\nretention_interval = \"1h\"\n\n\
             [tiered]\nurl = \"file://{}\"\ninterval = \"1s\"\n",
            tier.display()
        ),
    )
    .unwrap();
    let options = SpawnOptions::new().config(&config);
    // Leases of 60 s: a broker refreshes its registration once a TTL, so
    // none rewrites the old form this test puts until well after it
    // restored it (checked below).
    let brokers = spawn_cluster(
        &etcd,
        "rgate",
        3,
        root.path(),
        Duration::from_secs(60),
        &options,
    )
    .await;
    let t = "gated";
    let (ids, at) = create_r3(&brokers, t).await;
    let leader = &ids[at];
    // A follower's registration, rewritten to the form a broker from
    // before the level writes: no `group_commands`.
    let old = &ids[(at + 1) % 3];
    let key = format!("/ricochet/rgate/brokers/{old}");
    let (current, _) = etcd.get(&key).await.expect("registered");
    let mut reg: serde_json::Value = serde_json::from_str(&current).unwrap();
    assert_eq!(reg["group_commands"], 3, "{current}");
    reg.as_object_mut().unwrap().remove("group_commands");
    let old_form = reg.to_string();
    put(&etcd, &key, &old_form).await;

    // Twice the max age and more of publishes: each committed by the
    // group (the send's receipt), none rolls the segment by age.
    let c = client(&brokers[at].url()).await;
    let sent = trickle(&c, t, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every replica, the old-form member's included, applied every entry
    // into one unsealed segment (identical sizes).
    let start = Instant::now();
    loop {
        let held: Vec<Vec<(u64, u64)>> = brokers.iter().map(|b| segments(b, t)).collect();
        assert!(
            held.iter().all(|h| h.len() == 1 && h[0].0 == 0),
            "{sent} sent over 5 s (max age 2 s), {old}'s registration without the level: segments were sealed: {held:?}"
        );
        if held.iter().all(|h| h == &held[0]) {
            eprintln!("held back: {sent} sent, leader {leader}, old-form {old}, segments {held:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the replicas did not all apply the {sent} publishes: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The on-demand offload would seal through the group: refused.
    let refused = TieredClient::connect(brokers[at].url())
        .await
        .unwrap()
        .offload(TieredOffloadRequest {
            topic: format!("persistent://public/default/{t}"),
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused
            .message()
            .contains(&format!("member {old} advertises group commands level 0")),
        "{refused:?}"
    );
    assert_eq!(segments(&brokers[at], t).len(), 1, "the refusal sealed");
    let (still, _) = etcd.get(&key).await.unwrap();
    assert_eq!(
        still, old_form,
        "{old} refreshed its registration within the test: the hold above proves nothing"
    );

    // The registration advertises the level again: the next pass seals
    // (the topic idle: by age, busy or idle), at the same id everywhere.
    put(&etcd, &key, &current).await;
    let start = Instant::now();
    loop {
        let held: Vec<Vec<(u64, u64)>> = brokers.iter().map(|b| segments(b, t)).collect();
        let firsts: Vec<Vec<u64>> = held
            .iter()
            .map(|h| h.iter().map(|(f, _)| *f).collect())
            .collect();
        if firsts.iter().all(|f| *f == vec![0, sent]) {
            eprintln!("sealed once restored: segments {held:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the registration restored, no seal within 10 s: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Brokers whose `segment_entries`/`segment_max_bytes` differ would split
/// a replicated topic's replicas into segments at different ids: each
/// registers its rolls, and one that joins and finds another's differ
/// says so at WARN, naming it; brokers with equal settings say nothing.
#[tokio::test]
async fn a_broker_joining_with_other_segment_rolls_than_a_registered_one_warns_naming_it() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_broker_joining_with_other_segment_rolls").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "rrolls",
        2,
        root.path(),
        Duration::from_secs(10),
        &SpawnOptions::new(),
    )
    .await;
    let warned = |b: &ricochet_testkit::ClusterBroker| {
        b.process
            .as_ref()
            .unwrap()
            .log_tail()
            .into_iter()
            .find(|l| l.contains("segment rolls differ"))
    };
    assert_eq!(warned(&brokers[0]), None, "equal settings: no warning");
    assert_eq!(warned(&brokers[1]), None, "equal settings: no warning");

    let config = root.path().join("rolls.toml");
    std::fs::write(&config, "segment_entries = 1000\n").unwrap();
    brokers[1].restart_with(|o| o.config(&config)).await;
    let start = Instant::now();
    let line = loop {
        if let Some(l) = warned(&brokers[1]) {
            break l;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "b1 joined with segment_entries = 1000 beside b0's 16384: no warning in {:?}",
            brokers[1].process.as_ref().unwrap().log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(line.contains("b0"), "{line}");
    assert!(line.contains("segment_entries = 16384"), "{line}");
    assert!(line.contains("segment_entries = 1000,"), "{line}");
}
