//! What the consumer reports as done is durable (issue #10, items 1–3),
//! checked against a broker child process that is frozen (SIGSTOP) and
//! killed (SIGKILL, no clean shutdown):
//!
//! * `close()` fails, naming how many acks the broker never confirmed, and
//!   so does every later or concurrent `close()`, also after the consumer
//!   stopped because it could not resubscribe;
//! * with ack receipts, `ack().await` and `nack().await` return `Ok` only
//!   once durable, and fail when the broker dies first;
//! * `flush()` confirms every ack so far, and every queued
//!   `reconsume_later` (#12: queued by default, as acks are);
//! * an ack of a message received before a reconnect never applies to a
//!   message delivered after it.

use crate::common;

use std::time::Duration;

use common::{client, recv, text, topic};
use ricochet_client::{Client, Consumer, ErrorKind, InitialPosition, SubscriptionType};
use ricochet_testkit::{BrokerProcess, Direction, FaultProxy, InProcessBroker, SpawnOptions};

const T: Duration = Duration::from_secs(10);

async fn broker(dir: &std::path::Path) -> BrokerProcess {
    BrokerProcess::spawn(dir, &SpawnOptions::new()).await
}

async fn consumer(client: &Client, t: &str, receipts: bool) -> Consumer {
    client
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(receipts)
        .subscribe()
        .await
        .unwrap()
}

/// The `n` messages a fresh consumer of `t` gets (each within `T`, so a
/// loaded machine does not fail the test), after which nothing more comes
/// for half a second; and the subscription agrees: `n` in flight, and a
/// backlog of those and `held` nacks the broker holds.
async fn redelivered(url: &str, t: &str, n: usize, held: u64) -> Vec<String> {
    let client = client(url).await;
    let mut c = consumer(&client, t, false).await;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(text(&recv(&mut c, T).await));
    }
    if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), c.receive()).await {
        panic!("more than {n} came back: {out:?} and {}", text(&m));
    }
    let stats = client.admin().subscription_stats(t, "s").await.unwrap();
    assert_eq!(stats.unacked, n as u64, "{stats:?}");
    assert_eq!(stats.backlog, held + n as u64, "{stats:?}");
    out.sort();
    out
}

/// A broker child process with one topic whose consumer received its two
/// messages, then the broker frozen (SIGSTOP): what a consumer settles now
/// is never confirmed.
struct Received {
    dir: tempfile::TempDir,
    b: BrokerProcess,
    t: String,
    c: Consumer,
    m1: ricochet_client::Message,
    m2: ricochet_client::Message,
}

async fn two_received(name: &str) -> Received {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let t = topic(name);
    let client = client(b.url()).await;
    let mut c = consumer(&client, &t, false).await;
    produce_to(&client, &t, 2).await;
    let m1 = recv(&mut c, T).await;
    let m2 = recv(&mut c, T).await;
    b.freeze();
    Received {
        dir,
        b,
        t,
        c,
        m1,
        m2,
    }
}

