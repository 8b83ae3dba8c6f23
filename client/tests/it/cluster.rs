//! The client against a real cluster: etcd (Debian's `etcd-server`) and
//! three brokers as child processes on loopback (skipped with a printed
//! line when `etcd` is missing, unless `RICOCHET_REQUIRE_ETCD=1`, which
//! `.ci/run` sets). A client given any one broker's URL finds every
//! topic's owner: a partitioned topic spread over the three brokers is
//! produced and consumed exactly once, keys staying in order, and its
//! base name's stats (asked of any broker) sum its partitions'; a `kill -9`
//! of one owner makes its topic fail with `OwnerDown` naming that broker
//! while the others keep serving, and after its restart the same producer
//! and consumer go on, with everything acknowledged still there.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::{recv, text};
use ricochet_client::proto::TopicRequest;
use ricochet_client::proto::admin_client::AdminClient;
use ricochet_client::{Client, ErrorKind, InitialPosition, OutgoingMessage, SubscriptionType};
use ricochet_testkit::{FakeAnswer, FakeCluster, SpawnOptions, etcd_or_skip, spawn_cluster};

/// One cluster at a time: three brokers and an etcd renew leases on two
/// shared cores.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LONG: Duration = Duration::from_secs(60);

async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_client_through_one_broker_uses_a_partitioned_topic_spread_over_three() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_client_through_one_broker_uses_a_partitioned_topic").await
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        &etcd,
        "e2e",
        3,
        root.path(),
        Duration::from_secs(3),
        &SpawnOptions::new(),
    )
    .await;
    // The client knows only the last broker.
    let c = client(&brokers[2].url()).await;
    let t = "orders";
    c.admin().create_partitioned_topic(t, 8).await.unwrap();
    let mut owners = BTreeSet::new();
    for i in 0..8 {
        owners.insert(c.lookup(&format!("{t}-partition-{i}")).await.unwrap().url);
    }
    let urls: BTreeSet<String> = brokers.iter().map(|b| b.url()).collect();
    assert_eq!(
        owners, urls,
        "the 8 partitions spread over all three brokers"
    );

    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let producer = c.producer(t).create().await.unwrap();
    const KEYS: usize = 20;
    const PER_KEY: usize = 100;
    let mut sends = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            sends.push(
                producer
                    .send_async(OutgoingMessage::builder(format!("k{k}:{i}")).key(format!("k{k}")))
                    .await
                    .unwrap(),
            );
        }
    }
    for s in sends {
        s.await.unwrap();
    }
    // Every message once, each key in order.
    let mut next: HashMap<String, usize> = HashMap::new();
    for _ in 0..KEYS * PER_KEY {
        let m = recv(&mut consumer, LONG).await;
        let body = text(&m);
        let (key, i) = body.split_once(':').unwrap();
        let expected = next.entry(key.to_owned()).or_default();
        assert_eq!(i.parse::<usize>().unwrap(), *expected, "{key} out of order");
        *expected += 1;
        consumer.ack(&m).await.unwrap();
    }
    assert!(next.values().all(|n| *n == PER_KEY));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), consumer.receive())
            .await
            .is_err(),
        "nothing more than each message once"
    );
    consumer.flush().await.unwrap();
    // Each partition's messages are on its owner: the stats, asked of the
    // owner, add up to everything sent.
    let mut stored = 0;
    let mut each = Vec::new();
    for i in 0..8 {
        let p = format!("{t}-partition-{i}");
        let n = c.admin().topic_stats(&p).await.unwrap().message_count;
        each.push(n);
        stored += n;
    }
    assert_eq!(stored, (KEYS * PER_KEY) as u64);
    // The base name's stats, asked of any broker, fan out to the
    // partitions' owners: the same counts, summed.
    for b in [&brokers[0], &brokers[2]] {
        let whole = client(&b.url()).await.admin().topic_stats(t).await.unwrap();
        assert_eq!(whole.partition_count, 8, "{whole:?}");
        let per: Vec<u64> = whole.partitions.iter().map(|p| p.message_count).collect();
        assert_eq!(per, each, "each partition's count, in order");
        assert_eq!(whole.message_count, stored, "the sum");
        let subs: Vec<&str> = whole
            .subscriptions
            .iter()
            .map(|s| s.subscription.as_str())
            .collect();
        assert_eq!(subs, ["s"], "one subscription, merged: {whole:?}");
    }
}

#[tokio::test]
async fn a_killed_owner_fails_its_topic_by_name_and_returns_with_everything_acknowledged() {
    killed_owner_fails_by_name_and_returns("a_killed_owner_fails_its_topic_by_name", false).await;
}

/// The same with every broker wording its errors differently
/// (`RICOCHET_TEST_REWORD_ERRORS=1`: the words reversed): the client's
/// redirects and failover are decided from the structured details alone.
/// Also checks a not-owner refusal from a broker that does not own the
/// topic: the redirect names the owner, its URL and its epoch.
#[tokio::test]
async fn failover_and_redirects_hold_when_the_brokers_reword_their_errors() {
    killed_owner_fails_by_name_and_returns("failover_with_reworded_errors", true).await;
}

