//! Partitioned topics with a replication factor in a real cluster (issue
//! 22): etcd and three brokers as child processes on loopback. A
//! partitioned topic created with `replicas` 3 (or in a namespace whose
//! default is 3) has every partition its own Raft group of three, formed
//! before the create answers (and those a raised count adds before that
//! answers); a create whose groups cannot all form in time answers
//! UNAVAILABLE naming them, and first use forms them. A keyed producer and
//! a Shared consumer on the partitioned topic go through the client's
//! partitioned paths, and after a `kill -9` of one partition's leader every partition
//! is served again: the messages published after the kill all arrive, and
//! none acked before it comes again. Standalone, a factor above 1 is
//! refused and nothing is created.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ricochet_client::{ErrorKind, InitialPosition, OutgoingMessage, SubscriptionType};
use ricochet_testkit::{EtcdProcess, SpawnOptions, etcd_or_skip, spawn_cluster};

use crate::replicated::{ONE_CLUSTER, client, stable_leader};

/// The replication factor and members etcd records for `topic`'s group
/// in cluster `cluster`, if it has one.
async fn group_of(etcd: &EtcdProcess, cluster: &str, topic: &str) -> Option<(u64, usize)> {
    let key = format!("/ricochet/{cluster}/groups/persistent://{topic}");
    let (record, _) = etcd.get(&key).await?;
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    Some((
        record["replicas"].as_u64()?,
        record["members"].as_array()?.len(),
    ))
}

/// Receives until `want` distinct payloads came (acking each), or 30 s
/// passed; then 2 s more for anything extra. Every payload received, in
/// order.
async fn drain(consumer: &mut ricochet_client::Consumer, want: usize) -> Vec<String> {
    let mut got = Vec::new();
    let start = Instant::now();
    while got.iter().collect::<BTreeSet<_>>().len() < want
        && start.elapsed() < Duration::from_secs(30)
    {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(5), consumer.receive()).await {
            got.push(String::from_utf8_lossy(m.payload()).into_owned());
            consumer.ack(&m).await.unwrap();
        }
    }
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), consumer.receive()).await {
        got.push(String::from_utf8_lossy(m.payload()).into_owned());
        consumer.ack(&m).await.unwrap();
    }
    got
}

