//! Backpressure on the consumer stream (`max_pending_requests_per_consumer`):
//! a client that floods its stream with nacks without reading is held back
//! by the broker not reading it (the subscription's queue stays within the
//! bound, the client's sends stall), other consumers are served meanwhile,
//! and once the client reads every request is answered. A client that reads
//! while it floods completes.

use crate::common::*;
use futures::StreamExt as _;
use ricochet_broker::{SubscriptionName, TopicName};
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const BOUND: u32 = 64;
const TOPIC: &str = "persistent://public/default/flood";
/// Each nack's reason text: frames of about 1 kB, so the HTTP/2 windows
/// (about 1.4 MB between client and broker) hold ~1 400 of them.
const DETAIL: &str = concat!(
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
    "a reason text of a hundred bytes, repeated ten times to make each nack frame about one kilobyte",
);

/// The frames of a consumer that subscribes to [`TOPIC`] (subscription
/// `flood`) and then sends `frame(rid)` for request ids 1..=n; `pulled`
/// counts the frames the transport took.
fn flood(
    n: u64,
    pulled: Arc<AtomicU64>,
    frame: fn(u64) -> consume_request::Request,
) -> impl futures::Stream<Item = ConsumeRequest> + Send + 'static {
    let subscribe = ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(Subscribe {
            topic: TOPIC.into(),
            subscription: "flood".into(),
            subscription_type: SubscriptionType::Shared as i32,
            initial_position: InitialPosition::Earliest as i32,
            ..Default::default()
        })),
    };
    let frames = futures::stream::iter(1..=n).map(move |rid| {
        pulled.fetch_add(1, Ordering::Relaxed);
        ConsumeRequest {
            request: Some(frame(rid)),
        }
    });
    futures::stream::once(async { subscribe }).chain(frames)
}

/// A nack of one never-delivered message, with [`DETAIL`].
fn nack(rid: u64) -> consume_request::Request {
    consume_request::Request::Redeliver(Redeliver {
        request_id: rid,
        messages: vec![FailedDelivery {
            id: Some(MessageId {
                topic: TOPIC.into(),
                entry_id: 1_000_000 + rid,
            }),
            detail: DETAIL.into(),
            ..Default::default()
        }],
    })
}

/// An ack of an unknown type (refused before it reaches the
/// subscription), of a message id with a topic name padded to 1 kB.
fn refused_ack(rid: u64) -> consume_request::Request {
    consume_request::Request::Ack(Ack {
        request_id: rid,
        ack_type: 99,
        ids: vec![MessageId {
            topic: DETAIL.into(),
            entry_id: rid,
        }],
    })
}

/// A channel to `url` whose HTTP/2 receive windows are 64 KiB (hyper's
/// client default, 2 MiB per stream, would hold ~12 000 of the flood's
/// answers before the broker's writer stalls).
async fn small_windows(url: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .initial_stream_window_size(64 << 10)
        .initial_connection_window_size(64 << 10)
        .connect()
        .await
        .expect("connect")
}

/// Waits until `pulled` has not moved for `quiet` (at most `wait`); its value.
async fn settled(pulled: &AtomicU64, quiet: Duration, wait: Duration) -> u64 {
    let deadline = tokio::time::Instant::now() + wait;
    let mut last = pulled.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(quiet).await;
        let now = pulled.load(Ordering::Relaxed);
        if now == last || tokio::time::Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

/// Once the transport has stopped taking a flood of `n` frames that nobody
/// reads (see [`settled`]): how many it took, which must be under half.
async fn held_back(pulled: &AtomicU64, n: u64) -> u64 {
    let taken = settled(pulled, Duration::from_millis(500), Duration::from_secs(60)).await;
    assert!(
        taken < n / 2,
        "the transport took {taken} of {n} frames from a client that reads nothing"
    );
    taken
}

/// Reads `stream` until every request id in 1..=n is answered (each once).
async fn all_answered(stream: &mut tonic::Streaming<ConsumeResponse>, n: u64, wait: Duration) {
    let mut answered = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + wait;
    while (answered.len() as u64) < n {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let frame = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} answered in {wait:?}", answered.len()))
            .expect("stream open")
            .expect("stream open");
        if let Some(consume_response::Response::Result(r)) = frame.response {
            assert!(answered.insert(r.request_id), "{r:?} answered twice");
        }
    }
    assert_eq!(answered.first().copied(), Some(1));
    assert_eq!(answered.last().copied(), Some(n));
}

