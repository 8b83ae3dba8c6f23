//! `produce` and `consume`, the data-plane commands (like `pulsar-client`).
//! `produce` pipelines its sends (a window of 1000 unreceipted) and prints
//! the stored ids; `consume` subscribes, prints each message as it arrives
//! (one JSON object per line with `--output json`), and acks it, or fails
//! it with `--nack` so the subscription's policy drives it through retries
//! into the dead-letter tier.

use std::collections::VecDeque;
use std::time::Duration;

use ricochet_client::OutgoingMessage;
use serde::Serialize;

use crate::Ctx;
use crate::args::{ConsumeArgs, ProduceArgs};
use crate::error::{CliError, Result};
use crate::output::{write_json, write_json_line};
use crate::view::{IdView, MessageView};

/// Unreceipted sends `produce` keeps in flight.
const SEND_WINDOW: usize = 1000;

#[derive(Debug, Serialize)]
struct Produced {
    topic: String,
    sent: u64,
    ids: Vec<IdView>,
}

pub(crate) async fn produce(ctx: &mut Ctx<'_>, a: ProduceArgs) -> Result<()> {
    if a.count == 0 {
        return Err(CliError::Usage(
            "-n/--num-produce must be at least 1".into(),
        ));
    }
    let mut payloads: Vec<Vec<u8>> = a.messages.into_iter().map(String::into_bytes).collect();
    for f in &a.files {
        let data = std::fs::read(f)
            .map_err(|e| CliError::Other(format!("cannot read {}: {e}", f.display())))?;
        payloads.push(data);
    }
    let client = ctx.client().await?;
    let producer = client.producer(&a.topic).create().await?;
    let mut window = VecDeque::new();
    let mut ids = Vec::new();
    for _ in 0..a.count {
        for p in &payloads {
            let mut b = OutgoingMessage::builder(p.clone());
            if let Some(k) = &a.key {
                b = b.key(k.clone());
            }
            for (k, v) in &a.properties {
                b = b.property(k.clone(), v.clone());
            }
            if let Some(d) = a.deliver_after {
                b = b.deliver_after(d);
            }
            window.push_back(producer.send_async(b).await?);
            if window.len() >= SEND_WINDOW
                && let Some(f) = window.pop_front()
            {
                ids.push(f.await?);
            }
        }
    }
    for f in window {
        ids.push(f.await?);
    }
    producer.close().await?;
    let topic = ids
        .first()
        .map_or_else(|| a.topic.clone(), |id| id.topic().to_owned());
    let view = Produced {
        topic,
        sent: ids.len() as u64,
        ids: ids
            .iter()
            .map(|id| IdView {
                topic: id.topic().to_owned(),
                entry_id: id.entry_id(),
            })
            .collect(),
    };
    if ctx.json() {
        return write_json(ctx.out, &view);
    }
    for id in &view.ids {
        writeln!(ctx.out, "{id}")?;
    }
    writeln!(ctx.out, "sent {} message(s) to {}", view.sent, view.topic)?;
    Ok(())
}

pub(crate) async fn consume(ctx: &mut Ctx<'_>, a: ConsumeArgs) -> Result<()> {
    let client = ctx.client().await?;
    let mut b = client
        .consumer(&a.topic)
        .subscription(&a.subscription)
        .subscription_type(a.sub_type)
        .initial_position(a.position)
        // A message the broker pushed ahead and the command never took would
        // be redelivered with an attempt counted when the consumer closes:
        // with a message limit, prefetch as little as possible.
        .receiver_queue_size(if a.count > 0 { 1 } else { 1000 })
        .ack_group_time(Duration::ZERO)
        .dead_letter_reader(a.dead_letter_reader);
    if let Some(p) = a.policy {
        b = b.policy(p);
    }
    if let Some(d) = a.nack_delay {
        b = b.negative_ack_delay(d);
    }
    if let Some(n) = &a.name {
        b = b.consumer_name(n.clone());
    }
    let mut consumer = b.subscribe().await?;
    let mut received = 0u64;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut stop_reason = "limit reached";
    while a.count == 0 || received < a.count {
        let next = async {
            match a.timeout {
                Some(t) => tokio::time::timeout(t, consumer.receive()).await.ok(),
                None => Some(consumer.receive().await),
            }
        };
        let msg = tokio::select! {
            r = next => match r {
                Some(m) => m?,
                None => {
                    stop_reason = "idle timeout";
                    break;
                }
            },
            _ = &mut interrupted => {
                stop_reason = "interrupted";
                break;
            }
        };
        received += 1;
        let view = MessageView::from_client(&msg);
        if ctx.json() {
            write_json_line(ctx.out, &view)?;
        } else {
            writeln!(
                ctx.out,
                "{}  delivery_count={}  key={}  properties={{{}}}  payload={}",
                view.id,
                view.delivery_count,
                view.key.as_deref().unwrap_or("-"),
                if view.properties.is_empty() {
                    String::new()
                } else {
                    view.properties_line()
                },
                view.payload_preview(500),
            )?;
            ctx.out.flush()?;
        }
        if a.nack {
            consumer
                .nack_with_reason(&msg, a.nack_reason.clone())
                .await?;
        } else {
            consumer.ack(&msg).await?;
        }
    }
    consumer.close().await?;
    eprintln!(
        "{} {received} message(s) from subscription {} ({stop_reason})",
        if a.nack { "nacked" } else { "acked" },
        a.subscription
    );
    Ok(())
}
