//! A namespace's offload policy in a cluster is the cluster's (kept in
//! etcd): set through one broker, it is read back through another at once
//! and is in force on every broker's topics within a few seconds; removed
//! while a broker is down, that broker drops the policy it still stored
//! once it is back; a policy a standalone broker held becomes the
//! cluster's when it first joins one. Etcd and two brokers as child
//! processes, one `file://` tier.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::{
    GetOffloadPolicyRequest, OffloadPolicy, OffloadPolicyResponse, SetOffloadPolicyRequest,
};
use ricochet_testkit::{BrokerProcess, SpawnOptions, etcd_or_skip, spawn_cluster};

use super::replicated::{ONE_CLUSTER, client};
use super::replicated_offload::stored;

const NS: &str = "public/default";

/// Brokers with a `[tiered]` section on directory `root/tier` (passes an
/// hour apart, no default policy), its config written under `root`.
fn options(root: &Path) -> SpawnOptions {
    let config: PathBuf = root.join("broker.toml");
    std::fs::write(
        &config,
        format!(
            "[tiered]\nurl = \"file://{}\"\ninterval = \"1h\"\n",
            root.join("tier").display()
        ),
    )
    .unwrap();
    SpawnOptions::new().config(config)
}

async fn tiered(url: &str) -> TieredClient<tonic::transport::Channel> {
    TieredClient::connect(url.to_owned()).await.unwrap()
}

/// Sets (an empty `policy`: removes) the namespace's policy through `url`.
async fn set_ns(url: &str, policy: OffloadPolicy) -> Result<OffloadPolicyResponse, tonic::Status> {
    tiered(url)
        .await
        .set_offload_policy(SetOffloadPolicyRequest {
            namespace: NS.to_owned(),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

async fn get(
    url: &str,
    namespace: &str,
    topic: &str,
) -> Result<OffloadPolicyResponse, tonic::Status> {
    tiered(url)
        .await
        .get_offload_policy(GetOffloadPolicyRequest {
            namespace: namespace.to_owned(),
            topic: topic.to_owned(),
        })
        .await
        .map(|r| r.into_inner())
}

/// A topic name `Lookup` places on broker `id` (asked of `url`), so that
/// a topic's policy asked of `id` is answered by `id` itself; waits up to
/// 20 s for `id` to take topics (it may just have restarted).
async fn topic_on(url: &str, id: &str) -> String {
    let c = client(url).await;
    let start = Instant::now();
    loop {
        for i in 0..64 {
            let t = format!("offl-{i}");
            if c.lookup(&t).await.is_ok_and(|l| l.broker_id == id) {
                return t;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no topic of 64 placed on {id}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the policy in force on topic `t`, asked of `url` (the
/// broker that owns it), offloads after `want`; panics after 10 s. An
/// error (the broker just restarted) is waited out like another answer.
async fn in_force(url: &str, t: &str, want: Option<i64>) {
    let topic = stored(t);
    crate::common::policy_in_force(
        &format!("{t}'s offload after"),
        want,
        NS,
        || get(url, "", &topic),
        |got| {
            let after = got.effective.as_ref().and_then(|p| p.offload_after_ms);
            (after, got.effective_from.as_str())
        },
    )
    .await;
}

fn after(ms: i64) -> OffloadPolicy {
    OffloadPolicy {
        offload_after_ms: Some(ms),
        keep_local: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_offload_policy_is_the_clusters() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_namespace_offload_policy_is_the_clusters").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "nsoff",
        2,
        root.path(),
        Duration::from_secs(3),
        &options(root.path()),
    )
    .await;
    let (u0, u1) = (brokers[0].url(), brokers[1].url());
    let (t0, t1) = (topic_on(&u0, "b0").await, topic_on(&u0, "b1").await);
    // Nothing in force anywhere to begin with.
    in_force(&u0, &t0, None).await;
    in_force(&u1, &t1, None).await;

    let set = set_ns(&u0, after(3_600_000)).await.unwrap();
    assert_eq!(
        set.policy.as_ref().and_then(|p| p.offload_after_ms),
        Some(3_600_000)
    );
    assert!(
        etcd.get(&format!("/ricochet/nsoff/namespaces/{NS}/offload"))
            .await
            .is_some_and(|(v, _)| v.contains("3600000")),
        "the policy is not in etcd"
    );
    // Read through the other broker at once: it is the cluster's.
    let seen = get(&u1, NS, "").await.unwrap();
    let p = seen.policy.expect("b1 answers the cluster's policy");
    assert_eq!((p.offload_after_ms, p.keep_local), (Some(3_600_000), true));
    // In force on each broker's topics.
    in_force(&u1, &t1, Some(3_600_000)).await;
    in_force(&u0, &t0, Some(3_600_000)).await;

    // Removed through b0 while b1 is down: b1 comes back with the policy
    // in its own store, and drops it because the cluster has none.
    brokers[1].kill9();
    let removed = set_ns(&u0, OffloadPolicy::default()).await.unwrap();
    assert_eq!(removed.policy, None, "{removed:?}");
    in_force(&u0, &t0, None).await;
    brokers[1].restart().await;
    let u1 = brokers[1].url();
    let t1 = topic_on(&u0, "b1").await;
    in_force(&u1, &t1, None).await;
    let seen = get(&u1, NS, "").await.unwrap();
    assert_eq!(seen.policy, None, "{seen:?}");

    // Changed while b1 is down again: it follows the cluster's on return.
    brokers[1].kill9();
    set_ns(&u0, after(60_000)).await.unwrap();
    brokers[1].restart().await;
    let u1 = brokers[1].url();
    let t1 = topic_on(&u0, "b1").await;
    in_force(&u1, &t1, Some(60_000)).await;

    // Set through the returned broker: b0 takes it.
    set_ns(&u1, after(86_400_000)).await.unwrap();
    in_force(&u0, &t0, Some(86_400_000)).await;
}

/// A broker that kept a namespace offload policy in its own store before
/// the cluster kept them (an upgrade) publishes it when it is the first to
/// read the cluster's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_offload_policy_held_before_the_cluster_becomes_the_clusters() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_namespace_offload_policy_held_before").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let options = options(root.path());
    let alone = BrokerProcess::spawn(&root.path().join("b0"), &options).await;
    set_ns(alone.url(), after(1234)).await.unwrap();
    alone.stop().await;
    assert_eq!(etcd.get("/ricochet/nsoffmig/offload-in-etcd").await, None);

    let brokers = spawn_cluster(
        &etcd,
        "nsoffmig",
        1,
        root.path(),
        Duration::from_secs(3),
        &options,
    )
    .await;
    let recorded = etcd
        .value_within(
            &format!("/ricochet/nsoffmig/namespaces/{NS}/offload"),
            Duration::from_secs(10),
            "the broker's namespace policy",
        )
        .await;
    assert!(recorded.contains("1234"), "{recorded}");
    assert!(
        etcd.get("/ricochet/nsoffmig/offload-in-etcd")
            .await
            .is_some()
    );
    let seen = get(&brokers[0].url(), NS, "").await.unwrap();
    assert_eq!(
        seen.policy.as_ref().and_then(|p| p.offload_after_ms),
        Some(1234),
        "{seen:?}"
    );
}
