//! Broker throughput over loopback (a bench binary; prints its figures).
//!
//! Publish: `PRODUCERS` producers, each pipelining batches of `BATCH`
//! 100-byte messages with up to `IN_FLIGHT` batches awaiting receipts, in both
//! durability modes. Consume+ack: one Shared consumer with a 1000-message
//! receiver queue, acking in groups of 500 ids. Broker and load generator share
//! this machine's cores, as in the setup.
//!
//! `cargo bench -p ricochet-benches --bench broker_throughput`
//! (`RICOCHET_BENCH_MESSAGES` overrides the message count.)

use ricochet_broker::Durability;
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

// The same allocator as the broker binary (and its huge pages off: `main`).
#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

const PRODUCERS: usize = 4;
const BATCH: usize = 100;
const IN_FLIGHT: usize = 16;
const PAYLOAD: usize = 100;

async fn publish(url: &str, topic: &str, producer: usize, messages: usize) {
    let ch = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = BrokerClient::new(ch);
    let (tx, rx) = mpsc::channel(IN_FLIGHT * 2);
    tx.send(ProduceRequest {
        request: Some(produce_request::Request::Open(ProducerOpen {
            topic: topic.into(),
            producer_name: format!("bench-{producer}"),
            resend_in_order: false,
        })),
    })
    .await
    .unwrap();
    let mut inbound = client
        .produce(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    inbound.message().await.unwrap();
    let window = Arc::new(Semaphore::new(IN_FLIGHT));
    let batches = messages / BATCH;
    let w = window.clone();
    let reader = tokio::spawn(async move {
        for _ in 0..batches {
            match inbound.message().await.unwrap().and_then(|r| r.response) {
                Some(produce_response::Response::Receipts(_)) => w.add_permits(1),
                other => panic!("publish failed: {other:?}"),
            }
        }
    });
    let payload = vec![7u8; PAYLOAD];
    let mut seq = 0u64;
    for b in 0..batches {
        window.acquire().await.unwrap().forget();
        let messages = (0..BATCH)
            .map(|_| {
                seq += 1;
                OutboundMessage {
                    payload: payload.clone(),
                    sequence_id: seq,
                    ..Default::default()
                }
            })
            .collect();
        tx.send(ProduceRequest {
            request: Some(produce_request::Request::Send(SendBatch {
                request_id: b as u64,
                messages,
            })),
        })
        .await
        .unwrap();
    }
    reader.await.unwrap();
}

async fn consume_all(url: &str, topic: &str, total: usize) {
    let ch = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = BrokerClient::new(ch);
    let (tx, rx) = mpsc::channel(64);
    let send = |r| ConsumeRequest { request: Some(r) };
    tx.send(send(consume_request::Request::Subscribe(Subscribe {
        topic: topic.into(),
        subscription: "bench".into(),
        subscription_type: SubscriptionType::Shared as i32,
        initial_position: InitialPosition::Earliest as i32,
        ..Default::default()
    })))
    .await
    .unwrap();
    let mut inbound = client
        .consume(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(send(consume_request::Request::Flow(Flow { permits: 1000 })))
        .await
        .unwrap();
    let mut got = 0;
    let mut since_flow = 0u32;
    let mut acks = Vec::with_capacity(500);
    while got < total {
        let Some(frame) = inbound.message().await.unwrap() else {
            panic!("stream ended")
        };
        if let Some(consume_response::Response::Messages(b)) = frame.response {
            for m in b.messages {
                got += 1;
                since_flow += 1;
                acks.push(m.id.unwrap());
                if acks.len() == 500 || got == total {
                    let ids = std::mem::take(&mut acks);
                    tx.send(send(consume_request::Request::Ack(Ack {
                        request_id: 0,
                        ack_type: 0,
                        ids,
                    })))
                    .await
                    .unwrap();
                }
            }
            if since_flow >= 500 {
                tx.send(send(consume_request::Request::Flow(Flow {
                    permits: since_flow,
                })))
                .await
                .unwrap();
                since_flow = 0;
            }
        }
    }
}

async fn run(mode: Durability, messages: usize) {
    let broker = InProcessBroker::start_with(|c| c.durability = mode).await;
    let url = broker.url();
    let per = messages / PRODUCERS;
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let url = url.clone();
            tokio::spawn(async move { publish(&url, "bench", p, per).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let publish_secs = t0.elapsed().as_secs_f64();
    let published = per / BATCH * BATCH * PRODUCERS;
    let flushes = broker.core.flusher.flush_count();
    let t1 = Instant::now();
    consume_all(&url, "bench", published).await;
    let consume_secs = t1.elapsed().as_secs_f64();
    println!(
        "{mode:?}: publish {published} x {PAYLOAD} B, {PRODUCERS} producers, batch {BATCH}, {IN_FLIGHT} in flight: \
         {:.0} msg/s ({:.1} MB/s, {flushes} flushes) | consume+ack: {:.0} msg/s",
        published as f64 / publish_secs,
        published as f64 * PAYLOAD as f64 / publish_secs / 1e6,
        published as f64 / consume_secs,
    );
    broker.shutdown().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn main() {
    // As the broker binary does at start (transparent huge pages off).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    // `cargo bench` passes `--bench`; nothing else to parse.
    let messages: usize = std::env::var("RICOCHET_BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        run(Durability::Interval, messages).await;
        run(Durability::Sync, messages).await;
    });
}
