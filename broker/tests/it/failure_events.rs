//! Failure events across a clean stop: every dead-lettering the broker
//! confirmed has its event in the namespace's events topic after a clean
//! stop and a restart, even when the stop comes right after the last
//! confirmation (events are published in the background, after the move
//! is answered; the broker runs with the test failpoint
//! `events.publish.slow`, which holds each event back 500 ms).

use crate::common::*;
use ricochet_proto::SubscriptionType;
use ricochet_proto::admin_client::AdminClient;

const TOPIC: &str = "orders";
const EVENTS: &str = "persistent://public/default/__failure_events";
const N: usize = 400;

#[tokio::test]
async fn a_clean_stop_keeps_the_event_of_every_confirmed_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    let slow = options().env("RICOCHET_FAILPOINT", "events.publish.slow");
    let broker = ricochet_testkit::BrokerProcess::spawn(dir.path(), &slow).await;
    let url = broker.url().to_owned();
    let mut c = RawConsumer::simple(&url, TOPIC, "s", SubscriptionType::Shared).await;
    c.flow(N as u32).await;
    let mut p = RawProducer::open(&url, TOPIC, "p").await.unwrap();
    let msgs = (0..N)
        .map(|i| p.msg(format!("m{i}").into_bytes()))
        .collect();
    p.send_messages(msgs).await;
    let got = c.take(N, WAIT).await;
    // All terminates at once, then every confirmation: the events are
    // still held back when the stop begins.
    for (i, m) in got.iter().enumerate() {
        c.terminate(m.id.clone().unwrap(), "broken", i as u64 + 1)
            .await;
    }
    for _ in 0..N {
        assert_eq!(c.result(WAIT).await.expect("a result").code, 0);
    }
    drop(c);
    drop(p);
    assert!(broker.stop().await.success(), "clean stop");

    let broker = spawn(dir.path()).await;
    let stored = AdminClient::new(channel(broker.url()).await)
        .topic_stats(ricochet_proto::TopicRequest {
            topic: EVENTS.into(),
        })
        .await
        .expect("the events topic exists")
        .into_inner()
        .message_count;
    assert_eq!(
        stored, N as u64,
        "one event per confirmed dead letter survives the clean stop"
    );
    // Only the count is this test's; the restarted broker is not stopped
    // cleanly (one CI run saw its clean stop exit non-zero, cause not
    // captured: see the session notes).
    broker.kill9();
}
