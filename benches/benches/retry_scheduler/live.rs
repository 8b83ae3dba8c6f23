//! Part 4: memory per parked retry in a live broker (issue #12, item 2) —
//! the release broker binary on an empty data directory; `n` messages of
//! 100 B published, each received once and sent to the retry tier with a
//! 1 h `reconsume_later` (pipelined frames, no confirmation awaited); the
//! broker's resident memory once idle, minus its idle memory before, per
//! parked retry. Unlike part 3 the broker parks the retries itself, so its
//! caches hold what parking them touched.

use std::time::{Duration, Instant};

use ricochet_proto::{
    SubscriptionRequest, admin_client::AdminClient, consume_request, reconsume_later,
};

use crate::BoxError;
use crate::broker::{broker_bin, spawn_broker};
use crate::memory::rss;
use crate::raw::{RawConsumer, publish};

const TOPIC: &str = "live";
const HOUR_MS: u64 = 3_600_000;

async fn scheduled(url: &str) -> Result<u64, BoxError> {
    let mut admin = AdminClient::connect(url.to_owned()).await?;
    let s = admin
        .subscription_stats(SubscriptionRequest {
            topic: format!("persistent://public/default/{TOPIC}"),
            subscription: "s".into(),
        })
        .await?
        .into_inner();
    Ok(s.scheduled_retries)
}

pub(crate) async fn live_parked_retries(n: usize) -> Result<(), BoxError> {
    println!(
        "\n4. memory per parked retry in a live broker: {n} x 100 B published, each received once and reconsume_later(1 h); the release ricochet-broker binary, sync durability, default cache unless RS_LIVE_CONFIG"
    );
    let bin = match broker_bin() {
        Ok(bin) => bin,
        Err(e) => {
            println!("  skipped: {e}");
            return Ok(());
        }
    };
    // RS_LIVE_CONFIG: a broker config file (e.g. a smaller cache_capacity).
    let config = std::env::var_os("RS_LIVE_CONFIG").map(std::path::PathBuf::from);
    if let Some(c) = &config {
        println!(
            "  broker config: {}",
            std::fs::read_to_string(c)?.trim().replace('\n', "; ")
        );
    }
    let dir = tempfile::tempdir()?;
    let child = spawn_broker(&bin, dir.path(), config.as_deref()).await;
    let url = child.url().to_owned();
    let mut c = RawConsumer::subscribe(&url, TOPIC, None).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle, _) = rss(child.pid());

    let t = Instant::now();
    publish(&url, TOPIC, n).await?;
    let published = t.elapsed();
    let (after_publish, _) = rss(child.pid());

    let t = Instant::now();
    c.flow(n).await?;
    let mut parked = 0usize;
    while parked < n {
        let Some(batch) = c.messages(Duration::from_secs(60)).await? else {
            return Err(format!("only {parked} of {n} messages arrived").into());
        };
        for m in batch {
            c.send(consume_request::Request::ReconsumeLater(
                ricochet_proto::ReconsumeLater {
                    request_id: 0,
                    id: m.id,
                    delay: Some(reconsume_later::Delay::DelayMs(HOUR_MS)),
                    properties: Default::default(),
                    detail: String::new(),
                },
            ))
            .await?;
            parked += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s = scheduled(&url).await?;
        if s >= n as u64 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("only {s} of {n} retries parked after 10 min").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let parking = t.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (parked_rss, hwm) = rss(child.pid());
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n.max(1) as f64;
    println!(
        "  published in {published:.1?}; parked in {parking:.1?} ({:.0} retries/s)",
        n as f64 / parking.as_secs_f64()
    );
    println!(
        "  RSS idle {:.1} MB, after publishing {:.1} MB, with {n} parked {:.1} MB (peak {:.1} MB)",
        idle as f64 / 1e6,
        after_publish as f64 / 1e6,
        parked_rss as f64 / 1e6,
        hwm as f64 / 1e6
    );
    println!(
        "  resident memory per parked retry: {:.0} B above idle ({:.0} B above the published state); target <= 150 B",
        per(parked_rss, idle),
        per(parked_rss, after_publish)
    );
    drop(c);
    drop(child);
    Ok(())
}