/// A nack flood without reading: the broker stops reading the stream (the
/// client's transport stops taking frames long before the flood's end),
/// the subscription's queue never held more than the bound, another
/// subscription's consumer is served meanwhile; once the flooding client
/// reads, every nack is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_without_reads_is_held_back_and_answered_once_read() {
    let b = InProcessBroker::start_with(|c| c.max_pending_requests_per_consumer = BOUND).await;
    let url = b.url();
    let mut p = RawProducer::open(&url, TOPIC, "p").await.unwrap();
    p.send(&["before"]).await;
    const N: u64 = 20_000;
    let pulled = Arc::new(AtomicU64::new(0));
    let mut client = BrokerClient::new(small_windows(&url).await);
    let mut flood = client
        .consume(flood(N, pulled.clone(), nack))
        .await
        .expect("subscribed")
        .into_inner();
    // Not read: the broker's HTTP/2 window and ours buffer some frames,
    // then the transport stops taking more.
    let taken = held_back(&pulled, N).await;
    let handle = b
        .core
        .subscription(
            &TopicName::parse(TOPIC).unwrap(),
            &SubscriptionName::parse("flood").unwrap(),
        )
        .await
        .expect("the flooded subscription");
    let stats = handle.stats(b.core.storage.clone()).await.unwrap();
    eprintln!(
        "taken {taken} of {N} frames; queue peak {} commands",
        stats.queued_commands_peak
    );
    // Requests hold at least one unit each until handled; a few other
    // commands (this stats call, durable-write notices) may queue beside them.
    assert!(
        stats.queued_commands_peak <= u64::from(BOUND) + 4,
        "the subscription's queue held {} commands (bound {BOUND})",
        stats.queued_commands_peak
    );
    // Another subscription is served while the flood is held back.
    let mut other = RawConsumer::simple(&url, TOPIC, "other", SubscriptionType::Shared).await;
    other.flow(10).await;
    p.send(&["during"]).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = other.next(WAIT).await.expect("served during the flood");
        got.push(String::from_utf8(m.payload).unwrap());
    }
    assert_eq!(got, ["before", "during"]);
    // Reading now: every nack is answered, none lost.
    all_answered(&mut flood, N, Duration::from_secs(120)).await;
    assert_eq!(pulled.load(Ordering::Relaxed), N);
}

/// A client that floods and reads at once completes: the broker waits for
/// it to read only while it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_that_reads_completes() {
    let b = InProcessBroker::start_with(|c| c.max_pending_requests_per_consumer = 16).await;
    let url = b.url();
    const N: u64 = 20_000;
    let pulled = Arc::new(AtomicU64::new(0));
    let mut client = BrokerClient::new(channel(&url).await);
    let mut stream = client
        .consume(flood(N, pulled.clone(), nack))
        .await
        .expect("subscribed")
        .into_inner();
    all_answered(&mut stream, N, Duration::from_secs(120)).await;
}

/// Refused requests (answered by the stream's reader itself, never queued
/// for the subscription) are held back the same way when not read, and
/// every one is answered once the client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refused_requests_is_held_back_too() {
    let b = InProcessBroker::start_with(|c| c.max_pending_requests_per_consumer = BOUND).await;
    let url = b.url();
    const N: u64 = 20_000;
    let pulled = Arc::new(AtomicU64::new(0));
    let mut client = BrokerClient::new(small_windows(&url).await);
    let mut stream = client
        .consume(flood(N, pulled.clone(), refused_ack))
        .await
        .expect("subscribed")
        .into_inner();
    let taken = held_back(&pulled, N).await;
    eprintln!("refused: taken {taken} of {N} frames");
    all_answered(&mut stream, N, Duration::from_secs(120)).await;
}

/// Permits first (so the flooding consumer is sent the topic's message),
/// then nacks.
fn flow_then_nack(rid: u64) -> consume_request::Request {
    match rid {
        1 => consume_request::Request::Flow(Flow { permits: 10 }),
        _ => nack(rid),
    }
}

/// A client that goes away while its stream is throttled is removed like
/// any other (the reader stops waiting for room when the stream is gone):
/// the message it held goes to the subscription's other consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_client_that_goes_away_is_removed() {
    let b = InProcessBroker::start_with(|c| c.max_pending_requests_per_consumer = BOUND).await;
    let url = b.url();
    let mut p = RawProducer::open(&url, TOPIC, "p").await.unwrap();
    p.send(&["held"]).await;
    const N: u64 = 20_000;
    let pulled = Arc::new(AtomicU64::new(0));
    // The flooding client runs on a runtime of its own: dropping that
    // runtime closes its connection, as a client process exiting would.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let flooder = std::thread::spawn({
        let (url, pulled) = (url.clone(), pulled.clone());
        move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let mut client = BrokerClient::new(small_windows(&url).await);
                let _unread = client
                    .consume(flood(N, pulled, flow_then_nack))
                    .await
                    .expect("subscribed");
                let _ = stopped.await;
            });
        }
    });
    held_back(&pulled, N).await;
    let handle = b
        .core
        .subscription(
            &TopicName::parse(TOPIC).unwrap(),
            &SubscriptionName::parse("flood").unwrap(),
        )
        .await
        .expect("the flooded subscription");
    let stats = handle.stats(b.core.storage.clone()).await.unwrap();
    assert_eq!(
        stats.unacked, 1,
        "the message is held by the flooding consumer"
    );
    let mut other = RawConsumer::simple(&url, TOPIC, "flood", SubscriptionType::Shared).await;
    other.flow(10).await;
    stop.send(()).unwrap();
    tokio::task::spawn_blocking(move || flooder.join().unwrap())
        .await
        .unwrap();
    let m = other
        .next(Duration::from_secs(10))
        .await
        .expect("the flooding consumer's message, once it is gone");
    assert_eq!(m.payload, b"held");
    let stats = handle.stats(b.core.storage.clone()).await.unwrap();
    assert_eq!(stats.consumers.len(), 1, "{:?}", stats.consumers);
}
