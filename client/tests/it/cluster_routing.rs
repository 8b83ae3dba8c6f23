//! Topic routing against a test double of the cluster's lookup service
//! (`ricochet_testkit::FakeCluster`, no etcd) pointing topics at one of two
//! real in-process brokers: a client given the fake's URL produces to and
//! consumes from each topic's owner (checked through each broker's own
//! admin stats), a partitioned topic's partitions go to their own owners, a
//! standalone answer or UNIMPLEMENTED keeps everything on the service URL
//! with a single lookup per client, a topic whose broker is down gives
//! `ErrorKind::OwnerDown` naming it (so do sends that time out while it is
//! down), a stream whose broker goes away looks the topic up again and
//! reconnects to the new owner, and lookups, partition counts and the
//! broker list go to another known broker (one it was sent to, or a
//! fallback URL it was given) when the service URL is down.

use std::time::Duration;

use ricochet_client::{Client, ErrorKind, InitialPosition, SubscriptionType};
use ricochet_proto::partitions::partition_name;
use ricochet_testkit::fake_cluster::fq;
use ricochet_testkit::{FakeAnswer, FakeCluster, InProcessBroker};

const T: Duration = Duration::from_secs(30);

async fn client(url: &str) -> Client {
    Client::builder(url)
        .request_timeout(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
        .keep_alive_interval(Duration::from_secs(1))
        .connect()
        .await
        .expect("client connects")
}

/// How many messages `broker` stores on `topic` (`None`: no such topic).
async fn stored(broker: &InProcessBroker, topic: &str) -> Option<u64> {
    let c = client(&broker.url()).await;
    match c.admin().topic_stats(topic).await {
        Ok(r) => Some(r.message_count),
        Err(e) if e.kind() == ricochet_client::ErrorKind::NotFound => None,
        Err(s) => panic!("topic stats of {topic}: {s}"),
    }
}

#[tokio::test]
async fn producers_and_consumers_use_the_topics_owner() {
    let a = InProcessBroker::start().await;
    let b = InProcessBroker::start().await;
    let fake = FakeCluster::start("test", FakeAnswer::Unimplemented).await;
    fake.route("on-a", FakeAnswer::owner("a", a.url()));
    fake.route("on-b", FakeAnswer::owner("b", b.url()));
    let c = client(&fake.url()).await;

    let pa = c.producer("on-a").create().await.unwrap();
    let pb = c.producer("on-b").create().await.unwrap();
    for i in 0..3 {
        pa.send(format!("a{i}")).await.unwrap();
    }
    for i in 0..2 {
        pb.send(format!("b{i}")).await.unwrap();
    }
    assert_eq!(stored(&a, "on-a").await, Some(3));
    assert_eq!(stored(&b, "on-b").await, Some(2));
    assert_eq!(stored(&b, "on-a").await, None, "nothing went to b");
    assert_eq!(stored(&a, "on-b").await, None, "nothing went to a");

    let mut cons = c
        .consumer("on-b")
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = tokio::time::timeout(T, cons.receive())
            .await
            .expect("a message in time")
            .unwrap();
        got.push(String::from_utf8_lossy(m.payload()).into_owned());
        cons.ack(&m).await.unwrap();
    }
    assert_eq!(got, ["b0", "b1"]);
    assert_eq!(c.pooled_connections(), 2, "one channel per owner");

    // A topic-scoped admin call on the owner's connection.
    let stats = c.admin().topic_stats("on-a").await.unwrap();
    assert_eq!(stats.message_count, 3);
    assert_eq!(c.pooled_connections(), 2, "the pool is reused");

    let owner = c.lookup("on-b").await.unwrap();
    assert_eq!(owner.broker_id, "b");
    assert_eq!(owner.url, b.url());
    assert_eq!(owner.epoch, 1);
    assert_eq!(owner.cluster, "test");
    assert!(!owner.is_standalone());
    cons.close().await.unwrap();
    pa.close().await.unwrap();
    pb.close().await.unwrap();
}