/// Closes `c` while its frozen broker `b` is killed: the close must fail
/// naming the `n` settlements never confirmed.
async fn close_across_a_kill(c: Consumer, b: BrokerProcess, n: u64) {
    let closing = tokio::spawn(async move { c.close().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.kill9();
    let err = closing
        .await
        .unwrap()
        .expect_err("close must not report success");
    match err {
        ref e if e.kind() == ErrorKind::Unconfirmed => {
            assert_eq!(e.unconfirmed_count().unwrap(), n, "{err}")
        }
        other => panic!("expected Unconfirmed, got {other}"),
    }
}

#[tokio::test]
async fn close_fails_naming_the_acks_a_frozen_then_killed_broker_never_confirmed() {
    let Received {
        dir,
        b,
        t,
        c,
        m1,
        m2,
    } = two_received("r-close").await;
    c.ack(&m1).await.unwrap();
    c.ack(&m2).await.unwrap();
    close_across_a_kill(c, b, 2).await;
    // Indeed not durable: both come back after a restart.
    let b = broker(dir.path()).await;
    assert_eq!(redelivered(b.url(), &t, 2, 0).await, ["m0", "m1"]);
    b.kill9();
}

/// Every `close` reports what the first found: one made while another is
/// waiting for the broker, and one made after the consumer has stopped,
/// fail like it (neither may answer `Ok` for acks never confirmed).
#[tokio::test]
async fn every_close_reports_the_acks_the_first_found_unconfirmed() {
    let Received {
        dir,
        b,
        t,
        c,
        m1,
        m2,
    } = two_received("r-close-twice").await;
    c.ack(&m1).await.unwrap();
    c.ack(&m2).await.unwrap();
    let kill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.kill9();
    };
    let (first, second, ()) = tokio::join!(c.close(), c.close(), kill);
    let after = c.close().await;
    for (which, r) in [("first", first), ("concurrent", second), ("later", after)] {
        match r {
            Err(ref e) if e.kind() == ErrorKind::Unconfirmed => {
                assert_eq!(e.unconfirmed_count().unwrap(), 2, "{which} close")
            }
            other => panic!("{which} close: expected Unconfirmed, got {other:?}"),
        }
    }
    let b = broker(dir.path()).await;
    assert_eq!(redelivered(b.url(), &t, 2, 0).await, ["m0", "m1"]);
    b.kill9();
}

/// A consumer that cannot resubscribe stops on its own; a `close` after
/// that still reports the ack it never got confirmed.
#[tokio::test]
async fn close_after_a_refused_resubscribe_reports_the_ack_never_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let url = b.url().to_owned();
    let t = topic("r-refused");
    let client = client(&url).await;
    let mut c = client
        .consumer(&t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        // Held, unsent, when the stream breaks.
        .ack_group_time(Duration::from_secs(60))
        .subscribe()
        .await
        .unwrap();
    produce_to(&client, &t, 1).await;
    let m = recv(&mut c, T).await;
    c.ack(&m).await.unwrap();
    // The broker dies, and one that does not know the topic (another data
    // directory, no auto-creation) comes up on its port: the resubscribe is
    // refused with NOT_FOUND, which is not retried.
    let port = url.rsplit(':').next().unwrap().to_owned();
    b.kill9();
    let other = tempfile::tempdir().unwrap();
    let config = other.path().join("broker.toml");
    std::fs::write(&config, "auto_create_topics = false\n").unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let options = SpawnOptions::new()
        .listen(addr)
        .args([std::ffi::OsString::from("--config"), config.into()]);
    let b = BrokerProcess::spawn(&other.path().join("data"), &options).await;
    let err = tokio::time::timeout(T, c.receive())
        .await
        .expect("the consumer stops in time")
        .expect_err("it could not resubscribe");
    assert_eq!(err.grpc_code(), Some(tonic::Code::NotFound as i32), "{err}");
    match c.close().await {
        Err(ref e) if e.kind() == ErrorKind::Unconfirmed => {
            assert_eq!(e.unconfirmed_count().unwrap(), 1)
        }
        other => panic!("expected Unconfirmed, got {other:?}"),
    }
    b.kill9();
}

#[tokio::test]
async fn with_receipts_an_ack_is_ok_only_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let t = topic("r-receipt");
    let client = client(b.url()).await;
    let mut c = consumer(&client, &t, true).await;
    produce_to(&client, &t, 3).await;
    let m1 = recv(&mut c, T).await;
    let m2 = recv(&mut c, T).await;
    let m3 = recv(&mut c, T).await;
    // Confirmed: durable, so it survives a kill right after.
    c.ack(&m1).await.unwrap();
    // A nack with receipts is held by the broker, durably.
    c.nack_with_reason(&m2, "later").await.unwrap();
    // Frozen: the ack cannot be confirmed; killed (and not back): it fails
    // once the client's request timeout (5 s) ends the wait for the next
    // stream's check, which would have said whether it was applied.
    b.freeze();
    let acker = c.acker();
    let m3_name = text(&m3);
    let pending = tokio::spawn(async move { acker.ack(&m3).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "no receipt from a frozen broker");
    b.kill9();
    let err = pending.await.unwrap().expect_err("never confirmed");
    assert!(err.kind() == ErrorKind::Timeout, "{err}");

    // Only the unconfirmed ack's message comes back: the confirmed ack is
    // durable, and the nack was recorded before the kill (the broker holds
    // it for the default 60 s nack delay, so it is not back yet).
    let b = broker(dir.path()).await;
    assert_eq!(redelivered(b.url(), &t, 1, 1).await, [m3_name]);
    assert_ne!(text(&m1), text(&m2));
    b.kill9();
}

#[tokio::test]
async fn flush_confirms_every_ack_so_far() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let t = topic("r-flush");
    let client = client(b.url()).await;
    let mut c = consumer(&client, &t, false).await;
    produce_to(&client, &t, 5).await;
    for _ in 0..5 {
        let m = recv(&mut c, T).await;
        c.ack(&m).await.unwrap();
    }
    c.flush().await.unwrap();
    b.kill9();
    let b = broker(dir.path()).await;
    assert!(
        redelivered(b.url(), &t, 0, 0).await.is_empty(),
        "all five are durable"
    );
    b.kill9();
}

