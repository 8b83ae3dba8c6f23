//! Hostile field values in well-formed frames: empty everything, huge and
//! path-like names, unicode and control characters, oversize keys and
//! property maps, enum values out of range, `u64::MAX` ids. Each gets its
//! exact status and changes nothing.

use super::common::*;
use super::support::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::collections::HashMap;
use tonic::Code;

const MIB: usize = 1 << 20;

fn names() -> Vec<String> {
    vec![
        String::new(),
        "..".into(),
        ".".into(),
        "../../etc".into(),
        "a/../b".into(),
        ".hidden".into(),
        "a%2Fb".into(),
        "ünïcödé".into(),
        "tab\there".into(),
        "nul\0".into(),
        "new\nline".into(),
        "x".repeat(201),
        "n".repeat(MIB),
    ]
}

/// Every admin RPC with `topic` and `subscription` set to a bad name: the
/// status is INVALID_ARGUMENT and its message is short.
async fn admin_refuses(admin: &mut AdminClient<tonic::transport::Channel>, bad: &str) {
    let t = || bad.to_owned();
    let s = || "s".to_owned();
    let sub = || SubscriptionRequest {
        topic: t(),
        subscription: s(),
    };
    if !bad.is_empty() {
        let e = admin
            .list_topics(ListTopicsRequest {
                namespace: t(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "ListTopics: {e}");
    }
    let results: Vec<(&str, Result<(), tonic::Status>)> = vec![
        (
            "CreateTopic",
            admin
                .create_topic(CreateTopicRequest {
                    topic: t(),
                    replicas: 0,
                })
                .await
                .map(drop),
        ),
        (
            "DeleteTopic",
            admin
                .delete_topic(DeleteTopicRequest {
                    topic: t(),
                    force: true,
                })
                .await
                .map(drop),
        ),
        (
            "TopicStats",
            admin
                .topic_stats(TopicRequest { topic: t() })
                .await
                .map(drop),
        ),
        (
            "ListSubscriptions",
            admin
                .list_subscriptions(TopicRequest { topic: t() })
                .await
                .map(drop),
        ),
        (
            "SubscriptionStats",
            admin.subscription_stats(sub()).await.map(drop),
        ),
        (
            "DeleteSubscription",
            admin
                .delete_subscription(DeleteSubscriptionRequest {
                    topic: sub().topic,
                    subscription: sub().subscription,
                    force: false,
                })
                .await
                .map(drop),
        ),
        ("GetPolicy", admin.get_policy(sub()).await.map(drop)),
        (
            "SetPolicy",
            admin
                .set_policy(SetPolicyRequest {
                    topic: t(),
                    subscription: s(),
                    policy: None,
                })
                .await
                .map(drop),
        ),
        (
            "GetMessage",
            admin
                .get_message(GetMessageRequest {
                    id: Some(MessageId {
                        topic: t(),
                        entry_id: 0,
                    }),
                })
                .await
                .map(drop),
        ),
        (
            "ListDeadLetters",
            admin
                .list_dead_letters(ListDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
        (
            "ReplayDeadLetters",
            admin
                .replay_dead_letters(ReplayDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
        (
            "PurgeDeadLetters",
            admin
                .purge_dead_letters(PurgeDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    ..Default::default()
                })
                .await
                .map(drop),
        ),
    ];
    for (rpc, r) in results {
        let e = r.expect_err(rpc);
        assert_eq!(e.code(), Code::InvalidArgument, "{rpc} {:.80?}: {e}", bad);
        assert!(
            e.message().len() < 400,
            "{rpc}: {} bytes",
            e.message().len()
        );
    }
}

/// Bad topic and subscription names on every RPC that takes one.
#[tokio::test]
async fn bad_names_on_every_rpc() {
    let b = InProcessBroker::start().await;
    let mut admin = AdminClient::new(channel(&b.url()).await);
    for bad in names() {
        unchanged(&b.url(), "bad name", async {
            admin_refuses(&mut admin, &bad).await;
            let e = RawProducer::open(&b.url(), &bad, "p").await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            let e = RawConsumer::subscribe(&b.url(), &bad, "s", SubOpts::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            let e = RawConsumer::subscribe(&b.url(), "t", &bad, SubOpts::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        })
        .await;
    }
}

/// The empty request of every admin RPC: INVALID_ARGUMENT wherever a name
/// or id is required.
#[tokio::test]
async fn empty_requests() {
    let b = InProcessBroker::start().await;
    let mut admin = AdminClient::new(channel(&b.url()).await);
    unchanged(&b.url(), "empty admin requests", async {
        assert!(
            admin
                .list_topics(ListTopicsRequest::default())
                .await
                .is_ok()
        );
        let codes = [
            admin
                .create_topic(CreateTopicRequest::default())
                .await
                .map(drop),
            admin
                .delete_topic(DeleteTopicRequest::default())
                .await
                .map(drop),
            admin.topic_stats(TopicRequest::default()).await.map(drop),
            admin
                .list_subscriptions(TopicRequest::default())
                .await
                .map(drop),
            admin
                .subscription_stats(SubscriptionRequest::default())
                .await
                .map(drop),
            admin
                .delete_subscription(DeleteSubscriptionRequest::default())
                .await
                .map(drop),
            admin
                .get_policy(SubscriptionRequest::default())
                .await
                .map(drop),
            admin
                .set_policy(SetPolicyRequest::default())
                .await
                .map(drop),
            admin
                .get_message(GetMessageRequest::default())
                .await
                .map(drop),
            admin
                .list_dead_letters(ListDeadLettersRequest::default())
                .await
                .map(drop),
            admin
                .replay_dead_letters(ReplayDeadLettersRequest::default())
                .await
                .map(drop),
            admin
                .purge_dead_letters(PurgeDeadLettersRequest::default())
                .await
                .map(drop),
        ];
        for (i, r) in codes.into_iter().enumerate() {
            assert_eq!(r.unwrap_err().code(), Code::InvalidArgument, "request {i}");
        }
    })
    .await;
}

/// Oversize keys, property maps and whole messages; names of producers
/// and consumers that are huge or hold control characters.
#[tokio::test]
async fn oversize_messages_and_labels() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "sizes", "p").await.unwrap();
    p.send(&["a normal one"]).await;
    let mut many = HashMap::new();
    for i in 0..10_000 {
        many.insert(format!("k{i}"), "v".to_owned());
    }
    let limit = 5 * MIB;
    let cases: Vec<(&str, OutboundMessage)> = vec![
        (
            "30 MiB key",
            OutboundMessage {
                key: "k".repeat(30 * MIB),
                ..Default::default()
            },
        ),
        (
            "10 000 properties",
            OutboundMessage {
                properties: many.clone(),
                ..Default::default()
            },
        ),
        (
            "payload at the limit plus a key",
            OutboundMessage {
                payload: vec![0; limit],
                key: "k".into(),
                ..Default::default()
            },
        ),
        (
            "one property value over the limit",
            OutboundMessage {
                properties: HashMap::from([("big".to_owned(), "v".repeat(limit))]),
                ..Default::default()
            },
        ),
    ];
    for (what, mut m) in cases {
        unchanged(&b.url(), what, async {
            m.sequence_id = p.next_seq;
            match p.send_batch(vec![m]).await {
                produce_response::Response::Error(e) => {
                    assert_eq!(e.code, Code::InvalidArgument as i32, "{what}: {e:?}");
                    assert!(e.message.len() < 400, "{what}: {}", e.message);
                }
                other => panic!("{what}: {other:?}"),
            }
        })
        .await;
    }
    // The producer still works, and a message exactly at the limit is taken.
    let at_limit = OutboundMessage {
        payload: vec![0; limit - 2],
        key: "k".into(),
        properties: HashMap::from([("p".to_owned(), String::new())]),
        sequence_id: p.next_seq,
        ..Default::default()
    };
    p.send_messages(vec![at_limit]).await;

    for (what, name) in [
        ("huge producer name", "p".repeat(MIB)),
        ("producer name with a newline", "a\nb".into()),
    ] {
        unchanged(&b.url(), what, async {
            let e = RawProducer::open(&b.url(), "fresh-topic", &name)
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
            assert!(e.message().len() < 400);
        })
        .await;
    }
    for (what, name) in [
        ("huge consumer name", "c".repeat(MIB)),
        ("consumer name with NUL", "a\0b".into()),
    ] {
        unchanged(&b.url(), what, async {
            let opts = SubOpts {
                name: name.clone(),
                ..Default::default()
            };
            let e = RawConsumer::subscribe(&b.url(), "fresh-topic", "s", opts)
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
        })
        .await;
    }
}

/// Consumer requests with values out of range: each is answered
/// INVALID_ARGUMENT and settles nothing; the stream stays usable.
#[tokio::test]
async fn consumer_requests_out_of_range() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "ranges", "p").await.unwrap();
    p.send(&["m"]).await;
    let mut c = RawConsumer::simple(&b.url(), "ranges", "s", SubscriptionType::Exclusive).await;
    c.flow(u32::MAX).await;
    let m = c.next(WAIT).await.expect("delivered with u32::MAX permits");
    let id = m.id.clone().unwrap();
    let mut many = HashMap::new();
    for i in 0..10_000 {
        many.insert(format!("k{i}"), String::new());
    }
    use consume_request::Request as R;
    let cases: Vec<(&str, R)> = vec![
        (
            "ack type 99",
            R::Ack(Ack {
                request_id: 1,
                ack_type: 99,
                ids: vec![id.clone()],
            }),
        ),
        (
            "u64::MAX entry id",
            R::Ack(Ack {
                request_id: 2,
                ack_type: 0,
                ids: vec![MessageId {
                    entry_id: u64::MAX,
                    ..id.clone()
                }],
            }),
        ),
        (
            "foreign topic in an id",
            R::Ack(Ack {
                request_id: 3,
                ack_type: 0,
                ids: vec![MessageId {
                    topic: "x".repeat(MIB),
                    entry_id: 0,
                }],
            }),
        ),
        (
            "failure reason 99",
            R::Redeliver(Redeliver {
                request_id: 4,
                messages: vec![FailedDelivery {
                    id: Some(id.clone()),
                    reason: 99,
                    detail: String::new(),
                    delay_ms: 0,
                    ahead: false,
                    local: false,
                    delay_us: 0,
                }],
            }),
        ),
        (
            "1 MiB nack reason",
            R::Redeliver(Redeliver {
                request_id: 5,
                messages: vec![FailedDelivery {
                    id: Some(id.clone()),
                    reason: FailureReason::Nack as i32,
                    detail: "d".repeat(MIB),
                    delay_ms: 0,
                    ahead: false,
                    local: false,
                    delay_us: 0,
                }],
            }),
        ),
        (
            "10 000 properties on a reconsume",
            R::ReconsumeLater(ReconsumeLater {
                request_id: 6,
                id: Some(id.clone()),
                delay: Some(reconsume_later::Delay::DelayMs(1000)),
                properties: many,
                detail: String::new(),
                waited_us: 0,
            }),
        ),
        (
            "1 MiB terminate reason",
            R::Terminate(Terminate {
                request_id: 7,
                id: Some(id.clone()),
                detail: "d".repeat(MIB),
            }),
        ),
        (
            "a terminate without an id",
            R::Terminate(Terminate {
                request_id: 8,
                id: None,
                detail: String::new(),
            }),
        ),
    ];
    for (what, req) in cases {
        let rid = match &req {
            R::Ack(a) => a.request_id,
            R::Redeliver(r) => r.request_id,
            R::ReconsumeLater(r) => r.request_id,
            R::Terminate(t) => t.request_id,
            _ => unreachable!(),
        };
        let c = &mut c;
        unchanged(&b.url(), what, async move {
            c.request(req).await;
            let r = c.result(WAIT).await.expect("a result");
            assert_eq!(
                (r.request_id, r.code),
                (rid, Code::InvalidArgument as i32),
                "{what}: {r:?}"
            );
            assert!(r.message.len() < 400, "{what}: {} bytes", r.message.len());
        })
        .await;
    }
    // The message is still in flight with this consumer: an ack settles it.
    c.ack(vec![id], 9).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
}

/// Subscribe frames with enum values out of range, and an empty request
/// frame mid-stream.
#[tokio::test]
async fn subscribe_enums_out_of_range_and_empty_frames() {
    let b = InProcessBroker::start().await;
    let ch = channel(&b.url()).await;
    let mut client = ricochet_proto::broker_client::BrokerClient::new(ch);
    for (what, sub_type, initial) in [("type 99", 99, 0), ("position -1", 0, -1)] {
        unchanged(&b.url(), what, async {
            let first = ConsumeRequest {
                request: Some(consume_request::Request::Subscribe(Subscribe {
                    topic: "enums".into(),
                    subscription: "s".into(),
                    subscription_type: sub_type,
                    initial_position: initial,
                    ..Default::default()
                })),
            };
            let e = client
                .consume(tokio_stream::iter(vec![first]))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
        })
        .await;
    }
    let mut c = RawConsumer::simple(&b.url(), "enums", "s", SubscriptionType::Shared).await;
    unchanged(&b.url(), "empty ConsumeRequest", async {
        c.send_frame(ConsumeRequest { request: None }).await;
        let e = c.end(WAIT).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    })
    .await;
}

/// Tier names a subscribing client asks for that cannot be honoured: bad
/// names are INVALID_ARGUMENT, names that clash with existing topics,
/// other subscriptions' tiers or the subscription's own tiers are
/// FAILED_PRECONDITION; none creates anything.
#[tokio::test]
async fn tier_overrides_that_cannot_be_honoured() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "busy", "p").await.unwrap();
    p.send(&["an ordinary topic"]).await;
    let _owner = RawConsumer::simple(&b.url(), "orders", "a", SubscriptionType::Shared).await;
    let policy = |retry: &str, dlq: &str| DeadLetterPolicyConfig {
        key_order: None,
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(
            DelayLevelPolicyConfig::default(),
        )),
        retry_topic: retry.into(),
        dead_letter_topic: dlq.into(),
        breaker: None,
    };
    let huge = "t".repeat(MIB);
    // Subscription `b` on `topic` (the existing `orders`, or a topic the
    // refused Subscribe must not create), or the existing `a` on `orders`.
    let cases = |topic: &str| -> Vec<(&'static str, &'static str, DeadLetterPolicyConfig, Code)> {
        let own_retry = format!("{topic}-b-RETRY");
        let mut v = vec![
            ("dot-dot", "b", policy("..", ""), Code::InvalidArgument),
            (
                "path-like",
                "b",
                policy("", "../../x"),
                Code::InvalidArgument,
            ),
            ("huge", "b", policy(&huge, ""), Code::InvalidArgument),
            ("own topic", "b", policy(topic, ""), Code::InvalidArgument),
            (
                "retry = dlq",
                "b",
                policy("same", "same"),
                Code::InvalidArgument,
            ),
            (
                "dlq = default retry",
                "b",
                policy("", &own_retry),
                Code::InvalidArgument,
            ),
            (
                "an ordinary topic",
                "b",
                policy("busy", ""),
                Code::FailedPrecondition,
            ),
            (
                "another subscription's tier",
                "b",
                policy("", "orders-a-DLQ"),
                Code::FailedPrecondition,
            ),
        ];
        if topic == "orders" {
            v.push((
                "other tiers for an existing subscription",
                "a",
                policy("", "elsewhere"),
                Code::FailedPrecondition,
            ));
        }
        v
    };
    for topic in ["orders", "fresh"] {
        for (what, sub, policy, code) in cases(topic) {
            unchanged(&b.url(), what, async {
                let opts = SubOpts {
                    sub_type: SubscriptionType::Shared,
                    policy: Some(policy),
                    ..Default::default()
                };
                let e = RawConsumer::subscribe(&b.url(), topic, sub, opts)
                    .await
                    .unwrap_err();
                assert_eq!(e.code(), code, "{what} on {topic}: {e}");
                assert!(
                    e.message().len() < 400,
                    "{what}: {} bytes",
                    e.message().len()
                );
            })
            .await;
        }
    }
    // A tier that exists only as a name (nothing moved there yet) is not
    // created by a producer or an ordinary consumer that is refused.
    for (tier, consumer_code) in [
        ("orders-a-RETRY", Code::FailedPrecondition),
        ("orders-a-DLQ", Code::PermissionDenied),
    ] {
        unchanged(&b.url(), tier, async {
            let e = RawProducer::open(&b.url(), tier, "p").await.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{tier}: {e}");
            let e = RawConsumer::subscribe(&b.url(), tier, "peek", SubOpts::default())
                .await
                .unwrap_err();
            assert_eq!(e.code(), consumer_code, "{tier}: {e}");
        })
        .await;
    }
}