#[tokio::test]
async fn a_partitioned_topics_partitions_go_to_their_own_owners() {
    let a = InProcessBroker::start().await;
    let b = InProcessBroker::start().await;
    let fake = FakeCluster::start("test", FakeAnswer::Unimplemented).await;
    let base = fq("spread");
    fake.partitioned(&base, 4);
    for i in 0..4 {
        let (id, url) = if i % 2 == 0 {
            ("a", a.url())
        } else {
            ("b", b.url())
        };
        fake.route(&partition_name(&base, i), FakeAnswer::owner(id, url));
    }
    let c = client(&fake.url()).await;
    let p = c.producer("spread").batching(false).create().await.unwrap();
    assert_eq!(p.partitions(), Some(4));
    // Without a key and without batching: round-robin, one message each.
    for i in 0..40 {
        p.send(format!("m{i}")).await.unwrap();
    }
    for i in 0..4 {
        let name = partition_name(&base, i);
        let (owner, other) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        assert_eq!(stored(owner, &name).await, Some(10), "{name} on its owner");
        assert_eq!(stored(other, &name).await, None, "{name} nowhere else");
    }

    let mut cons = c
        .consumer("spread")
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let mut got = std::collections::HashSet::new();
    while got.len() < 40 {
        let m = tokio::time::timeout(T, cons.receive())
            .await
            .expect("a message in time")
            .unwrap();
        got.insert(String::from_utf8_lossy(m.payload()).into_owned());
        cons.ack(&m).await.unwrap();
    }
    assert_eq!(c.pooled_connections(), 2);
    cons.close().await.unwrap();
    p.close().await.unwrap();
}

#[tokio::test]
async fn standalone_and_older_brokers_keep_the_service_url_with_one_lookup() {
    let a = InProcessBroker::start().await;
    for answer in [
        // A standalone broker's answer names a URL: the client must still
        // use its service URL (here the fake, which cannot take a stream).
        FakeAnswer::Standalone { url: a.url() },
        FakeAnswer::Unimplemented,
    ] {
        let fake = FakeCluster::start("", answer.clone()).await;
        let c = client(&fake.url()).await;
        for t in ["s1", "s2"] {
            let e = c.producer(t).create().await.unwrap_err();
            assert_eq!(
                e.grpc_code(),
                Some(tonic::Code::Unimplemented as i32),
                "{answer:?}: the stream went to the service URL: {e}"
            );
        }
        let e = c
            .consumer("s3")
            .subscription("s")
            .subscribe()
            .await
            .unwrap_err();
        assert_eq!(
            e.grpc_code(),
            Some(tonic::Code::Unimplemented as i32),
            "{answer:?}: {e}"
        );
        assert_eq!(fake.lookups().len(), 1, "{answer:?}: one lookup per client");
        assert_eq!(c.pooled_connections(), 0, "{answer:?}: no extra connection");
        assert_eq!(stored(&a, "s1").await, None);

        let owner = c.lookup("s1").await.unwrap();
        assert!(owner.is_standalone());
        assert_eq!(
            owner.url,
            if answer == FakeAnswer::Unimplemented {
                fake.url()
            } else {
                a.url()
            }
        );
    }

    // A real standalone broker (it answers lookups for itself, with its
    // store id): the usual path, no extra connection.
    let c = client(&a.url()).await;
    let p = c.producer("plain").create().await.unwrap();
    p.send("x").await.unwrap();
    assert_eq!(stored(&a, "plain").await, Some(1));
    assert_eq!(c.pooled_connections(), 0);
    let owner = c.lookup("plain").await.unwrap();
    assert_eq!(owner.url, a.url());
    assert!(owner.is_standalone());
    assert!(!owner.broker_id.is_empty(), "{owner:?}");
}

