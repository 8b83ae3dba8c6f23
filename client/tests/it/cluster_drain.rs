//! Moving topics between brokers of a real cluster (etcd and three brokers
//! as child processes on loopback; skipped with a printed line when `etcd`
//! is missing, unless `RICOCHET_REQUIRE_ETCD=1`, which `.ci/run` sets):
//! `drain_broker` under load moves every partition off a broker while
//! producers and consumers keep going — every message sent is stored once
//! and consumed, no message whose ack the broker confirmed comes back — and
//! `move_topic` carries a subscription's whole state: cursor, messages in
//! flight, a retry waiting in the retry tier with its delivery count, a
//! dead letter, the producers' de-duplication; a topic's log is copied
//! while it is still served, the topic stopped only for the tail.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{recv, text};
use ricochet_client::proto::TopicRequest;
use ricochet_client::proto::admin_client::AdminClient;
use ricochet_client::{Client, InitialPosition, OutgoingMessage, SubscriptionType};
use ricochet_testkit::{SpawnOptions, etcd_or_skip, spawn_cluster};

/// One cluster at a time on two shared cores.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LONG: Duration = Duration::from_secs(60);

async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(10))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .connect()
        .await
        .unwrap()
}

/// etcd and `n` brokers (lease TTL 3 s) in a temporary directory; all of
/// it stops when dropped, so bind every field for the whole test.
struct Cluster {
    etcd: ricochet_testkit::EtcdProcess,
    brokers: Vec<ricochet_testkit::ClusterBroker>,
    _root: tempfile::TempDir,
}

/// A fresh cluster named `name` for `test`; `None` (skipped) without etcd.
/// `RICOCHET_TEST_BROKER_LOG=1` shows the brokers' logs (INFO).
async fn cluster(test: &str, name: &str, n: usize) -> Option<Cluster> {
    cluster_with(test, name, n, SpawnOptions::new()).await
}

/// [`cluster`] with the brokers started with `options`.
async fn cluster_with(test: &str, name: &str, n: usize, options: SpawnOptions) -> Option<Cluster> {
    let etcd = etcd_or_skip(test).await?;
    let root = tempfile::tempdir().unwrap();
    let brokers = spawn_cluster(
        &etcd,
        name,
        n,
        root.path(),
        Duration::from_secs(3),
        &options
            .echo_log(std::env::var_os("RICOCHET_TEST_BROKER_LOG").is_some())
            .rust_log("info"),
    )
    .await;
    Some(Cluster {
        etcd,
        brokers,
        _root: root,
    })
}

async fn stored(c: &Client, topic: &str) -> u64 {
    c.admin().topic_stats(topic).await.unwrap().message_count
}