#[tokio::test]
async fn flush_confirms_every_queued_reconsume_later() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let t = topic("r-reconsume");
    let client = client(b.url()).await;
    let mut c = consumer(&client, &t, false).await;
    produce_to(&client, &t, 5).await;
    for _ in 0..5 {
        let m = recv(&mut c, T).await;
        // Queued: returns once sent, not once durable.
        c.reconsume_later(&m, Duration::from_secs(3600))
            .await
            .unwrap();
    }
    c.flush().await.unwrap();
    b.kill9();
    let b = broker(dir.path()).await;
    // Nothing comes back from the main topic: all five are parked in the
    // retry tier, durably.
    assert!(redelivered(b.url(), &t, 0, 5).await.is_empty());
    let stats = client_stats(b.url(), &t).await;
    assert_eq!(stats.scheduled_retries, 5, "{stats:?}");
    b.kill9();
}

#[tokio::test]
async fn close_reports_queued_reconsumes_a_killed_broker_never_confirmed() {
    let Received {
        dir,
        b,
        t,
        c,
        m1,
        m2,
    } = two_received("r-reconsume-kill").await;
    c.reconsume_later(&m1, Duration::from_secs(3600))
        .await
        .unwrap();
    c.reconsume_later(&m2, Duration::from_secs(3600))
        .await
        .unwrap();
    close_across_a_kill(c, b, 2).await;
    // Indeed never moved: both come back from the main topic.
    let b = broker(dir.path()).await;
    assert_eq!(redelivered(b.url(), &t, 2, 0).await, ["m0", "m1"]);
    b.kill9();
}

async fn client_stats(url: &str, t: &str) -> ricochet_client::proto::SubscriptionStatsResponse {
    client(url)
        .await
        .admin()
        .subscription_stats(t, "s")
        .await
        .unwrap()
}

#[tokio::test]
async fn an_ack_from_before_a_reconnect_never_settles_a_later_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let url = b.url().to_owned();
    let t = topic("r-stale");
    let client = client(&url).await;
    let mut c = consumer(&client, &t, false).await;
    produce_to(&client, &t, 1).await;
    let old = recv(&mut c, T).await;
    // The broker dies and comes back on the same port: the consumer
    // reconnects and the message is delivered again.
    let port = url.rsplit(':').next().unwrap().to_owned();
    b.kill9();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let b = BrokerProcess::spawn(dir.path(), &SpawnOptions::new().listen(addr)).await;
    let again = recv(&mut c, T).await;
    assert_eq!(text(&again), text(&old));
    // The old delivery cannot be settled any more; the new one can.
    let err = c.ack(&old).await.expect_err("stale");
    assert!(err.kind() == ErrorKind::StaleDelivery, "{err}");
    let err = c.nack(&old).await.expect_err("stale");
    assert!(err.kind() == ErrorKind::StaleDelivery, "{err}");
    c.ack(&again).await.unwrap();
    c.flush().await.unwrap();
    c.close().await.unwrap();
    assert!(redelivered(b.url(), &t, 0, 0).await.is_empty());
    b.kill9();
}

