//! The producer's bounded queue and its close, against a broker process
//! that is killed (`kill -9`) and comes back on the same port: with the
//! broker gone, a full queue fails fast with `QueueFull` when the producer
//! was built so, or makes `send_async` wait until the broker is back and
//! answers; the queue is visible in `Producer::stats`. A clone's `close`
//! flushes and leaves the other clones open; the last clone's close closes
//! the stream; a producer that stopped on its own (its reconnect was
//! refused) reports why from `close` instead of `Ok`.

use crate::common;

use std::time::Duration;

use common::{client, topic};
use ricochet_client::ErrorKind;
use ricochet_testkit::{BrokerProcess, SpawnOptions};

const T: Duration = Duration::from_secs(15);

/// The port of `url` (`http://127.0.0.1:PORT`), to come back on it.
fn addr_of(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

#[tokio::test]
async fn a_full_queue_fails_fast_when_asked_and_waits_for_room_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let b = BrokerProcess::spawn(&dir.path().join("data"), &SpawnOptions::new()).await;
    let url = b.url().to_owned();
    let c = client(&url).await;
    let t = topic("queue");
    let fast = c
        .producer(&t)
        .max_pending_messages(5)
        .block_if_queue_full(false)
        .send_timeout(Duration::ZERO)
        .create()
        .await
        .unwrap();
    let waits = c
        .producer(&t)
        .max_pending_messages(3)
        .send_timeout(Duration::ZERO)
        .create()
        .await
        .unwrap();
    fast.send("up").await.unwrap();
    assert_eq!(fast.stats().pending_messages, 0);

    b.kill9();
    let mut fast_receipts = Vec::new();
    for i in 0..5 {
        fast_receipts.push(fast.send_async(format!("f{i}")).await.unwrap());
    }
    let e = fast.send_async("one too many").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueFull, "{e}");
    assert_eq!(fast.stats().pending_messages, 5);
    assert_eq!(fast.stats().pending_bytes, 10, "five 2-byte payloads");

    let mut waiting_receipts = Vec::new();
    for i in 0..3 {
        waiting_receipts.push(waits.send_async(format!("w{i}")).await.unwrap());
    }
    let fourth = {
        let waits = waits.clone();
        tokio::spawn(async move { waits.send("w3").await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !fourth.is_finished(),
        "waits for room while the broker is gone"
    );
    assert_eq!(waits.stats().pending_messages, 3);

    // The broker comes back: everything queued is sent, room frees up,
    // the waiting send goes through.
    let _b = BrokerProcess::spawn(
        &dir.path().join("data"),
        &SpawnOptions::new().listen(addr_of(&url)),
    )
    .await;
    for r in fast_receipts.into_iter().chain(waiting_receipts) {
        tokio::time::timeout(T, r).await.unwrap().unwrap();
    }
    tokio::time::timeout(T, fourth)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(fast.stats().pending_messages, 0);
    assert_eq!(waits.stats().pending_bytes, 0);
    fast.send("room again").await.unwrap();
}

#[tokio::test]
async fn a_clones_close_flushes_and_only_the_last_close_closes_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let b = BrokerProcess::spawn(&dir.path().join("data"), &SpawnOptions::new()).await;
    let c = client(b.url()).await;
    let t = topic("close");
    let producer = c.producer(&t).create().await.unwrap();
    let clone = producer.clone();
    let receipt = clone.send_async("from the clone").await.unwrap();
    clone.close().await.unwrap();
    // The clone's close flushed: its message is receipted already.
    let id = tokio::time::timeout(Duration::from_millis(100), receipt)
        .await
        .expect("receipted before the close returned")
        .unwrap();
    assert!(!id.is_unknown());
    // The other handle still sends on the same stream.
    let next = producer.send("from the original").await.unwrap();
    assert_eq!(next.entry_id(), id.entry_id() + 1);
    producer.close().await.unwrap();
}

#[tokio::test]
async fn close_reports_why_a_producer_stopped_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let b = BrokerProcess::spawn(&dir.path().join("data"), &SpawnOptions::new()).await;
    let url = b.url().to_owned();
    let c = client(&url).await;
    let t = topic("stopped");
    let producer = c.producer(&t).create().await.unwrap();
    producer.send("stored").await.unwrap();
    // The broker dies; one that does not know the topic (another data
    // directory, no auto-creation) comes up on its port: the reopen is
    // refused with NOT_FOUND, which is not retried, so the producer stops.
    b.kill9();
    let other = tempfile::tempdir().unwrap();
    let config = other.path().join("broker.toml");
    std::fs::write(&config, "auto_create_topics = false\n").unwrap();
    let _b = BrokerProcess::spawn(
        &other.path().join("data"),
        &SpawnOptions::new()
            .listen(addr_of(&url))
            .args([std::ffi::OsString::from("--config"), config.into()]),
    )
    .await;
    let deadline = tokio::time::Instant::now() + T;
    loop {
        match producer.send("after").await {
            Err(e) if e.kind() == ErrorKind::NotFound => break,
            Err(e) if e.kind() == ErrorKind::Closed => break,
            other => {
                assert!(tokio::time::Instant::now() < deadline, "{other:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let e = producer
        .close()
        .await
        .expect_err("a stopped producer's close is no Ok");
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}