#[tokio::test]
async fn a_drain_under_load_moves_every_partition_losing_and_duplicating_nothing() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(Cluster {
        etcd: _etcd,
        brokers,
        _root,
    }) = cluster("a_drain_under_load_moves_every_partition", "drain", 3).await
    else {
        return;
    };
    let c = client(&brokers[0].url()).await;
    let t = "orders";
    const PARTITIONS: u32 = 6;
    c.admin()
        .create_partitioned_topic(t, PARTITIONS)
        .await
        .unwrap();
    let partitions: Vec<String> = (0..PARTITIONS)
        .map(|i| format!("{t}-partition-{i}"))
        .collect();
    let mut before = HashMap::new();
    for p in &partitions {
        before.insert(p.clone(), c.lookup(p).await.unwrap().broker_id);
    }
    // The broker the client was given is drained too: it keeps answering
    // lookups and redirects while it owns nothing.
    let victim = before[&partitions[0]].clone();
    let victims: Vec<&String> = partitions.iter().filter(|p| before[*p] == victim).collect();
    assert_eq!(victims.len(), 2, "6 partitions over 3 brokers: {before:?}");

    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let producer = Arc::new(c.producer(t).create().await.unwrap());
    const N: usize = 3_000;
    let sending = {
        let producer = producer.clone();
        tokio::spawn(async move {
            let mut sends = Vec::with_capacity(N);
            for i in 0..N {
                sends.push(
                    producer
                        .send_async(
                            OutgoingMessage::builder(format!("m{i}")).key(format!("k{}", i % 10)),
                        )
                        .await
                        .unwrap(),
                );
                if i % 50 == 49 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            let mut failed = Vec::new();
            for (i, s) in sends.into_iter().enumerate() {
                if let Err(e) = s.await {
                    failed.push(format!("m{i}: {e}"));
                }
            }
            failed
        })
    };
    // Acks are confirmed by the broker (ack receipts) and sent without
    // waiting for each other; a message delivered again after its ack was
    // confirmed would be a duplicate. An ack whose stream ended with the
    // move is answered with an error although the broker may have applied
    // it: the client asks the new owner (`CheckAcks`), and `flush` then
    // reports any it had not applied as lost — those messages come back
    // and are acked again. So the run ends when every message is confirmed,
    // or confirmed-or-refused with a `flush` that lost nothing.
    let consuming = tokio::spawn(async move {
        let acker = consumer.acker();
        let confirmed = Arc::new(Mutex::new(HashSet::new()));
        let refused = Arc::new(Mutex::new(HashSet::new()));
        let acking = Arc::new(AtomicU64::new(0));
        let refusals = Arc::new(AtomicU64::new(0));
        let mut after_ack = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut shown = Instant::now();
        loop {
            let (n_confirmed, settled) = {
                let c = confirmed.lock().unwrap();
                let r = refused.lock().unwrap();
                (c.len(), c.union(&r).count())
            };
            if n_confirmed == N {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{n_confirmed} of {N} acks confirmed in time, {} refused",
                refused.lock().unwrap().len()
            );
            if settled == N && acking.load(Ordering::Acquire) == 0 {
                // Every message acked; some acks unconfirmed. Nothing lost
                // means the broker had applied them.
                match acker.flush().await {
                    Ok(()) => break,
                    Err(e) => eprintln!("flush: {e}"),
                }
            }
            if shown.elapsed() > Duration::from_secs(5) {
                shown = Instant::now();
                eprintln!(
                    "consumer: {n_confirmed} confirmed, {} delivered again after it, {} refused",
                    after_ack.len(),
                    refused.lock().unwrap().len()
                );
            }
            let Ok(m) = tokio::time::timeout(Duration::from_millis(500), consumer.receive()).await
            else {
                continue;
            };
            let m = m.unwrap();
            let body = text(&m);
            if confirmed.lock().unwrap().contains(&body) {
                after_ack.push(body);
                continue;
            }
            let (acker, confirmed, refused, acking, refusals) = (
                acker.clone(),
                confirmed.clone(),
                refused.clone(),
                acking.clone(),
                refusals.clone(),
            );
            acking.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                match acker.ack(&m).await {
                    Ok(()) => {
                        refused.lock().unwrap().remove(&body);
                        confirmed.lock().unwrap().insert(body);
                    }
                    // Not confirmed (the stream ended as the topic moved).
                    Err(_) => {
                        refusals.fetch_add(1, Ordering::Relaxed);
                        refused.lock().unwrap().insert(body);
                    }
                }
                acking.fetch_sub(1, Ordering::AcqRel);
            });
        }
        let n = confirmed.lock().unwrap().len();
        let unconfirmed = refused.lock().unwrap().len();
        (n, unconfirmed, after_ack, refusals.load(Ordering::Relaxed))
    });
    // Let the load run, then drain the victim in the middle of it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = c.admin().drain_broker(&victim).await.unwrap();
    assert!(report.not_moved.is_empty(), "{report:?}");
    let mut moved: Vec<&str> = report.moved.iter().map(|m| m.topic.as_str()).collect();
    moved.sort();
    let mut expected: Vec<String> = victims
        .iter()
        .map(|p| format!("persistent://public/default/{p}"))
        .collect();
    expected.sort();
    assert_eq!(moved, expected, "{report:?}");
    assert!(report.moved.iter().all(|m| m.to_broker != victim));

    let failed = tokio::time::timeout(LONG, sending).await.unwrap().unwrap();
    assert!(failed.is_empty(), "sends that failed: {failed:?}");
    let (acked, applied_unconfirmed, after_ack, refused_acks) = consuming.await.unwrap();
    assert_eq!(acked + applied_unconfirmed, N);
    assert!(
        after_ack.is_empty(),
        "messages delivered again after the broker confirmed their ack: {after_ack:?}"
    );
    println!(
        "drain of {victim}: {} partitions in {} ms ({:?}); {refused_acks} acks not confirmed during the move, {applied_unconfirmed} of them applied (not redelivered)",
        report.moved.len(),
        report.millis,
        report
            .moved
            .iter()
            .map(|m| (m.entries, m.millis))
            .collect::<Vec<_>>()
    );
    // Stored once each: resends after the move were de-duplicated.
    let mut total = 0;
    for p in &partitions {
        let owner = c.lookup(p).await.unwrap().broker_id;
        assert_ne!(owner, victim, "{p} still on the drained broker");
        total += stored(&c, p).await;
        // Nothing left behind: the unconfirmed acks were applied.
        let sub = c.admin().subscription_stats(p, "s").await.unwrap();
        assert_eq!((sub.backlog, sub.unacked), (0, 0), "{p}: {sub:?}");
    }
    assert_eq!(total, N as u64, "every message stored exactly once");
    let brokers_now = c.admin().brokers(false).await.unwrap().brokers;
    let v = brokers_now.iter().find(|b| b.id == victim).unwrap();
    assert!(v.draining, "{v:?}");
    assert_eq!((v.placed_topics, v.owned_topics), (0, 0), "{v:?}");
    // New topics go elsewhere while it drains.
    for i in 0..4 {
        let owner = c
            .lookup(&format!("fresh-{i}"))
            .await
            .unwrap_or_else(|e| panic!("lookup of fresh-{i}: {e}"))
            .broker_id;
        assert_ne!(owner, victim);
    }
}

