//! Entry ids across crashes in `interval` durability: a receipt (or a
//! delivery) may name a message that a SIGKILL then loses, and that id must
//! never name another message. The broker runs as a child process with a
//! one-hour flush interval (so nothing is flushed by the timer before the
//! kill), is killed right after handing out ids, and restarted, several
//! times; every id it hands out — on the topic, its retry tier and its
//! dead-letter tier — must be new, and whatever is delivered under an id
//! must be the message first receipted or delivered under it.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::BrokerProcess;
use std::collections::HashMap;
use std::path::Path;

const ROUNDS: usize = 4;

/// A config file for interval durability with a flush interval that never
/// comes during a round.
fn config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("interval.toml");
    std::fs::write(
        &path,
        "durability = \"interval\"\nflush_interval = \"1h\"\n",
    )
    .unwrap();
    path
}

async fn spawn_interval(data: &Path, config: &Path) -> BrokerProcess {
    BrokerProcess::spawn(
        data,
        &options().args(["--config".as_ref(), config.as_os_str()]),
    )
    .await
}

/// Records that `id` named `payload`; a second, different message under
/// the same id is a violation.
fn record(seen: &mut HashMap<(String, u64), String>, id: &MessageId, payload: String) {
    let key = (id.topic.clone(), id.entry_id);
    if let Some(before) = seen.get(&key) {
        assert_eq!(
            before, &payload,
            "id {}:{} named {before:?} before the crash and {payload:?} after",
            id.topic, id.entry_id
        );
    }
    seen.insert(key, payload);
}

#[tokio::test]
async fn interval_mode_never_hands_out_a_topic_id_twice_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = config(dir.path());
    let mut seen = HashMap::new();
    let mut ids = Vec::new();
    for round in 0..ROUNDS {
        let broker = spawn_interval(&data, &config).await;
        let mut p = RawProducer::open(broker.url(), "ids", "p").await.unwrap();
        let payload = format!("round {round}");
        let id = p.send(&[&payload]).await.remove(0);
        // Killed before any flush: the message is (very likely) lost.
        broker.kill9();
        record(&mut seen, &id, payload);
        ids.push(id.entry_id);
    }
    let broker = spawn_interval(&data, &config).await;
    let mut c =
        RawConsumer::simple(broker.url(), "ids", "check", SubscriptionType::Exclusive).await;
    c.flow(100).await;
    while let Some(m) = c.next(QUIET).await {
        record(&mut seen, m.id.as_ref().unwrap(), text(&m));
    }
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "an id was handed out twice: {ids:?}"
    );
    broker.kill9();
}

#[tokio::test]
async fn interval_mode_never_hands_out_a_retry_or_dead_letter_id_twice_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = config(dir.path());
    let mut seen = HashMap::new();
    let (mut retry_ids, mut dlq_ids) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let broker = spawn_interval(&data, &config).await;
        let url = broker.url();
        let mut p = RawProducer::open(url, "tiers", "p").await.unwrap();
        let (dead, retried) = (format!("dead {round}"), format!("retried {round}"));
        p.send(&[&dead, &retried]).await;
        let mut c = RawConsumer::simple(url, "tiers", "s", SubscriptionType::Shared).await;
        c.flow(100).await;
        // Earlier rounds' messages may have survived: answer only this round's.
        let (mut dead_id, mut retried_id) = (None, None);
        while dead_id.is_none() || retried_id.is_none() {
            let m = c.next(WAIT).await.expect("this round's messages");
            if text(&m) == dead {
                dead_id = m.id;
            } else if text(&m) == retried {
                retried_id = m.id;
            }
        }
        c.terminate(dead_id.unwrap(), "dead", 1).await;
        c.reconsume_later(retried_id.unwrap(), reconsume_later::Delay::DelayMs(1), 2)
            .await;
        for _ in 0..2 {
            assert_eq!(c.result(WAIT).await.expect("a result").code, 0);
        }
        // The retry-tier delivery names its id.
        let again = loop {
            let m = c.next(WAIT).await.expect("the retry comes back");
            if text(&m) == retried && m.id.as_ref().unwrap().topic.ends_with("-RETRY") {
                break m;
            }
        };
        let retry_id = again.id.clone().unwrap();
        record(&mut seen, &retry_id, retried.clone());
        retry_ids.push(retry_id.entry_id);
        let dead_letters = AdminClient::new(channel(url).await)
            .list_dead_letters(ListDeadLettersRequest {
                topic: "tiers".into(),
                subscription: "s".into(),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .dead_letters;
        let mine = dead_letters
            .iter()
            .filter_map(|d| d.message.as_ref())
            .find(|m| text(m) == dead)
            .expect("this round's dead letter");
        let dlq_id = mine.id.clone().unwrap();
        record(&mut seen, &dlq_id, dead.clone());
        dlq_ids.push(dlq_id.entry_id);
        drop(c);
        broker.kill9();
    }
    for (tier, ids) in [("retry", &retry_ids), ("dead-letter", &dlq_ids)] {
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            ids.len(),
            "a {tier} tier id was handed out twice: {ids:?}"
        );
    }
}

