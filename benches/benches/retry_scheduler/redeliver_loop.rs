//! Part 2: throughput of the fail → retry tier → redeliver loop — a working
//! set of messages kept cycling, every delivery failed at once (by
//! reconsume-later or by one nack frame per received frame).

use std::time::{Duration, Instant};

use ricochet_broker::Durability;
use ricochet_proto::MessageId;

use crate::BoxError;
use crate::broker::Broker;
use crate::raw::{RawConsumer, delay_levels, publish};

#[derive(Debug, Clone, Copy)]
pub(crate) enum Fail {
    /// One `ReconsumeLater` (0 ms delay) per message.
    ReconsumeLater,
    /// One `Redeliver` (nack) frame per received frame, 1 ms delay level.
    NackFrame,
}

pub(crate) async fn redeliver_loop(
    durability: Durability,
    how: Fail,
    working_set: usize,
    secs: u64,
) -> Result<(), BoxError> {
    let broker = Broker::start(durability, 50_000).await?;
    let url = broker.url.clone();
    let topic = "loop";
    let mut c = RawConsumer::subscribe(&url, topic, Some(delay_levels(vec![1], 1_000_000))).await?;
    c.flow(working_set).await?;
    publish(&url, topic, working_set).await?;
    let warmup = Duration::from_millis(500);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + Duration::from_secs(secs);
    let mut counted = 0u64;
    let mut total = 0u64;
    let mut from_retry = 0u64;
    while Instant::now() < end {
        let Some(msgs) = c.messages(Duration::from_secs(10)).await? else {
            return Err(format!("{how:?}: the loop stalled after {total} deliveries").into());
        };
        let now = Instant::now();
        let k = msgs.len();
        total += k as u64;
        from_retry += msgs
            .iter()
            .filter(|m| m.id.as_ref().is_some_and(|id| id.topic.ends_with("-RETRY")))
            .count() as u64;
        if now >= measure_from {
            counted += k as u64;
        }
        let ids: Vec<MessageId> = msgs.into_iter().filter_map(|m| m.id).collect();
        match how {
            Fail::ReconsumeLater => {
                for id in ids {
                    c.reconsume_now(id).await?;
                }
            }
            Fail::NackFrame => c.nack(ids, 0).await?,
        }
        c.flow(k).await?;
    }
    let elapsed = Instant::now().saturating_duration_since(measure_from);
    println!(
        "  {durability:?}, {how:?}: {:.0} msg/s redelivered ({counted} in {elapsed:.2?}; {from_retry} of {total} deliveries from the retry tier)",
        counted as f64 / elapsed.as_secs_f64()
    );
    drop(c);
    broker.stop().await?;
    Ok(())
}
