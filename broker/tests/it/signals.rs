//! The broker binary under the other signals a test sends it: SIGTERM shuts
//! it down cleanly (exit status 0, receipted writes flushed even with
//! `--durability interval`), SIGSTOP holds every answer until SIGCONT.

use crate::common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::BrokerProcess;

#[tokio::test]
async fn sigterm_exits_cleanly_with_interval_writes_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let options = options().args(["--durability", "interval"]);
    let broker = BrokerProcess::spawn(dir.path(), &options).await;
    let mut p = RawProducer::open(broker.url(), "term", "p").await.unwrap();
    let payloads: Vec<String> = (0..100).map(|i| format!("m-{i}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    assert_eq!(p.send(&refs).await.len(), 100);
    let status = broker.stop().await;
    assert!(status.success(), "exit after SIGTERM: {status}");
    drop(p);

    let broker = spawn(dir.path()).await;
    let mut c = RawConsumer::simple(broker.url(), "term", "s", SubscriptionType::Exclusive).await;
    c.flow(1000).await;
    let got: Vec<String> = c.take(100, WAIT).await.iter().map(text).collect();
    assert_eq!(got, payloads);
    assert!(c.next(QUIET).await.is_none());
    broker.kill9();
}

#[tokio::test]
async fn a_frozen_broker_answers_nothing_until_thawed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = spawn(dir.path()).await;
    let mut p = RawProducer::open(broker.url(), "frozen", "p")
        .await
        .unwrap();
    p.send(&["before"]).await;
    broker.freeze();
    let send = tokio::spawn(async move { p.send(&["while frozen"]).await });
    tokio::time::sleep(QUIET).await;
    assert!(!send.is_finished(), "a frozen broker answered");
    broker.thaw();
    let ids = tokio::time::timeout(WAIT, send)
        .await
        .expect("answered once thawed")
        .unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(ids[0].entry_id, 1);
    broker.kill9();
}

/// A SIGTERM that comes while the broker is still starting (the store
/// open, nothing listening yet) is kept: the start finishes and the broker
/// stops cleanly (exit 0, sled's snapshot taken), where the signal's
/// default action killed it.
#[tokio::test]
async fn a_sigterm_during_the_start_is_a_clean_stop_once_started() {
    let dir = tempfile::tempdir().unwrap();
    let broker = spawn(dir.path()).await;
    let mut p = RawProducer::open(broker.url(), "early", "p").await.unwrap();
    p.send(&["before"]).await;
    drop(p);
    assert!(broker.stop().await.success());

    let starting = BrokerProcess::spawn(
        dir.path(),
        &options()
            .env("RICOCHET_FAILPOINT", "start.pause_before_listen")
            .rust_log("info")
            .ready_when("failpoint start.pause_before_listen"),
    )
    .await;
    let status = starting.stop().await;
    assert!(status.success(), "a SIGTERM during the start: {status}");

    let broker = spawn(dir.path()).await;
    let mut c = RawConsumer::simple(broker.url(), "early", "s", SubscriptionType::Exclusive).await;
    c.flow(10).await;
    let got: Vec<String> = c.take(1, WAIT).await.iter().map(text).collect();
    assert_eq!(got, ["before"]);
    broker.kill9();
}
