//! Retry-tier figures for the broker (a bench binary; prints them):
//!
//! 1. **Redelivery lateness** of N concurrent scheduled retries (10 000 and
//!    100 000 by default), due times spread over `RS_SPREAD_MS`:
//!    * at the scheduler alone: `Scheduler` + `SledStorage` in this process,
//!      entries written through `Storage::put_schedule` then handed to the
//!      scheduler (as a tier move does); lateness = wall-clock time the fire
//!      callback (the subscription's channel) receives an entry − its due time;
//!    * end to end: an in-process `TestBroker`, a raw gRPC consumer on a
//!      delay-level policy nacks every message in paced frames (so the due
//!      times spread over `RS_SPREAD_MS`), the level's delay being long enough
//!      that the broker has confirmed every move before the first is due;
//!      lateness = wall-clock receive time of the retry copy − its
//!      `deliver_at_ms` (the due time the broker stored).
//!
//!    "early" counts deliveries before their due time (must be 0).
//! 2. **Throughput of the fail → retry tier → redeliver loop**: a consumer
//!    keeps `RS_LOOP_WORKING_SET` messages cycling; every delivery is failed
//!    at once (per-message `reconsume_later` with a 0 ms delay, or one nack
//!    frame per received frame on a 1 ms delay-level policy), and comes back
//!    from the retry tier. Messages per second = redeliveries per second.
//! 3. **Memory and restart with 1 000 000 scheduled retries due in 1–2 h**:
//!    the data directory is written by the broker's own tier move
//!    (`Storage::move_messages`: per message a retry-tier entry and a schedule
//!    entry holding its failure record); then the real `ricochet-broker` binary is started on it
//!    (and on a directory with no retries, the baseline). Restart time = spawn
//!    → listening, and spawn → a consumer receives a freshly published
//!    message; memory = the broker process's VmRSS (from /proc) once idle.
//!    Needs the release binary: `cargo build --release -p ricochet-broker`
//!    (or `RS_BROKER_BIN=path`, or `RICOCHET_BROKER_BIN=path`); skipped with
//!    a note otherwise.
//!
//! `cargo bench -p ricochet-benches --bench retry_scheduler`. Environment:
//! * sizes: `RS_QUICK=1` (10 000 only, 100 000 retries for part 3, 2 s
//!   loops), `RS_SIZES=10000,100000`, `RS_SPREAD_MS=3000`, `RS_LOOP_SECS=5`,
//!   `RS_LOOP_WORKING_SET=2000`, `RS_MEM_RETRIES=1000000`;
//! * `RS_ONLY=scheduler|e2e|short|loop|memory|live` runs one part;
//!   part 4 (`live`, see `live.rs`): `RS_LIVE_COUNTS=200000,1000000,5000000`
//!   retries parked by a live broker (one fresh broker per count; default
//!   200 000), `RS_LIVE_CONFIG=file` a broker config for it,
//!   `RS_LIVE_RESTARTS=3` restarts on the store the largest count left
//!   per `verify_on_start` mode of `RS_LIVE_VERIFY=before,background,off`,
//!   `RS_LIVE_RESTART_DIR=dir` only those restarts, on a kept store,
//!   `RS_LIVE_URL`/`RS_LIVE_PID` a broker started by hand (a profiler's);
//! * part 1: `RS_SCHED_GROUP=k` gives k entries the same due time (as one
//!   tier move's batch has), `RS_E2E_FRAMES=k` nack frames (default: frames
//!   of 100 ids),
//!   `RS_E2E_CHILD=1` runs the broker binary in a child process instead,
//!   `RS_DEBUG=1` shows the latest deliveries;
//! * part 3: `RS_BROKER_BIN=path`, `RS_MEM_DIR=dir` keeps (and reuses) the
//!   data directories, `RS_MEM_MOVE=k` moves k retries per transaction
//!   (default 1 000), `RS_MEM_CONFIG=file.toml` is passed to the broker as
//!   `--config`.
//!
//! This file holds the environment helpers and `main`, which runs the
//! parts; each part has its own module, beside the pieces they share: the
//! lateness histogram, a raw gRPC client, and the broker under test.

