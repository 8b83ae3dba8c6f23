//! `perf consume`: consumers acking everything they receive, measuring
//! end-to-end latency from the send time in each payload's header.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ricochet_client::InitialPosition;
use tokio::sync::watch;

use super::payload::{now_micros, read_header};
use super::report::{Recorder, Summary};
use super::{check_count, next_or_stop, run_until_stopped};
use crate::Ctx;
use crate::args::PerfConsumeArgs;
use crate::error::Result;

pub(super) async fn consume(ctx: &mut Ctx<'_>, a: PerfConsumeArgs) -> Result<Summary> {
    check_count("consumers", a.consumers)?;
    let client = ctx.client().await?;
    let rec = Arc::new(Recorder::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..a.consumers {
        let mut consumer = client
            .consumer(&a.common.topic)
            .subscription(&a.subscription)
            .subscription_type(a.sub_type)
            .initial_position(InitialPosition::Latest)
            .consumer_name(format!("perf-{}-{i}", std::process::id()))
            .receiver_queue_size(a.receiver_queue_size)
            .subscribe()
            .await?;
        let rec = rec.clone();
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(msg) = next_or_stop(&mut consumer, &mut stop, &rec).await else {
                    break;
                };
                let latency = match read_header(msg.payload()) {
                    Some((sent_us, _)) => {
                        Duration::from_micros(now_micros().saturating_sub(sent_us))
                    }
                    None => SystemTime::now()
                        .duration_since(msg.publish_time())
                        .unwrap_or_default(),
                };
                rec.record(msg.payload().len(), latency);
                if consumer.ack(&msg).await.is_err() {
                    rec.error();
                }
            }
            let _ = consumer.close().await;
        }));
    }
    let elapsed = run_until_stopped(
        "received",
        a.common.duration,
        &rec,
        (stop_tx, stop_rx),
        tasks,
    )
    .await;
    let mut s = Summary::new(
        "consume",
        &a.common.topic,
        &rec,
        elapsed,
        "end to end (send -> receive)",
    );
    s.set("consumers", a.consumers)
        .set("subscription", a.subscription.clone())
        .set("type", a.sub_type.to_string())
        .set("receiver_queue_size", a.receiver_queue_size);
    Ok(s)
}
