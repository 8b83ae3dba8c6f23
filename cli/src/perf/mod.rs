//! `perf produce|consume|redeliver`: load generators in the manner of
//! `pulsar-perf`. Each mode runs until `--duration` elapses (or Ctrl-C),
//! prints a progress line on stderr every second (rate, MB/s and latency
//! percentiles of that second), and ends with a summary on stdout:
//! throughput (msg/s, MB/s with MB = 10^6 bytes) and latency p50/p99/p999/max
//! from an HDR histogram (microsecond resolution, 3 significant digits).
//!
//! * `produce` measures **publish latency**: from handing a message to the
//!   producer to its receipt (the broker stored it, durably in `sync` mode).
//! * `consume` measures **end-to-end latency**: from the send time `perf
//!   produce` writes into each payload's header to the moment the consumer
//!   takes the message (falls back to the broker's publish time, at
//!   millisecond resolution, for other payloads).
//! * `redeliver` feeds a topic, nacks every message once under a policy and
//!   acks its redelivery: it measures the nack → redelivery loop, whose
//!   latency includes the policy's first delay (the summary also gives the
//!   lateness beyond that delay).
//!
//! Payload header (24 bytes, the rest is filler): `RCP1`, 4 zero bytes, the
//! send time in microseconds since the Unix epoch (u64 LE), a sequence
//! number (u64 LE).
//!
//! This module dispatches the three modes and owns what they share to run:
//! the stop timer and the argument checks. Each mode has its own module;
//! the payload header and the report (recorder, progress, summary) theirs.

mod consume;
mod payload;
mod produce;
mod redeliver;
mod report;

use std::time::Duration;

use tokio::sync::watch;

use crate::Ctx;
use crate::args::PerfCommand;
use crate::error::{CliError, Result};
use payload::HEADER;

pub(crate) async fn run(ctx: &mut Ctx<'_>, c: PerfCommand) -> Result<()> {
    let summary = match c {
        PerfCommand::Produce(a) => produce::produce(ctx, a).await?,
        PerfCommand::Consume(a) => consume::consume(ctx, a).await?,
        PerfCommand::Redeliver(a) => redeliver::redeliver(ctx, a).await?,
    };
    summary.write(ctx)
}

/// Turns `stop` true after `duration` (if not zero) or on Ctrl-C.
fn spawn_stopper(duration: Duration, stop: watch::Sender<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let timer = async {
            if duration.is_zero() {
                std::future::pending::<()>().await;
            } else {
                tokio::time::sleep(duration).await;
            }
        };
        tokio::select! {
            _ = timer => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = stop.closed() => {}
        }
        let _ = stop.send(true);
    })
}

/// Runs `tasks` until they end or the run's duration (or Ctrl-C) stops
/// them, printing a progress line labelled `label` every second; returns
/// how long they ran.
async fn run_until_stopped(
    label: &'static str,
    duration: Duration,
    rec: &std::sync::Arc<report::Recorder>,
    stop: (watch::Sender<bool>, watch::Receiver<bool>),
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> Duration {
    let (stop_tx, stop_rx) = stop;
    let start = std::time::Instant::now();
    let stopper = spawn_stopper(duration, stop_tx);
    let progress = report::spawn_progress(label, rec.clone(), None, stop_rx);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed();
    stopper.abort();
    let _ = progress.await;
    elapsed
}

/// The consumer's next message, or `None` once the run is stopped or the
/// consumer fails (a failure is counted in `rec`).
async fn next_or_stop(
    consumer: &mut ricochet_client::Consumer,
    stop: &mut watch::Receiver<bool>,
    rec: &report::Recorder,
) -> Option<ricochet_client::Message> {
    tokio::select! {
        m = consumer.receive() => m.inspect_err(|_| rec.error()).ok(),
        _ = stop.wait_for(|s| *s) => None,
    }
}

fn check_size(size: usize) -> Result<()> {
    if size < HEADER {
        return Err(CliError::Usage(format!(
            "--size must be at least {HEADER} bytes (the timestamp header)"
        )));
    }
    Ok(())
}

fn check_count(what: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Err(CliError::Usage(format!("--{what} must be at least 1")));
    }
    Ok(())
}
