//! The history checker (`ricochet_testkit::history`) over kill -9 rounds
//! of one broker child process: in each round a producer publishes with
//! receipts and a Shared consumer with ack receipts acks most messages and
//! nacks every fifth one each time it comes (its policy dead-letters it
//! after two redeliveries), until the broker is killed with SIGKILL mid-run.
//! After the last round an auditor drains the subscription (acking what
//! comes) and lists the dead letters. Every receipted publish must be in
//! exactly one of acked / pending / dead-lettered, nothing acked with a
//! receipt may come again, and no delivery count may go back.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, text, topic};
use ricochet_client::admin::DeadLetterFilter;
use ricochet_client::{Client, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::{BrokerProcess, History, Place, SpawnOptions};

const ROUNDS: usize = 4;
/// How long each round runs before the kill.
const RUN: Duration = Duration::from_millis(1500);

/// Every fifth message always fails.
fn poison(id: &str) -> bool {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n % 5 == 0)
}

/// A consumer of the subscription, with ack receipts or not.
async fn subscribe(client: &Client, t: &str, receipts: bool) -> ricochet_client::Consumer {
    client
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .ack_receipts(receipts)
        .policy("backoff:fixed=100ms,max=2".parse::<PolicySpec>().unwrap())
        .subscribe()
        .await
        .unwrap()
}

/// Publishes `round-<i>` one at a time until the broker goes away.
async fn produce(client: Client, t: String, round: usize, h: Arc<History>) {
    let Ok(p) = client.producer(&t).create().await else {
        return;
    };
    for i in 0.. {
        let id = format!("{round}-{i}");
        h.sent(&id);
        match tokio::time::timeout(Duration::from_secs(2), p.send(id.clone())).await {
            Ok(Ok(_)) => h.receipted(&id),
            _ => return,
        }
    }
}

/// Consumes until the broker goes away, recording what it confirms.
async fn consume(client: Client, t: String, h: Arc<History>) {
    let mut c = subscribe(&client, &t, true).await;
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(2), c.receive()).await {
        let id = text(&m);
        h.delivered(&id, m.delivery_count());
        if poison(&id) {
            if c.nack_with_reason(&m, "poison").await.is_ok() {
                h.failure_confirmed(&id);
            }
        } else {
            h.ack_sent(&id);
            match c.ack(&m).await {
                Ok(()) => h.ack_confirmed(&id),
                Err(_) => return,
            }
        }
    }
}

#[tokio::test]
async fn kill_9_rounds_keep_the_history_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let t = topic("history");
    let h = Arc::new(History::new());
    for round in 0..ROUNDS {
        let broker = BrokerProcess::spawn(dir.path(), &SpawnOptions::new()).await;
        let c = client(broker.url()).await;
        let producing = tokio::spawn(produce(c.clone(), t.clone(), round, h.clone()));
        let consuming = tokio::spawn(consume(c.clone(), t.clone(), h.clone()));
        tokio::time::sleep(RUN).await;
        broker.kill9();
        let _ = tokio::time::timeout(Duration::from_secs(15), producing).await;
        let _ = tokio::time::timeout(Duration::from_secs(15), consuming).await;
    }

    // The audit: what is still deliverable comes to a consumer that acks
    // everything; a retry due later comes within the policy's 100 ms.
    let broker = BrokerProcess::spawn(dir.path(), &SpawnOptions::new()).await;
    let client = client(broker.url()).await;
    let mut auditor = subscribe(&client, &t, false).await;
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(3), auditor.receive()).await {
        let id = text(&m);
        h.delivered(&id, m.delivery_count());
        h.found(&id, Place::Pending);
        auditor.ack(&m).await.unwrap();
    }
    auditor.flush().await.unwrap();
    let mut after = None;
    loop {
        let page = client
            .admin()
            .list_dead_letters(&t, "s", &DeadLetterFilter::default(), 1_000, after)
            .await
            .unwrap();
        let Some(last) = page.dead_letters.last() else {
            break;
        };
        after = last
            .message
            .as_ref()
            .and_then(|m| m.id.as_ref())
            .map(|i| i.entry_id);
        assert!(after.is_some(), "a dead letter without an id: {last:?}");
        for d in &page.dead_letters {
            let m = d.message.as_ref().unwrap();
            let id = String::from_utf8_lossy(&m.payload).into_owned();
            assert!(poison(&id), "{id} was dead-lettered but never failed");
            h.found(&id, Place::DeadLettered);
        }
    }
    let summary = h.assert_ok();
    eprintln!("history: {summary:?}");
    // The run did what it is meant to exercise.
    assert!(summary.receipted > 100, "{summary:?}");
    assert!(summary.acks_confirmed > 50, "{summary:?}");
    assert!(summary.failures_confirmed > 10, "{summary:?}");
    assert!(
        summary
            .places
            .get(&Place::DeadLettered)
            .is_some_and(|n| *n > 0),
        "{summary:?}"
    );
    drop(auditor);
    broker.kill9();
}