/// The groups `ListBrokers` (asked of `url`) lists for the partitions of
/// `base` (`public/default/<base>-partition-<i>`), by partition index:
/// (replicas, members, leader, leader's last index).
async fn listed_groups(url: &str, base: &str) -> Vec<(u32, usize, String, u64)> {
    let listed = client(url).await.admin().brokers(false).await.unwrap();
    let prefix = format!("persistent://public/default/{base}-partition-");
    let mut groups: Vec<(u32, (u32, usize, String, u64))> = listed
        .groups
        .iter()
        .filter_map(|g| {
            let i = g.topic.strip_prefix(&prefix)?.parse().ok()?;
            assert!(
                g.leader.is_empty() || g.members.contains(&g.leader),
                "the leader is a member: {g:?}"
            );
            Some((
                i,
                (g.replicas, g.members.len(), g.leader.clone(), g.last_index),
            ))
        })
        .collect();
    groups.sort();
    let indexes: Vec<u32> = groups.iter().map(|g| g.0).collect();
    assert!(
        indexes.iter().enumerate().all(|(n, i)| n as u32 == *i),
        "at most one group per partition, from 0 on: {indexes:?}"
    );
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Asserts that the partitions of `base` are listed (by the broker at
/// `url`) as `n` groups of three members with a leader at once, and that
/// within 15 s each leader reports its log (only a leader writes that
/// report), with no produce or lookup in between.
async fn assert_groups_formed(url: &str, base: &str, n: usize) {
    let groups = listed_groups(url, base).await;
    assert_eq!(groups.len(), n, "one group per partition: {groups:?}");
    for g in &groups {
        assert_eq!((g.0, g.1), (3, 3), "three members: {groups:?}");
        assert!(!g.2.is_empty(), "a leader: {groups:?}");
    }
    let start = Instant::now();
    loop {
        let groups = listed_groups(url, base).await;
        if groups.len() == n && groups.iter().all(|g| g.3 > 0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "every leader reports its group within 15 s: {groups:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn publish(p: &ricochet_client::Producer, range: std::ops::Range<u32>) {
    for i in range {
        let m = OutgoingMessage::builder(format!("m{i}"))
            .key(format!("k{i}"))
            .build();
        tokio::time::timeout(Duration::from_secs(30), p.send(m))
            .await
            .expect("a receipt within 30 s")
            .unwrap();
    }
}

fn names(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

#[tokio::test]
async fn each_partition_of_a_replicated_partitioned_topic_is_a_group_and_survives_its_leaders_kill()
{
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("each_partition_of_a_replicated_partitioned_topic").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut brokers = spawn_cluster(
        &etcd,
        "rpart",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let admin_client = client(&brokers[0].url()).await;
    let admin = admin_client.admin();
    // More replicas than brokers: refused, nothing created.
    let e = admin
        .create_replicated_partitioned_topic("pt4", 2, 4)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(e.to_string().contains("needs 4 live brokers"), "{e}");
    assert_eq!(admin.partitions("pt4").await.unwrap(), None);

    let t = "pt";
    let info = admin
        .create_replicated_partitioned_topic(t, 4, 3)
        .await
        .unwrap();
    assert_eq!(info.partitions, 4, "{info:?}");
    // Every partition is a group of three with a leader once the create
    // answered, before any client used one.
    assert_groups_formed(&brokers[0].url(), t, 4).await;
    // So are the partitions a raised count adds.
    let raised = admin.update_partitions(t, 6).await.unwrap();
    assert_eq!(raised.partitions, 6, "{raised:?}");
    assert_groups_formed(&brokers[0].url(), t, 6).await;

    // Clients know broker 0 and broker 1; a producer and a consumer of the
    // partitioned topic use every partition.
    let c = client(&brokers[0].url()).await;
    let p = c
        .producer(t)
        .send_timeout(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    publish(&p, 0..40).await;
    // The base name's stats sum the partitions', each asked of its leader.
    let whole = admin.topic_stats(t).await.unwrap();
    assert_eq!(
        (whole.partition_count, whole.message_count),
        (6, 40),
        "{whole:?}"
    );
    for i in 0..6 {
        let part = format!("public/default/{t}-partition-{i}");
        assert_eq!(
            group_of(&etcd, "rpart", &part).await,
            Some((3, 3)),
            "{part} is a group of three"
        );
    }
    let mut first = drain(&mut consumer, 40).await;
    first.sort();
    let mut want = names(0..40);
    want.sort();
    assert_eq!(first, want, "every message once before the kill");

    // kill -9 of partition 0's leader.
    let ids: Vec<String> = (0..3).map(|i| format!("b{i}")).collect();
    let p0 = format!("{t}-partition-0");
    let (leader, _) = stable_leader(&brokers[0].url(), &p0, &ids, Duration::from_secs(20))
        .await
        .expect("partition 0 has a leader");
    let victim = ids.iter().position(|m| *m == leader).unwrap();
    let survivor = brokers[(victim + 1) % 3].url();
    // The clients' own broker may be the victim: new clients on a survivor.
    let killed = Instant::now();
    brokers[victim].kill9();
    drop((p, consumer));
    let others: Vec<String> = ids.iter().filter(|m| **m != leader).cloned().collect();
    let (next, _) = stable_leader(&survivor, &p0, &others, Duration::from_secs(30))
        .await
        .expect("another member leads partition 0");
    println!(
        "replicated partitions: {leader} killed; partition 0 led by {next} after {} ms",
        killed.elapsed().as_millis()
    );
    let c = client(&survivor).await;
    let p = c
        .producer(t)
        .send_timeout(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    publish(&p, 40..80).await;
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let mut after = drain(&mut consumer, 40).await;
    after.sort();
    let mut want = names(40..80);
    want.sort();
    assert_eq!(
        after, want,
        "the 40 published after the kill, once each, and none acked before it"
    );

    // A namespace's default factor reaches a partitioned topic created
    // without one (three live brokers again: the victim restarted).
    brokers[victim].restart().await;
    let admin = c.admin();
    let start = Instant::now();
    while let Err(e) = admin.set_namespace_replication("acme/parted", 3).await {
        assert!(
            start.elapsed() < Duration::from_secs(30) && e.to_string().contains("live brokers"),
            "{e}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let nt = "persistent://acme/parted/orders";
    admin.create_partitioned_topic(nt, 2).await.unwrap();
    let p = c
        .producer(nt)
        .send_timeout(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    publish(&p, 0..4).await;
    for i in 0..2 {
        let part = format!("acme/parted/orders-partition-{i}");
        let g = group_of(&etcd, "rpart", &part).await;
        assert_eq!(g.map(|g| g.0), Some(3), "{part}: {g:?}");
    }
    // An explicit factor 1 keeps the partitions out of groups.
    let single = "persistent://acme/parted/single";
    admin
        .create_replicated_partitioned_topic(single, 2, 1)
        .await
        .unwrap();
    let p = c.producer(single).create().await.unwrap();
    publish(&p, 0..4).await;
    for i in 0..2 {
        let part = format!("acme/parted/single-partition-{i}");
        assert_eq!(group_of(&etcd, "rpart", &part).await, None, "{part}");
    }
}

/// A broker stopped (SIGSTOP) just after it registered still counts as
/// live for its lease's 3 s, so a create at factor 3 is accepted and
/// places a partition on it, whose group cannot form: the create answers
/// UNAVAILABLE after its bound (here 5 s, `partition_form_timeout`) naming exactly the partitions placed
/// there, the others are groups already, the topic stays created, and
/// once the broker runs again a producer's first use forms the rest.
#[tokio::test]
async fn a_create_whose_groups_cannot_form_in_time_names_them_and_first_use_forms_them() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_create_whose_groups_cannot_form_in_time").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        &etcd,
        "rpartstop",
        3,
        root.path(),
        Duration::from_secs(3),
        // Not the default 30 s: the create waits this out.
        &SpawnOptions::new().env("RICOCHET_PARTITION_FORM_TIMEOUT", "5s"),
    )
    .await;
    let admin_client = client(&brokers[0].url()).await;
    let admin = admin_client.admin();
    let t = "pt";
    brokers[2].process().freeze();
    let started = Instant::now();
    let e = admin
        .create_replicated_partitioned_topic(t, 3, 3)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e:?}");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(20),
        "the 5 s bound set, not the default 30 s: {took:?}"
    );
    let message = e.to_string();
    assert!(message.contains("form when first used"), "{message}");
    let mut on_stopped = Vec::new();
    for i in 0..3 {
        let key =
            format!("/ricochet/rpartstop/placement/persistent://public/default/{t}-partition-{i}");
        let (placed, _) = etcd.get(&key).await.expect("every partition is placed");
        if placed == "b2" {
            on_stopped.push(i.to_string());
        }
    }
    assert!(
        !on_stopped.is_empty(),
        "a partition is placed on the stopped broker"
    );
    assert!(
        message.contains(&format!("partitions {} (of 3)", on_stopped.join(", "))),
        "names the partitions placed on b2 ({on_stopped:?}): {message}"
    );
    println!(
        "replicated partitions: a create with b2 stopped answered after {} ms: {message}",
        took.as_millis()
    );
    assert_eq!(
        admin.partitions(t).await.unwrap().map(|p| p.partitions),
        Some(3),
        "the topic stays created"
    );
    for i in 0..3 {
        let part = format!("public/default/{t}-partition-{i}");
        let g = group_of(&etcd, "rpartstop", &part).await;
        if on_stopped.contains(&i.to_string()) {
            assert_eq!(g, None, "{part} was not formed");
        } else {
            assert_eq!(g, Some((3, 3)), "{part} is a group of three");
        }
    }

    // Running again, the broker registers again; a producer's first use
    // forms the groups still missing.
    brokers[2].process().thaw();
    let start = Instant::now();
    while ricochet_testkit::etcd::live_brokers(&brokers[0].url()).await < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "b2 is live again within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let p = admin_client
        .producer(t)
        .send_timeout(Duration::from_secs(30))
        .create()
        .await
        .unwrap();
    publish(&p, 0..30).await;
    for i in 0..3 {
        let part = format!("public/default/{t}-partition-{i}");
        assert_eq!(
            group_of(&etcd, "rpartstop", &part).await,
            Some((3, 3)),
            "{part} is a group of three after first use"
        );
    }
}

#[tokio::test]
async fn a_standalone_broker_refuses_a_partitioned_topic_with_a_factor() {
    let env = crate::common::start().await;
    let admin = env.client.admin();
    let e = admin
        .create_replicated_partitioned_topic("standalone-pt", 2, 3)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    assert!(e.to_string().contains("standalone"), "{e}");
    assert_eq!(admin.partitions("standalone-pt").await.unwrap(), None);
    let ok = admin
        .create_replicated_partitioned_topic("standalone-pt", 2, 1)
        .await
        .unwrap();
    assert_eq!(ok.partitions, 2, "{ok:?}");
}
