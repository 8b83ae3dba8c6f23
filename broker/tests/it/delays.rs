//! Delays the broker serves: a nack whose delay the broker holds survives a
//! crash, and no client-supplied delay can overflow or exceed the broker's
//! `max_delay` (issue #10, item 4): it is refused with INVALID_ARGUMENT
//! naming the limit, and nothing changes.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::{InProcessBroker, now_ms};
use std::time::Duration;
use tonic::Code;

const TOPIC: &str = "persistent://public/default/delays";

#[tokio::test]
async fn a_held_nack_survives_a_crash_and_keeps_its_due_time() {
    let dir = tempfile::tempdir().unwrap();
    let broker = spawn(dir.path()).await;
    let mut c = RawConsumer::simple(broker.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(broker.url(), TOPIC, "p").await.unwrap();
    p.send(&["held"]).await;
    let m = c.next(WAIT).await.unwrap();
    let asked = now_ms();
    c.nack_after(m.id.clone().unwrap(), "come back in 3 s", 3_000, 1)
        .await;
    let r = c.result(WAIT).await.unwrap();
    assert_eq!((r.request_id, r.code), (1, 0), "{r:?}");
    // Confirmed means durable: kill at once, no clean shutdown.
    broker.kill9();

    let broker = spawn(dir.path()).await;
    let mut c = RawConsumer::simple(broker.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let again = c.next(Duration::from_secs(10)).await.expect("redelivered");
    let at = now_ms();
    assert!(
        at >= asked + 3_000,
        "came back {} ms early",
        asked + 3_000 - at
    );
    assert_eq!(again.delivery_count, 1, "the attempt was counted");
    assert_eq!(again.id.unwrap().topic, TOPIC, "in place");
    broker.kill9();
}

#[tokio::test]
async fn delays_beyond_max_delay_are_refused_and_change_nothing() {
    let b = InProcessBroker::start_with(|c| c.max_delay = Duration::from_secs(3600)).await;
    let mut c = RawConsumer::simple(&b.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    p.send(&["m"]).await;
    let m = c.next(WAIT).await.unwrap();
    let id = m.id.clone().unwrap();
    for (rid, delay) in [(1, u64::MAX), (2, 3_600_001)] {
        c.reconsume_later(id.clone(), reconsume_later::Delay::DelayMs(delay), rid)
            .await;
        let r = c.result(WAIT).await.unwrap();
        assert_eq!(
            (r.request_id, r.code),
            (rid, Code::InvalidArgument as i32),
            "{r:?}"
        );
        assert!(r.message.contains("max_delay of 3600000 ms"), "{r:?}");
    }
    c.nack_after(id.clone(), "much later", u64::MAX, 3).await;
    let r = c.result(WAIT).await.unwrap();
    assert_eq!(
        (r.request_id, r.code),
        (3, Code::InvalidArgument as i32),
        "{r:?}"
    );

    // Nothing moved, nothing counted: still in flight, and an hour is fine.
    let stats = AdminClient::new(channel(&b.url()).await)
        .subscription_stats(SubscriptionRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.unacked, stats.scheduled_retries), (1, 0));
    c.reconsume_later(id, reconsume_later::Delay::DelayMs(3_600_000), 4)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    assert!(c.next(QUIET).await.is_none(), "not redelivered at once");

    // A deliver_at past the limit is refused too, and stores nothing.
    let mut late = p.msg("far future");
    late.deliver_at_ms = now_ms() + 2 * 3_600_000;
    match p.send_batch(vec![late]).await {
        produce_response::Response::Error(e) => {
            assert_eq!(e.code, Code::InvalidArgument as i32, "{e:?}");
            assert!(e.message.contains("max_delay"), "{e:?}");
        }
        other => panic!("accepted: {other:?}"),
    }
    let mut wrap = p.msg("wraps");
    wrap.deliver_at_ms = u64::MAX;
    assert!(matches!(
        p.send_batch(vec![wrap]).await,
        produce_response::Response::Error(_)
    ));
    let topic = AdminClient::new(channel(&b.url()).await)
        .topic_stats(TopicRequest {
            topic: TOPIC.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(topic.next_entry_id, 1, "only the first message was stored");
}

fn levels(levels_ms: Vec<u64>, start_level: u32) -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(
            DelayLevelPolicyConfig {
                levels_ms,
                start_level,
                max_reconsume_times: 3,
            },
        )),
        ..Default::default()
    }
}

#[tokio::test]
async fn absurd_or_too_long_policies_are_refused() {
    let b = InProcessBroker::start_with(|c| c.max_delay = Duration::from_secs(3600)).await;
    let subscribe = |policy| {
        let url = b.url();
        async move {
            RawConsumer::subscribe(
                &url,
                TOPIC,
                "s",
                SubOpts {
                    policy: Some(policy),
                    ..Default::default()
                },
            )
            .await
        }
    };
    for (policy, needle) in [
        (levels(vec![1_000, u64::MAX], 1), "365 days"),
        (levels(vec![1_000, 2_000], 3), "past the end"),
        (levels(vec![1_000, 7_200_000], 1), "max_delay of 3600000 ms"),
    ] {
        let err = subscribe(policy).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains(needle), "{err}");
    }
    // Within bounds it is accepted; an operator cannot set a longer one.
    let c = subscribe(levels(vec![1_000, 3_600_000], 1)).await.unwrap();
    let err = AdminClient::new(channel(&b.url()).await)
        .set_policy(SetPolicyRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            policy: Some(levels(vec![86_400_000], 1)),
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("max_delay"), "{err}");
    assert_eq!(
        c.subscribed.dead_letter_policy.unwrap().kind,
        levels(vec![1_000, 3_600_000], 1).kind
    );
}

