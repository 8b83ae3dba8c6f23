//! Admin calls on a partitioned topic's base name in a cluster (etcd and
//! three brokers as child processes, skipped with a printed line when
//! `etcd` is missing, unless `RICOCHET_REQUIRE_ETCD=1`): a topic of 6
//! partitions spread over the three brokers. Asked of one broker, a policy
//! set on the base name is in force on every partition (read back from
//! each partition's owner), and so is a forced breaker; dead letters of
//! every partition are listed, grouped, replayed and purged together; the
//! subscription is listed and its stats summed; deleting the base name
//! (refused first without `force`, changing nothing) removes every
//! partition from every broker and the count from etcd. With one owner
//! stopped (SIGSTOP), a call with a short deadline answers UNAVAILABLE
//! naming the partition and the broker before the deadline, a change
//! also naming the partitions done before it.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{recv, text};
use ricochet_client::admin::{DeadLetterFilter, DeadLetterGroupBy, ReplayOptions};
use ricochet_client::{
    Client, Consumer, ErrorKind, InitialPosition, OutgoingMessage, SubscriptionType,
};
use ricochet_policy::{BreakerMode, BreakerSpec, PolicySpec};
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::partitions::partition_for_key;
use ricochet_proto::partitions_client::PartitionsClient;
use ricochet_proto::{PartitionsRequest, SetPolicyRequest, TopicRequest};
use ricochet_testkit::{ClusterBroker, SpawnOptions, etcd_or_skip, spawn_cluster};

/// One cluster at a time: three brokers and an etcd on two shared cores.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LONG: Duration = Duration::from_secs(60);
pub(crate) const PARTITIONS: u32 = 6;

pub(crate) async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(10))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

pub(crate) fn partition(t: &str, i: u32) -> String {
    format!("{t}-partition-{i}")
}

/// Creates `t` with [`PARTITIONS`] partitions through `c`; each
/// partition's owner's broker id, checked to span all of `brokers`.
pub(crate) async fn create_spread(
    c: &Client,
    t: &str,
    brokers: &[ClusterBroker],
) -> BTreeMap<u32, String> {
    c.admin()
        .create_partitioned_topic(t, PARTITIONS)
        .await
        .unwrap();
    let mut owners = BTreeMap::new();
    let mut urls = BTreeSet::new();
    for i in 0..PARTITIONS {
        let o = c.lookup(&partition(t, i)).await.unwrap();
        urls.insert(o.url);
        owners.insert(i, o.broker_id);
    }
    let all: BTreeSet<String> = brokers.iter().map(|b| b.url()).collect();
    assert_eq!(urls, all, "the partitions spread over all three brokers");
    owners
}

/// A key of partition `i` (of [`PARTITIONS`]).
pub(crate) fn key_of(i: u32) -> String {
    (0..)
        .map(|k| format!("k{k}"))
        .find(|k| partition_for_key(k, PARTITIONS) == i)
        .unwrap()
}

/// The partitions of `t` a broker has as topics (asked of that broker,
/// for its own).
async fn partitions_on(b: &ClusterBroker, t: &str) -> Vec<String> {
    let listed = AdminClient::new(client(&b.url()).await.channel())
        .list_topics(ricochet_proto::ListTopicsRequest {
            local_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let prefix = format!("persistent://public/default/{t}-partition-");
    listed
        .topics
        .into_iter()
        .filter(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|i| i.parse::<u32>().is_ok())
        })
        .collect()
}

