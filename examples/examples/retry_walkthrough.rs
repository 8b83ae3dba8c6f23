//! The retry walk-through, hands on: a producer sends one message, a
//! consumer fails it every time with `reconsume_later` under RocketMQ-style
//! delay levels on a compressed millisecond table, and the output shows each
//! attempt as it happens — wall-clock time, attempt number, the delay the
//! broker applied (`DELAY_TIME`) against the gap actually observed, and the
//! tier (topic) it was delivered from — then the dead-letter entry with its
//! whole history, fetched through the admin API.
//!
//! ```text
//! cargo run -p ricochet-broker -- --data-dir ./data      # in another terminal
//! cargo run -p ricochet-examples --example retry_walkthrough
//! ```
//!
//! The broker URL comes from `RICOCHET_URL` (default `http://127.0.0.1:6650`).
//! The retries are scheduled by the broker, in its retry tier: the consumer
//! only says "later" and the broker picks the level (`3 + n` in RocketMQ;
//! here the table starts at level 1).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ricochet_client::admin::DeadLetterFilter;
use ricochet_client::{Client, InitialPosition, OutgoingMessage, PolicySpec, SubscriptionType};
use ricochet_policy::{FailureReason, Outcome, explain, explain_table};
use ricochet_proto::convert::failure_reason_from_i32;

const LEVELS: &str = "10ms 20ms 40ms 80ms 160ms";

fn at(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("RICOCHET_URL").unwrap_or_else(|_| "http://127.0.0.1:6650".into());
    let client = Client::connect(&url).await?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let topic = format!("retry-walkthrough-{stamp}");
    let subscription = "order-service";

    // Level n of the table is the n-th retry's delay; 4 retries, then the DLQ.
    let policy: PolicySpec = format!("delay-levels:levels={LEVELS},start=1,max=4").parse()?;
    let schedule = policy.build()?;
    println!(
        "{}",
        explain_table(&*schedule, FailureReason::ReconsumeLater)
    );
    let failures_until_dlq = explain(&*schedule, FailureReason::ReconsumeLater)
        .iter()
        .find(|r| matches!(r.outcome, Outcome::DeadLetter { .. }))
        .map_or(1, |r| r.attempt);

    let mut consumer = client
        .consumer(&topic)
        .subscription(subscription)
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .policy(policy)
        .subscribe()
        .await?;
    let producer = client.producer(&topic).create().await?;
    let id = producer
        .send(
            OutgoingMessage::builder("charge order #1001")
                .key("order-1001")
                .property("trace-id", "7f3a"),
        )
        .await?;
    println!("{}  sent {id}\n", now());

    println!(
        "{:<24}  {:>7}  {:>7}  {:>10}  {:>9}  tier (delivered from)",
        "time", "attempt", "count", "DELAY_TIME", "gap"
    );
    let mut last = Instant::now();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await??;
        let gap = last.elapsed();
        last = Instant::now();
        let tier = if msg.is_retry() { "retry" } else { "main" };
        println!(
            "{:<24}  {:>7}  {:>7}  {:>10}  {:>9}  {tier}: {}",
            now(),
            msg.delivery_count() + 1,
            msg.delivery_count(),
            msg.delay_time()
                .map_or("-".to_owned(), |d| format!("{}ms", d.as_millis())),
            format!("{:.1}ms", gap.as_secs_f64() * 1000.0),
            msg.topic(),
        );
        // Level 0: "the policy decides" (RocketMQ's delayLevelWhenNextConsume = 0).
        consumer.reconsume_later_level(&msg, 0).await?;
        if msg.delivery_count() + 1 >= failures_until_dlq {
            break;
        }
    }
    consumer.close().await?;
    producer.close().await?;

    let letters = client
        .admin()
        .list_dead_letters(&topic, subscription, &DeadLetterFilter::default(), 10, None)
        .await?;
    println!("\ndead letters of {subscription}: {}", letters.total);
    for d in &letters.dead_letters {
        let m = d.message.clone().unwrap_or_default();
        let id = m.id.clone().unwrap_or_default();
        println!("  entry:           {}:{}", id.topic, id.entry_id);
        if let Some(o) = &d.origin {
            println!("  origin:          {}:{}", o.topic, o.entry_id);
        }
        println!("  reason:          {}", d.reason);
        println!("  dead-lettered:   {}", at(d.dead_lettered_at_ms));
        println!("  payload:         {}", String::from_utf8_lossy(&m.payload));
        let mut props: Vec<_> = m.properties.iter().collect();
        props.sort();
        for (k, v) in props {
            println!("  property:        {k}={v}");
        }
        println!("  history:");
        let mut prev: Option<u64> = None;
        for a in &d.attempts {
            let reason = failure_reason_from_i32(a.reason)
                .map_or_else(|_| a.reason.to_string(), |r| r.to_string());
            let gap = prev.map_or(String::new(), |p| {
                format!("  (+{}ms)", a.time_ms.saturating_sub(p))
            });
            prev = Some(a.time_ms);
            println!(
                "    #{}  {}  {reason}  {}{gap}",
                a.delivery_count,
                at(a.time_ms),
                a.consumer
            );
        }
    }
    Ok(())
}