#[tokio::test]
async fn a_topic_whose_broker_is_down_gives_the_typed_error() {
    let fake = FakeCluster::start("test", FakeAnswer::Down { id: "b9".into() }).await;
    let c = Client::builder(fake.url())
        .request_timeout(Duration::from_millis(800))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let e = c.lookup("gone").await.unwrap_err();
    assert_eq!(e.owner_down(), Some("b9"), "{e}");
    let e = c.producer("gone").create().await.unwrap_err();
    assert!(
        e.kind() == ErrorKind::OwnerDown && e.owner_down() == Some("b9"),
        "{e:?}"
    );
    assert!(e.to_string().contains("b9"), "{e}");
    let e = c
        .consumer("gone")
        .subscription("s")
        .subscribe()
        .await
        .unwrap_err();
    assert_eq!(e.owner_down(), Some("b9"), "{e:?}");
    // Retried (with backoff) until the request timeout, each time asking.
    assert!(fake.lookups().len() > 3, "{:?}", fake.lookups().len());
    assert_eq!(c.pooled_connections(), 0);
}

#[tokio::test]
async fn a_broken_stream_looks_the_topic_up_again_and_follows_the_new_owner() {
    let a = InProcessBroker::start().await;
    let b = InProcessBroker::start().await;
    let fake = FakeCluster::start("test", FakeAnswer::Unimplemented).await;
    fake.route("moving", FakeAnswer::owner("a", a.url()));
    let c = client(&fake.url()).await;
    let p = c.producer("moving").create().await.unwrap();
    let mut cons = c
        .consumer("moving")
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    p.send("before").await.unwrap();
    let m = tokio::time::timeout(T, cons.receive())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload()[..], b"before");
    cons.ack(&m).await.unwrap();
    cons.flush().await.unwrap();
    assert_eq!(stored(&a, "moving").await, Some(1));

    // The topic moves to b and a shuts down: both streams end with
    // UNAVAILABLE, look the topic up again, and reopen on b.
    fake.route(
        "moving",
        FakeAnswer::Owner {
            id: "b".into(),
            url: b.url(),
            epoch: 2,
        },
    );
    let _dir = a.shutdown().await;
    let id = tokio::time::timeout(T, p.send("after"))
        .await
        .expect("resent in time")
        .unwrap();
    assert_eq!(stored(&b, "moving").await, Some(1), "{id:?} landed on b");
    let m = tokio::time::timeout(T, cons.receive())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload()[..], b"after");
    cons.ack(&m).await.unwrap();
    cons.close().await.unwrap();
    p.close().await.unwrap();
}