#[tokio::test]
async fn admin_calls_on_a_base_name_reach_every_partition_at_its_owner() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("admin_calls_on_a_base_name_reach_every_partition").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        &etcd,
        "adm",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    let t = "orders";
    // The client knows only broker 0: every base-name call is answered
    // there, over partitions two thirds of which live elsewhere.
    let c = client(&brokers[0].url()).await;
    let owners = create_spread(&c, t, &brokers).await;
    let admin = c.admin();

    // One message per partition, each terminated: a dead letter on every
    // partition, so on every broker.
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = c.producer(t).create().await.unwrap();
    for i in 0..PARTITIONS {
        producer
            .send(OutgoingMessage::builder(format!("p{i}")).key(key_of(i)))
            .await
            .unwrap();
    }
    let mut seen = BTreeSet::new();
    for _ in 0..PARTITIONS {
        let m = recv(&mut consumer, LONG).await;
        seen.insert(text(&m));
        consumer.terminate(&m, "bad order").await.unwrap();
    }
    consumer.flush().await.unwrap();
    assert_eq!(seen.len(), PARTITIONS as usize);

    // Subscriptions: listed and summed over the partitions.
    assert_eq!(admin.list_subscriptions(t).await.unwrap(), ["s"]);
    let stats = admin.subscription_stats(t, "s").await.unwrap();
    assert_eq!(stats.dead_lettered, u64::from(PARTITIONS), "{stats:?}");

    // A policy (with a breaker) set on the base name is in force on each
    // partition, read back from its owner.
    let policy = PolicySpec::fixed_backoff(Duration::from_millis(250), 7);
    let set = admin
        .set_policy_options(t, "s", Some(&policy), None, Some(&BreakerSpec::default()))
        .await
        .unwrap();
    assert_eq!(set.source, "admin");
    for i in 0..PARTITIONS {
        let p = partition(t, i);
        let got = admin.policy(&p, "s").await.unwrap();
        assert_eq!(got.source, "admin", "{p} at {}: {got:?}", owners[&i]);
        // The same policy and breaker; the tiers are each partition's.
        let (got, set) = (got.policy.unwrap(), set.policy.clone().unwrap());
        assert_eq!(got.kind, set.kind, "{p} at {}", owners[&i]);
        assert_eq!(got.breaker, set.breaker, "{p} at {}", owners[&i]);
        assert!(
            got.dead_letter_topic
                .starts_with(&format!("persistent://public/default/{p}-"))
        );
    }
    let whole = admin.policy(t, "s").await.unwrap().policy.unwrap();
    assert_eq!(whole.kind, set.policy.as_ref().unwrap().kind);

    // Dead letters of every partition, together.
    let all = DeadLetterFilter::default();
    let page = admin
        .list_dead_letters(t, "s", &all, 0, None)
        .await
        .unwrap();
    assert_eq!(page.total, u64::from(PARTITIONS), "{page:?}");
    let origins: BTreeSet<String> = page
        .dead_letters
        .iter()
        .map(|d| d.origin.as_ref().unwrap().topic.clone())
        .collect();
    assert_eq!(
        origins.len(),
        PARTITIONS as usize,
        "one per partition: {origins:?}"
    );
    let groups = admin
        .group_dead_letters(t, "s", &all, DeadLetterGroupBy::Reason, 0)
        .await
        .unwrap();
    assert_eq!(groups.total, u64::from(PARTITIONS), "{groups:?}");

    // Replayed through the base name: every partition's comes back.
    let replayed = admin
        .replay_dead_letters(t, "s", &ReplayOptions::new())
        .await
        .unwrap();
    assert_eq!(replayed.replayed, u64::from(PARTITIONS), "{replayed:?}");
    let mut again = BTreeSet::new();
    for _ in 0..PARTITIONS {
        let m = recv(&mut consumer, LONG).await;
        again.insert(text(&m));
        // Dead-lettered again, for the purge.
        consumer.terminate(&m, "still bad").await.unwrap();
    }
    consumer.flush().await.unwrap();
    assert_eq!(again, seen, "each replayed message once");

    // Purged through the base name: a dry run first changes nothing.
    let dry = admin.purge_dead_letters(t, "s", &all, true).await.unwrap();
    assert_eq!(dry.dead_letter_ids.len(), PARTITIONS as usize, "{dry:?}");
    let purged = admin.purge_dead_letters(t, "s", &all, false).await.unwrap();
    assert_eq!(purged.purged, u64::from(PARTITIONS), "{purged:?}");
    for i in 0..PARTITIONS {
        let p = partition(t, i);
        let left = admin
            .list_dead_letters(&p, "s", &all, 0, None)
            .await
            .unwrap();
        assert_eq!(left.total, 0, "{p} at {}", owners[&i]);
    }

    // The breaker forced open on the base name: open on each partition.
    admin
        .set_breaker(t, "s", BreakerMode::ForcedOpen)
        .await
        .unwrap();
    for i in 0..PARTITIONS {
        let p = partition(t, i);
        let b = admin.subscription_stats(&p, "s").await.unwrap().breaker;
        let b = b.unwrap_or_else(|| panic!("{p}: no breaker"));
        assert_eq!(b.state, "open", "{p} at {}: {b:?}", owners[&i]);
    }
    consumer.close().await.unwrap();
    drop(producer);

    // Delete: without force refused (the partitions have a subscription),
    // nothing removed; with force every partition goes from its broker.
    let before: usize = {
        let mut n = 0;
        for b in &brokers {
            n += partitions_on(b, t).await.len();
        }
        n
    };
    assert_eq!(before, PARTITIONS as usize);
    let e = admin.delete_topic(t, false).await.unwrap_err();
    assert!(e.to_string().contains("subscription"), "{e}");
    for b in &brokers {
        assert!(!partitions_on(b, t).await.is_empty(), "kept on {}", b.url());
    }
    admin.delete_topic(t, true).await.unwrap();
    for b in &brokers {
        assert_eq!(
            partitions_on(b, t).await,
            Vec::<String>::new(),
            "removed from {}",
            b.url()
        );
    }
    let count = PartitionsClient::new(c.channel())
        .get_partitions(PartitionsRequest { topic: t.into() })
        .await
        .unwrap()
        .into_inner()
        .partitions;
    assert_eq!(count, 0, "the count is gone from etcd");

    replay_jobs_on_a_base_name(&c, &brokers).await;
}

