//! `perf produce`: paced producers publishing stamped payloads, measuring
//! publish latency (send → receipt). The producer loop is shared with
//! `perf redeliver`, which feeds its topic the same way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ricochet_client::{Client, Producer};
use tokio::sync::{Semaphore, mpsc, watch};

use super::payload::make_payload;
use super::report::{Recorder, Summary};
use super::{check_count, check_size, run_until_stopped};
use crate::Ctx;
use crate::args::PerfProduceArgs;
use crate::error::Result;

/// What one producer task needs.
#[derive(Debug, Clone)]
pub(super) struct Feed {
    pub(super) rate_per_producer: f64,
    pub(super) size: usize,
    pub(super) max_pending: usize,
    /// Messages left over all producers; `None` means no limit.
    pub(super) budget: Option<Arc<AtomicU64>>,
    pub(super) next_seq: Arc<AtomicU64>,
}

/// Sends until `stop` or the budget runs out, pacing to the rate; a second
/// task awaits the receipts in order and records publish latency.
async fn producer_loop(
    producer: Producer,
    feed: Feed,
    rec: Arc<Recorder>,
    mut stop: watch::Receiver<bool>,
) {
    let window = Arc::new(Semaphore::new(feed.max_pending.max(1)));
    let (tx, mut rx) = mpsc::unbounded_channel::<(
        std::pin::Pin<
            Box<dyn Future<Output = ricochet_client::Result<ricochet_client::MessageId>> + Send>,
        >,
        Instant,
        tokio::sync::OwnedSemaphorePermit,
    )>();
    let size = feed.size;
    let rec2 = rec.clone();
    let receipts = tokio::spawn(async move {
        while let Some((fut, t0, permit)) = rx.recv().await {
            match fut.await {
                Ok(_) => rec2.record(size, t0.elapsed()),
                Err(_) => rec2.error(),
            }
            drop(permit);
        }
    });
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        if *stop.borrow() {
            break;
        }
        if let Some(b) = &feed.budget
            && b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_err()
        {
            break;
        }
        if feed.rate_per_producer > 0.0 {
            let due = start + Duration::from_secs_f64(sent as f64 / feed.rate_per_producer);
            if due > Instant::now() {
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
        let permit = tokio::select! {
            p = window.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let seq = feed.next_seq.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let fut = match producer.send_async(make_payload(feed.size, seq)).await {
            Ok(receipt) => receipt,
            Err(e) => {
                let failed: futures::future::BoxFuture<'static, ricochet_client::Result<_>> =
                    Box::pin(async move { Err(e) });
                if tx.send((failed, t0, permit)).is_err() {
                    break;
                }
                sent += 1;
                continue;
            }
        };
        if tx.send((Box::pin(fut), t0, permit)).is_err() {
            break;
        }
        sent += 1;
    }
    drop(tx);
    let _ = receipts.await;
    let _ = producer.close().await;
}

/// Starts `n` producers on `topic`; returns their tasks.
pub(super) async fn start_producers(
    client: &Client,
    topic: &str,
    n: usize,
    feed: &Feed,
    rec: &Arc<Recorder>,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let producer = client
            .producer(topic)
            .name(format!("perf-{}-{i}", std::process::id()))
            .create()
            .await?;
        tasks.push(tokio::spawn(producer_loop(
            producer,
            feed.clone(),
            rec.clone(),
            stop.clone(),
        )));
    }
    Ok(tasks)
}

pub(super) async fn produce(ctx: &mut Ctx<'_>, a: PerfProduceArgs) -> Result<Summary> {
    check_size(a.size)?;
    check_count("producers", a.producers)?;
    check_count("max-pending", a.max_pending)?;
    let client = ctx.client().await?;
    if a.partitions > 0 {
        crate::partitions::ensure(&client, &a.common.topic, a.partitions).await?;
    }
    let rec = Arc::new(Recorder::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let feed = Feed {
        rate_per_producer: a.rate as f64 / a.producers as f64,
        size: a.size,
        max_pending: a.max_pending,
        budget: (a.messages > 0).then(|| Arc::new(AtomicU64::new(a.messages))),
        next_seq: Arc::new(AtomicU64::new(0)),
    };
    let tasks =
        start_producers(&client, &a.common.topic, a.producers, &feed, &rec, &stop_rx).await?;
    let elapsed = run_until_stopped(
        "published",
        a.common.duration,
        &rec,
        (stop_tx, stop_rx),
        tasks,
    )
    .await;
    let mut s = Summary::new(
        "produce",
        &a.common.topic,
        &rec,
        elapsed,
        "publish (send -> receipt)",
    );
    s.set("producers", a.producers)
        .set("size", a.size)
        .set(
            "rate",
            if a.rate == 0 {
                serde_json::Value::from("max")
            } else {
                a.rate.into()
            },
        )
        .set("max_pending", a.max_pending);
    Ok(s)
}
