//! Dead letters from code: list them, inspect one with its history, pick
//! some by reason, replay those onto the original topic (with a fresh
//! delivery count, rate-limited) and purge the rest — the operator's
//! decision the admin API leaves to a human or a tool, never a loop.
//!
//! The example makes its own dead letters first: six invoices, of which
//! the consumer rejects the two with a bad schema (`terminate`, straight to
//! the dead-letter tier) and fails the two whose downstream is down (`nack`,
//! twice, under a `backoff:fixed=100ms,max=1` policy), then acks the
//! replayed ones as if the outage were over.
//!
//! ```text
//! cargo run -p ricochet-broker -- --data-dir ./data      # in another terminal
//! cargo run -p ricochet-examples --example dlq_inspect
//! ```
//!
//! The broker URL comes from `RICOCHET_URL` (default `http://127.0.0.1:6650`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ricochet_client::admin::{DeadLetter, DeadLetterFilter, ReplayOptions};
use ricochet_client::{Client, InitialPosition, OutgoingMessage, PolicySpec, SubscriptionType};
use ricochet_proto::convert::failure_reason_from_i32;

fn at(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn payload(d: &DeadLetter) -> String {
    d.message.as_ref().map_or_else(String::new, |m| {
        String::from_utf8_lossy(&m.payload).into_owned()
    })
}

fn entry_id(d: &DeadLetter) -> u64 {
    d.message
        .as_ref()
        .and_then(|m| m.id.as_ref())
        .map_or(0, |id| id.entry_id)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("RICOCHET_URL").unwrap_or_else(|_| "http://127.0.0.1:6650".into());
    let client = Client::connect(&url).await?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let topic = format!("invoices-{stamp}");
    let sub = "ledger";

    // 1. Make some dead letters.
    let mut consumer = client
        .consumer(&topic)
        .subscription(sub)
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .policy("backoff:fixed=100ms,max=1".parse::<PolicySpec>()?)
        .subscribe()
        .await?;
    let producer = client.producer(&topic).create().await?;
    let kinds = [
        "ok",
        "bad-schema",
        "downstream",
        "ok",
        "bad-schema",
        "downstream",
    ];
    for (i, kind) in kinds.iter().enumerate() {
        producer
            .send(
                OutgoingMessage::builder(format!("invoice #{i} ({kind})")).property("kind", *kind),
            )
            .await?;
    }
    let mut settled = 0;
    while settled < kinds.len() {
        let msg = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await??;
        match msg.property("kind") {
            Some("bad-schema") => {
                consumer
                    .terminate(&msg, "schema mismatch: field amount missing")
                    .await?;
                settled += 1;
            }
            Some("downstream") => {
                consumer
                    .nack_with_reason(&msg, "payment gateway timeout")
                    .await?;
                if msg.delivery_count() >= 1 {
                    settled += 1; // the second failure dead-letters it
                }
            }
            _ => {
                consumer.ack(&msg).await?;
                settled += 1;
            }
        }
    }
    // The broker moves the last nacked ones right after the nacks arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let admin = client.admin();

    // 2. List.
    let all = admin
        .list_dead_letters(&topic, sub, &DeadLetterFilter::default(), 100, None)
        .await?;
    println!("{} dead letter(s) on {topic} / {sub}:", all.total);
    for d in &all.dead_letters {
        println!(
            "  #{:<2} {}  failures={}  reason={:?}  payload={:?}",
            entry_id(d),
            at(d.dead_lettered_at_ms),
            d.message.as_ref().map_or(0, |m| m.delivery_count),
            d.reason,
            payload(d)
        );
    }

    // 3. Inspect one in full.
    if let Some(d) = all
        .dead_letters
        .iter()
        .find(|d| payload(d).contains("downstream"))
    {
        println!("\ninspect #{}:", entry_id(d));
        if let Some(o) = &d.origin {
            println!("  origin:   {}:{}", o.topic, o.entry_id);
        }
        if let Some(m) = &d.message {
            let mut props: Vec<_> = m.properties.iter().collect();
            props.sort();
            for (k, v) in props {
                println!("  property: {k}={v}");
            }
        }
        for a in &d.attempts {
            let reason = failure_reason_from_i32(a.reason)
                .map_or_else(|_| a.reason.to_string(), |r| r.to_string());
            println!(
                "  attempt {}: {} {reason} by {} ({})",
                a.delivery_count,
                at(a.time_ms),
                a.consumer,
                a.detail
            );
        }
    }

    // 4. The gateway is back: replay the timeouts, with a fresh count, 50/s.
    let timeouts = DeadLetterFilter {
        reason_contains: "gateway timeout".into(),
        ..Default::default()
    };
    // The default: back into this subscription's own retry tier (only it
    // sees them again); `.to_topic(true)` republishes for all.
    let replay = ReplayOptions::new()
        .filter(timeouts)
        .reset_delivery_count(true)
        .rate_per_second(50);
    let replayed = admin.replay_dead_letters(&topic, sub, &replay).await?;
    println!(
        "\nreplayed {} into the retry tier of {sub}:",
        replayed.replayed
    );
    for id in &replayed.new_ids {
        println!("  new id {}:{}", id.topic, id.entry_id);
    }
    for _ in 0..replayed.replayed {
        let msg = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await??;
        println!(
            "  consumed {:?} (delivery count {}) and acked",
            msg.payload_str().unwrap_or("?"),
            msg.delivery_count()
        );
        consumer.ack(&msg).await?;
    }
    consumer.close().await?;
    producer.close().await?;

    // 5. The bad-schema ones cannot be fixed by retrying: purge them.
    let bad_schema = DeadLetterFilter {
        reason_contains: "schema mismatch".into(),
        ..Default::default()
    };
    let purged = admin
        .purge_dead_letters(&topic, sub, &bad_schema, false)
        .await?;
    println!("\npurged {}", purged.purged);

    let stats = admin.subscription_stats(&topic, sub).await?;
    println!(
        "subscription {sub}: backlog={} dead_lettered={} scheduled_retries={}",
        stats.backlog, stats.dead_lettered, stats.scheduled_retries
    );
    Ok(())
}