/// Two dead letters on each partition of `t` in subscription `s` (so a
/// replay job at one a second is still running after its first); the
/// subscription's consumer.
pub(crate) async fn two_dead_letters_per_partition(c: &Client, t: &str) -> Consumer {
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = c.producer(t).create().await.unwrap();
    for i in 0..2 * PARTITIONS {
        producer
            .send(OutgoingMessage::builder(format!("j{i}")).key(key_of(i % PARTITIONS)))
            .await
            .unwrap();
    }
    for _ in 0..2 * PARTITIONS {
        let m = recv(&mut consumer, LONG).await;
        consumer.terminate(&m, "bad").await.unwrap();
    }
    consumer.flush().await.unwrap();
    consumer
}

/// Detached replay jobs of a partitioned topic whose partitions live on
/// three brokers: started, listed and cancelled through one broker by the
/// base name. Each broker numbers its own jobs, so an id may name a job on
/// several partitions: cancelling it by the base name is then refused,
/// changing nothing, and the partition's name cancels it.
async fn replay_jobs_on_a_base_name(c: &Client, brokers: &[ClusterBroker]) {
    let t = "jobs";
    create_spread(c, t, brokers).await;
    let admin = c.admin();
    let consumer = two_dead_letters_per_partition(c, t).await;
    let slow = ReplayOptions::new().rate_per_second(1).detach(true);
    let started = admin.replay_dead_letters(t, "s", &slow).await.unwrap();
    let mut each: Vec<(String, u64)> = started
        .jobs
        .iter()
        .map(|j| (j.topic.clone(), j.total))
        .collect();
    each.sort();
    let want: Vec<(String, u64)> = (0..PARTITIONS)
        .map(|i| {
            (
                format!("persistent://public/default/{}", partition(t, i)),
                2,
            )
        })
        .collect();
    assert_eq!(each, want, "one job per partition: {started:?}");
    let key = |j: &ricochet_client::admin::ReplayJob| (j.topic.clone(), j.id);
    let mut jobs: Vec<_> = started.jobs.iter().map(key).collect();
    jobs.sort();
    let mut listed: Vec<_> = admin
        .list_replay_jobs(Some(t), Some("s"))
        .await
        .unwrap()
        .iter()
        .map(key)
        .collect();
    listed.sort();
    assert_eq!(listed, jobs, "every partition's job, from every broker");

    let mut running = jobs.clone();
    for (topic, id) in &jobs {
        let same_id = running.iter().filter(|(_, i)| i == id).count();
        let by_base = admin.cancel_replay_job(*id, Some(t)).await;
        if same_id == 1 {
            by_base.unwrap_or_else(|e| panic!("job {id} of {topic}: {e}"));
        } else {
            let e = by_base.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e}");
            assert!(e.to_string().contains(topic.as_str()), "{e}");
            admin.cancel_replay_job(*id, Some(topic)).await.unwrap();
        }
        running.retain(|j| j != &(topic.clone(), *id));
        let left = admin.list_replay_jobs(Some(t), Some("s")).await.unwrap();
        assert!(
            !left.iter().any(|j| key(j) == (topic.clone(), *id)),
            "job {id} of {topic} cancelled: {left:?}"
        );
    }
    let e = admin
        .cancel_replay_job(jobs[0].1, Some(t))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    consumer.close().await.unwrap();
}

