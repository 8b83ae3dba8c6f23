//! The retry and dead-letter tiers end to end: RocketMQ and Pulsar
//! walk-throughs at a compressed time scale, delayed delivery on every
//! subscription type, broker-side decisions with no consumer alive, and DLQ
//! replay.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::{InProcessBroker, now_ms};
use std::time::{Duration, Instant};

fn ms_levels() -> DeadLetterPolicyConfig {
    // RocketMQ's 18-level shape, in milliseconds: level k = 10·k ms.
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(
            DelayLevelPolicyConfig {
                levels_ms: (1..=18).map(|k| 10 * k).collect(),
                start_level: 3,
                max_reconsume_times: 16,
            },
        )),
        ..Default::default()
    }
}

fn multiplier(max_redeliver_count: u32) -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::Backoff(
            BackoffPolicyConfig {
                backoff: Some(backoff_policy_config::Backoff::Multiplier(
                    MultiplierBackoff {
                        min_delay_ms: 20,
                        max_delay_ms: 200,
                        multiplier: 2.0,
                        jitter: 0.0,
                    },
                )),
                max_redeliver_count,
            },
        )),
        ..Default::default()
    }
}

async fn admin(url: &str) -> AdminClient<tonic::transport::Channel> {
    AdminClient::new(channel(url).await)
}

async fn dead_letters(url: &str, topic: &str, sub: &str) -> Vec<DeadLetter> {
    admin(url)
        .await
        .list_dead_letters(ListDeadLettersRequest {
            topic: topic.into(),
            subscription: sub.into(),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters
}

#[tokio::test]
async fn rocketmq_walkthrough_sixteen_retries_on_the_level_table_then_dlq() {
    let b = InProcessBroker::start().await;
    let opts = SubOpts {
        sub_type: SubscriptionType::Shared,
        policy: Some(ms_levels()),
        ..Default::default()
    };
    let mut c = RawConsumer::subscribe(&b.url(), "rmq", "group", opts)
        .await
        .unwrap();
    assert!(c.subscribed.retry_topic.ends_with("rmq-group-RETRY"));
    c.flow(1000).await;
    let mut p = RawProducer::open(&b.url(), "rmq", "p").await.unwrap();
    p.send(&["order-42"]).await;

    let mut m = c.next(WAIT).await.unwrap();
    assert_eq!(m.delivery_count, 0);
    for attempt in 1..=16u32 {
        let failed_at = Instant::now();
        c.reconsume_later(
            m.id.clone().unwrap(),
            reconsume_later::Delay::DelayLevel(0),
            100 + u64::from(attempt),
        )
        .await;
        m = c
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("attempt {attempt} never redelivered"));
        let waited = failed_at.elapsed();
        let level = (2 + attempt).min(18);
        let delay = Duration::from_millis(10 * u64::from(level));
        assert!(
            waited >= delay,
            "attempt {attempt}: redelivered after {waited:?}, before its {delay:?}"
        );
        assert!(
            waited < delay + Duration::from_millis(500),
            "attempt {attempt}: {waited:?} for {delay:?}"
        );
        assert_eq!(m.delivery_count, attempt);
        assert!(m.id.as_ref().unwrap().topic.ends_with("-RETRY"));
        assert_eq!(
            m.properties.get("RECONSUMETIMES").map(String::as_str),
            Some(attempt.to_string().as_str())
        );
        assert_eq!(
            m.properties.get("REAL_TOPIC").map(String::as_str),
            Some("persistent://public/default/rmq")
        );
        assert_eq!(
            m.properties.get("ORIGIN_MESSAGE_ID").map(String::as_str),
            Some("persistent://public/default/rmq:0")
        );
        assert_eq!(text(&m), "order-42");
    }
    // The 17th failure exhausts 16 retries.
    c.reconsume_later(
        m.id.clone().unwrap(),
        reconsume_later::Delay::DelayLevel(0),
        999,
    )
    .await;
    assert!(
        c.next(Duration::from_millis(500)).await.is_none(),
        "no more deliveries"
    );
    let dl = dead_letters(&b.url(), "rmq", "group").await;
    assert_eq!(dl.len(), 1);
    let d = &dl[0];
    assert_eq!(text(d.message.as_ref().unwrap()), "order-42");
    assert_eq!(d.origin.as_ref().unwrap().entry_id, 0);
    assert_eq!(
        d.attempts.len(),
        17,
        "16 retries plus the failure that exhausted them"
    );
    assert!(
        d.attempts
            .windows(2)
            .all(|w| w[0].delivery_count < w[1].delivery_count)
    );
    let stats = admin(&b.url())
        .await
        .subscription_stats(SubscriptionRequest {
            topic: "rmq".into(),
            subscription: "group".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (stats.backlog, stats.scheduled_retries, stats.dead_lettered),
        (0, 0, 1)
    );
}

#[tokio::test]
async fn pulsar_walkthrough_three_redeliveries_then_dlq() {
    let b = InProcessBroker::start().await;
    let opts = SubOpts {
        sub_type: SubscriptionType::Exclusive,
        policy: Some(multiplier(3)),
        ..Default::default()
    };
    let mut c = RawConsumer::subscribe(&b.url(), "pls", "s", opts)
        .await
        .unwrap();
    c.flow(100).await;
    let mut p = RawProducer::open(&b.url(), "pls", "p").await.unwrap();
    p.send(&["payment"]).await;
    let mut counts = Vec::new();
    let mut m = c.next(WAIT).await.unwrap();
    loop {
        counts.push(m.delivery_count);
        // The client served the backoff already; the broker redelivers in place.
        c.nack(
            m.id.clone().unwrap(),
            &format!("declined #{}", m.delivery_count),
            0,
        )
        .await;
        match c.next(Duration::from_millis(700)).await {
            Some(next) => {
                assert_eq!(next.id, m.id, "nack redelivers the same message in place");
                m = next;
            }
            None => break,
        }
    }
    assert_eq!(counts, vec![0, 1, 2, 3], "3 redeliveries, then the DLQ");
    let dl = dead_letters(&b.url(), "pls", "s").await;
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].attempts.len(), 4);
    assert_eq!(dl[0].attempts[3].detail, "declined #3");
    assert!(dl[0].reason.contains('3') || !dl[0].reason.is_empty());
}

