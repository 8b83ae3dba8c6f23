//! Floods beyond the configured limits: topics (broker-wide and per
//! namespace, by every way of creating one, concurrently), subscriptions
//! per topic. Past a limit every attempt is RESOURCE_EXHAUSTED naming the
//! setting, nothing more is created, and the broker keeps serving.

use super::common::*;
use super::support::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use tonic::Code;

/// Topics: per namespace, then broker-wide, by admin, producer and
/// consumer; a concurrent flood creates exactly up to the limit; tiers do
/// not count (a message can still be dead-lettered at the limit).
#[tokio::test]
async fn topics_beyond_the_limits() {
    let b = InProcessBroker::start_with(|c| {
        c.max_topics_per_namespace = 20;
        c.max_topics = 30;
    })
    .await;
    let url = b.url();
    let mut admin = AdminClient::new(channel(&url).await);
    // The canary topic the checks publish to takes one place in the
    // namespace; a concurrent flood of 200 creations takes the rest.
    assert_serving(&url).await;
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..200 {
        let mut admin = admin.clone();
        flood.spawn(async move {
            admin
                .create_topic(CreateTopicRequest {
                    topic: format!("flood-{i}"),
                    replicas: 0,
                })
                .await
                .map_err(|e| e.code())
        });
    }
    let mut codes = std::collections::HashMap::new();
    while let Some(r) = flood.join_next().await {
        *codes.entry(r.unwrap().err()).or_insert(0) += 1;
    }
    assert_eq!(codes.get(&None), Some(&19), "{codes:?}");
    assert_eq!(
        codes.get(&Some(Code::ResourceExhausted)),
        Some(&181),
        "{codes:?}"
    );
    let full = |e: &tonic::Status, setting: &str| {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        assert!(e.message().contains(setting), "{e}");
    };
    unchanged(&url, "a full namespace", async {
        let e = admin
            .create_topic(CreateTopicRequest {
                topic: "one-more".into(),
                replicas: 0,
            })
            .await
            .unwrap_err();
        full(&e, "max_topics_per_namespace");
        let e = RawProducer::open(&url, "one-more", "p").await.unwrap_err();
        full(&e, "max_topics_per_namespace");
        let e = RawConsumer::subscribe(&url, "one-more", "s", SubOpts::default())
            .await
            .unwrap_err();
        full(&e, "max_topics_per_namespace");
    })
    .await;
    // Dead letters still move at the limit: tier topics do not count.
    let flooded = snapshot(&channel(&url).await).await;
    let one = flooded
        .topics()
        .into_iter()
        .find(|t| t.contains("/flood-"))
        .expect("a flood topic")
        .to_owned();
    let mut c = RawConsumer::simple(&url, &one, "s", SubscriptionType::Shared).await;
    c.flow(1).await;
    let mut p = RawProducer::open(&url, &one, "p").await.unwrap();
    p.send(&["poison"]).await;
    let m = c.next(WAIT).await.unwrap();
    c.terminate(m.id.unwrap(), "poison", 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    // Other namespaces fill the rest of the broker-wide limit.
    for i in 0..10 {
        admin
            .create_topic(CreateTopicRequest {
                topic: format!("t{i}/ns/x"),
                replicas: 0,
            })
            .await
            .unwrap();
    }
    unchanged(&url, "a full broker", async {
        let e = admin
            .create_topic(CreateTopicRequest {
                topic: "elsewhere/ns/x".into(),
                replicas: 0,
            })
            .await
            .unwrap_err();
        full(&e, "(max_topics in");
    })
    .await;
    // Deleting one makes room for one.
    admin
        .delete_topic(DeleteTopicRequest {
            topic: "t0/ns/x".into(),
            force: false,
        })
        .await
        .unwrap();
    admin
        .create_topic(CreateTopicRequest {
            topic: "elsewhere/ns/x".into(),
            replicas: 0,
        })
        .await
        .unwrap();
}

/// Subscriptions on one topic beyond `max_subscriptions_per_topic`.
#[tokio::test]
async fn subscriptions_beyond_the_limit() {
    let b = InProcessBroker::start_with(|c| c.max_subscriptions_per_topic = 5).await;
    let url = b.url();
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(
            RawConsumer::simple(&url, "subs", &format!("s{i}"), SubscriptionType::Shared).await,
        );
    }
    unchanged(&url, "a full topic", async {
        for i in 5..50 {
            let e = RawConsumer::subscribe(&url, "subs", &format!("s{i}"), SubOpts::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            assert!(e.message().contains("max_subscriptions_per_topic"), "{e}");
        }
    })
    .await;
    // An existing subscription still takes more consumers.
    let more = RawConsumer::simple(&url, "subs", "s0", SubscriptionType::Shared).await;
    drop((held, more));
}

/// A health check on `ch`.
async fn health(ch: &tonic::transport::Channel) -> Result<(), tonic::Status> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(drop)
}

