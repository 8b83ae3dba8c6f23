//! `perf redeliver`: the nack → redelivery loop under a policy. Producers
//! feed the topic, consumers nack each first delivery and ack its
//! redelivery; the run drains before it reports latency and the lateness
//! beyond the policy's first delay.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ricochet_client::{InitialPosition, SubscriptionType};
use ricochet_policy::{Decision, FailureContext, FailureReason};
use tokio::sync::watch;

use super::payload::read_header;
use super::produce::{Feed, start_producers};
use super::report::{Latency, Recorder, Summary, new_histogram, spawn_progress};
use super::{check_count, check_size, next_or_stop, spawn_stopper};
use crate::Ctx;
use crate::args::PerfRedeliverArgs;
use crate::error::{CliError, Result};

/// The delay a policy gives a message's first failure (a nack).
fn first_delay(spec: &ricochet_policy::PolicySpec) -> Result<Duration> {
    let p = spec.build()?;
    Ok(
        match p.decide(&FailureContext::new(1, FailureReason::Nack)) {
            Decision::Redeliver { after, .. } => after,
            Decision::DeadLetter { .. } => Duration::ZERO,
        },
    )
}

pub(super) async fn redeliver(ctx: &mut Ctx<'_>, a: PerfRedeliverArgs) -> Result<Summary> {
    check_size(a.size)?;
    check_count("producers", a.producers)?;
    check_count("consumers", a.consumers)?;
    let delay = first_delay(&a.policy)?;
    if delay.is_zero() {
        return Err(CliError::Usage(format!(
            "policy {} dead-letters on the first failure: nothing would be redelivered",
            a.policy
        )));
    }
    let client = ctx.client().await?;
    let redelivered = Arc::new(Recorder::new());
    let published = Arc::new(Recorder::new());
    let nacks = Arc::new(AtomicU64::new(0));
    let nacked_at: Arc<Mutex<HashMap<u64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    // Producers stop on `stop`; consumers on `drained` (after the redeliveries
    // of what was nacked before the stop have arrived, or a grace period).
    let (stop_tx, stop_rx) = watch::channel(false);
    let (drained_tx, drained_rx) = watch::channel(false);
    let mut consumers = Vec::new();
    for i in 0..a.consumers {
        let mut consumer = client
            .consumer(&a.common.topic)
            .subscription(&a.subscription)
            .subscription_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Latest)
            .consumer_name(format!("perf-redeliver-{}-{i}", std::process::id()))
            .policy(a.policy.clone())
            .subscribe()
            .await?;
        let rec = redelivered.clone();
        let nacks = nacks.clone();
        let nacked_at = nacked_at.clone();
        let mut stop = drained_rx.clone();
        consumers.push(tokio::spawn(async move {
            loop {
                let Some(msg) = next_or_stop(&mut consumer, &mut stop, &rec).await else {
                    break;
                };
                let seq = read_header(msg.payload()).map(|(_, s)| s);
                if msg.delivery_count() == 0 {
                    if let Some(seq) = seq {
                        nacked_at
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(seq, Instant::now());
                    }
                    nacks.fetch_add(1, Ordering::Relaxed);
                    if consumer
                        .nack_with_reason(&msg, "perf redeliver")
                        .await
                        .is_err()
                    {
                        rec.error();
                    }
                } else {
                    let t = seq.and_then(|s| {
                        nacked_at
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&s)
                    });
                    if let Some(t) = t {
                        rec.record(msg.payload().len(), t.elapsed());
                    }
                    if consumer.ack(&msg).await.is_err() {
                        rec.error();
                    }
                }
            }
            let _ = consumer.close().await;
        }));
    }
    let feed = Feed {
        rate_per_producer: a.rate as f64 / a.producers as f64,
        size: a.size,
        max_pending: 1000,
        budget: None,
        next_seq: Arc::new(AtomicU64::new(0)),
    };
    let producers = start_producers(
        &client,
        &a.common.topic,
        a.producers,
        &feed,
        &published,
        &stop_rx,
    )
    .await?;
    let start = Instant::now();
    let stopper = spawn_stopper(a.common.duration, stop_tx);
    let progress = spawn_progress(
        "redelivered",
        redelivered.clone(),
        Some(published.clone()),
        drained_rx.clone(),
    );
    for t in producers {
        let _ = t.await;
    }
    // Drain: wait for every published message to have been nacked and
    // redelivered, up to the policy delay plus 5 s.
    let grace = Instant::now() + delay + Duration::from_secs(5);
    loop {
        let outstanding = nacked_at.lock().unwrap_or_else(|p| p.into_inner()).len();
        let first_seen = nacks.load(Ordering::Relaxed);
        let sent = published.count.load(Ordering::Relaxed);
        if (outstanding == 0 && first_seen >= sent) || Instant::now() >= grace {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = start.elapsed();
    let _ = drained_tx.send(true);
    stopper.abort();
    for t in consumers {
        let _ = t.await;
    }
    let _ = progress.await;
    let outstanding = nacked_at.lock().unwrap_or_else(|p| p.into_inner()).len();
    let mut s = Summary::new(
        "redeliver",
        &a.common.topic,
        &redelivered,
        elapsed,
        "nack -> redelivery (includes the policy delay)",
    );
    let lateness = {
        let total = redelivered.total();
        let d = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        let mut late = new_histogram();
        for v in total.iter_recorded() {
            late.saturating_record_n(
                v.value_iterated_to().saturating_sub(d).max(1),
                v.count_at_value(),
            );
        }
        Latency::of(&late)
    };
    s.set("policy", a.policy.to_string())
        .set(
            "policy_delay_ms",
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
        )
        .set("producers", a.producers)
        .set("consumers", a.consumers)
        .set("size", a.size)
        .set(
            "rate",
            if a.rate == 0 {
                serde_json::Value::from("max")
            } else {
                a.rate.into()
            },
        )
        .set("published", published.count.load(Ordering::Relaxed))
        .set("nacked", nacks.load(Ordering::Relaxed))
        .set("not_redelivered", outstanding as u64);
    s.lateness_ms = Some(lateness);
    Ok(s)
}