#[tokio::test]
async fn retries_fire_and_policies_exhaust_with_no_consumer_connected() {
    let b = InProcessBroker::start().await;
    let opts = || SubOpts {
        sub_type: SubscriptionType::Shared,
        policy: Some(multiplier(1)),
        ..Default::default()
    };
    let mut p = RawProducer::open(&b.url(), "alone", "p").await.unwrap();
    p.send(&["later", "doomed"]).await;
    let mut c = RawConsumer::subscribe(&b.url(), "alone", "s", opts())
        .await
        .unwrap();
    c.flow(2).await;
    let got = c.take(2, WAIT).await;
    let asked = now_ms();
    c.reconsume_later(
        got[0].id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(400),
        1,
    )
    .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    // "doomed" is lost with its consumer twice: the broker alone dead-letters it.
    drop(c);
    tokio::time::sleep(QUIET).await;
    let mut c = RawConsumer::subscribe(&b.url(), "alone", "s", opts())
        .await
        .unwrap();
    c.flow(1).await;
    let m = c.next(WAIT).await.unwrap();
    assert_eq!((text(&m).as_str(), m.delivery_count), ("doomed", 1));
    drop(c);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let dl = dead_letters(&b.url(), "alone", "s").await;
    assert_eq!(dl.len(), 1, "dead-lettered with no consumer alive");
    assert_eq!(text(dl[0].message.as_ref().unwrap()), "doomed");
    assert_eq!(
        dl[0].attempts.last().unwrap().reason,
        FailureReason::ConsumerLost as i32
    );
    // The retry fired on schedule while nobody was connected: a new consumer gets it at once.
    let stats = admin(&b.url())
        .await
        .subscription_stats(SubscriptionRequest {
            topic: "alone".into(),
            subscription: "s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stats.scheduled_retries, 1,
        "fired but not yet acked: still in the retry tier"
    );
    let mut c = RawConsumer::subscribe(&b.url(), "alone", "s", opts())
        .await
        .unwrap();
    c.flow(10).await;
    let t0 = Instant::now();
    let m = c.next(WAIT).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(300),
        "already due: {:?}",
        t0.elapsed()
    );
    assert_eq!(text(&m), "later");
    assert!(now_ms() >= asked + 400);
    c.ack(vec![m.id.clone().unwrap()], 9).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
}