/// The naming rule, written independently of the broker: a part is 1-200
/// characters of `[A-Za-z0-9-_.=:]` not starting with a dot; a topic is
/// `persistent://t/n/x`, `t/n/x` or a bare `x`. Returns the full name.
fn model_topic(s: &str) -> Option<String> {
    let part = |p: &str| {
        (1..=200).contains(&p.len())
            && !p.starts_with('.')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.=:".contains(c))
    };
    let (rest, full) = match s.strip_prefix("persistent://") {
        Some(rest) => (rest, true),
        None if s.contains("://") => return None,
        None => (s, false),
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [x] if !full && part(x) => Some(format!("persistent://public/default/{x}")),
        [t, n, x] if part(t) && part(n) && part(x) => Some(format!("persistent://{t}/{n}/{x}")),
        _ => None,
    }
}

/// Arbitrary names on CreateTopic: created exactly when the rule allows
/// (ALREADY_EXISTS the second time), INVALID_ARGUMENT otherwise, and the
/// topic list always what the rule predicts.
#[test]
fn arbitrary_topic_names_follow_the_rule() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let b = rt.block_on(InProcessBroker::start());
    let admin = rt.block_on(async { AdminClient::new(channel(&b.url()).await) });
    let names = prop_oneof![
        "[a-c./:%=_-]{0,6}",
        "(persistent://)?[a-c.%]{0,3}(/[a-c.]{0,3}){0,3}",
        "\\PC{0,12}",
        "[a-z]{195,205}",
    ];
    let created = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&names, |name| {
            let mut admin = admin.clone();
            let mut created = created.lock().unwrap();
            rt.block_on(async {
                let r = admin
                    .create_topic(CreateTopicRequest {
                        topic: name.clone(),
                        replicas: 0,
                    })
                    .await;
                match model_topic(&name) {
                    Some(full) if created.contains(&full) => {
                        assert_eq!(r.unwrap_err().code(), Code::AlreadyExists, "{name:?}")
                    }
                    Some(full) => {
                        assert_eq!(r.expect(&name).into_inner().topic, full);
                        created.insert(full);
                    }
                    None => assert_eq!(r.unwrap_err().code(), Code::InvalidArgument, "{name:?}"),
                }
                let listed: std::collections::BTreeSet<String> = admin
                    .list_topics(ListTopicsRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .topics
                    .into_iter()
                    .collect();
                assert_eq!(listed, *created, "after {name:?}");
            });
            Ok(())
        })
        .unwrap();
}
