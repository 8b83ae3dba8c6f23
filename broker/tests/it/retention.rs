//! Retention policies against a live broker (in-process, segments of 10
//! entries, enforced every 100 ms): a topic with no subscription is trimmed
//! by size and by age, whole segments at a time; a subscription behind the
//! trimmed point continues from the first kept message with its backlog
//! reduced; dead-letter tiers are never trimmed; a namespace's policy
//! applies to topics created later and a topic's own policy replaces it;
//! a refusing backlog quota answers RESOURCE_EXHAUSTED and stores nothing
//! until subscriptions consume, a dropping one keeps publishing;
//! policies survive a restart; bad input is INVALID_ARGUMENT and changes
//! nothing. Nothing here depends on timing beyond generous polling.

use crate::common;

use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::retention_client::RetentionClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::time::Duration;
use tonic::Code;

const NS: &str = "ret/ns";
const WAIT: Duration = Duration::from_secs(30);

async fn broker_in(dir: tempfile::TempDir) -> InProcessBroker {
    InProcessBroker::start_in(dir, |c| {
        c.segment_entries = 10;
        c.retention_interval = Duration::from_millis(100);
    })
    .await
}

async fn broker() -> InProcessBroker {
    broker_in(tempfile::tempdir().unwrap()).await
}

fn topic(name: &str) -> String {
    format!("persistent://{NS}/{name}")
}

async fn set(
    url: &str,
    namespace: &str,
    topic: &str,
    age: Option<i64>,
    size: Option<i64>,
) -> Result<RetentionResponse, tonic::Status> {
    set_policy(
        url,
        namespace,
        topic,
        RetentionPolicy {
            max_age_ms: age,
            max_size_bytes: size,
            ..Default::default()
        },
    )
    .await
}

async fn set_policy(
    url: &str,
    namespace: &str,
    topic: &str,
    policy: RetentionPolicy,
) -> Result<RetentionResponse, tonic::Status> {
    RetentionClient::new(channel(url).await)
        .set_retention(SetRetentionRequest {
            namespace: namespace.into(),
            topic: topic.into(),
            policy: Some(policy),
        })
        .await
        .map(|r| r.into_inner())
}

fn quota(bytes: i64, action: &str) -> RetentionPolicy {
    RetentionPolicy {
        backlog_quota_bytes: Some(bytes),
        quota_action: action.into(),
        ..Default::default()
    }
}

/// Sends one 100-byte message; its receipt or refusal.
async fn send_one(p: &mut RawProducer, i: u32) -> produce_response::Response {
    let m = p.msg(format!("m{i:<99}"));
    p.send_batch(vec![m]).await
}