async fn killed_owner_fails_by_name_and_returns(test: &str, reworded: bool) {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip(test).await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut options = SpawnOptions::new();
    if reworded {
        options = options.env("RICOCHET_TEST_REWORD_ERRORS", "1");
    }
    let mut brokers = spawn_cluster(
        &etcd,
        "e2e",
        3,
        root.path(),
        Duration::from_secs(2),
        &options,
    )
    .await;
    let c = client(&brokers[0].url()).await;
    // Two topics on different brokers, neither on broker 0 (the client's
    // service URL stays up).
    let mut on: HashMap<String, String> = HashMap::new();
    let mut i = 0;
    while on.len() < 2 {
        let t = format!("k{i}");
        i += 1;
        let o = c.lookup(&t).await.unwrap();
        if o.url != brokers[0].url() && !on.values().any(|u| *u == o.url) {
            on.insert(o.url.clone(), t);
        }
    }
    let victim_url = brokers[1].url();
    let victim_topic = on[&victim_url].clone();
    let other_topic = on[&brokers[2].url()].clone();
    let victim = c.lookup(&victim_topic).await.unwrap();
    let victim_id = victim.broker_id.clone();

    let producer = c
        .producer(&victim_topic)
        .send_timeout(Duration::from_secs(6))
        .create()
        .await
        .unwrap();
    let mut consumer = c
        .consumer(&victim_topic)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    for i in 0..50 {
        producer.send(format!("before-{i}")).await.unwrap();
    }
    for _ in 0..10 {
        let m = recv(&mut consumer, LONG).await;
        consumer.ack(&m).await.unwrap();
    }
    consumer.flush().await.unwrap();
    if reworded {
        // Claimed now (the streams are open): its epoch is set.
        let victim = c.lookup(&victim_topic).await.unwrap();
        assert!(victim.epoch > 0, "{victim:?}");
        // Asked of a broker that does not own it, a topic-scoped call is
        // refused with the redirect: the owner, its URL and epoch.
        let status = AdminClient::new(c.transport())
            .topic_stats(TopicRequest {
                topic: victim_topic.clone(),
            })
            .await
            .unwrap_err();
        assert!(
            status.message().starts_with("[reworded]"),
            "the broker rewords: {status:?}"
        );
        let e = ricochet_client::__private::error_from_status(status);
        assert_eq!(e.kind(), ErrorKind::Redirect, "{e:?}");
        let r = e.redirect().expect("the owner");
        assert_eq!(r.owner, victim_id);
        assert_eq!(r.url.as_deref(), Some(victim.url.as_str()));
        assert_eq!(r.epoch, Some(victim.epoch));

        // A typed admin call routed to that wrong broker (a stale lookup,
        // here a stand-in cluster's) follows the redirect to the owner.
        let fake = FakeCluster::start("e2e", FakeAnswer::Unimplemented).await;
        fake.route(&victim_topic, FakeAnswer::owner("b0", brokers[0].url()));
        let misled = client(&fake.url()).await;
        let stats = misled
            .admin()
            .subscription_stats(&victim_topic, "s")
            .await
            .expect("the call is made again at the owner the refusal names");
        assert_eq!(stats.subscription, "s");
        assert_eq!(fake.lookups().len(), 1, "one lookup, then the redirect");
    }

    brokers[1].kill9();
    let err = producer.send("during").await.unwrap_err();
    assert_eq!(err.owner_down(), Some(victim_id.as_str()), "{err}");
    assert_eq!(err.kind(), ErrorKind::OwnerDown, "{err}");
    let err = c.lookup(&victim_topic).await.unwrap_err();
    assert_eq!(err.owner_down(), Some(victim_id.as_str()), "{err}");
    // The other broker's topic keeps serving.
    let other = c.producer(&other_topic).create().await.unwrap();
    other.send("still served").await.unwrap();

    brokers[1].restart().await;
    let mut sent = None;
    for _ in 0..60 {
        match producer.send("after").await {
            Ok(id) => {
                sent = Some(id);
                break;
            }
            Err(e) => assert_eq!(e.owner_down(), Some(victim_id.as_str()), "{e}"),
        }
    }
    assert!(
        sent.is_some(),
        "the producer goes on once its broker is back"
    );
    // The 40 acknowledged but unacked messages come back (acks of the
    // first 10 were confirmed), then the new one; "during" may or may not
    // have been stored before the kill (it was never acknowledged).
    let mut got = Vec::new();
    loop {
        let m = recv(&mut consumer, LONG).await;
        let body = text(&m);
        consumer.ack(&m).await.unwrap();
        if body == "after" {
            break;
        }
        got.push(body);
    }
    got.retain(|b| b != "during");
    got.sort();
    got.dedup();
    let mut expected: Vec<String> = (10..50).map(|i| format!("before-{i}")).collect();
    expected.sort();
    assert_eq!(got, expected);
    // Every ack reached the returned owner: nothing is left to deliver.
    // (How many entries the log still holds depends on how soon those acks
    // let it drop the segments they cover, so it is not checked.)
    consumer.flush().await.unwrap();
    let stats = c
        .admin()
        .subscription_stats(&victim_topic, "s")
        .await
        .unwrap();
    assert_eq!((stats.backlog, stats.unacked), (0, 0), "{stats:?}");
}
