//! Numbers at their extremes and policies that cannot work: `u64::MAX`
//! ids, times and sequence ids, `u32::MAX` limits and rates, NaN and
//! infinite multipliers, level tables out of range. Each is refused with its
//! exact status or handled without harm; none panics the broker.

use super::common::*;
use super::support::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use tonic::Code;

fn delay_levels(c: DelayLevelPolicyConfig) -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(c)),
        ..Default::default()
    }
}

fn multiplier(m: MultiplierBackoff) -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::Backoff(
            BackoffPolicyConfig {
                backoff: Some(backoff_policy_config::Backoff::Multiplier(m)),
                max_redeliver_count: 3,
            },
        )),
        ..Default::default()
    }
}

fn sane() -> MultiplierBackoff {
    MultiplierBackoff {
        min_delay_ms: 10,
        max_delay_ms: 1000,
        multiplier: 2.0,
        jitter: 0.0,
    }
}

/// Policies that cannot work, on SetPolicy and on Subscribe: refused
/// INVALID_ARGUMENT, the policy in force unchanged. (A start level past the
/// table is not among them: it means "always the last level", as RocketMQ
/// clamps.)
#[tokio::test]
async fn policies_that_cannot_work() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    let _c = RawConsumer::simple(&url, "pol", "s", SubscriptionType::Shared).await;
    let mut admin = AdminClient::new(channel(&url).await);
    let cases: Vec<(&str, DeadLetterPolicyConfig)> = vec![
        (
            "NaN multiplier",
            multiplier(MultiplierBackoff {
                multiplier: f64::NAN,
                ..sane()
            }),
        ),
        (
            "infinite multiplier",
            multiplier(MultiplierBackoff {
                multiplier: f64::INFINITY,
                ..sane()
            }),
        ),
        (
            "negative multiplier",
            multiplier(MultiplierBackoff {
                multiplier: -2.0,
                ..sane()
            }),
        ),
        (
            "jitter above 1",
            multiplier(MultiplierBackoff {
                jitter: 1.5,
                ..sane()
            }),
        ),
        (
            "NaN jitter",
            multiplier(MultiplierBackoff {
                jitter: f64::NAN,
                ..sane()
            }),
        ),
        (
            "min above max",
            multiplier(MultiplierBackoff {
                min_delay_ms: 5000,
                max_delay_ms: 10,
                ..sane()
            }),
        ),
        (
            "a level of 0 ms",
            delay_levels(DelayLevelPolicyConfig {
                levels_ms: vec![0],
                start_level: 1,
                max_reconsume_times: 3,
            }),
        ),
        (
            "unregistered named policy",
            DeadLetterPolicyConfig {
                key_order: None,
                kind: Some(dead_letter_policy_config::Kind::Named(NamedPolicyConfig {
                    name: "n".repeat(1 << 20),
                    params: "{".into(),
                })),
                ..Default::default()
            },
        ),
    ];
    for (what, policy) in cases {
        unchanged(&url, what, async {
            let e = admin
                .set_policy(SetPolicyRequest {
                    topic: "pol".into(),
                    subscription: "s".into(),
                    policy: Some(policy.clone()),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
            assert!(
                e.message().len() < 1100,
                "{what}: {} bytes",
                e.message().len()
            );
            let opts = SubOpts {
                sub_type: SubscriptionType::Shared,
                policy: Some(policy),
                ..Default::default()
            };
            let e = RawConsumer::subscribe(&url, "pol", "s", opts)
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
        })
        .await;
    }
}

/// Extreme numbers in admin requests: answered, nothing changed.
#[tokio::test]
async fn extreme_numbers_in_admin_requests() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    let mut c = RawConsumer::simple(&url, "nums", "s", SubscriptionType::Shared).await;
    c.flow(1).await;
    let mut p = RawProducer::open(&url, "nums", "p").await.unwrap();
    p.send(&["poison"]).await;
    let m = c.next(WAIT).await.unwrap();
    c.terminate(m.id.unwrap(), "poison", 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let mut admin = AdminClient::new(channel(&url).await);
    let filter = |since_ms, until_ms| {
        Some(DeadLetterFilter {
            entry_ids: vec![u64::MAX, 0],
            reason_contains: String::new(),
            since_ms,
            until_ms,
        })
    };
    unchanged(&url, "extreme admin numbers", async {
        let e = admin
            .get_message(GetMessageRequest {
                id: Some(MessageId {
                    topic: "nums".into(),
                    entry_id: u64::MAX,
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e}");
        let listed = admin
            .list_dead_letters(ListDeadLettersRequest {
                topic: "nums".into(),
                subscription: "s".into(),
                filter: filter(0, 0),
                limit: u32::MAX,
                after_entry_id: None,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.total, 1);
        let listed = admin
            .list_dead_letters(ListDeadLettersRequest {
                topic: "nums".into(),
                subscription: "s".into(),
                filter: None,
                limit: 10,
                after_entry_id: Some(u64::MAX),
            })
            .await
            .unwrap()
            .into_inner();
        // Nothing on a page past the end; the total is still every match.
        assert!(listed.dead_letters.is_empty());
        assert_eq!(listed.total, 1);
        // An empty window (since after until) matches nothing: replay and
        // purge do nothing at any rate.
        let replayed = admin
            .replay_dead_letters(ReplayDeadLettersRequest {
                topic: "nums".into(),
                subscription: "s".into(),
                filter: filter(u64::MAX, 1),
                reset_delivery_count: Some(true),
                rate_per_second: u32::MAX,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(replayed.replayed, 0);
        let purged = admin
            .purge_dead_letters(PurgeDeadLettersRequest {
                topic: "nums".into(),
                subscription: "s".into(),
                filter: filter(u64::MAX, 1),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(purged.purged, 0);
    })
    .await;
}

/// Extreme numbers on the data plane: sequence ids, times, delays and
/// levels at their limits are stored or refused, never a crash.
#[tokio::test]
async fn extreme_numbers_on_the_data_plane() {
    let b = InProcessBroker::start().await;
    let url = b.url();
    let mut p = RawProducer::open(&url, "ext", "p").await.unwrap();
    // A sequence id of u64::MAX is stored, and the producer's next open
    // says so.
    let top = OutboundMessage {
        payload: b"top".to_vec(),
        sequence_id: u64::MAX,
        event_time_ms: u64::MAX,
        ..Default::default()
    };
    p.send_messages(vec![top]).await;
    let again = RawProducer::open(&url, "ext", "p").await.unwrap();
    assert_eq!(again.last_sequence_id, Some(u64::MAX));
    unchanged(&url, "a resend below u64::MAX is a duplicate", async {
        let mut p = RawProducer::open(&url, "ext", "p").await.unwrap();
        let dup = OutboundMessage {
            payload: b"dup".to_vec(),
            sequence_id: 5,
            ..Default::default()
        };
        match p.send_batch(vec![dup]).await {
            produce_response::Response::Receipts(r) => assert!(r.receipts[0].duplicate),
            other => panic!("{other:?}"),
        }
    })
    .await;

    let mut c = RawConsumer::simple(&url, "ext", "s", SubscriptionType::Shared).await;
    c.flow(u32::MAX).await;
    let mut p = RawProducer::open(&url, "ext", "other").await.unwrap();
    p.send(&["a", "b", "c"]).await;
    let got = c.take(4, WAIT).await;
    // Delay levels far outside the table, both ways, and the largest delay:
    // all refused (only -1, 0 and the table's levels mean something; a
    // delay past the broker's max_delay is refused too).
    let delays = [
        (
            reconsume_later::Delay::DelayLevel(i32::MAX),
            Code::InvalidArgument,
        ),
        (
            reconsume_later::Delay::DelayLevel(i32::MIN),
            Code::InvalidArgument,
        ),
        (
            reconsume_later::Delay::DelayMs(u64::MAX),
            Code::InvalidArgument,
        ),
    ];
    for (i, (m, (d, code))) in got.iter().skip(1).zip(delays).enumerate() {
        let rid = 10 + i as u64;
        c.reconsume_later(m.id.clone().unwrap(), d, rid).await;
        let r = c.result(WAIT).await.expect("an answer");
        assert_eq!((r.request_id, r.code), (rid, code as i32), "{d:?}: {r:?}");
    }
    // A nack hold past max_delay, in ms or in µs (the field that wins when
    // set), is refused the same way.
    for (rid, delay_ms, delay_us) in [(20, u64::MAX, 0), (21, 0, u64::MAX), (22, 1, u64::MAX)] {
        c.request(consume_request::Request::Redeliver(Redeliver {
            request_id: rid,
            messages: vec![FailedDelivery {
                id: got[0].id.clone(),
                reason: FailureReason::Nack as i32,
                delay_ms,
                delay_us,
                ..Default::default()
            }],
        }))
        .await;
        let r = c.result(WAIT).await.expect("an answer");
        assert_eq!(
            (r.request_id, r.code),
            (rid, Code::InvalidArgument as i32),
            "delay_ms {delay_ms}, delay_us {delay_us}: {r:?}"
        );
    }
    let stats = AdminClient::new(channel(&url).await)
        .subscription_stats(SubscriptionRequest {
            topic: "ext".into(),
            subscription: "s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    // Every refusal left its message in flight: nothing moved.
    assert_eq!(stats.dead_lettered, 0);
    assert_eq!(stats.scheduled_retries, 0, "{stats:?}");
    assert_eq!(stats.unacked, 4, "{stats:?}");
    assert_serving(&url).await;
}
