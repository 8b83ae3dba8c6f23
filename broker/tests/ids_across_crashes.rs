//! Entry ids across crashes in `interval` durability: a receipt (or a
//! delivery) may name a message that a SIGKILL then loses, and that id must
//! never name another message. The broker runs as a child process with a
//! one-hour flush interval (so nothing is flushed by the timer before the
//! kill), is killed right after handing out ids, and restarted, several
//! times; every id it hands out — on the topic, its retry tier and its
//! dead-letter tier — must be new, and whatever is delivered under an id
//! must be the message first receipted or delivered under it.

mod common;
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