#[tokio::test]
async fn a_stopped_owner_fails_a_base_name_call_unavailable_naming_it() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_stopped_owner_fails_a_base_name_call").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    // A lease longer than the test's calls: the stopped broker still
    // counts as live, so its partitions are called, not found down.
    let brokers = spawn_cluster(
        &etcd,
        "adm",
        3,
        root.path(),
        Duration::from_secs(20),
        &SpawnOptions::new(),
    )
    .await;
    let t = "orders";
    let c = client(&brokers[0].url()).await;
    let owners = create_spread(&c, t, &brokers).await;
    let stopped = c.lookup(&partition(t, 0)).await.unwrap();
    let stopped = if stopped.url == brokers[0].url() {
        // Broker 0 answers the calls: stop another.
        c.lookup(&partition(t, 1)).await.unwrap()
    } else {
        stopped
    };
    let victim = brokers.iter().find(|b| b.url() == stopped.url).unwrap();
    let victims: Vec<u32> = owners
        .iter()
        .filter(|(_, b)| **b == stopped.broker_id)
        .map(|(i, _)| *i)
        .collect();
    // A subscription on every partition, for the policy set.
    let consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .subscribe()
        .await
        .unwrap();
    consumer.close().await.unwrap();

    victim.process().freeze();
    let mut admin = AdminClient::new(c.channel());
    let deadline = Duration::from_secs(3);
    let names_victim = |m: &str| {
        victims.iter().any(|i| m.contains(&partition(t, *i)))
            && m.contains(&format!("broker {}", stopped.broker_id))
    };

    let mut r = tonic::Request::new(TopicRequest { topic: t.into() });
    r.set_timeout(deadline);
    let started = Instant::now();
    let e = admin.list_subscriptions(r).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(names_victim(e.message()), "{e:?}");
    assert!(
        took < deadline,
        "answered before the caller's deadline: {took:?}"
    );

    let mut r = tonic::Request::new(SetPolicyRequest {
        topic: t.into(),
        subscription: "s".into(),
        policy: Some((&PolicySpec::fixed_backoff(Duration::from_millis(250), 7)).into()),
    });
    r.set_timeout(deadline);
    let e = admin.set_policy(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(names_victim(e.message()), "{e:?}");
    // The partitions before the first of the stopped broker's are done.
    let first = victims[0];
    assert!(
        e.message().contains("partitions done before this failure"),
        "{e:?}"
    );
    for i in 0..first {
        assert!(e.message().contains(&partition(t, i)), "{i} done: {e:?}");
    }
    victim.process().thaw();
}
