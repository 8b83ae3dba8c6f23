//! Retry-tier references end to end (issue #21 item 2): a retry refers to
//! its topic's entry instead of copying it, and to a consumer the retry
//! tier reads exactly as a copy would (payload, key, the user's properties,
//! `REAL_TOPIC`, `ORIGIN_MESSAGE_ID`, `RECONSUMETIMES`, `DELAY_TIME`).
//! The topic's segments a parked retry refers to stay while consumers move
//! on; a retention trim of such a segment first replaces the references
//! with copies; and a kill -9 in the middle of that (test failpoints
//! `refs.trim.after_copy`: copies durable, segment not yet dropped;
//! `log.trim.after_start`: the segment's files being deleted) loses no
//! retry.

use crate::common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::retention_client::RetentionClient;
use ricochet_proto::*;
use ricochet_testkit::{BrokerProcess, InProcessBroker};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const TOPIC: &str = "persistent://public/default/refs";
const WAIT: Duration = Duration::from_secs(30);
/// Messages published (segments of 10: three of them).
const N: u64 = 30;
/// The first `PARKED` go to the retry tier; the rest are acked.
const PARKED: u64 = 10;

type Seen = (String, String, BTreeMap<String, String>);

/// Message `i` as published.
fn outbound(i: u64) -> OutboundMessage {
    OutboundMessage {
        payload: format!("m{i}").into_bytes(),
        key: format!("k{i}"),
        properties: [("user".to_owned(), i.to_string())].into(),
        sequence_id: i + 1,
        ..Default::default()
    }
}

