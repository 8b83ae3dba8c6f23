//! Bad input gets a precise gRPC status and changes nothing.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use tonic::Code;

#[tokio::test]
async fn malformed_names_and_unknown_things_are_rejected() {
    let b = InProcessBroker::start().await;
    let mut admin = AdminClient::new(channel(&b.url()).await);
    for bad in ["", "a/b", "bad name", "http://x/y/z"] {
        let e = RawProducer::open(&b.url(), bad, "p")
            .await
            .expect_err("rejected");
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e}");
        let e = admin
            .create_topic(CreateTopicRequest {
                topic: bad.into(),
                replicas: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    let e = RawConsumer::subscribe(&b.url(), "t", "bad sub", SubOpts::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = admin
        .topic_stats(TopicRequest {
            topic: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    admin
        .create_topic(CreateTopicRequest {
            topic: "t".into(),
            replicas: 0,
        })
        .await
        .unwrap();
    let e = admin
        .create_topic(CreateTopicRequest {
            topic: "t".into(),
            replicas: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let e = admin
        .subscription_stats(SubscriptionRequest {
            topic: "t".into(),
            subscription: "none".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // Nothing was created by the rejected calls.
    let topics = admin
        .list_topics(ListTopicsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .topics;
    assert_eq!(topics, vec!["persistent://public/default/t".to_string()]);
}

#[tokio::test]
async fn invalid_policies_are_rejected_on_subscribe_and_set() {
    let b = InProcessBroker::start().await;
    let zero = DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::Backoff(
            BackoffPolicyConfig {
                backoff: Some(backoff_policy_config::Backoff::FixedDelayMs(1000)),
                max_redeliver_count: 0,
            },
        )),
        ..Default::default()
    };
    let opts = SubOpts {
        policy: Some(zero.clone()),
        ..Default::default()
    };
    let e = RawConsumer::subscribe(&b.url(), "pol", "s", opts)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let _c = RawConsumer::simple(&b.url(), "pol", "s2", SubscriptionType::Shared).await;
    let mut admin = AdminClient::new(channel(&b.url()).await);
    let e = admin
        .set_policy(SetPolicyRequest {
            topic: "pol".into(),
            subscription: "s2".into(),
            policy: Some(zero),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let p = admin
        .get_policy(SubscriptionRequest {
            topic: "pol".into(),
            subscription: "s2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.source, "default", "the rejected policy changed nothing");
}

#[tokio::test]
async fn oversize_and_out_of_order_batches_are_rejected_whole() {
    let b = InProcessBroker::start_with(|c| c.max_message_size = 1024).await;
    let mut p = RawProducer::open(&b.url(), "big", "p").await.unwrap();
    let ok = p.msg(vec![0u8; 10]);
    let big = p.msg(vec![0u8; 2048]);
    match p.send_batch(vec![ok, big]).await {
        produce_response::Response::Error(e) => {
            assert_eq!(e.code, Code::InvalidArgument as i32);
            assert!(e.message.contains("limit is 1024"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    let m1 = p.msg("a");
    let mut m0 = p.msg("b");
    m0.sequence_id = 0;
    match p.send_batch(vec![m1, m0]).await {
        produce_response::Response::Error(e) => assert_eq!(e.code, Code::InvalidArgument as i32),
        other => panic!("{other:?}"),
    }
    let mut admin = AdminClient::new(channel(&b.url()).await);
    let stats = admin
        .topic_stats(TopicRequest {
            topic: "big".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stats.message_count, 0,
        "nothing of a rejected batch is stored"
    );
}

#[tokio::test]
async fn acks_and_failures_for_undelivered_ids_are_rejected() {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "acks", "p").await.unwrap();
    p.send(&["one", "two"]).await;
    let mut c = RawConsumer::simple(&b.url(), "acks", "s", SubscriptionType::Shared).await;
    c.flow(1).await;
    let m = c.next(WAIT).await.unwrap();
    let topic = m.id.as_ref().unwrap().topic.clone();
    // Entry 1 was never delivered (no permits); entry 99 does not exist.
    for (entry, rid) in [(1u64, 11u64), (99, 12)] {
        c.ack(
            vec![MessageId {
                topic: topic.clone(),
                entry_id: entry,
            }],
            rid,
        )
        .await;
        let r = c.result(WAIT).await.unwrap();
        assert_eq!(
            (r.request_id, r.code),
            (rid, Code::InvalidArgument as i32),
            "{r:?}"
        );
        assert!(r.message.contains("never delivered"), "{}", r.message);
    }
    c.ack(
        vec![MessageId {
            topic: "persistent://public/default/other".into(),
            entry_id: 0,
        }],
        13,
    )
    .await;
    assert_eq!(
        c.result(WAIT).await.unwrap().code,
        Code::InvalidArgument as i32
    );
    c.nack(
        MessageId {
            topic: topic.clone(),
            entry_id: 1,
        },
        "x",
        14,
    )
    .await;
    assert_eq!(
        c.result(WAIT).await.unwrap().code,
        Code::InvalidArgument as i32
    );
    // A mixed batch (one valid id, one not) is rejected whole: the valid one stays unacked.
    c.ack(
        vec![
            m.id.clone().unwrap(),
            MessageId {
                topic: topic.clone(),
                entry_id: 1,
            },
        ],
        15,
    )
    .await;
    assert_eq!(
        c.result(WAIT).await.unwrap().code,
        Code::InvalidArgument as i32
    );
    let mut admin = AdminClient::new(channel(&b.url()).await);
    let s = admin
        .subscription_stats(SubscriptionRequest {
            topic: "acks".into(),
            subscription: "s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((s.backlog, s.unacked), (2, 1));
    // A second Subscribe frame on the same stream ends it with InvalidArgument.
    c.request(consume_request::Request::Subscribe(Subscribe::default()))
        .await;
    let mut saw_error = false;
    for _ in 0..5 {
        match tokio::time::timeout(WAIT, async { c.next(QUIET).await }).await {
            Ok(None) | Err(_) => {
                saw_error = true;
                break;
            }
            Ok(Some(_)) => {}
        }
    }
    assert!(saw_error);
}

#[tokio::test]
async fn auto_create_off_means_unknown_topics_are_not_found() {
    let b = InProcessBroker::start_with(|c| c.auto_create_topics = false).await;
    let e = RawProducer::open(&b.url(), "ghost", "p")
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::NotFound);
    let e = RawConsumer::subscribe(&b.url(), "ghost", "s", SubOpts::default())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::NotFound);
    let mut admin = AdminClient::new(channel(&b.url()).await);
    admin
        .create_topic(CreateTopicRequest {
            topic: "real".into(),
            replicas: 0,
        })
        .await
        .unwrap();
    assert!(RawProducer::open(&b.url(), "real", "p").await.is_ok());
}

/// Tier topics are the broker's: a retry tier cannot be subscribed to, and a
/// dead-letter tier only by a consumer that says it is a dead-letter reader.
/// A refused subscription creates nothing.
#[tokio::test]
async fn tier_topics_refuse_ordinary_subscriptions() {
    let b = InProcessBroker::start().await;
    let mut c = RawConsumer::simple(&b.url(), "orders", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), "orders", "p").await.unwrap();
    p.send(&["retry me", "kill me"]).await;
    let got = c.take(2, WAIT).await;
    c.reconsume_later(
        got[0].id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(3_600_000),
        1,
    )
    .await;
    c.terminate(got[1].id.clone().unwrap(), "poison", 2).await;
    for _ in 0..2 {
        assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    }
    let retry = "persistent://public/default/orders-s-RETRY";
    let dlq = "persistent://public/default/orders-s-DLQ";

    let e = RawConsumer::subscribe(&b.url(), retry, "peek", SubOpts::default())
        .await
        .expect_err("a retry tier is not for consumers");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("retry tier"), "{e}");
    let e = RawConsumer::subscribe(&b.url(), dlq, "peek", SubOpts::default())
        .await
        .expect_err("a DLQ needs an explicit reader");
    assert_eq!(e.code(), Code::PermissionDenied, "{e}");
    assert!(e.message().contains("dead_letter_reader"), "{e}");
    let mut admin = AdminClient::new(channel(&b.url()).await);
    for topic in [retry, dlq] {
        let subs = admin
            .list_subscriptions(TopicRequest {
                topic: topic.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .subscriptions;
        assert!(
            !subs.contains(&"peek".to_owned()),
            "{topic}: the refused subscription was created: {subs:?}"
        );
    }

    // An explicit reader gets the dead letter.
    let opts = SubOpts {
        dead_letter_reader: true,
        ..Default::default()
    };
    let mut reader = RawConsumer::subscribe(&b.url(), dlq, "ops", opts)
        .await
        .unwrap();
    reader.flow(10).await;
    let m = reader.next(WAIT).await.expect("the dead letter");
    assert_eq!(text(&m), "kill me");
}

/// A topic that merely has a tier's name is not used as the tier: the move
/// is refused with FAILED_PRECONDITION and the message stays where it was.
#[tokio::test]
async fn a_normal_topic_with_a_tier_name_is_not_used_as_the_tier() {
    let b = InProcessBroker::start().await;
    let squatter = "persistent://public/default/pay-s-DLQ";
    let mut p = RawProducer::open(&b.url(), squatter, "p").await.unwrap();
    p.send(&["not a dead letter"]).await;
    let mut c = RawConsumer::simple(&b.url(), "pay", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), "pay", "p").await.unwrap();
    p.send(&["poison"]).await;
    let m = c.next(WAIT).await.unwrap();
    c.terminate(m.id.clone().unwrap(), "bad", 1).await;
    let r = c.result(WAIT).await.unwrap();
    assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
    assert!(
        r.message.contains("cannot serve as a DeadLetter tier"),
        "{r:?}"
    );
    // Still in flight here: acking it works, and nothing moved.
    c.ack(vec![m.id.clone().unwrap()], 2).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let stats = AdminClient::new(channel(&b.url()).await)
        .topic_stats(TopicRequest {
            topic: squatter.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.message_count, 1);
}

/// Path-like names are refused, and an error about a huge name quotes a
/// short prefix of it (the whole name in `grpc-message` would break HTTP/2).
#[tokio::test]
async fn path_like_and_huge_names_get_short_invalid_argument() {
    let b = InProcessBroker::start().await;
    let mut admin = AdminClient::new(channel(&b.url()).await);
    let huge = "n".repeat(1 << 20);
    for bad in [
        "..",
        ".",
        "../../x",
        "a/../x",
        ".hidden",
        "a%2Fb",
        huge.as_str(),
    ] {
        let e = admin
            .create_topic(CreateTopicRequest {
                topic: bad.into(),
                replicas: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
        assert!(e.message().len() < 400, "{} bytes", e.message().len());
        let e = RawConsumer::subscribe(&b.url(), "t", bad, SubOpts::default())
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    }
    let topics = admin
        .list_topics(ListTopicsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .topics;
    assert!(topics.is_empty(), "{topics:?}");
}

#[tokio::test]
async fn a_replication_factor_above_one_on_a_standalone_broker_is_refused() {
    let b = InProcessBroker::start().await;
    let mut admin = AdminClient::new(channel(&b.url()).await);
    let create = |topic: &str, replicas| CreateTopicRequest {
        topic: topic.into(),
        replicas,
    };
    let e = admin.create_topic(create("r3", 3)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("standalone"), "{e}");
    let e = admin.create_topic(create("r99", 99)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let topics = admin
        .list_topics(ListTopicsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .topics;
    assert!(topics.is_empty(), "refused creates created {topics:?}");
    // Factor 1, asked for or by default, is today's topic.
    admin.create_topic(create("r1", 1)).await.unwrap();
    admin.create_topic(create("r0", 0)).await.unwrap();
    let topics = admin
        .list_topics(ListTopicsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .topics;
    assert_eq!(topics.len(), 2, "{topics:?}");
}
