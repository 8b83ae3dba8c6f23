//! Partitioned topics through the client: key routing is stable (the same
//! key lands on the same partition from two clients, and where the shared
//! Murmur3 rule says), order per key is kept, a Shared subscription over 8
//! partitions consumes every one of 100 000 messages exactly once,
//! Key_Shared never splits a key across consumers, Failover spreads the
//! partitions over the consumers, nack / reconsume_later / terminate work
//! on messages of any partition (and the dead letters show on the
//! partitioned topic as a whole), partitions added later are produced to
//! and consumed, and a named producer's per-partition sequence ids resume
//! after a restart (de-duplication keeps nothing new out).

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::{recv, start, text, topic};
use ricochet_client::{Client, Consumer, InitialPosition, OutgoingMessage, SubscriptionType};
use ricochet_policy::PolicySpec;
use ricochet_proto::UpdatePartitionsRequest;
use ricochet_proto::partitions::{parse_partition, partition_for_key, partition_name};
use ricochet_proto::partitions_client::PartitionsClient;

const T: Duration = Duration::from_secs(30);

fn full(t: &str) -> String {
    format!("persistent://public/default/{t}")
}

async fn create(client: &Client, t: &str, n: u32) {
    PartitionsClient::new(client.channel())
        .create_partitioned_topic(UpdatePartitionsRequest {
            topic: t.into(),
            partitions: n,
            replicas: 0,
        })
        .await
        .unwrap();
}

async fn raise(client: &Client, t: &str, n: u32) {
    PartitionsClient::new(client.channel())
        .update_partitions(UpdatePartitionsRequest {
            topic: t.into(),
            partitions: n,
            replicas: 0,
        })
        .await
        .unwrap();
}

fn partition_of(topic: &str) -> u32 {
    parse_partition(topic).expect("a partition's name").1
}

async fn consumer(client: &Client, t: &str, name: &str, sub_type: SubscriptionType) -> Consumer {
    client
        .consumer(t)
        .subscription("s")
        .subscription_type(sub_type)
        .consumer_name(name)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap()
}

#[tokio::test]
async fn keys_route_to_the_same_partition_from_every_client() {
    let env = start().await;
    let t = topic("p-keys");
    create(&env.client, &t, 8).await;
    let other = Client::connect(env.broker.url()).await.unwrap();
    let a = env.client.producer(&t).create().await.unwrap();
    let b = other.producer(&t).create().await.unwrap();
    assert_eq!(a.partitions(), Some(8));
    assert_eq!(a.topic(), full(&t));
    let mut used = HashSet::new();
    for k in 0..64 {
        let key = format!("key-{k}");
        let ia = a
            .send(OutgoingMessage::builder("x").key(key.clone()))
            .await
            .unwrap();
        let ib = b
            .send(OutgoingMessage::builder("y").key(key.clone()))
            .await
            .unwrap();
        assert_eq!(ia.topic(), ib.topic(), "{key}");
        let want = partition_name(&full(&t), partition_for_key(&key, 8));
        assert_eq!(ia.topic(), want, "{key}");
        used.insert(ia.topic().to_owned());
    }
    assert!(
        used.len() >= 6,
        "64 keys spread over 8 partitions: {used:?}"
    );
    // Without a key, batches go round-robin: every partition gets some.
    let mut ids = Vec::new();
    for i in 0..64 {
        ids.push(
            a.send_async(OutgoingMessage::new(format!("n{i}")))
                .await
                .unwrap(),
        );
    }
    a.flush().await.unwrap();
    let batchless = env
        .client
        .producer(&t)
        .batching(false)
        .create()
        .await
        .unwrap();
    let mut seen = HashSet::new();
    for i in 0..16 {
        let id = batchless.send(format!("u{i}")).await.unwrap();
        seen.insert(partition_of(id.topic()));
    }
    assert_eq!(seen.len(), 8, "unbatched sends rotate over every partition");
    for f in ids {
        f.await.unwrap();
    }
}

#[tokio::test]
async fn order_per_key_is_kept_across_partitions() {
    let env = start().await;
    let t = topic("p-order");
    create(&env.client, &t, 4).await;
    let p = env.client.producer(&t).create().await.unwrap();
    let keys = 20;
    let per_key = 50;
    let mut futs = Vec::new();
    for i in 0..per_key {
        for k in 0..keys {
            futs.push(
                p.send_async(OutgoingMessage::builder(format!("{k}:{i}")).key(format!("k{k}")))
                    .await
                    .unwrap(),
            );
        }
    }
    for f in futs {
        f.await.unwrap();
    }
    let mut c = consumer(&env.client, &t, "c", SubscriptionType::Exclusive).await;
    let mut next: HashMap<String, u32> = HashMap::new();
    for _ in 0..keys * per_key {
        let m = recv(&mut c, T).await;
        let s = text(&m);
        let (k, i) = s.split_once(':').unwrap();
        let i: u32 = i.parse().unwrap();
        let want = next.entry(k.to_owned()).or_insert(0);
        assert_eq!(i, *want, "key {k} out of order");
        *want += 1;
        assert_eq!(
            partition_of(m.id().topic()),
            partition_for_key(m.key().unwrap(), 4)
        );
        c.ack(&m).await.unwrap();
    }
    assert!(next.values().all(|n| *n == per_key));
}