async fn get(url: &str, namespace: &str, topic: &str) -> Result<RetentionResponse, tonic::Status> {
    RetentionClient::new(channel(url).await)
        .get_retention(GetRetentionRequest {
            namespace: namespace.into(),
            topic: topic.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn stats(url: &str, topic: &str) -> TopicStatsResponse {
    AdminClient::new(channel(url).await)
        .topic_stats(TopicRequest {
            topic: topic.into(),
        })
        .await
        .expect("topic stats")
        .into_inner()
}

/// Publishes `m<from>..m<to>` with 100-byte payloads (one batch each).
async fn publish(url: &str, topic: &str, range: std::ops::Range<u32>) {
    let mut p = RawProducer::open(url, topic, "").await.unwrap();
    for i in range {
        let payload = format!("m{i:<99}");
        p.send(&[payload.as_str()]).await;
    }
}

/// Polls the topic's first entry id until `ok` holds (or fails after WAIT).
async fn first_entry_becomes(url: &str, topic: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let first = stats(url, topic).await.first_entry_id;
        if ok(first) {
            return first;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "first entry of {topic} stayed at {first}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn label(m: &Message) -> String {
    text(m).trim_end().to_owned()
}

#[tokio::test]
async fn size_limit_drops_whole_oldest_segments_of_a_topic_without_subscriptions() {
    let b = broker().await;
    let url = b.url();
    let t = topic("sized");
    publish(&url, &t, 0..100).await;
    assert_eq!(
        stats(&url, &t).await.first_entry_id,
        0,
        "kept forever by default"
    );
    // Ten segments of ten ~120-byte messages: 2000 bytes keep one segment.
    set(&url, "", &t, None, Some(2000)).await.unwrap();
    let first = first_entry_becomes(&url, &t, |f| f > 0).await;
    assert_eq!(first, 90, "whole segments dropped, the newest kept");
    let s = stats(&url, &t).await;
    assert_eq!((s.next_entry_id, s.message_count), (100, 10));
    // A new subscription from the earliest position starts at the first kept.
    let mut c = RawConsumer::simple(&url, &t, "late", SubscriptionType::Exclusive).await;
    c.flow(100).await;
    let got: Vec<String> = c.take(10, WAIT).await.iter().map(label).collect();
    assert_eq!(got.first().map(String::as_str), Some("m90"));
    assert_eq!(got.last().map(String::as_str), Some("m99"));
}

#[tokio::test]
async fn a_size_limit_is_enforced_when_a_segment_fills_not_only_on_the_timer() {
    // The timer runs once at the start and then not for an hour: only a
    // write starting a new segment can make retention look again.
    let b = InProcessBroker::start_in(tempfile::tempdir().unwrap(), |c| {
        c.segment_entries = 10;
        c.retention_interval = Duration::from_secs(3600);
    })
    .await;
    let url = b.url();
    let t = topic("rolled");
    set(&url, "", &t, None, Some(2000)).await.unwrap();
    publish(&url, &t, 0..100).await;
    // Ten segments of ten ~120-byte messages: when message 90 started
    // the last one, segments 0-7 went (8 and the new 9 fit in 2000 bytes).
    let first = first_entry_becomes(&url, &t, |f| f > 0).await;
    assert!(first >= 80, "dropped only up to {first}");
    assert_eq!(stats(&url, &t).await.next_entry_id, 100);
}

#[tokio::test]
async fn age_limit_from_the_namespace_applies_to_topics_created_later() {
    let b = broker().await;
    let url = b.url();
    set(&url, NS, "", Some(300), None).await.unwrap();
    let t = topic("aged");
    publish(&url, &t, 0..30).await;
    // Segments 0 and 1 expire; the one being written (2) is kept.
    let first = first_entry_becomes(&url, &t, |f| f >= 20).await;
    assert_eq!(first, 20);
    publish(&url, &t, 30..35).await;
    assert_eq!(first_entry_becomes(&url, &t, |f| f >= 30).await, 30);
    // Another namespace is not touched.
    let other = "persistent://ret/other/aged".to_owned();
    publish(&url, &other, 0..30).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(stats(&url, &other).await.first_entry_id, 0);
}

#[tokio::test]
async fn a_topic_policy_replaces_its_namespaces_and_clearing_it_restores_it() {
    let b = broker().await;
    let url = b.url();
    let t = topic("both");
    set(&url, NS, "", Some(3_600_000), None).await.unwrap();
    let r = get(&url, "", &t).await.unwrap();
    assert_eq!(r.policy, None);
    assert_eq!(r.effective_from, NS);
    assert_eq!(r.effective.unwrap().max_age_ms, Some(3_600_000));
    let r = set(&url, "", &t, None, Some(1 << 20)).await.unwrap();
    assert_eq!(r.effective_from, t);
    let e = r.effective.unwrap();
    assert_eq!((e.max_age_ms, e.max_size_bytes), (None, Some(1 << 20)));
    // Clearing the topic's policy: the namespace's applies again.
    let r = set(&url, "", &t, None, None).await.unwrap();
    assert_eq!((r.policy, r.effective_from.as_str()), (None, NS));
    let r = get(&url, NS, "").await.unwrap();
    assert_eq!(r.target, NS);
    assert_eq!(r.policy.unwrap().max_age_ms, Some(3_600_000));
}

#[tokio::test]
async fn a_subscription_behind_the_trimmed_point_continues_from_the_first_kept_message() {
    let b = broker().await;
    let url = b.url();
    let t = topic("behind");
    let mut c = RawConsumer::simple(&url, &t, "s", SubscriptionType::Exclusive).await;
    publish(&url, &t, 0..50).await;
    // Five in flight, not acked, when retention drops them.
    c.flow(5).await;
    let held = c.take(5, WAIT).await;
    assert_eq!(label(&held[0]), "m0");
    assert_eq!(sub_stats(&url, &t, "s").await.backlog, 50);
    set(&url, "", &t, None, Some(2000)).await.unwrap();
    assert_eq!(first_entry_becomes(&url, &t, |f| f > 0).await, 40);
    assert_eq!(
        sub_stats(&url, &t, "s").await.backlog,
        10,
        "dropped ids are no backlog"
    );
    // Acking a dropped message is harmless.
    c.ack(held.iter().filter_map(|m| m.id.clone()).collect(), 1)
        .await;
    let r = c.result(WAIT).await.expect("ack result");
    assert_eq!(r.code, 0, "{r:?}");
    c.flow(100).await;
    let got: Vec<String> = c.take(10, WAIT).await.iter().map(label).collect();
    assert_eq!(got[0], "m40");
    assert_eq!(got[9], "m49");
    assert!(c.next(Duration::from_millis(300)).await.is_none());
}

#[tokio::test]
async fn dead_letter_tiers_are_never_trimmed() {
    let b = broker().await;
    let url = b.url();
    let t = topic("doomed");
    let doomed: Vec<Doomed> = (0..25)
        .map(|_| Doomed {
            payload: &[7u8; 100],
            key: "",
            properties: &[],
            detail: "bad",
        })
        .collect();
    dead_letter_all(&url, &t, "s", &doomed).await;
    assert_eq!(dead_letter_count(&url, &t, "s").await, 25);
    // The whole namespace, the dead-letter tier's too, limited to one byte.
    set(&url, NS, "", Some(1), Some(1)).await.unwrap();
    publish(&url, &t, 0..20).await;
    first_entry_becomes(&url, &t, |f| f >= 40).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(dead_letter_count(&url, &t, "s").await, 25);
    let dlq = stats(&url, &format!("{t}-s-DLQ")).await;
    assert_eq!(dlq.first_entry_id, 0, "{dlq:?}");
}

#[tokio::test]
async fn policies_survive_a_restart() {
    let b = broker().await;
    let url = b.url();
    let t = topic("kept");
    set(&url, NS, "", Some(60_000), None).await.unwrap();
    set_policy(
        &url,
        "",
        &t,
        RetentionPolicy {
            max_age_ms: Some(5_000),
            max_size_bytes: Some(4096),
            backlog_quota_bytes: Some(2048),
            quota_action: "drop_oldest".into(),
        },
    )
    .await
    .unwrap();
    let dir = b.shutdown().await;
    let b = broker_in(dir).await;
    let url = b.url();
    let ns = get(&url, NS, "").await.unwrap().policy.unwrap();
    assert_eq!((ns.max_age_ms, ns.max_size_bytes), (Some(60_000), None));
    let own = get(&url, "", &t).await.unwrap().policy.unwrap();
    assert_eq!(
        (own.max_age_ms, own.max_size_bytes),
        (Some(5_000), Some(4096))
    );
    assert_eq!(
        (own.backlog_quota_bytes, own.quota_action.as_str()),
        (Some(2048), "drop_oldest")
    );
}

#[tokio::test]
async fn bad_input_is_invalid_argument_and_changes_nothing() {
    let b = broker().await;
    let url = b.url();
    let t = topic("bad");
    type Case<'a> = (&'a str, &'a str, Option<i64>, Option<i64>, &'a str);
    let cases: Vec<Case> = vec![
        ("", &t, Some(-1), None, "max_age_ms must be positive"),
        ("", &t, Some(0), None, "max_age_ms must be positive"),
        ("", &t, None, Some(-5), "max_size_bytes must be positive"),
        (NS, "", None, Some(0), "max_size_bytes must be positive"),
        (NS, &t, Some(1), None, "exactly one"),
        ("", "", Some(1), None, "exactly one"),
        ("nope", "", Some(1), None, "invalid namespace"),
        ("a/b/c", "", Some(1), None, "invalid namespace"),
        ("", "http://x/y/z", Some(1), None, ""),
    ];
    for (ns, topic, age, size, why) in cases {
        let e = set(&url, ns, topic, age, size).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{ns} {topic}: {e:?}");
        assert!(e.message().contains(why), "{ns} {topic}: {e:?}");
    }
    assert_eq!(get(&url, "", &t).await.unwrap().policy, None);
    assert_eq!(get(&url, NS, "").await.unwrap().policy, None);
    let e = get(&url, "", "").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_refusing_backlog_quota_answers_resource_exhausted_and_stores_nothing() {
    let b = broker().await;
    let url = b.url();
    let t = topic("quota");
    let mut c = RawConsumer::simple(&url, &t, "s", SubscriptionType::Exclusive).await;
    let r = set_policy(&url, "", &t, quota(2000, "refuse"))
        .await
        .unwrap();
    assert_eq!(r.policy.unwrap().quota_action, "refuse");
    let mut p = RawProducer::open(&url, &t, "").await.unwrap();
    let mut accepted = 0;
    let refusal = loop {
        match send_one(&mut p, accepted).await {
            produce_response::Response::Receipts(_) => accepted += 1,
            produce_response::Response::Error(e) => break e,
            other => panic!("{other:?}"),
        }
        assert!(accepted < 100, "never refused");
    };
    assert_eq!(refusal.code, Code::ResourceExhausted as i32, "{refusal:?}");
    assert!(refusal.message.contains("backlog quota"), "{refusal:?}");
    assert!(
        (10..=20).contains(&accepted),
        "~130 B each under 2000 B: {accepted}"
    );
    let next = stats(&url, &t).await.next_entry_id;
    assert_eq!(
        next,
        u64::from(accepted),
        "the refused batch stored nothing"
    );
    match send_one(&mut p, 1000).await {
        produce_response::Response::Error(e) => assert_eq!(e.code, Code::ResourceExhausted as i32),
        other => panic!("still over the quota: {other:?}"),
    }
    assert_eq!(stats(&url, &t).await.next_entry_id, next);
    // Consuming frees the backlog (consumed segments are dropped): publishes pass again.
    c.flow(100).await;
    let got = c.take(accepted as usize, WAIT).await;
    c.ack_cumulative(got.last().unwrap().id.clone().unwrap(), 1)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match send_one(&mut p, 2000).await {
            produce_response::Response::Receipts(_) => break,
            produce_response::Response::Error(e) => {
                assert_eq!(e.code, Code::ResourceExhausted as i32, "{e:?}");
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still refused: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_drop_oldest_backlog_quota_keeps_publishing() {
    let b = broker().await;
    let url = b.url();
    let t = topic("dropping");
    set_policy(&url, NS, "", quota(2000, "drop_oldest"))
        .await
        .unwrap();
    let mut p = RawProducer::open(&url, &t, "").await.unwrap();
    for i in 0..100 {
        match send_one(&mut p, i).await {
            produce_response::Response::Receipts(_) => {}
            other => panic!("message {i}: {other:?}"),
        }
    }
    assert_eq!(first_entry_becomes(&url, &t, |f| f >= 90).await, 90);
}

#[tokio::test]
async fn bad_quotas_are_invalid_argument() {
    let b = broker().await;
    let url = b.url();
    let t = topic("badquota");
    for (policy, why) in [
        (quota(1000, "explode"), "unknown quota_action"),
        (quota(0, "refuse"), "backlog_quota_bytes must be positive"),
        (
            quota(-1, "drop_oldest"),
            "backlog_quota_bytes must be positive",
        ),
        (
            RetentionPolicy {
                quota_action: "drop_oldest".into(),
                ..Default::default()
            },
            "needs backlog_quota_bytes",
        ),
    ] {
        let e = set_policy(&url, "", &t, policy).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(why), "{e:?}");
    }
    assert_eq!(get(&url, "", &t).await.unwrap().policy, None);
}

/// A producer that resends in order (`ProducerOpen.resend_in_order`): once
/// a batch is refused for the quota, nothing later on that stream is
/// stored, even with the quota gone, so the resent batch is not dropped as
/// a duplicate of a later one; the stream ends. On a new stream the
/// refused batch is stored, with its sequence id, in order.
#[tokio::test]
async fn a_refused_batch_ends_an_in_order_producer_stream_and_nothing_behind_it_is_stored() {
    let b = broker().await;
    let url = b.url();
    let t = topic("in-order");
    let mut p = RawProducer::open_with(&url, &t, "p", true).await.unwrap();
    for i in 0..3 {
        assert!(matches!(
            send_one(&mut p, i).await,
            produce_response::Response::Receipts(_)
        ));
    }
    set_policy(&url, "", &t, quota(1, "refuse")).await.unwrap();
    let refused = p.msg("m3");
    match p.send_batch(vec![refused.clone()]).await {
        produce_response::Response::Error(e) => {
            assert_eq!(e.code, Code::ResourceExhausted as i32, "{e:?}")
        }
        other => panic!("{other:?}"),
    }
    set_policy(&url, "", &t, RetentionPolicy::default())
        .await
        .unwrap();
    // Sent behind the refused batch on the same stream: not stored.
    let behind = p.msg("m4");
    let r = p.send_batch_result(vec![behind.clone()]).await;
    assert!(r.is_err(), "the stream ends after the refusal: {r:?}");
    assert_eq!(stats(&url, &t).await.next_entry_id, 3);
    // The resend, in order, on a new stream.
    let mut again = RawProducer::open_with(&url, &t, "p", true).await.unwrap();
    assert_eq!(again.last_sequence_id, Some(2));
    match again.send_batch(vec![refused, behind]).await {
        produce_response::Response::Receipts(r) => {
            let ids: Vec<_> = r
                .receipts
                .iter()
                .map(|r| (r.sequence_id, r.message_id.as_ref().map(|m| m.entry_id)))
                .collect();
            assert_eq!(ids, [(3, Some(3)), (4, Some(4))]);
        }
        other => panic!("{other:?}"),
    }
}

/// A batch refused for its content does not end an in-order stream.
#[tokio::test]
async fn an_invalid_batch_does_not_end_an_in_order_producer_stream() {
    let b = broker().await;
    let url = b.url();
    let t = topic("in-order-invalid");
    let mut p = RawProducer::open_with(&url, &t, "p", true).await.unwrap();
    let mut far = p.msg("far");
    far.deliver_at_ms = u64::MAX;
    match p.send_batch(vec![far]).await {
        produce_response::Response::Error(e) => {
            assert_eq!(e.code, Code::InvalidArgument as i32, "{e:?}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        send_one(&mut p, 1).await,
        produce_response::Response::Receipts(_)
    ));
}
