//! Part 1c: short delays end to end — retries due sooner than a flush
//! takes, 2 000 messages nacked 10 per frame every 5 ms on one delay level.

use std::time::Duration;

use ricochet_broker::Durability;
use ricochet_testkit::now_us;

use crate::broker::Broker;
use crate::lateness::Lateness;
use crate::raw::failing_consumer;
use crate::{BoxError, debug};

/// Retries due sooner than a flush takes: the timer must not wait for the
/// move's fsync before it starts counting.
pub(crate) async fn short_delay_lateness(
    durability: Durability,
    delay_ms: u64,
) -> Result<(), BoxError> {
    const N: usize = 2_000;
    let broker = Broker::start(durability, N + 1_000).await?;
    let url = broker.url.clone();
    let topic = "short";
    let (mut c, ids) = failing_consumer(&url, topic, delay_ms, N).await?;
    let mut late = Lateness::new();
    let mut redelivered = Vec::with_capacity(N);
    let mut very_late = Vec::new();
    let mut chunks = ids.chunks(10);
    let mut next_nack = tokio::time::Instant::now();
    let mut nacking = true;
    while redelivered.len() < N {
        // Interleave: nack the next frame when its time comes, read meanwhile.
        if nacking && tokio::time::Instant::now() >= next_nack {
            match chunks.next() {
                Some(chunk) => c.nack(chunk.to_vec(), 0).await?,
                None => nacking = false,
            }
            next_nack += Duration::from_millis(5);
            continue;
        }
        let wait = if nacking {
            next_nack.saturating_duration_since(tokio::time::Instant::now())
        } else {
            Duration::from_secs(30)
        };
        let Some(msgs) = c.messages(wait).await? else {
            if nacking {
                continue;
            }
            break;
        };
        let at = now_us();
        for m in msgs {
            if m.id.as_ref().is_some_and(|id| id.topic.ends_with("-RETRY")) {
                late.record(at, m.deliver_at_ms);
                if debug() && at > m.deliver_at_ms * 1000 + 20_000 {
                    very_late.push((redelivered.len(), (at - m.deliver_at_ms * 1000) / 1000));
                }
                redelivered.extend(m.id);
            }
        }
    }
    late.print(&format!("{durability:?}, {delay_ms} ms delay"));
    if !very_late.is_empty() {
        println!(
            "    {} more than 20 ms late (redelivery index, ms late): first {:?}, last {:?}",
            very_late.len(),
            very_late.first(),
            very_late.last()
        );
    }
    for chunk in redelivered.chunks(1_000) {
        c.ack(chunk.to_vec(), 0).await?;
    }
    drop(c);
    broker.stop().await?;
    Ok(())
}