#[tokio::test]
async fn shared_consumes_a_million_messages_over_8_partitions_exactly_once() {
    let env = start().await;
    let t = topic("p-shared");
    create(&env.client, &t, 8).await;
    const N: usize = 1_000_000;
    let mut consumers = Vec::new();
    for name in ["a", "b"] {
        consumers.push(consumer(&env.client, &t, name, SubscriptionType::Shared).await);
    }
    let p = env.client.producer(&t).create().await.unwrap();
    let sender = tokio::spawn(async move {
        let mut window = std::collections::VecDeque::new();
        for i in 0..N {
            window.push_back(p.send_async(format!("{i}")).await.unwrap());
            if window.len() >= 5000 {
                window.pop_front().unwrap().await.unwrap();
            }
        }
        for f in window {
            f.await.unwrap();
        }
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for mut c in consumers {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(m) = c.receive().await {
                c.ack(&m).await.unwrap();
                if tx.send((text(&m), m.id().topic().to_owned())).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    let mut seen = vec![false; N];
    let mut partitions = HashSet::new();
    for _ in 0..N {
        let (s, topic) = tokio::time::timeout(Duration::from_secs(120), rx.recv())
            .await
            .expect("messages keep coming")
            .unwrap();
        let i: usize = s.parse().unwrap();
        assert!(!seen[i], "message {i} delivered twice");
        seen[i] = true;
        partitions.insert(topic);
    }
    sender.await.unwrap();
    assert!(seen.iter().all(|s| *s));
    assert_eq!(partitions.len(), 8);
    // Nothing more comes (each message exactly once).
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn key_shared_never_splits_a_key_across_consumers() {
    let env = start().await;
    let t = topic("p-keyshared");
    create(&env.client, &t, 8).await;
    let mut cs = Vec::new();
    for name in ["a", "b", "c"] {
        cs.push(consumer(&env.client, &t, name, SubscriptionType::KeyShared).await);
    }
    let p = env.client.producer(&t).create().await.unwrap();
    let n = 3000;
    let mut futs = Vec::new();
    for i in 0..n {
        futs.push(
            p.send_async(OutgoingMessage::builder(format!("{i}")).key(format!("k{}", i % 60)))
                .await
                .unwrap(),
        );
    }
    for f in futs {
        f.await.unwrap();
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (ci, mut c) in cs.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(m) = c.receive().await {
                c.ack(&m).await.unwrap();
                let _ = tx.send((ci, m.key().unwrap().to_owned()));
            }
        });
    }
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut per_consumer = [0; 3];
    for _ in 0..n {
        let (ci, key) = tokio::time::timeout(T, rx.recv()).await.unwrap().unwrap();
        let o = *owner.entry(key.clone()).or_insert(ci);
        assert_eq!(o, ci, "key {key} went to consumers {o} and {ci}");
        per_consumer[ci] += 1;
    }
    assert_eq!(owner.len(), 60);
    assert!(per_consumer.iter().all(|n| *n > 0), "{per_consumer:?}");
}

#[tokio::test]
async fn failover_spreads_partitions_over_consumers() {
    let env = start().await;
    let t = topic("p-failover");
    create(&env.client, &t, 6).await;
    let mut cs = Vec::new();
    for name in ["c0", "c1", "c2"] {
        cs.push(consumer(&env.client, &t, name, SubscriptionType::Failover).await);
    }
    // Each subscribe returned once the broker had elected on every
    // partition with that consumer in, so the spread is final here.
    let p = env
        .client
        .producer(&t)
        .batching(false)
        .create()
        .await
        .unwrap();
    for i in 0..60 {
        p.send(format!("{i}")).await.unwrap();
    }
    let mut from: Vec<HashSet<u32>> = vec![HashSet::new(); 3];
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + T;
    while got < 60 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {got} of 60 arrived"
        );
        for (ci, c) in cs.iter_mut().enumerate() {
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(50), c.receive()).await {
                from[ci].insert(partition_of(m.id().topic()));
                c.ack(&m).await.unwrap();
                got += 1;
            }
        }
    }
    // Partition i goes to consumer i mod 3 (by name), as Pulsar spreads them.
    for (ci, parts) in from.iter().enumerate() {
        let want: HashSet<u32> = (0..6).filter(|i| *i as usize % 3 == ci).collect();
        assert_eq!(parts, &want, "consumer c{ci}");
        assert_eq!(cs[ci].is_active(), Some(true));
    }
}