#[tokio::test]
async fn delayed_delivery_works_on_every_subscription_type() {
    let b = InProcessBroker::start().await;
    for (i, t) in [
        SubscriptionType::Exclusive,
        SubscriptionType::Failover,
        SubscriptionType::Shared,
        SubscriptionType::KeyShared,
    ]
    .into_iter()
    .enumerate()
    {
        let topic = format!("delayed-{i}");
        let mut c = RawConsumer::simple(&b.url(), &topic, "s", t).await;
        c.flow(10).await;
        let mut p = RawProducer::open(&b.url(), &topic, "p").await.unwrap();
        // A second: the undelayed message's dispatch must come first even
        // on a loaded machine (it failed once at 300 ms under load 10).
        let due = now_ms() + 1000;
        let mut late = p.msg("late");
        late.deliver_at_ms = due;
        late.key = "k".into();
        let mut now = p.msg("now");
        now.key = "k2".into();
        p.send_messages(vec![late, now]).await;
        let first = c.next(WAIT).await.unwrap();
        assert_eq!(
            text(&first),
            "now",
            "{t:?}: the undelayed message is not held back"
        );
        let second = c.next(WAIT).await.unwrap();
        let at = now_ms();
        assert_eq!(text(&second), "late");
        assert!(at >= due, "{t:?}: delivered {} ms early", due - at);
        assert!(at < due + 2000, "{t:?}: {} ms late", at - due);
    }
}

#[tokio::test]
async fn terminated_message_replays_from_the_dlq_onto_the_topic_when_asked() {
    let b = InProcessBroker::start().await;
    let mut c = RawConsumer::simple(&b.url(), "replay", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), "replay", "p").await.unwrap();
    p.send(&["poison"]).await;
    let m = c.next(WAIT).await.unwrap();
    c.terminate(m.id.clone().unwrap(), "schema mismatch", 4)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let dl = dead_letters(&b.url(), "replay", "s").await;
    assert_eq!(dl.len(), 1);
    assert!(dl[0].attempts[0].detail.contains("schema mismatch"));
    assert!(c.next(QUIET).await.is_none());

    let mut a = admin(&b.url()).await;
    let r = a
        .replay_dead_letters(ReplayDeadLettersRequest {
            topic: "replay".into(),
            subscription: "s".into(),
            reset_delivery_count: Some(false),
            mode: ReplayMode::Topic as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replayed, 1);
    let again = c
        .next(WAIT)
        .await
        .expect("replayed message delivered again");
    assert_eq!(text(&again), "poison");
    assert_eq!(
        again.id.as_ref().unwrap().topic,
        "persistent://public/default/replay"
    );
    assert_eq!(again.delivery_count, 1, "count kept");
    assert!(dead_letters(&b.url(), "replay", "s").await.is_empty());

    // Dead-letter it again and replay with the count reset: a fresh start.
    c.terminate(again.id.clone().unwrap(), "still broken", 5)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    a.replay_dead_letters(ReplayDeadLettersRequest {
        topic: "replay".into(),
        subscription: "s".into(),
        reset_delivery_count: Some(true),
        mode: ReplayMode::Topic as i32,
        ..Default::default()
    })
    .await
    .unwrap();
    let fresh = c.next(WAIT).await.expect("replayed again");
    assert_eq!(fresh.delivery_count, 0, "count reset");
    assert!(!fresh.properties.contains_key("RECONSUMETIMES"));
    assert_eq!(
        fresh
            .properties
            .get("ORIGIN_MESSAGE_ID")
            .map(String::as_str),
        Some("persistent://public/default/replay:0"),
        "provenance kept"
    );
}

/// `reconsume_later` requests that arrive together are moved in one
/// transaction; each still gets its own answer, a repeated id gets the error
/// it would get one request at a time, and every message is retried once.
#[tokio::test]
async fn a_burst_of_reconsume_later_moves_each_message_once() {
    let b = InProcessBroker::start().await;
    let mut c = RawConsumer::simple(&b.url(), "burst", "s", SubscriptionType::Shared).await;
    c.flow(1000).await;
    let mut p = RawProducer::open(&b.url(), "burst", "p").await.unwrap();
    let texts: Vec<String> = (0..200).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    p.send(&refs).await;
    let got = c.take(200, WAIT).await;
    // Back to back, without waiting for answers; the first id twice.
    for (i, m) in got.iter().enumerate() {
        c.reconsume_later(
            m.id.clone().unwrap(),
            reconsume_later::Delay::DelayMs(100),
            i as u64 + 1,
        )
        .await;
    }
    c.reconsume_later(
        got[0].id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(100),
        1_000,
    )
    .await;
    let mut ok = 0;
    let mut refused = Vec::new();
    for _ in 0..201 {
        let r = c.result(WAIT).await.expect("an answer per request");
        if r.code == 0 {
            ok += 1;
        } else {
            refused.push(r);
        }
    }
    assert_eq!(ok, 200);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].request_id, 1_000);
    assert_eq!(refused[0].code, tonic::Code::InvalidArgument as i32);
    let again = c.take(200, WAIT).await;
    let mut seen: Vec<String> = again.iter().map(text).collect();
    seen.sort();
    let mut want = texts.clone();
    want.sort();
    assert_eq!(seen, want, "each message comes back once");
    for m in &again {
        assert!(m.id.as_ref().unwrap().topic.ends_with("-RETRY"));
        assert_eq!(m.delivery_count, 1);
    }
    assert!(c.next(Duration::from_millis(300)).await.is_none());
}