/// Retries `f` until it succeeds (connections released by a client are
/// noticed by the broker a moment later).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether the broker closed `s` within `wait` (a read ends or fails).
async fn closed_within(s: &mut tokio::net::TcpStream, wait: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // HTTP/2 settings or a GOAWAY: keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

/// Connections beyond `max_connections`: the next ones are answered
/// RESOURCE_EXHAUSTED, then closed; past the refusal window, closed on
/// accept. A released slot serves again.
#[tokio::test]
async fn connections_beyond_the_limit() {
    let b = InProcessBroker::start_with(|c| c.max_connections = 4).await;
    let url = b.url();
    unchanged(&url, "a connection flood", async {
        // `unchanged` holds one connection for its snapshots: three more
        // reach the limit.
        let mut held = Vec::new();
        for _ in 0..3 {
            let ch = channel(&url).await;
            health(&ch).await.expect("within the limit");
            held.push(ch);
        }
        let extra = channel(&url).await;
        let e = health(&extra).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        assert!(e.message().contains("max_connections"), "{e}");
        let e = RawProducer::open(&url, "over", "p").await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
        // A flood of raw sockets: those past the refusal window are closed
        // at once, the rest after the grace; none is served.
        let mut flood = Vec::new();
        for _ in 0..100 {
            flood.push(tokio::net::TcpStream::connect(b.addr).await.unwrap());
        }
        let mut closed_at_once = 0;
        for s in &mut flood {
            if closed_within(s, std::time::Duration::from_millis(50)).await {
                closed_at_once += 1;
            }
        }
        assert!(closed_at_once >= 30, "{closed_at_once} closed on accept");
        for s in &mut flood {
            assert!(
                closed_within(s, std::time::Duration::from_secs(4)).await,
                "a refused connection stays open"
            );
        }
        drop((held, extra, flood));
        eventually("a released slot serves again", || async {
            health(&channel(&url).await).await.is_ok()
        })
        .await;
    })
    .await;
}

/// Calls open on one connection beyond `max_streams_per_connection`:
/// RESOURCE_EXHAUSTED for streams and unary calls alike, until one ends.
#[tokio::test]
async fn streams_beyond_the_limit_per_connection() {
    let b = InProcessBroker::start_with(|c| c.max_streams_per_connection = 3).await;
    let url = b.url();
    let ch = channel(&url).await;
    let mut client = ricochet_proto::broker_client::BrokerClient::new(ch.clone());
    let subscribe = |sub: &str| {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.try_send(ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(Subscribe {
                topic: "streams".into(),
                subscription: sub.into(),
                subscription_type: SubscriptionType::Shared as i32,
                ..Default::default()
            })),
        })
        .unwrap();
        (tx, tokio_stream::wrappers::ReceiverStream::new(rx))
    };
    let mut open = Vec::new();
    for i in 0..3 {
        let (tx, rx) = subscribe(&format!("s{i}"));
        let mut inbound = client
            .consume(rx)
            .await
            .expect("within the limit")
            .into_inner();
        inbound.message().await.unwrap().expect("Subscribed");
        open.push((tx, inbound));
    }
    unchanged(&url, "calls beyond the limit", async {
        for i in 3..20 {
            let (_tx, rx) = subscribe(&format!("s{i}"));
            let e = client.consume(rx).await.unwrap_err();
            assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
            assert!(e.message().contains("max_streams_per_connection"), "{e}");
        }
        let e = health(&ch).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    })
    .await;
    // One ends: the connection serves one more call.
    drop(open.pop());
    eventually("a call slot frees", || async { health(&ch).await.is_ok() }).await;
}

/// A connection with no call open for `idle_timeout` is closed; one with a
/// quiet consumer stream open is not, and a channel reconnects after.
#[tokio::test]
async fn idle_connections_are_closed() {
    let idle = std::time::Duration::from_millis(300);
    let b = InProcessBroker::start_with(|c| c.idle_timeout = idle).await;
    let url = b.url();
    // A socket that never speaks.
    let mut silent = tokio::net::TcpStream::connect(b.addr).await.unwrap();
    assert!(
        closed_within(&mut silent, idle * 5).await,
        "silent socket kept"
    );
    // A consumer whose stream stays quiet for several timeouts.
    let mut c = RawConsumer::simple(&url, "idle", "s", SubscriptionType::Shared).await;
    c.flow(1).await;
    tokio::time::sleep(idle * 4).await;
    let mut p = RawProducer::open(&url, "idle", "p").await.unwrap();
    p.send(&["after a quiet spell"]).await;
    let m = c.next(WAIT).await.expect("the quiet stream was kept");
    assert_eq!(text(&m), "after a quiet spell");
    // A channel used once, then idle: closed by the broker, reconnected on use.
    let ch = channel(&url).await;
    health(&ch).await.unwrap();
    tokio::time::sleep(idle * 4).await;
    eventually("the channel reconnects", || async {
        health(&ch).await.is_ok()
    })
    .await;
    assert_serving(&url).await;
}

/// A flood of requests on one consumer stream: thousands of acks of ids
/// never delivered, each answered INVALID_ARGUMENT (none dropped), permits
/// piled past `u32::MAX`; the stream and the subscription still work.
#[tokio::test]
async fn request_flood_on_one_stream() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    let mut p = RawProducer::open(&url, "reqs", "p").await.unwrap();
    p.send(&["real"]).await;
    let mut c = RawConsumer::simple(&url, "reqs", "s", SubscriptionType::Shared).await;
    let topic = "persistent://public/default/reqs".to_owned();
    const N: u64 = 5_000;
    unchanged(&url, "a request flood", async {
        for rid in 1..=N {
            let id = MessageId {
                topic: topic.clone(),
                entry_id: 1_000 + rid,
            };
            c.ack(vec![id], rid).await;
        }
        let mut answered = std::collections::BTreeSet::new();
        while answered.len() < N as usize {
            let r = c
                .result(WAIT)
                .await
                .unwrap_or_else(|| panic!("{} of {N} answered", answered.len()));
            assert_eq!(r.code, Code::InvalidArgument as i32, "{r:?}");
            assert!(answered.insert(r.request_id), "{r:?} twice");
        }
    })
    .await;
    for _ in 0..3 {
        c.flow(u32::MAX).await;
    }
    let m = c.next(WAIT).await.expect("delivered");
    c.ack(vec![m.id.unwrap()], N + 1).await;
    let r = c.result(WAIT).await.unwrap();
    assert_eq!((r.request_id, r.code), (N + 1, 0));
}