#[tokio::test]
async fn settling_works_for_messages_of_any_partition_and_dead_letters_aggregate() {
    let env = start().await;
    let t = topic("p-settle");
    create(&env.client, &t, 4).await;
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .negative_ack_delay(Duration::from_millis(10))
        .policy(PolicySpec::fixed_backoff(Duration::from_millis(100), 5))
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let p = env.client.producer(&t).create().await.unwrap();
    // One message per partition, found by key.
    let mut keys = Vec::new();
    for part in 0..4 {
        let key = (0..)
            .map(|k| format!("k{k}"))
            .find(|k| partition_for_key(k, 4) == part)
            .unwrap();
        p.send(OutgoingMessage::builder(format!("p{part}")).key(key.clone()))
            .await
            .unwrap();
        keys.push(key);
    }
    // First deliveries: nack p0, reconsume p1, terminate p2, ack p3.
    let mut done = HashSet::new();
    while done.len() < 4 {
        let m = recv(&mut c, T).await;
        let s = text(&m);
        match (s.as_str(), m.delivery_count()) {
            ("p0", 0) => c.nack(&m).await.unwrap(),
            ("p0", n) => {
                assert!(n >= 1);
                c.ack(&m).await.unwrap();
                done.insert(s);
            }
            ("p1", _) if !m.is_retry() => c
                .reconsume_later(&m, Duration::from_millis(200))
                .await
                .unwrap(),
            ("p1", _) => {
                assert!(m.id().topic().ends_with("-s-RETRY"), "{}", m.id());
                c.ack(&m).await.unwrap();
                done.insert(s);
            }
            ("p2", _) => {
                c.terminate(&m, "bad order").await.unwrap();
                done.insert(s);
            }
            ("p3", _) => {
                c.ack(&m).await.unwrap();
                done.insert(s);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    c.flush().await.unwrap();
    let dl = env
        .client
        .admin()
        .list_dead_letters(&t, "s", &Default::default(), 0, None)
        .await
        .unwrap();
    assert_eq!(dl.total, 1);
    let origin = dl.dead_letters[0].origin.as_ref().unwrap();
    assert_eq!(origin.topic, partition_name(&full(&t), 2));
}

#[tokio::test]
async fn partitions_added_later_are_produced_to_and_consumed() {
    let env = start().await;
    let t = topic("p-grow");
    create(&env.client, &t, 2).await;
    let refresh = Duration::from_millis(100);
    let p = env
        .client
        .producer(&t)
        .partitions_refresh(refresh)
        .create()
        .await
        .unwrap();
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .partitions_refresh(refresh)
        .subscribe()
        .await
        .unwrap();
    raise(&env.client, &t, 4).await;
    let deadline = tokio::time::Instant::now() + T;
    while p.partitions() != Some(4) || c.partitions() != Some(4) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "partitions not picked up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let key3 = (0..)
        .map(|k| format!("k{k}"))
        .find(|k| partition_for_key(k, 4) == 3)
        .unwrap();
    let id = p
        .send(OutgoingMessage::builder("late").key(key3))
        .await
        .unwrap();
    assert_eq!(partition_of(id.topic()), 3);
    let m = recv(&mut c, T).await;
    assert_eq!(m.id(), &id);
    c.ack(&m).await.unwrap();
    c.close().await.unwrap();
    p.close().await.unwrap();
}

#[tokio::test]
async fn a_named_producer_continues_each_partitions_sequence_after_a_restart() {
    let env = start().await;
    let t = topic("p-dedup");
    create(&env.client, &t, 4).await;
    let send_all = |p: ricochet_client::Producer, from: usize| async move {
        let mut ids = Vec::new();
        for i in from..from + 40 {
            ids.push(
                p.send(OutgoingMessage::builder(format!("{i}")).key(format!("k{i}")))
                    .await
                    .unwrap(),
            );
        }
        p.close().await.unwrap();
        ids
    };
    let first = env
        .client
        .producer(&t)
        .name("stable")
        .create()
        .await
        .unwrap();
    assert_eq!(first.last_sequence_id(), 0);
    let ids = send_all(first, 0).await;
    assert!(ids.iter().all(|id| !id.is_unknown()));
    // A new producer of that name: every partition's stream resumes from
    // its own last sequence id, so nothing new is taken for a resend.
    let again = env
        .client
        .producer(&t)
        .name("stable")
        .create()
        .await
        .unwrap();
    assert!(again.last_sequence_id() > 0);
    let ids = send_all(again, 40).await;
    assert!(ids.iter().all(|id| !id.is_unknown()), "{ids:?}");
    let stats = env.client.admin().topic_stats(&t).await.unwrap();
    assert_eq!(stats.message_count, 80);
    assert_eq!(stats.partition_count, 4);
}
