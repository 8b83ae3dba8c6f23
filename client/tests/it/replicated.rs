//! Replicated topics in a real cluster (issue 22): etcd and three brokers
//! as child processes on loopback (skipped like `cluster.rs` when `etcd`
//! is missing, unless `RICOCHET_REQUIRE_ETCD=1`). A topic created with
//! `--replicas 3` is a Raft group over the three brokers, recorded in
//! etcd; `Lookup` answers its Raft leader, and after a `kill -9` of the
//! leader's process another member leads and `Lookup` answers it. What is
//! not built yet is checked as refused, not assumed: producers of a
//! replicated topic get FAILED_PRECONDITION saying so.

use std::time::{Duration, Instant};

use ricochet_client::{Client, ErrorKind};
use ricochet_testkit::{SpawnOptions, etcd_or_skip, spawn_cluster};

/// One cluster at a time (shared with nothing else in this module).
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

/// The member `Lookup` (asked of `url`) names for `topic`, once it names
/// one of `among` and the answer held for two reads 300 ms apart; `None`
/// after `within`.
async fn stable_leader(
    url: &str,
    topic: &str,
    among: &[String],
    within: Duration,
) -> Option<(String, String)> {
    let c = client(url).await;
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < within {
        if let Ok(o) = c.lookup(topic).await
            && among.contains(&o.broker_id)
        {
            let now = (o.broker_id.clone(), o.url.clone());
            if last.as_ref() == Some(&now) {
                return last;
            }
            last = Some(now);
        } else {
            last = None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    None
}

#[tokio::test]
async fn a_replicated_topic_is_a_group_of_three_led_by_the_broker_lookup_answers() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_replicated_topic_is_a_group_of_three").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "rep",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let c = client(&brokers[0].url()).await;
    let admin = c.admin();

    // More replicas than live brokers: refused, and nothing is recorded.
    let e = admin.create_replicated_topic("r4", 4).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(
        e.to_string().contains("needs 4 live brokers; 3 are live"),
        "{e}"
    );
    let groups = "/ricochet/rep/groups/persistent://public/default/";
    assert_eq!(etcd.get(&format!("{groups}r4")).await, None);

    let t = "orders";
    let info = admin.create_replicated_topic(t, 3).await.unwrap();
    assert!(info.created, "{info:?}");
    let again = admin.create_replicated_topic(t, 3).await.unwrap();
    assert!(!again.created, "a second create finds the group: {again:?}");
    let e = admin.create_replicated_topic(t, 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e:?}");
    let e = admin.create_topic(t).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e:?}");

    let (record, _) = etcd
        .get(&format!("{groups}{t}"))
        .await
        .expect("the group is recorded in etcd");
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["replicas"], 3, "{record}");
    let mut members: Vec<String> = record["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_owned())
        .collect();
    members.sort();
    assert_eq!(members, ["b0", "b1", "b2"], "{record}");

    let (leader, leader_url) =
        stable_leader(&brokers[1].url(), t, &members, Duration::from_secs(20))
            .await
            .expect("Lookup answers a member of the group");
    // Every broker answers the same leader.
    for b in &brokers {
        let o = client(&b.url()).await.lookup(t).await.unwrap();
        assert_eq!(o.broker_id, leader, "asked of {}", b.url());
    }
    // Not served yet: refused on the leader with a clear error, not
    // written unreplicated.
    let e = client(&leader_url)
        .await
        .producer(t)
        .create()
        .await
        .err()
        .expect("a producer of a replicated topic is refused");
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(e.to_string().contains("not served yet"), "{e}");

    // kill -9 of the leader: another member leads, and Lookup says so.
    let victim = members.iter().position(|m| *m == leader).unwrap();
    let survivor = brokers[(victim + 1) % 3].url();
    let killed = Instant::now();
    brokers[victim].kill9();
    let others: Vec<String> = members.iter().filter(|m| **m != leader).cloned().collect();
    let (next, _) = stable_leader(&survivor, t, &others, Duration::from_secs(30))
        .await
        .expect("after the leader's kill -9 another member leads");
    println!(
        "replicated: leader {leader} killed; {next} answered by Lookup after {} ms",
        killed.elapsed().as_millis()
    );
    assert_ne!(next, leader);

    // The old leader returns and rejoins the group: one member leads and
    // every broker answers the same one (Raft may elect any of them).
    brokers[victim].restart().await;
    let (after, _) = stable_leader(&brokers[victim].url(), t, &members, Duration::from_secs(20))
        .await
        .expect("a leader after the return");
    for b in &brokers {
        let o = client(&b.url()).await.lookup(t).await.unwrap();
        assert_eq!(o.broker_id, after, "asked of {}", b.url());
    }
}
