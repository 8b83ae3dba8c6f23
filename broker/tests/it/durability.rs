//! Crash tests: the broker runs as a child process and is killed with SIGKILL
//! (no clean shutdown, no final flush), then restarted on the same directory.

use crate::common;
use common::*;
use ricochet_proto::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[tokio::test]
async fn acknowledged_publishes_and_cursors_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let broker = spawn(dir.path()).await;
    let url = broker.url();

    let mut p = RawProducer::open(url, "durable", "p").await.unwrap();
    let mut expected = Vec::new();
    for batch in 0..20 {
        let payloads: Vec<String> = (0..50).map(|i| format!("{batch}-{i}")).collect();
        let refs: Vec<&str> = payloads.iter().map(|s| s.as_str()).collect();
        p.send(&refs).await;
        expected.extend(payloads);
    }
    // Consume and ack the first 100 (acks awaited: durable), fail 1 via nack.
    let mut c = RawConsumer::simple(url, "durable", "s", SubscriptionType::Shared).await;
    c.flow(102).await;
    let got = c.take(101, WAIT).await;
    c.ack(
        got[..100].iter().map(|m| m.id.clone().unwrap()).collect(),
        1,
    )
    .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    c.nack(got[100].id.clone().unwrap(), "boom", 2).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    // Enough permits that the redelivery is not stuck behind newer messages.
    c.flow(1000).await;
    let again = loop {
        let m = c.next(WAIT).await.expect("the nacked message comes back");
        if m.id.as_ref().unwrap().entry_id == 100 {
            break m;
        }
    };
    assert_eq!(again.delivery_count, 1);
    drop(c);
    drop(p);
    broker.kill9();

    let broker = spawn(dir.path()).await;
    let url = broker.url();
    let mut c = RawConsumer::simple(url, "durable", "s", SubscriptionType::Shared).await;
    c.flow(2000).await;
    let rest = c.take(900, WAIT).await;
    assert!(
        c.next(QUIET).await.is_none(),
        "acked messages are not redelivered"
    );
    let first = &rest[0];
    assert_eq!(first.id.clone().unwrap().entry_id, 100);
    // In flight (count 1) when the broker died; the count never goes back.
    assert!(
        first.delivery_count >= 1,
        "count went backwards: {}",
        first.delivery_count
    );
    let texts: Vec<String> = rest.iter().map(text).collect();
    assert_eq!(texts, expected[100..].to_vec());
    drop(c);
    broker.kill9();
}

#[tokio::test]
async fn repeated_kills_during_publish_lose_no_receipted_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut receipted: Vec<String> = Vec::new();
    for round in 0..4 {
        let broker = spawn(dir.path()).await;
        let url = broker.url();
        let mut p = RawProducer::open(url, "kills", "p").await.unwrap();
        // Publish in the background; kill mid-stream, once receipts flow
        // (a fixed sleep killed before the first receipt on a loaded
        // machine).
        let receipts = Arc::new(AtomicUsize::new(0));
        let counted = receipts.clone();
        let task = tokio::spawn(async move {
            let mut ok = Vec::new();
            for i in 0..10_000 {
                let payload = format!("{round}-{i}");
                let m = p.msg(payload.clone());
                match tokio::time::timeout(Duration::from_secs(2), p.try_send_batch(vec![m])).await
                {
                    Ok(Some(produce_response::Response::Receipts(_))) => {
                        ok.push(payload);
                        counted.fetch_add(1, Ordering::Release);
                    }
                    _ => break,
                }
            }
            ok
        });
        let started = std::time::Instant::now();
        while receipts.load(Ordering::Acquire) < 20 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50 * round)).await;
        broker.kill9();
        let ok = task.await.unwrap_or_default();
        assert!(!ok.is_empty(), "round {round} published nothing");
        receipted.extend(ok);
    }
    let broker = spawn(dir.path()).await;
    let url = broker.url();
    let mut c = RawConsumer::simple(url, "kills", "s", SubscriptionType::Exclusive).await;
    c.flow(100_000).await;
    // Read until every receipted message is in, or nothing came for 5 s.
    let mut missing: std::collections::HashSet<String> = receipted.iter().cloned().collect();
    while !missing.is_empty() {
        let Some(m) = c.next(Duration::from_secs(5)).await else {
            break;
        };
        missing.remove(&text(&m));
    }
    let lost: Vec<&String> = missing.iter().collect();
    assert!(
        lost.is_empty(),
        "{} receipted messages lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    drop(c);
    broker.kill9();
}