/// `reconsume_later` with a delay level: only `-1` (dead-letter now), `0`
/// (the policy decides) and a level of the subscription's policy mean
/// something. Others (−7, `i32::MIN`, past the table, any level for a
/// policy without levels) are refused with INVALID_ARGUMENT naming what is
/// valid, and nothing changes: the message stays in flight, not moved, not
/// counted, not dead-lettered.
#[tokio::test]
async fn delay_levels_that_mean_nothing_are_refused_and_change_nothing() {
    let b = InProcessBroker::start().await;
    let backoff = DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::Backoff(
            BackoffPolicyConfig {
                backoff: Some(backoff_policy_config::Backoff::FixedDelayMs(1000)),
                max_redeliver_count: 3,
            },
        )),
        ..Default::default()
    };
    // No policy (RocketMQ's 18 levels apply), three levels, and a backoff.
    let cases: [(&str, Option<DeadLetterPolicyConfig>, &[i32], &str); 3] = [
        ("none", None, &[-7, i32::MIN, -2, 19, i32::MAX], "1 to 18"),
        (
            "levels",
            Some(levels(vec![100, 200, 300], 1)),
            &[4, -3],
            "1 to 3",
        ),
        ("backoff", Some(backoff), &[1, -5], "no delay levels"),
    ];
    let mut p = RawProducer::open(&b.url(), TOPIC, "p").await.unwrap();
    for (sub, policy, bad, says) in cases {
        let opts = SubOpts {
            sub_type: SubscriptionType::Shared,
            policy,
            ..Default::default()
        };
        let mut c = RawConsumer::subscribe(&b.url(), TOPIC, sub, opts)
            .await
            .unwrap();
        c.flow(10).await;
        p.send(&[sub]).await;
        let m = loop {
            let m = c.next(WAIT).await.expect("delivered");
            if text(&m) == sub {
                break m;
            }
            c.ack(vec![m.id.clone().unwrap()], 0).await;
        };
        let id = m.id.clone().unwrap();
        for (rid, level) in bad.iter().enumerate() {
            let rid = rid as u64 + 1;
            c.reconsume_later(id.clone(), reconsume_later::Delay::DelayLevel(*level), rid)
                .await;
            let r = c.result(WAIT).await.unwrap();
            assert_eq!(
                (r.request_id, r.code),
                (rid, Code::InvalidArgument as i32),
                "{sub}: level {level}: {r:?}"
            );
            let named = if *level < -1 {
                "-1 (dead-letter now)"
            } else {
                says
            };
            assert!(
                r.message.contains(&level.to_string()) && r.message.contains(named),
                "{sub}: level {level}: {r:?}"
            );
        }
        let stats = AdminClient::new(channel(&b.url()).await)
            .subscription_stats(SubscriptionRequest {
                topic: TOPIC.into(),
                subscription: sub.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (stats.unacked, stats.scheduled_retries, stats.dead_lettered),
            (1, 0, 0),
            "{sub}: nothing changed"
        );
        // A meaningful level is still taken: -1 dead-letters at once.
        c.reconsume_later(id, reconsume_later::Delay::DelayLevel(-1), 99)
            .await;
        let r = c.result(WAIT).await.unwrap();
        assert_eq!((r.request_id, r.code), (99, 0), "{sub}: {r:?}");
    }
}
