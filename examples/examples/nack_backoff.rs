//! A consumer that fails a message three times with a multiplier backoff
//! (200 ms, 400 ms, 800 ms), printing each redelivery's time, delivery count
//! and delay, then acks it.
//!
//! The nack delay is served by the client (Pulsar semantics): it holds the
//! nacked id for the delay the policy gives the next attempt, then asks the
//! broker to redeliver; the broker persists the delivery count and would
//! dead-letter the message after `max_redeliver_count` failures.
//!
//! ```text
//! cargo run -p ricochet-examples --example nack_backoff
//! ```
//!
//! The broker URL comes from `RICOCHET_URL` (default `http://127.0.0.1:6650`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ricochet_client::{Client, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_policy::MultiplierBackoff;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("RICOCHET_URL").unwrap_or_else(|_| "http://127.0.0.1:6650".into());
    let client = Client::connect(&url).await?;
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let topic = format!("nack-backoff-{stamp}");

    let policy = PolicySpec::multiplier_backoff(
        MultiplierBackoff {
            min: Duration::from_millis(200),
            max: Duration::from_secs(10),
            multiplier: 2.0,
            jitter: 0.0,
        },
        5,
    );
    println!("policy: {policy}");
    let mut consumer = client
        .consumer(&topic)
        .subscription("nack-demo")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .policy(policy)
        .subscribe()
        .await?;

    let producer = client.producer(&topic).create().await?;
    let id = producer.send("flaky work item").await?;
    println!("sent {id}");

    let start = Instant::now();
    let mut last_nack: Option<Instant> = None;
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await??;
        let now = Instant::now();
        let waited = last_nack.map(|t| now - t);
        println!(
            "t={:>7.1?}  delivery_count={}  delay since nack={}",
            now - start,
            msg.delivery_count(),
            waited.map_or("-".to_owned(), |w| format!("{w:.1?}")),
        );
        if msg.delivery_count() < 3 {
            consumer
                .nack_with_reason(
                    &msg,
                    format!("simulated failure #{}", msg.delivery_count() + 1),
                )
                .await?;
            last_nack = Some(Instant::now());
        } else {
            consumer.ack(&msg).await?;
            println!("acked after {} failures", msg.delivery_count());
            break;
        }
    }
    consumer.close().await?;
    producer.close().await?;
    Ok(())
}