/// `interval` mode defers the flush of publishes and plain acks only: a
/// delivery count a consumer has seen never goes back after a crash, and a
/// confirmed request (here an ack with a request id) is durable.
#[tokio::test]
async fn in_interval_mode_seen_counts_and_confirmed_acks_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    // A long flush interval: nothing becomes durable by the clock during the
    // test, only by what waits for a flush.
    let config = dir.path().join("interval.toml");
    std::fs::write(
        &config,
        "durability = \"interval\"\nflush_interval = \"30s\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let opts = options().args(["--config", config.to_str().unwrap()]);
    let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts).await;
    let url = broker.url().to_owned();
    let mut p = RawProducer::open(&url, "counts", "p").await.unwrap();
    p.send(&["keep", "acked"]).await;
    let mut c = RawConsumer::simple(&url, "counts", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let got = c.take(2, WAIT).await;
    let (keep, acked) = (got[0].id.clone().unwrap(), got[1].id.clone().unwrap());
    c.ack(vec![acked], 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    // Two failures in place; each redelivery shows the count it reached.
    let mut seen = 0;
    for round in 1..=2u32 {
        // No request id: nothing but the redelivery itself waits for a flush.
        c.nack(keep.clone(), "again", 0).await;
        let m = c.next(WAIT).await.expect("redelivered");
        assert_eq!(m.delivery_count, round);
        seen = m.delivery_count;
    }
    broker.kill9();
    let broker = ricochet_testkit::BrokerProcess::spawn(&data, &opts).await;
    let mut c = RawConsumer::simple(broker.url(), "counts", "s", SubscriptionType::Shared).await;
    c.flow(10).await;
    let m = c.next(WAIT).await.expect("still unacked");
    assert_eq!(m.id.unwrap().entry_id, keep.entry_id);
    assert!(
        m.delivery_count >= seen,
        "count went back: {} < {seen}",
        m.delivery_count
    );
    assert!(c.next(QUIET).await.is_none(), "the confirmed ack held");
    broker.kill9();
}

/// Pipelined nack frames whose holds the broker serves are taken in
/// together (one write for many frames, `subscription/intake.rs`): killed
/// with SIGKILL right after the last confirmation, the restarted broker
/// still holds every confirmed nack at its delivery count (1), none lost,
/// none back before its hold ends.
#[tokio::test]
async fn confirmed_held_nacks_of_a_pipelined_burst_survive_kill_9() {
    const N: usize = 400;
    const FRAME: usize = 8;
    const TOPIC: &str = "persistent://public/default/held-burst";
    let dir = tempfile::tempdir().unwrap();
    let broker = spawn(dir.path()).await;
    let mut p = RawProducer::open(broker.url(), TOPIC, "p").await.unwrap();
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    p.send(&payloads.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let mut c = RawConsumer::simple(broker.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(N as u32).await;
    let got = c.take(N, WAIT).await;
    let frames: Vec<&[Message]> = got.chunks(FRAME).collect();
    for (i, frame) in frames.iter().enumerate() {
        let messages = frame
            .iter()
            .map(|m| FailedDelivery {
                id: m.id.clone(),
                reason: FailureReason::Nack as i32,
                delay_ms: 3_600_000,
                ..FailedDelivery::default()
            })
            .collect();
        c.request(consume_request::Request::Redeliver(Redeliver {
            request_id: i as u64 + 1,
            messages,
        }))
        .await;
    }
    for _ in 0..frames.len() {
        let r = c.result(WAIT).await.expect("every frame confirmed");
        assert_eq!(r.code, 0, "{r:?}");
    }
    broker.kill9();

    let broker = spawn(dir.path()).await;
    let stats = sub_stats(broker.url(), TOPIC, "s").await;
    assert_eq!(
        stats.scheduled_retries, N as u64,
        "every confirmed nack held"
    );
    let mut c = RawConsumer::simple(broker.url(), TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(N as u32).await;
    assert!(c.next(QUIET).await.is_none(), "none back before its hold");
    for id in [0, N as u64 / 2, N as u64 - 1] {
        let m = ricochet_proto::admin_client::AdminClient::new(channel(broker.url()).await)
            .get_message(GetMessageRequest {
                id: Some(MessageId {
                    topic: TOPIC.into(),
                    entry_id: id,
                }),
            })
            .await
            .unwrap()
            .into_inner();
        let s = m.subscriptions.iter().find(|s| s.subscription == "s");
        let s = s.expect("subscription s");
        assert_eq!((s.state.as_str(), s.delivery_count), ("scheduled", 1));
    }
    broker.kill9();
}