/// What the retry tier must deliver for message `i`: what a copy holds.
fn expected(i: u64, delay_ms: u64) -> Seen {
    let props = [
        ("user", i.to_string()),
        ("REAL_TOPIC", TOPIC.to_owned()),
        ("ORIGIN_MESSAGE_ID", format!("{TOPIC}:{i}")),
        ("RECONSUMETIMES", "1".to_owned()),
        ("DELAY_TIME", delay_ms.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    (format!("m{i}"), format!("k{i}"), props)
}

fn seen(m: &Message) -> Seen {
    (
        text(m),
        m.key.clone(),
        m.properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    )
}

async fn consumer(url: &str) -> RawConsumer {
    RawConsumer::subscribe(
        url,
        TOPIC,
        "s",
        SubOpts {
            sub_type: SubscriptionType::Shared,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Publishes `N` messages; consumer `s` parks the first `PARKED` in the
/// retry tier for `delay_ms` and acks the others. Returns the consumer.
async fn park(url: &str, delay_ms: u64) -> RawConsumer {
    let mut c = consumer(url).await;
    c.flow(N as u32).await;
    let mut p = RawProducer::open(url, TOPIC, "p").await.unwrap();
    for i in 0..N {
        p.send_batch(vec![outbound(i)]).await;
    }
    let got = c.take(N as usize, WAIT).await;
    assert_eq!(got.len(), N as usize);
    for (i, m) in got.iter().take(PARKED as usize).enumerate() {
        c.reconsume_later(
            m.id.clone().unwrap(),
            reconsume_later::Delay::DelayMs(delay_ms),
            i as u64 + 1,
        )
        .await;
        assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    }
    let rest = got[PARKED as usize..]
        .iter()
        .map(|m| m.id.clone().unwrap())
        .collect();
    c.ack(rest, 100).await;
    c
}

/// The `PARKED` retries as the consumer receives them, by origin.
async fn retries(c: &mut RawConsumer) -> Vec<Seen> {
    c.flow(PARKED as u32).await;
    let got = c.take(PARKED as usize, WAIT).await;
    assert_eq!(got.len(), PARKED as usize, "every retry delivered");
    let mut out: Vec<Seen> = got.iter().map(seen).collect();
    out.sort_by_key(|s| s.2.get("user").and_then(|u| u.parse::<u64>().ok()));
    for m in &got {
        assert_eq!(m.id.as_ref().unwrap().topic, format!("{TOPIC}-s-RETRY"));
    }
    out
}

fn all_expected(delay_ms: u64) -> Vec<Seen> {
    (0..PARKED).map(|i| expected(i, delay_ms)).collect()
}

async fn first_entry(url: &str) -> u64 {
    AdminClient::new(channel(url).await)
        .topic_stats(TopicRequest {
            topic: TOPIC.into(),
        })
        .await
        .expect("topic stats")
        .into_inner()
        .first_entry_id
}

/// Limits the topic to one byte: retention drops every sealed segment.
async fn retain_nothing(url: &str) {
    RetentionClient::new(channel(url).await)
        .set_retention(SetRetentionRequest {
            namespace: String::new(),
            topic: TOPIC.into(),
            policy: Some(RetentionPolicy {
                max_size_bytes: Some(1),
                ..Default::default()
            }),
        })
        .await
        .expect("set retention");
}

async fn first_entry_reaches(url: &str, at_least: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while first_entry(url).await < at_least {
        assert!(tokio::time::Instant::now() < deadline, "never trimmed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn broker() -> InProcessBroker {
    InProcessBroker::start_in(tempfile::tempdir().unwrap(), |c| {
        c.segment_entries = 10;
        c.retention_interval = Duration::from_millis(100);
    })
    .await
}

#[tokio::test]
async fn a_retry_reads_as_its_copy_and_holds_the_segment_it_refers_to() {
    let b = broker().await;
    let url = b.url();
    let mut c = park(&url, 1500).await;
    // Every subscription has passed entries 0..30, but retries still refer
    // to segment 0: a consumer-driven drop keeps it (without references
    // segments 0 and 1 would go, the first entry becoming 20).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(first_entry(&url).await, 0);
    assert_eq!(retries(&mut c).await, all_expected(1500));
}

#[tokio::test]
async fn retention_copies_retries_before_dropping_the_segment_they_refer_to() {
    let b = broker().await;
    let url = b.url();
    let mut c = park(&url, 2500).await;
    retain_nothing(&url).await;
    first_entry_reaches(&url, 20).await;
    assert_eq!(retries(&mut c).await, all_expected(2500));
}

async fn spawn_with(dir: &Path, config: &Path, failpoint: Option<&str>) -> BrokerProcess {
    let mut o = options()
        .rust_log("error")
        .args(["--config".as_ref(), config.as_os_str()]);
    if let Some(f) = failpoint {
        o = o.env("RICOCHET_FAILPOINT", f);
    }
    BrokerProcess::spawn(dir, &o).await
}

/// Polls `url` until the broker behind it stops answering.
async fn died(url: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let alive = match tonic::transport::Endpoint::from_shared(url.to_owned())
            .unwrap()
            .connect()
            .await
        {
            Ok(ch) => AdminClient::new(ch)
                .topic_stats(TopicRequest {
                    topic: TOPIC.into(),
                })
                .await
                .is_ok(),
            Err(_) => false,
        };
        if !alive {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the broker should have died at its failpoint"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn crash_in_copy_on_trim(failpoint: &str) {
    const DELAY: u64 = 4000;
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("broker.toml");
    std::fs::write(
        &config,
        "segment_entries = 10\nretention_interval = \"100ms\"\n",
    )
    .unwrap();
    let b = spawn_with(data.path(), &config, Some(failpoint)).await;
    let c = park(b.url(), DELAY).await;
    retain_nothing(b.url()).await;
    died(b.url()).await;
    drop(c);
    b.kill9(); // reaps it (it is already gone)
    let b = spawn_with(data.path(), &config, None).await;
    // The trim is redone (or finished) after the restart; every retry is
    // delivered whole, whichever form it was in when the broker died.
    first_entry_reaches(b.url(), 20).await;
    let mut c = consumer(b.url()).await;
    assert_eq!(retries(&mut c).await, all_expected(DELAY), "{failpoint}");
    drop(c);
    b.stop().await;
}

#[tokio::test]
async fn a_crash_after_the_copies_are_written_loses_no_retry() {
    crash_in_copy_on_trim("refs.trim.after_copy").await;
}

#[tokio::test]
async fn a_crash_while_the_segment_files_go_loses_no_retry() {
    crash_in_copy_on_trim("log.trim.after_start").await;
}