#[tokio::test]
async fn a_moved_topic_keeps_its_cursor_retries_delivery_counts_and_dead_letters() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(Cluster {
        etcd: _etcd,
        brokers,
        _root,
    }) = cluster("a_moved_topic_keeps_its_cursor", "move", 2).await
    else {
        return;
    };
    let c = client(&brokers[1].url()).await;
    let t = "jobs";
    let producer = c.producer(t).name("p").create().await.unwrap();
    for i in 0..10 {
        producer.send(format!("m{i}")).await.unwrap();
    }
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let mut got = HashMap::new();
    for _ in 0..10 {
        let m = recv(&mut consumer, LONG).await;
        got.insert(text(&m), m);
    }
    for i in 0..5 {
        consumer.ack(&got[&format!("m{i}")]).await.unwrap();
    }
    consumer
        .reconsume_later(&got["m5"], Duration::from_secs(3))
        .await
        .unwrap();
    consumer.terminate(&got["m7"], "bad input").await.unwrap();
    consumer.flush().await.unwrap();
    // m6, m8, m9 are in flight, unacked.

    let from = c.lookup(t).await.unwrap();
    let moved = c.admin().move_topic(t, None).await.unwrap();
    assert_ne!(moved.to_broker, from.broker_id);
    assert!(
        moved.entries >= 12,
        "log, retry and dead-letter tiers: {moved:?}"
    );
    let to = c.lookup(t).await.unwrap();
    assert_eq!(to.broker_id, moved.to_broker);
    assert!(to.epoch > from.epoch, "a new claim: {from:?} → {to:?}");

    // The old owner no longer serves it: it redirects.
    let e = AdminClient::new(
        tonic::transport::Channel::from_shared(from.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
    .topic_stats(TopicRequest { topic: t.into() })
    .await
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    // The same consumer goes on at the new owner: the messages that were in
    // flight come again, the retry comes from the retry tier with its
    // delivery count, and nothing acked or dead-lettered comes back.
    let mut again: HashMap<String, u32> = HashMap::new();
    while again.len() < 4 {
        let m = recv(&mut consumer, LONG).await;
        let body = text(&m);
        assert!(
            ["m5", "m6", "m8", "m9"].contains(&body.as_str()),
            "{body} came back after the move"
        );
        again.insert(body, m.delivery_count());
        consumer.ack(&m).await.unwrap();
    }
    assert_eq!(
        again["m5"], 1,
        "the retry keeps its delivery count: {again:?}"
    );

    // The dead letter moved with its record.
    let dead = c
        .admin()
        .list_dead_letters(t, "s", &Default::default(), 0, None)
        .await
        .unwrap()
        .dead_letters;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(format!("{:?}", dead[0]).contains("bad input"), "{dead:?}");

    // The producer follows, and its sequence ids still de-duplicate.
    producer.send("m10").await.unwrap();
    let m = recv(&mut consumer, LONG).await;
    assert_eq!(text(&m), "m10");
    consumer.ack(&m).await.unwrap();
    assert_eq!(stored(&c, t).await, 11);
    assert!(
        tokio::time::timeout(Duration::from_millis(800), consumer.receive())
            .await
            .is_err(),
        "nothing else"
    );
}

#[tokio::test]
async fn a_move_the_target_refuses_leaves_the_topic_served_where_it_was() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(Cluster {
        etcd: _etcd,
        brokers,
        _root,
    }) = cluster("a_move_the_target_refuses", "refuse", 2).await
    else {
        return;
    };
    let c = client(&brokers[0].url()).await;
    let t = "jobs";
    let producer = c.producer(t).create().await.unwrap();
    producer.send("m0").await.unwrap();
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let m = recv(&mut consumer, LONG).await;
    // The retry tier exists on the owner now...
    consumer
        .reconsume_later(&m, Duration::from_millis(300))
        .await
        .unwrap();
    consumer.flush().await.unwrap();
    let source = c.lookup(t).await.unwrap().broker_id;
    // ...and an ordinary topic of the same name on the other broker (the
    // emptier one, so placed there), which the move cannot overwrite.
    let clash = format!("{t}-s-RETRY");
    c.producer(&clash)
        .create()
        .await
        .unwrap()
        .send("not a tier")
        .await
        .unwrap();
    let target = c.lookup(&clash).await.unwrap().broker_id;
    assert_ne!(target, source);

    let e = c.admin().move_topic(t, Some(&target)).await.unwrap_err();
    assert!(
        e.to_string().contains("exists on this broker already"),
        "{e}"
    );
    // Still placed and served where it was: the retry comes back there, the
    // producer and the consumer go on.
    assert_eq!(c.lookup(t).await.unwrap().broker_id, source);
    let again = recv(&mut consumer, LONG).await;
    assert_eq!((text(&again).as_str(), again.delivery_count()), ("m0", 1));
    consumer.ack(&again).await.unwrap();
    producer.send("m1").await.unwrap();
    let m1 = recv(&mut consumer, LONG).await;
    assert_eq!(text(&m1), "m1");
    consumer.ack(&m1).await.unwrap();
    assert_eq!(stored(&c, t).await, 2);
    assert_eq!(stored(&c, &clash).await, 1, "the other topic untouched");
}