async fn produce_to(client: &Client, t: &str, n: usize) {
    let p = client.producer(t).create().await.unwrap();
    for i in 0..n {
        p.send(format!("m{i}")).await.unwrap();
    }
}

/// A consumer with ack receipts behind a fault proxy, with two messages
/// received: the proxy, the in-process broker, the consumer and both
/// messages.
async fn behind_a_proxy(
    name: &str,
) -> (
    FaultProxy,
    InProcessBroker,
    Consumer,
    ricochet_client::Message,
    ricochet_client::Message,
) {
    let broker = InProcessBroker::start().await;
    let upstream = broker.url().trim_start_matches("http://").parse().unwrap();
    let proxy = FaultProxy::start(upstream).await;
    let client = client(&proxy.url()).await;
    let t = topic(name);
    let mut c = consumer(&client, &t, true).await;
    produce_to(&client, &t, 2).await;
    let m1 = recv(&mut c, T).await;
    let m2 = recv(&mut c, T).await;
    (proxy, broker, c, m1, m2)
}

/// The subscription's unacked count, asked of the broker directly.
async fn unacked(broker: &InProcessBroker, t: &str) -> u64 {
    client(&broker.url())
        .await
        .admin()
        .subscription_stats(t, "s")
        .await
        .unwrap()
        .unacked
}

/// Breaks every connection through `proxy`, then lets new ones through.
async fn break_stream(proxy: &FaultProxy) {
    proxy.drop_connections();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.heal();
}

#[tokio::test]
async fn an_ack_applied_before_its_stream_broke_is_confirmed_by_the_next_streams_check() {
    let (proxy, broker, mut c, m1, m2) = behind_a_proxy("r-check-applied").await;
    let t = c.topic().to_owned();
    // The broker's answers stop coming back: the ack goes in and is
    // applied, its receipt is lost with the stream.
    proxy.cut(Direction::FromUpstream);
    let acker = c.acker();
    let acking = tokio::spawn(async move { acker.ack(&m1).await });
    let deadline = std::time::Instant::now() + T;
    while unacked(&broker, &t).await != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the ack never applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    break_stream(&proxy).await;
    let r = tokio::time::timeout(T, acking).await.unwrap().unwrap();
    assert!(
        r.is_ok(),
        "the broker applied the ack, so its receipt is Ok: {r:?}"
    );
    // Only the unacked message comes back on the new stream.
    assert_eq!(text(&recv(&mut c, T).await), text(&m2));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), c.receive())
            .await
            .is_err(),
        "the acked message is not redelivered"
    );
}

#[tokio::test]
async fn an_ack_lost_with_its_stream_fails_once_the_next_streams_check_says_so() {
    let (proxy, broker, mut c, m1, _m2) = behind_a_proxy("r-check-lost").await;
    let t = c.topic().to_owned();
    // The ack never reaches the broker.
    proxy.cut(Direction::ToUpstream);
    let acker = c.acker();
    let m1_text = text(&m1);
    let acking = tokio::spawn(async move { acker.ack(&m1).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(unacked(&broker, &t).await, 2, "nothing applied");
    break_stream(&proxy).await;
    let e = tokio::time::timeout(T, acking)
        .await
        .unwrap()
        .unwrap()
        .expect_err("an ack the broker never applied fails");
    assert_eq!(e.kind(), ErrorKind::Disconnected, "{e:?}");
    assert!(
        e.to_string().contains("had not applied 1 of these 1"),
        "{e}"
    );
    // Its message comes back (with the other one) on the new stream.
    let mut again = vec![text(&recv(&mut c, T).await), text(&recv(&mut c, T).await)];
    again.sort();
    assert!(again.contains(&m1_text), "{again:?}");
}
