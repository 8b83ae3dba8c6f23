//! Produce ten messages, then consume and ack them.
//!
//! Start a broker (`cargo run -p ricochet-broker`), then:
//!
//! ```text
//! cargo run -p ricochet-examples --example quickstart
//! ```
//!
//! The broker URL comes from `RICOCHET_URL` (default `http://127.0.0.1:6650`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ricochet_client::{Client, InitialPosition, OutgoingMessage};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("RICOCHET_URL").unwrap_or_else(|_| "http://127.0.0.1:6650".into());
    let client = Client::connect(&url).await?;
    // A fresh topic per run, so the example always sees exactly its own ten.
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let topic = format!("quickstart-{stamp}");

    let producer = client.producer(&topic).create().await?;
    // Pipelined: queue all ten, then wait for the receipts.
    let mut receipts = Vec::new();
    for i in 0..10 {
        let receipt = producer
            .send_async(
                OutgoingMessage::builder(format!("hello #{i}"))
                    .key(format!("user-{}", i % 3))
                    .property("example", "quickstart"),
            )
            .await?;
        receipts.push(receipt);
    }
    for r in receipts {
        println!("sent     {}", r.await?);
    }
    producer.close().await?;

    let mut consumer = client
        .consumer(&topic)
        .subscription("quickstart")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await?;
    for _ in 0..10 {
        let msg = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await??;
        println!(
            "received {} key={} payload={:?}",
            msg.id(),
            msg.key().unwrap_or("-"),
            msg.payload_str().unwrap_or("<binary>")
        );
        consumer.ack(&msg).await?;
    }
    // Flushes the grouped acks and waits until the broker has them.
    consumer.close().await?;
    println!(
        "done: 10 produced, consumed and acked on {}",
        consumer.topic()
    );
    Ok(())
}
