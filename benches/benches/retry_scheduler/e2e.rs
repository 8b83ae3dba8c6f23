//! Part 1b: lateness end to end — an in-process broker, a raw consumer on a
//! one-level delay policy nacking every message in paced frames over the
//! spread; lateness is the receive time of each retry copy minus the
//! `deliver_at_ms` the broker stored.

use std::time::Duration;

use ricochet_broker::Durability;
use ricochet_proto::props;
use ricochet_testkit::{now_ms, now_us};

use crate::broker::Broker;
use crate::lateness::Lateness;
use crate::raw::failing_consumer;
use crate::{BoxError, debug, env_or};

pub(crate) async fn e2e_lateness(
    durability: Durability,
    n: usize,
    spread_ms: u64,
) -> Result<(), BoxError> {
    let broker = Broker::start(durability, n + 1_000).await?;
    let url = broker.url.clone();
    let topic = "late";
    // Every nack waits the one level: the spread plus a lead long enough for
    // the broker to have moved all n into the retry tier before the first one
    // is due (it moves about 20 000 messages a second here).
    let lead_ms = 1_000 + n as u64 / 15;
    let delay_ms = spread_ms + lead_ms;
    let (mut c, ids) = failing_consumer(&url, topic, delay_ms, n).await?;
    // Nack in paced frames over the spread.
    // Frames of 100 ids by default, as a client's grouped nacks; all ids of a
    // frame share one due time, so a frame is a burst due at one instant.
    let frames = env_or("RS_E2E_FRAMES", n.div_ceil(100)).clamp(1, n);
    let per_frame = n.div_ceil(frames);
    let pace = Duration::from_millis(spread_ms) / frames as u32;
    let t0 = tokio::time::Instant::now();
    let mut nacked_until = 0;
    for (i, chunk) in ids.chunks(per_frame).enumerate() {
        tokio::time::sleep_until(t0 + pace * i as u32).await;
        c.nack(chunk.to_vec(), i as u64 + 1).await?;
        nacked_until = now_ms();
    }
    let frames_sent = ids.chunks(per_frame).count();
    let mut late = Lateness::new();
    let mut first_due = u64::MAX;
    let mut got = 0;
    let mut wrong_delay = 0;
    let mut worst = Vec::new();
    let mut redelivered = Vec::with_capacity(n);
    while got < n {
        let Some(msgs) = c.messages(Duration::from_millis(delay_ms + 30_000)).await? else {
            break;
        };
        let at = now_us();
        for m in msgs {
            if !m.id.as_ref().is_some_and(|id| id.topic.ends_with("-RETRY")) {
                continue;
            }
            if m.properties.get(props::DELAY_TIME) != Some(&delay_ms.to_string()) {
                wrong_delay += 1;
            }
            first_due = first_due.min(m.deliver_at_ms);
            late.record(at, m.deliver_at_ms);
            if let Some(id) = m.id {
                redelivered.push(id);
            }
            if debug() {
                worst.push((at.saturating_sub(m.deliver_at_ms * 1000), m.deliver_at_ms));
            }
            got += 1;
        }
    }
    let sent_ahead = first_due as i64 - nacked_until as i64;
    let moved_ahead = first_due as i64 - c.last_confirmed_ms as i64;
    if c.confirmed < frames_sent {
        println!(
            "  NOTE: {} of {frames_sent} nack frames confirmed",
            c.confirmed
        );
    }
    println!(
        "  {durability:?}, {n} retries: last nack sent {sent_ahead} ms and moved (confirmed) {moved_ahead} ms before the first was due; {got} redelivered{}",
        if wrong_delay > 0 {
            format!(", {wrong_delay} with a wrong DELAY_TIME")
        } else {
            String::new()
        }
    );
    late.print(&format!("{n} end to end ({durability:?}, {})", broker.kind));
    if debug() {
        worst.sort_unstable();
        let from = worst.len().saturating_sub(5);
        for (us, due) in &worst[from..] {
            println!(
                "    {us} us late, due {} ms after the first",
                due - first_due
            );
        }
        let mut per_100ms = std::collections::BTreeMap::new();
        for (us, due) in &worst {
            if *us > 20_000 {
                *per_100ms.entry((due - first_due) / 100 * 100).or_insert(0) += 1;
            }
        }
        println!("    > 20 ms late, by due offset (ms): {per_100ms:?}");
    }
    // Ack everything, so closing the consumer leaves nothing to redeliver.
    let before = c.confirmed;
    let chunks = redelivered.chunks(1_000).count();
    for (i, chunk) in redelivered.chunks(1_000).enumerate() {
        c.ack(chunk.to_vec(), 1_000_000 + i as u64).await?;
    }
    c.confirmed(before + chunks, Duration::from_secs(60))
        .await?;
    drop(c);
    broker.stop().await?;
    Ok(())
}
