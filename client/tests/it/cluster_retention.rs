//! A namespace's retention policy in a cluster is the cluster's (kept in
//! etcd): set through one broker, it is read back through another at once
//! and is in force on every broker's topics within a few seconds; cleared
//! while a broker is down, that broker drops the policy it still stored
//! once it is back. Etcd and two brokers as child processes.

use std::time::{Duration, Instant};

use ricochet_client::ErrorKind;
use ricochet_client::admin::{RetentionPolicy, RetentionTarget};
use ricochet_testkit::{BrokerProcess, SpawnOptions, etcd_or_skip, spawn_cluster};

use super::replicated::{ONE_CLUSTER, client};

const NS: &str = "public/default";

/// A topic name `Lookup` places on broker `id` (asked of `url`).
async fn topic_on(url: &str, id: &str) -> String {
    let c = client(url).await;
    for i in 0..64 {
        let t = format!("kept-{i}");
        if c.lookup(&t).await.unwrap().broker_id == id {
            return t;
        }
    }
    panic!("no topic of 64 placed on {id}");
}

/// Waits until the policy in force on topic `t` (asked of `url`, answered
/// by its owner) has max age `want`; panics after 10 s. An error (the
/// owner just restarted and has not taken its lease back yet) is waited
/// out like a different answer.
async fn in_force(url: &str, t: &str, want: Option<i64>) {
    let admin = client(url).await.admin();
    let target = RetentionTarget::Topic(t.to_owned());
    crate::common::policy_in_force(
        &format!("{t}'s max age"),
        want,
        NS,
        || admin.retention(&target),
        |got| {
            let age = got.effective.as_ref().and_then(|p| p.max_age_ms);
            (age, got.effective_from.as_str())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_retention_policy_is_the_clusters() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_namespace_retention_policy_is_the_clusters").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "nsret",
        2,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let (t0, t1) = (
        topic_on(&brokers[0].url(), "b0").await,
        topic_on(&brokers[0].url(), "b1").await,
    );
    let ns = RetentionTarget::Namespace(NS.to_owned());
    let hour = RetentionPolicy {
        max_age_ms: Some(3_600_000),
        ..Default::default()
    };
    client(&brokers[0].url())
        .await
        .admin()
        .set_retention(&ns, hour)
        .await
        .unwrap();
    // Read through the other broker at once: it is the cluster's.
    let seen = client(&brokers[1].url())
        .await
        .admin()
        .retention(&ns)
        .await
        .unwrap();
    assert_eq!(
        seen.policy.as_ref().and_then(|p| p.max_age_ms),
        Some(3_600_000),
        "{seen:?}"
    );
    // In force on each broker's topics.
    in_force(&brokers[1].url(), &t0, Some(3_600_000)).await;
    in_force(&brokers[0].url(), &t1, Some(3_600_000)).await;

    // Cleared through b0 while b1 is down: b1 comes back with the policy
    // in its own store, and drops it because the cluster has none.
    brokers[1].kill9();
    let admin0 = client(&brokers[0].url()).await.admin();
    let cleared = admin0.remove_retention(&ns).await.unwrap();
    assert_eq!(cleared.policy, None, "{cleared:?}");
    in_force(&brokers[0].url(), &t0, None).await;
    brokers[1].restart().await;
    in_force(&brokers[0].url(), &t1, None).await;

    // Set again through the returned broker: b0 takes it.
    let day = RetentionPolicy {
        max_age_ms: Some(86_400_000),
        ..Default::default()
    };
    // (Refused UNAVAILABLE until it joined the cluster again.)
    let admin1 = client(&brokers[1].url()).await.admin();
    let start = Instant::now();
    while let Err(e) = admin1.set_retention(&ns, day.clone()).await {
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(10), "{e:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    in_force(&brokers[1].url(), &t0, Some(86_400_000)).await;
}

/// A broker that kept a namespace policy in its own store before the
/// cluster kept them (an upgrade) publishes it when it is the first to
/// read the cluster's: the policy is not lost, and becomes the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_policy_held_before_the_cluster_kept_them_becomes_the_clusters() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_namespace_policy_held_before_the_cluster").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    // The store a standalone broker left, with a namespace policy.
    let alone = BrokerProcess::spawn(&root.path().join("b0"), &SpawnOptions::new()).await;
    let ns = RetentionTarget::Namespace(NS.to_owned());
    let a_gib = RetentionPolicy {
        max_size_bytes: Some(1 << 30),
        ..Default::default()
    };
    client(alone.url())
        .await
        .admin()
        .set_retention(&ns, a_gib)
        .await
        .unwrap();
    alone.stop().await;
    assert_eq!(etcd.get("/ricochet/nsmig/retention-in-etcd").await, None);

    let brokers = spawn_cluster(
        &etcd,
        "nsmig",
        1,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let recorded = etcd
        .value_within(
            &format!("/ricochet/nsmig/namespaces/{NS}/retention"),
            Duration::from_secs(10),
            "the broker's namespace policy",
        )
        .await;
    assert!(recorded.contains("1073741824"), "{recorded}");
    assert!(
        etcd.get("/ricochet/nsmig/retention-in-etcd")
            .await
            .is_some()
    );
    let seen = client(&brokers[0].url())
        .await
        .admin()
        .retention(&ns)
        .await
        .unwrap();
    assert_eq!(
        seen.policy.as_ref().and_then(|p| p.max_size_bytes),
        Some(1 << 30),
        "{seen:?}"
    );
}