/// Publishes `batches` batches of `per_batch` messages as producer `name`,
/// pipelined (all sent without waiting); returns the receipted ids in
/// batch order.
async fn pipeline(url: String, name: String, batches: u64, per_batch: u64) -> Vec<u64> {
    use ricochet_proto::broker_client::BrokerClient;
    use tokio_stream::wrappers::ReceiverStream;
    let mut client = BrokerClient::new(channel(&url).await);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let send = |r| ProduceRequest { request: Some(r) };
    tx.send(send(produce_request::Request::Open(ProducerOpen {
        topic: "pipelined".into(),
        producer_name: name,
        resend_in_order: false,
    })))
    .await
    .unwrap();
    let mut inbound = client
        .produce(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    inbound.message().await.unwrap();
    let reader = tokio::spawn(async move {
        let mut ids = Vec::new();
        for _ in 0..batches {
            match inbound.message().await.unwrap().and_then(|r| r.response) {
                Some(produce_response::Response::Receipts(r)) => {
                    for receipt in r.receipts {
                        assert!(
                            !receipt.duplicate,
                            "batch {} taken for a duplicate",
                            r.request_id
                        );
                        ids.push(receipt.message_id.unwrap().entry_id);
                    }
                }
                other => panic!("publish failed: {other:?}"),
            }
        }
        ids
    });
    for b in 0..batches {
        let messages = (0..per_batch)
            .map(|i| OutboundMessage {
                payload: vec![1; 10],
                sequence_id: b * per_batch + i,
                ..Default::default()
            })
            .collect();
        let batch = send(produce_request::Request::Send(SendBatch {
            request_id: b,
            messages,
        }));
        // A reader that failed stops taking responses: stop sending then.
        let sent = tokio::time::timeout(std::time::Duration::from_secs(10), tx.send(batch)).await;
        if !matches!(sent, Ok(Ok(()))) {
            break;
        }
    }
    reader.await.unwrap()
}

/// Producers' pipelined batches get ids in the order they were sent, also
/// while batches wait for id reservations (the topic's first, and whenever
/// the producers outrun the reservation ahead of use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_batches_get_ids_in_order_while_ids_are_reserved() {
    const PRODUCERS: usize = 4;
    const BATCHES: u64 = 100;
    const PER_BATCH: u64 = 500;
    let b = ricochet_testkit::InProcessBroker::start_with(|c| {
        c.durability = ricochet_broker::Durability::Interval;
    })
    .await;
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(pipeline(b.url(), format!("p{p}"), BATCHES, PER_BATCH)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        let ids = t.await.unwrap();
        assert_eq!(ids.len() as u64, BATCHES * PER_BATCH);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a producer's ids out of order"
        );
        all.extend(ids);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len() as u64, PRODUCERS as u64 * BATCHES * PER_BATCH);
}