mod broker;
mod e2e;
mod lateness;
mod live;
mod memory;
mod raw;
mod redeliver_loop;
mod scheduler;
mod short;

use ricochet_broker::Durability;

use crate::e2e::e2e_lateness;
use crate::memory::memory_and_restart;
use crate::redeliver_loop::{Fail, redeliver_loop};
use crate::scheduler::scheduler_lateness;
use crate::short::short_delay_lateness;

// The same allocator as the broker binary (jemalloc with the feature).
#[global_allocator]
static GLOBAL: ricochet_benches::allocator::Global = ricochet_benches::allocator::GLOBAL;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn debug() -> bool {
    std::env::var_os("RS_DEBUG").is_some()
}

fn quick() -> bool {
    std::env::var_os("RS_QUICK").is_some()
}

fn main() -> Result<(), BoxError> {
    // As the broker binary does at start (mimalloc would ask for huge pages).
    ricochet_broker::process::disable_transparent_huge_pages();
    eprintln!("{}", ricochet_benches::allocator::configure());
    // Criterion-style filters may be passed by `cargo bench`; ignore them.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "retry_scheduler: {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let only = std::env::var("RS_ONLY").unwrap_or_default();
    let part = |p: &str| only.is_empty() || only == p;
    let sizes: Vec<usize> = match std::env::var("RS_SIZES") {
        Ok(s) => s.split(',').filter_map(|v| v.trim().parse().ok()).collect(),
        Err(_) if quick() => vec![10_000],
        Err(_) => vec![10_000, 100_000],
    };
    let spread_ms: u64 = env_or("RS_SPREAD_MS", 3_000);
    rt.block_on(async {
        if part("scheduler") {
            println!("\n1a. lateness at the scheduler (Scheduler + SledStorage, fire callback − due), due times over {spread_ms} ms");
            for &n in &sizes {
                scheduler_lateness(n, spread_ms).await?;
            }
        }
        if part("e2e") {
            println!("\n1b. lateness end to end (in-process broker, nack → retry tier → consumer receive − deliver_at_ms), due times over {spread_ms} ms");
            for durability in [Durability::Sync, Durability::Interval] {
                for &n in &sizes {
                    e2e_lateness(durability, n, spread_ms).await?;
                }
            }
        }
        if part("short") {
            println!("\n1c. short delays end to end: 2 000 messages nacked 10 per frame every 5 ms, one delay level; lateness = receive − deliver_at_ms");
            for durability in [Durability::Sync, Durability::Interval] {
                for delay_ms in [10, 50] {
                    short_delay_lateness(durability, delay_ms).await?;
                }
            }
        }
        if part("loop") {
            let secs: u64 = env_or("RS_LOOP_SECS", if quick() { 2 } else { 5 });
            let working_set: usize = env_or("RS_LOOP_WORKING_SET", 2_000);
            println!("\n2. fail → retry tier → redeliver loop, {working_set} messages cycling, {secs} s per case");
            for durability in [Durability::Sync, Durability::Interval] {
                for how in [Fail::ReconsumeLater, Fail::NackFrame] {
                    redeliver_loop(durability, how, working_set, secs).await?;
                }
            }
        }
        Ok::<_, BoxError>(())
    })?;
    if part("memory") {
        let n: usize = env_or("RS_MEM_RETRIES", if quick() { 100_000 } else { 1_000_000 });
        rt.block_on(memory_and_restart(n))?;
    }
    if part("live")
        && let Err(e) = rt.block_on(live::live_parked_retries())
    {
        // Said before the runtime is dropped: a task it still waits for
        // must not hide the error.
        eprintln!("live parked retries: {e}");
        rt.shutdown_timeout(std::time::Duration::from_secs(1));
        return Err(e);
    }
    Ok(())
}
