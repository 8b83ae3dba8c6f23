//! Part 1a: lateness at the scheduler alone — `Scheduler` and `SledStorage`
//! in this process, entries persisted with `Storage::put_schedule` and
//! handed to the scheduler; lateness is when the fire callback receives an
//! entry, minus its due time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet_broker::Scheduler;
use ricochet_broker::clock::SystemClock;
use ricochet_broker::storage::{ScheduleKey, SledStorage, Storage, SubMessage, TierId};
use ricochet_testkit::{now_ms, now_us};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::lateness::Lateness;
use crate::{BoxError, env_or};

pub(crate) async fn scheduler_lateness(n: usize, spread_ms: u64) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let storage: Arc<dyn Storage> =
        Arc::new(SledStorage::open(dir.path(), 16_384, 256 * 1024 * 1024)?);
    let stop = CancellationToken::new();
    let scheduler = Scheduler::start(
        storage.clone(),
        Duration::from_secs(60),
        Arc::new(SystemClock),
        stop.clone(),
    );
    let (tx, mut fired) = mpsc::unbounded_channel();
    scheduler.register(1, tx);
    // Let the first refill run (an empty index).
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Every entry is persisted and handed over before the first is due.
    let lead_ms = 1_000 + n as u64 / 20;
    // Entries due at the same instant, as one tier move's batch is.
    let group: usize = env_or("RS_SCHED_GROUP", 1).max(1);
    let first_due = now_ms() + lead_ms;
    let keys: Vec<ScheduleKey> = (0..n)
        .map(|i| ScheduleKey {
            due_ms: first_due + spread_ms * (i - i % group) as u64 / n as u64,
            message: SubMessage {
                sub_id: 1,
                tier: TierId::Retry,
                entry_id: i as u64,
            },
        })
        .collect();
    let t = Instant::now();
    for chunk in keys.chunks(10_000) {
        let writes: Vec<(ScheduleKey, bool)> = chunk.iter().map(|k| (*k, true)).collect();
        storage.put_schedule(&writes)?;
        scheduler.add(chunk.to_vec());
    }
    let handed_over = t.elapsed();
    let spare = first_due as i64 - now_ms() as i64;

    let mut late = Lateness::new();
    let mut got = 0;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(lead_ms + spread_ms + 30_000);
    while got < n {
        let Ok(Some(fired)) = tokio::time::timeout_at(deadline, fired.recv()).await else {
            break;
        };
        // Announced ahead of their due times: only the fire counts here.
        let ricochet_broker::Fired::Due(batch) = fired else {
            continue;
        };
        let at = now_us();
        for k in batch {
            late.record(at, k.due_ms);
            got += 1;
        }
    }
    let stats = &scheduler.stats;
    let fired_total = stats.fired.load(std::sync::atomic::Ordering::Relaxed);
    let mean_ms = stats
        .lateness_us_total
        .load(std::sync::atomic::Ordering::Relaxed) as f64
        / fired_total.max(1) as f64
        / 1000.0;
    stop.cancel();
    println!(
        "  {n} retries: written and handed over in {handed_over:.0?} ({spare} ms before the first was due); {got} fired"
    );
    late.print(&format!("{n} at the scheduler"));
    println!("  (the scheduler's own counter, ms resolution: mean {mean_ms:.2} ms late)");
    if got < n {
        println!("  MISSING: {} entries never fired", n - got);
    }
    Ok(())
}