/// Tier names a subscribing client chooses (Pulsar's `retryLetterTopic` and
/// `deadLetterTopic`) are where its retries and dead letters go, across a
/// restart; a producer cannot write to them, a dead-letter reader can wait
/// on one before the first dead letter, and the choice is fixed once the
/// subscription exists.
#[tokio::test]
async fn tier_names_chosen_at_subscription_are_honoured() {
    let b = InProcessBroker::start().await;
    let retry = "persistent://ops/tiers/orders-retries";
    let dlq = "persistent://ops/tiers/orders-poison";
    let policy = DeadLetterPolicyConfig {
        retry_topic: retry.into(),
        dead_letter_topic: dlq.into(),
        ..ms_levels()
    };
    let opts = |policy: DeadLetterPolicyConfig| SubOpts {
        sub_type: SubscriptionType::Shared,
        policy: Some(policy),
        ..Default::default()
    };
    let mut c = RawConsumer::subscribe(&b.url(), "orders", "billing", opts(policy.clone()))
        .await
        .unwrap();
    assert_eq!(c.subscribed.retry_topic, retry);
    assert_eq!(c.subscribed.dead_letter_topic, dlq);
    // A dead-letter reader may subscribe before anything is dead-lettered.
    let reader_opts = SubOpts {
        dead_letter_reader: true,
        ..Default::default()
    };
    let mut reader = RawConsumer::subscribe(&b.url(), dlq, "ops", reader_opts)
        .await
        .expect("the chosen DLQ is a dead-letter tier");
    reader.flow(10).await;
    // Producers are refused on both.
    for tier in [retry, dlq] {
        let e = RawProducer::open(&b.url(), tier, "p").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{tier}: {e}");
    }

    c.flow(10).await;
    let mut p = RawProducer::open(&b.url(), "orders", "p").await.unwrap();
    p.send(&["retry me", "kill me"]).await;
    let got = c.take(2, WAIT).await;
    c.reconsume_later(
        got[0].id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(20),
        1,
    )
    .await;
    c.terminate(got[1].id.clone().unwrap(), "poison", 2).await;
    for _ in 0..2 {
        assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    }
    let again = c.next(WAIT).await.expect("the retry");
    assert_eq!(again.id.as_ref().unwrap().topic, retry);
    assert_eq!(text(&again), "retry me");
    let dead = reader.next(WAIT).await.expect("the dead letter");
    assert_eq!(text(&dead), "kill me");
    assert_eq!(dead.id.as_ref().unwrap().topic, dlq);

    // Fixed once created: a different name is refused, the same is fine.
    let other = DeadLetterPolicyConfig {
        dead_letter_topic: "persistent://ops/tiers/elsewhere".into(),
        ..policy.clone()
    };
    let e = RawConsumer::subscribe(&b.url(), "orders", "billing", opts(other.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    let mut admin = AdminClient::new(channel(&b.url()).await);
    let e = admin
        .set_policy(SetPolicyRequest {
            topic: "orders".into(),
            subscription: "billing".into(),
            policy: Some(other),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    let read_back = admin
        .get_policy(SubscriptionRequest {
            topic: "orders".into(),
            subscription: "billing".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .policy
        .unwrap();
    admin
        .set_policy(SetPolicyRequest {
            topic: "orders".into(),
            subscription: "billing".into(),
            policy: Some(read_back),
        })
        .await
        .expect("the policy as read back, tiers included, can be set again");
    drop((c, reader));

    // Across a restart.
    let dir = b.shutdown().await;
    let b = InProcessBroker::start_in(dir, |_| {}).await;
    let c = RawConsumer::subscribe(&b.url(), "orders", "billing", opts(policy))
        .await
        .unwrap();
    assert_eq!(c.subscribed.dead_letter_topic, dlq);
    let stats = AdminClient::new(channel(&b.url()).await)
        .subscription_stats(SubscriptionRequest {
            topic: "orders".into(),
            subscription: "billing".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (stats.retry_topic.as_str(), stats.dead_letter_topic.as_str()),
        (retry, dlq)
    );
    assert_eq!(stats.dead_lettered, 1);
}