#[tokio::test]
async fn sends_while_the_owner_is_down_fail_naming_it_and_resume_when_it_returns() {
    let a = InProcessBroker::start().await;
    let fake = FakeCluster::start("test", FakeAnswer::Unimplemented).await;
    fake.route("falls", FakeAnswer::owner("a", a.url()));
    let c = client(&fake.url()).await;
    let p = c
        .producer("falls")
        .send_timeout(Duration::from_secs(1))
        .create()
        .await
        .unwrap();
    p.send("one").await.unwrap();

    // a goes down; the cluster says so.
    fake.route("falls", FakeAnswer::Down { id: "a".into() });
    let dir = a.shutdown().await;
    let e = tokio::time::timeout(T, p.send("lost"))
        .await
        .expect("the send timeout fires")
        .unwrap_err();
    assert_eq!(e.owner_down(), Some("a"), "{e:?}");

    // a returns (on a new port) and takes the topic back.
    let a = InProcessBroker::start_in(dir, |_| {}).await;
    fake.route(
        "falls",
        FakeAnswer::Owner {
            id: "a".into(),
            url: a.url(),
            epoch: 3,
        },
    );
    let mut sent = None;
    let mut attempts = 0;
    for _ in 0..30 {
        attempts += 1;
        match p.send("two").await {
            Ok(id) => {
                sent = Some(id);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
    }
    assert!(
        sent.is_some(),
        "the producer reconnected to the returned owner"
    );
    // "one" from before, and "two" ("lost" failed and was not resent); a
    // "two" that timed out on a loaded machine may have been stored too.
    let n = stored(&a, "falls").await.unwrap();
    assert!(
        (2..=1 + attempts).contains(&n),
        "{n} stored, {attempts} attempts"
    );
    p.close().await.unwrap();
}

#[tokio::test]
async fn lookups_go_to_a_known_broker_when_the_service_url_is_down() {
    let first = FakeCluster::start("test", FakeAnswer::Unimplemented).await;
    let second = FakeCluster::start("test", FakeAnswer::owner("y", "http://127.0.0.1:9")).await;
    // `first` sends topic t1 to `second`: the client now has a channel there.
    first.route("t1", FakeAnswer::owner("x", second.url()));
    let c = client(&first.url()).await;
    c.transport_for("t1").await.unwrap();
    assert_eq!(c.pooled_connections(), 1);

    first.stop().await;
    let owner = c.lookup("t2").await.expect("asked of the other broker");
    assert_eq!(owner.broker_id, "y");
    assert_eq!(second.lookups(), [fq("t2")]);

    // The broker list and partition counts too: a producer on a
    // partitioned topic opens although the service URL is gone.
    second.brokers(vec![ricochet_proto::BrokerInfo {
        id: "y".into(),
        ..Default::default()
    }]);
    assert_eq!(c.admin().brokers(false).await.unwrap().brokers[0].id, "y");
    let a = InProcessBroker::start().await;
    let base = fq("pt");
    second.partitioned(&base, 2);
    for i in 0..2 {
        second.route(&partition_name(&base, i), FakeAnswer::owner("a", a.url()));
    }
    let p = c.producer("pt").create().await.unwrap();
    assert_eq!(p.partitions(), Some(2));
    p.send("x").await.unwrap();
    p.close().await.unwrap();
}

/// A client that never was sent to another broker knows only its service
/// URL's; its fallback URLs are asked once that one is down.
#[tokio::test]
async fn lookups_go_to_a_fallback_url_when_the_service_url_is_down() {
    let first = FakeCluster::start("test", FakeAnswer::owner("x", "http://127.0.0.1:9")).await;
    let second = FakeCluster::start("test", FakeAnswer::owner("y", "http://127.0.0.1:9")).await;
    let with = Client::builder(first.url())
        .request_timeout(Duration::from_secs(5))
        .fallback_url(second.url())
        .connect()
        .await
        .unwrap();
    let without = client(&first.url()).await;
    assert_eq!(with.lookup("t1").await.unwrap().broker_id, "x");
    assert!(
        second.lookups().is_empty(),
        "asked only while the first is down"
    );

    first.stop().await;
    let e = without.lookup("t2").await.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Disconnected | ErrorKind::Timeout),
        "{e:?}"
    );
    let owner = with.lookup("t2").await.expect("asked of the fallback");
    assert_eq!(owner.broker_id, "y");
    assert_eq!(second.lookups(), [fq("t2")]);
}

#[tokio::test]
async fn admin_on_a_partitioned_base_name_stays_on_the_service_url() {
    let fake = FakeCluster::start("test", FakeAnswer::Invalid).await;
    let c = client(&fake.url()).await;
    // The lookup refuses the base name: the admin call goes to the service
    // URL (here the fake, which has no Admin service), not anywhere else.
    let e = c.admin().topic_stats("orders").await.unwrap_err();
    assert_eq!(
        e.grpc_code(),
        Some(tonic::Code::Unimplemented as i32),
        "{e:?}"
    );
    assert_eq!(fake.lookups(), [fq("orders")]);
    assert_eq!(c.pooled_connections(), 0);
    // A producer is not opened on a refused name.
    let e = c.producer("orders").create().await.unwrap_err();
    assert_eq!(
        e.grpc_code(),
        Some(tonic::Code::InvalidArgument as i32),
        "{e:?}"
    );
}
