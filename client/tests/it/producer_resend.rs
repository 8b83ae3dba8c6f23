//! The producer after a batch the broker could not store. The retryable
//! cause is a real one: a `refuse` backlog quota set on the topic while the
//! producer runs (every publish is then refused RESOURCE_EXHAUSTED, as on a
//! full disk), lifted later. A refused batch must be resent in order with
//! its sequence ids until the send timeout (every message receipted,
//! consumed once, in order); one refused for good (a `deliver_at` beyond
//! the broker's `max_delay`, INVALID_ARGUMENT) fails alone and at once.

use crate::common;

use std::time::{Duration, Instant};

use common::{Env, assert_quiet, recv, start, text, topic};
use ricochet_client::admin::{RetentionPolicy, RetentionTarget};
use ricochet_client::{ErrorKind, MessageId, Producer, ProducerBuilder};

const T: Duration = Duration::from_secs(10);

/// Refuses every publish to `t` from now on: a quota of one byte, which
/// the messages already stored exceed.
async fn refuse(env: &Env, t: &str) {
    let policy = RetentionPolicy {
        backlog_quota_bytes: Some(1),
        quota_action: "refuse".into(),
        ..Default::default()
    };
    env.client
        .admin()
        .set_retention(&RetentionTarget::Topic(t.into()), policy)
        .await
        .unwrap();
}

async fn lift(env: &Env, t: &str) {
    env.client
        .admin()
        .remove_retention(&RetentionTarget::Topic(t.into()))
        .await
        .unwrap();
}

/// Waits until `p` dropped its stream at least `n` times.
async fn reconnects_reach(p: &Producer, n: u64) {
    let deadline = Instant::now() + T;
    while p.stats().reconnects < n {
        assert!(
            Instant::now() < deadline,
            "{} reconnect(s), not {n}",
            p.stats().reconnects
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn label(i: usize) -> String {
    format!("m{i:04}")
}

#[tokio::test]
async fn batches_refused_for_a_while_are_resent_in_order_and_stored_once() {
    let env = start().await;
    let t = topic("resend");
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscribe()
        .await
        .unwrap();
    let p = env.client.producer(&t).create().await.unwrap();
    let mut receipts = Vec::new();
    for i in 0..300 {
        receipts.push(p.send_async(label(i)).await.unwrap());
    }
    p.flush().await.unwrap();
    assert_eq!(p.stats().reconnects, 0);
    refuse(&env, &t).await;
    // Pipelined: many batches are in flight behind the first refused one.
    for i in 300..1000 {
        receipts.push(p.send_async(label(i)).await.unwrap());
    }
    // Refused, reopened, resent, refused again: the quota holds.
    reconnects_reach(&p, 2).await;
    lift(&env, &t).await;
    let mut ids: Vec<MessageId> = Vec::new();
    for (i, r) in receipts.into_iter().enumerate() {
        let id = tokio::time::timeout(T, r)
            .await
            .unwrap_or_else(|_| panic!("message {i}: no receipt in time"))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        ids.push(id);
    }
    // Every message stored by its own batch: no id is unknown, and the ids
    // follow the order of the sends.
    assert!(ids.iter().all(|id| !id.is_unknown()), "{ids:?}");
    let entries: Vec<u64> = ids.iter().map(|id| id.entry_id()).collect();
    assert!(
        entries.windows(2).all(|w| w[0] < w[1]),
        "entry ids out of order: {entries:?}"
    );
    for i in 0..1000 {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), label(i), "delivery {i}");
        c.ack(&m).await.unwrap();
    }
    assert_quiet(&mut c, Duration::from_millis(500)).await;
    p.close().await.unwrap();
}

#[tokio::test]
async fn a_batch_refused_for_good_fails_alone_and_at_once() {
    refused_for_good_fails_alone("resend-fatal", |b| b.batch_max_messages(1)).await;
}

/// `batching(false)` makes every send its own batch, also when the sends
/// were queued at once (they were gathered into one batch before, so the
/// refusal of one failed all twenty).
#[tokio::test]
async fn with_batching_off_a_refused_send_fails_alone() {
    refused_for_good_fails_alone("resend-fatal-unbatched", |b| b.batching(false)).await;
}

async fn refused_for_good_fails_alone(
    name: &str,
    one_per_batch: impl FnOnce(ProducerBuilder) -> ProducerBuilder,
) {
    let env = start().await;
    let t = topic(name);
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscribe()
        .await
        .unwrap();
    // One message per batch, all in flight at once.
    let p = one_per_batch(env.client.producer(&t))
        .create()
        .await
        .unwrap();
    let started = Instant::now();
    let mut receipts = Vec::new();
    for i in 0..20 {
        let mut m = ricochet_client::OutgoingMessage::builder(label(i));
        if i == 7 {
            // Past the broker's max_delay (7 days): INVALID_ARGUMENT.
            m = m.deliver_after(Duration::from_secs(30 * 24 * 3600));
        }
        receipts.push(p.send_async(m).await.unwrap());
    }
    for (i, r) in receipts.into_iter().enumerate() {
        let got = tokio::time::timeout(T, r).await.expect("answered");
        if i == 7 {
            let e = got.expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "failed after {:?}, not at once",
                started.elapsed()
            );
        } else {
            got.unwrap_or_else(|e| panic!("message {i}: {e}"));
        }
    }
    assert_eq!(p.stats().reconnects, 0, "a refusal for good is not resent");
    for i in (0..20).filter(|&i| i != 7) {
        let m = recv(&mut c, T).await;
        assert_eq!(text(&m), label(i));
        c.ack(&m).await.unwrap();
    }
    assert_quiet(&mut c, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_refusal_that_lasts_past_the_send_timeout_fails_with_the_timeout_naming_it() {
    let env = start().await;
    let t = topic("resend-timeout");
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscribe()
        .await
        .unwrap();
    let timeout = Duration::from_millis(1500);
    let p = env
        .client
        .producer(&t)
        .send_timeout(timeout)
        .create()
        .await
        .unwrap();
    for i in 0..5 {
        p.send(label(i)).await.unwrap();
    }
    refuse(&env, &t).await;
    let sent = Instant::now();
    let mut receipts = Vec::new();
    for i in 5..15 {
        receipts.push(p.send_async(label(i)).await.unwrap());
    }
    for (i, r) in receipts.into_iter().enumerate() {
        let e = tokio::time::timeout(T, r)
            .await
            .expect("answered")
            .expect_err("the quota holds past the send timeout");
        assert_eq!(e.kind(), ErrorKind::Timeout, "message {}: {e}", i + 5);
        // Failed by the timeout, not by the first refusal.
        assert!(sent.elapsed() >= timeout, "after {:?}: {e}", sent.elapsed());
        let cause = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<ricochet_client::Error>())
            .unwrap_or_else(|| panic!("the cause is the source: {e:?}"));
        assert_eq!(cause.kind(), ErrorKind::ResourceExhausted, "{cause}");
        assert!(e.to_string().contains("ResourceExhausted"), "{e}");
    }
    assert!(p.stats().reconnects >= 1);
    // The producer is still usable once the quota goes.
    lift(&env, &t).await;
    p.send(label(100)).await.unwrap();
    let mut got = Vec::new();
    loop {
        let m = recv(&mut c, T).await;
        c.ack(&m).await.unwrap();
        got.push(text(&m));
        if got.last().is_some_and(|l| *l == label(100)) {
            break;
        }
    }
    assert_eq!(&got[..5], &(0..5).map(label).collect::<Vec<_>>()[..]);
    // Nothing twice, nothing out of order.
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
    p.close().await.unwrap();
}
