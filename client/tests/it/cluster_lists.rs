//! The cluster's lists in a cluster (etcd and three brokers as child
//! processes, skipped with a printed line when `etcd` is missing, unless
//! `RICOCHET_REQUIRE_ETCD=1`): `ListTopics` and `ListReplayJobs` without a
//! topic asked of any broker answer every live broker's. The partitions of
//! a topic spread over the three brokers are listed through each broker,
//! with the topic's partition count; a topic replicated on all three is
//! listed once through each (its leader lists it); detached replay jobs on every broker are listed through
//! one. With one broker stopped (SIGSTOP), both lists answer UNAVAILABLE
//! naming it before the caller's deadline.

use crate::cluster_admin::{
    PARTITIONS, client, create_spread, partition, two_dead_letters_per_partition,
};

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ricochet_client::admin::ReplayOptions;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::{ListReplayJobsRequest, ListTopicsRequest};
use ricochet_testkit::{ClusterBroker, SpawnOptions, etcd_or_skip, spawn_cluster};

const LONG: Duration = Duration::from_secs(60);

fn full(t: &str) -> String {
    format!("persistent://public/default/{t}")
}

/// The topics broker `b` holds itself (`local_only`).
async fn local_topics(b: &ClusterBroker) -> Vec<String> {
    AdminClient::new(client(&b.url()).await.channel())
        .list_topics(ListTopicsRequest {
            local_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .topics
}

#[tokio::test]
async fn lists_asked_of_any_broker_are_the_clusters() {
    let Some(etcd) = etcd_or_skip("lists_asked_of_any_broker_are_the_clusters").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    // A lease longer than the test's calls: the stopped broker still
    // counts as live, so it is asked, not found down.
    let brokers = spawn_cluster(
        &etcd,
        "lists",
        3,
        root.path(),
        Duration::from_secs(20),
        &SpawnOptions::new(),
    )
    .await;
    let c = client(&brokers[0].url()).await;
    let admin = c.admin();

    // A partitioned topic spread over the three brokers, each partition
    // used (so a topic on its owner): two dead letters on each.
    let t = "jobs";
    create_spread(&c, t, &brokers).await;
    let _consumer = two_dead_letters_per_partition(&c, t).await;

    // A topic replicated on all three, used: its leader has it open (its
    // followers hold its data but list it not).
    let rep = "everywhere";
    admin.create_replicated_topic(rep, 3).await.unwrap();
    c.producer(rep)
        .create()
        .await
        .unwrap()
        .send("r")
        .await
        .unwrap();
    let started = Instant::now();
    let mut holders = Vec::new();
    while holders.is_empty() {
        assert!(started.elapsed() < LONG, "{rep} held by none");
        for b in &brokers {
            if local_topics(b).await.contains(&full(rep)) {
                holders.push(b.id.clone());
            }
        }
    }

    let parts: BTreeSet<String> = (0..PARTITIONS).map(|i| full(&partition(t, i))).collect();
    for b in &brokers {
        let listed = client(&b.url())
            .await
            .admin()
            .list_topics(Some("public/default"), false)
            .await
            .unwrap();
        let names: BTreeSet<String> = listed.topics.iter().cloned().collect();
        assert!(
            names.is_superset(&parts),
            "every partition through {}: {listed:?}",
            b.id
        );
        let once = listed.topics.iter().filter(|n| **n == full(rep)).count();
        assert_eq!(
            once, 1,
            "{rep} (held by {holders:?}) listed once through {}: {listed:?}",
            b.id
        );
        assert!(
            listed
                .partitioned
                .iter()
                .any(|p| p.topic == full(t) && p.partitions == PARTITIONS),
            "{t}'s count through {}: {listed:?}",
            b.id
        );
    }
    // Another namespace's list has none of them.
    let other = admin
        .list_topics(Some("public/other"), false)
        .await
        .unwrap();
    assert!(
        other.topics.is_empty() && other.partitioned.is_empty(),
        "{other:?}"
    );

    // A detached job per partition, so on every broker, listed through
    // broker 0 without a topic, each with its partition.
    let slow = ReplayOptions::new().rate_per_second(1).detach(true);
    let replays = admin.replay_dead_letters(t, "s", &slow).await.unwrap();
    let mut jobs: Vec<(String, u64)> = replays
        .jobs
        .iter()
        .map(|j| (j.topic.clone(), j.id))
        .collect();
    jobs.sort();
    assert_eq!(jobs.len(), PARTITIONS as usize, "{replays:?}");
    let mut listed: Vec<(String, u64)> = admin
        .list_replay_jobs(None, None)
        .await
        .unwrap()
        .iter()
        .map(|j| (j.topic.clone(), j.id))
        .collect();
    listed.sort();
    assert_eq!(listed, jobs, "every broker's jobs through broker 0");

    // One broker stopped: both lists fail UNAVAILABLE naming it, before
    // the caller's deadline.
    let victim = &brokers[1];
    victim.process().freeze();
    let mut raw = AdminClient::new(c.channel());
    let deadline = Duration::from_secs(3);
    let names_victim = |e: &tonic::Status| {
        e.code() == tonic::Code::Unavailable
            && e.message().contains(&format!("broker {}", victim.id))
    };
    let mut r = tonic::Request::new(ListTopicsRequest::default());
    r.set_timeout(deadline);
    let asked = Instant::now();
    let e = raw.list_topics(r).await.unwrap_err();
    assert!(names_victim(&e), "{e:?}");
    assert!(asked.elapsed() < deadline, "took {:?}", asked.elapsed());
    let mut r = tonic::Request::new(ListReplayJobsRequest::default());
    r.set_timeout(deadline);
    let asked = Instant::now();
    let e = raw.list_replay_jobs(r).await.unwrap_err();
    assert!(names_victim(&e), "{e:?}");
    assert!(asked.elapsed() < deadline, "took {:?}", asked.elapsed());
    victim.process().thaw();
}