/// A broker that crashed in the middle of a move, after etcd placed the
/// topic elsewhere but before it deleted its own copy, deletes that copy
/// when it comes back (it would never serve it).
#[tokio::test]
async fn a_copy_left_by_an_unfinished_move_is_deleted_when_its_broker_returns() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(Cluster {
        etcd,
        mut brokers,
        _root,
    }) = cluster("a_copy_left_by_an_unfinished_move", "stale", 2).await
    else {
        return;
    };
    let c = client(&brokers[0].url()).await;
    c.producer("x")
        .create()
        .await
        .unwrap()
        .send("m")
        .await
        .unwrap();
    let owner = c.lookup("x").await.unwrap().broker_id;
    let (i, other) = if owner == "b0" { (0, "b1") } else { (1, "b0") };
    let local_topics = |url: String| async move {
        AdminClient::new(
            tonic::transport::Channel::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap(),
        )
        .list_topics(ricochet_client::proto::ListTopicsRequest {
            namespace: "public/default".into(),
            local_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .topics
    };
    assert!(
        local_topics(brokers[i].url())
            .await
            .contains(&"persistent://public/default/x".to_owned())
    );
    // The crash: killed, and the placement switched as the hand-over does.
    brokers[i].kill9();
    etcd.kv()
        .await
        .put(ricochet_cluster::proto::PutRequest {
            key: b"/ricochet/stale/placement/persistent://public/default/x".to_vec(),
            value: other.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    brokers[i].restart().await;
    assert!(
        !local_topics(brokers[i].url())
            .await
            .contains(&"persistent://public/default/x".to_owned()),
        "the stale copy is gone"
    );
}

/// `ImportTopic` is broker to broker, but its input is still checked: a
/// state that does not decode, entries outside the moved logs, a transfer
/// cut short or whose counts do not match are refused with
/// INVALID_ARGUMENT, and leave nothing behind.
#[tokio::test]
async fn a_bad_or_incomplete_import_is_refused_and_leaves_nothing() {
    use ricochet_client::proto::cluster_client::ClusterClient;
    use ricochet_client::proto::{
        TopicTransferPart, TransferBegin, TransferEnd, TransferEntries, topic_transfer_part::Part,
    };
    let _one = ONE_CLUSTER.lock().await;
    let Some(Cluster {
        etcd: _etcd,
        brokers,
        _root,
    }) = cluster("a_bad_or_incomplete_import_is_refused", "import", 1).await
    else {
        return;
    };
    let url = brokers[0].url();
    let name = "persistent://public/default/imported";
    let state = format!(
        r#"{{"logs":[{{"record":{{"name":"{name}","created_ms":1,"kind":"normal"}},"first":0,"next":2,"sequences":[]}}],"subscriptions":[],"retention":null}}"#
    );
    let begin = |state: &str| {
        Part::Begin(TransferBegin {
            topic: name.into(),
            from_broker: "elsewhere".into(),
            state: state.as_bytes().to_vec(),
        })
    };
    let entries = |topic: &str, first_id: u64| {
        Part::Entries(TransferEntries {
            topic: topic.into(),
            first_id,
            entries: vec![b"a".to_vec(), b"b".to_vec()],
        })
    };
    let end = |n: u64| {
        Part::End(TransferEnd {
            entries: [(name.to_owned(), n)].into(),
        })
    };
    let import = |parts: Vec<Part>| {
        let url = url.clone();
        async move {
            let channel = tonic::transport::Channel::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let parts: Vec<TopicTransferPart> = parts
                .into_iter()
                .map(|p| TopicTransferPart { part: Some(p) })
                .collect();
            ClusterClient::new(channel)
                .import_topic(futures::stream::iter(parts))
                .await
                .map(|r| r.into_inner().entries)
        }
    };
    let cases: Vec<(Vec<Part>, &str)> = vec![
        (vec![begin("not json"), end(0)], "does not decode"),
        (vec![begin(&state), entries(name, 0)], "without TransferEnd"),
        (
            vec![begin(&state), entries(name, 0), end(3)],
            "2 entries arrived, 3 were sent",
        ),
        (vec![begin(&state), entries(name, 1), end(2)], "lie outside"),
        (
            vec![
                begin(&state),
                entries("persistent://public/default/other", 0),
                end(2),
            ],
            "not part of this move",
        ),
    ];
    for (parts, why) in cases {
        let e = import(parts).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{why}: {e:?}");
        assert!(e.message().contains(why), "{why}: {e:?}");
        let c = client(&url).await;
        let topics = c
            .admin()
            .list_topics(Some("public/default"), false)
            .await
            .unwrap()
            .topics;
        assert!(!topics.contains(&name.to_owned()), "{why}: left {topics:?}");
    }
    // The same transfer, whole, is taken.
    assert_eq!(
        import(vec![begin(&state), entries(name, 0), end(2)])
            .await
            .unwrap(),
        2
    );
}

/// A factor-1 topic moves in two phases: its log (here ten sealed segments
/// of 100 ids and an open one) is copied while the topic is still served and
/// takes publishes; it is stopped only to copy what it took meanwhile and its
/// subscription state. Every message is delivered once after the move, with
/// the entry id its producer's receipt named.
#[tokio::test]
async fn a_move_copies_the_log_while_served_and_stops_the_topic_only_for_the_tail() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, "segment_entries = 100\n").unwrap();
    let options = SpawnOptions::new().config(&config);
    let Some(Cluster {
        etcd: _etcd,
        brokers,
        _root,
    }) = cluster_with("a_move_copies_the_log_while_served", "precopy", 2, options).await
    else {
        return;
    };
    let c = client(&brokers[0].url()).await;
    let t = "ledger";
    let consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    // Ten sealed segments (ids 0..1000) and an open one (1000..1050), of
    // 10 KB messages (the pre-copy takes a while: publishes land meanwhile).
    const SEALED: u64 = 1_000;
    const BEFORE: u64 = 1_050;
    let producer = Arc::new(c.producer(t).name("p").create().await.unwrap());
    let mut receipts = HashMap::new();
    let mut sends = Vec::new();
    for i in 0..BEFORE {
        let payload = format!("m{i} {}", "x".repeat(10_000));
        sends.push((format!("m{i}"), producer.send_async(payload).await.unwrap()));
    }
    for (body, s) in sends {
        receipts.insert(body, s.await.unwrap().entry_id());
    }
    // A cursor to carry: 200 messages acked (confirmed), then the consumer
    // leaves.
    let mut consumer = consumer;
    let mut acked = HashSet::new();
    while acked.len() < 200 {
        let m = recv(&mut consumer, LONG).await;
        consumer.ack(&m).await.unwrap();
        acked.insert(name_of(&m));
    }
    consumer.flush().await.unwrap();
    drop(consumer);

    // Publishes go on while the topic moves; each send waits for its receipt.
    let stop = Arc::new(AtomicU64::new(0));
    let publishing = {
        let (producer, stop) = (producer.clone(), stop.clone());
        tokio::spawn(async move {
            let mut receipts = HashMap::new();
            let mut i = 0;
            while stop.load(Ordering::Acquire) == 0 {
                let body = format!("during{i}");
                let id = producer.send(body.clone()).await.unwrap();
                receipts.insert(body, id.entry_id());
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            receipts
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let from = c.lookup(t).await.unwrap().broker_id;
    let moved = c.admin().move_topic(t, None).await.unwrap();
    eprintln!("moved: {moved:?}");
    assert_ne!(moved.to_broker, from);
    // The two segments the 200 acks cover may have been dropped (all
    // subscriptions past them); the other eight sealed ones moved.
    let kept_sealed = SEALED - 200;
    assert!(moved.entries >= BEFORE - 200, "{moved:?}");
    // Only the tail was copied while stopped, not the sealed segments (a
    // copy made all while stopped counts every entry here).
    assert!(
        moved.entries_while_stopped < kept_sealed,
        "copied while stopped: {moved:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(1, Ordering::Release);
    let during = publishing.await.unwrap();
    assert!(!during.is_empty());
    receipts.extend(during);
    assert_eq!(c.lookup(t).await.unwrap().broker_id, moved.to_broker);

    // Every message not acked before the move, once, with its id.
    let mut consumer = c
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .ack_receipts(true)
        .subscribe()
        .await
        .unwrap();
    let expected = receipts.len() - acked.len();
    let mut got = HashMap::new();
    while got.len() < expected {
        let m = recv(&mut consumer, LONG).await;
        let body = name_of(&m);
        assert!(!acked.contains(&body), "{body} was acked before the move");
        let id = m.id().entry_id();
        // A send whose receipt the move cut off is resent, recognised as
        // a duplicate by the new owner, and receipted without its id.
        let receipt = receipts.get(&body).copied();
        if receipt != Some(ricochet_client::MessageId::UNKNOWN_ENTRY) {
            assert_eq!(receipt, Some(id), "{body}'s id");
        }
        assert!(got.insert(body.clone(), id).is_none(), "{body} twice");
        consumer.ack(&m).await.unwrap();
    }
    if let Ok(m) = tokio::time::timeout(Duration::from_secs(1), consumer.receive()).await {
        panic!("one more message: {:?}", m.map(|m| text(&m)));
    }
    // Ids 0..n were handed out, each once (the acked segments may have
    // been dropped by now: stats' count is not compared).
    let stats = c.admin().topic_stats(t).await.unwrap();
    assert_eq!(stats.next_entry_id, receipts.len() as u64);
}

/// A message's name: its payload up to the first space.
fn name_of(m: &ricochet_client::Message) -> String {
    text(m).split(' ').next().unwrap_or_default().to_owned()
}
