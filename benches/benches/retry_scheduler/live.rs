//! Part 4: memory per parked retry in a live broker (issue #12, item 2) —
//! the release broker binary on an empty data directory; `n` messages of
//! 100 B published, each received once and sent to the retry tier with a
//! 1 h `reconsume_later` (pipelined frames, no confirmation awaited), or
//! with `RS_LIVE_KIND=nack` nacked with a 1 h delay the broker holds (in
//! place, NATS' `NakWithDelay`; one confirmed frame per delivered batch);
//! with `RS_LIVE_KIND=reconsume2` a retry of a retry (each retried once
//! after 10 ms, then `reconsume_later(1 h)` from the retry tier, that pass
//! timed); `RS_LIVE_KIND=reconsume,nack` runs both; `RS_LIVE_NACK_FRAME=k` sends
//! the nacks in frames of `k` messages instead (a client that fails its
//! messages a few at a time); the
//! broker's resident memory idle, after publishing and once the retries are
//! parked, per parked retry, for each count of `RS_LIVE_COUNTS`. Unlike
//! part 3 the broker parks the retries itself, so its caches hold what
//! parking them touched. Then, for the largest count, the broker is stopped
//! (SIGTERM) and restarted on the store it left: spawn → listening, spawn →
//! a freshly published message dispatched, and RSS once idle, over
//! `RS_LIVE_RESTARTS` restarts.
//!
//! Each restart is repeated for every `verify_on_start` mode of
//! `RS_LIVE_VERIFY` (default `before,background,off`; `true,false` for a
//! binary older than the modes), with the load average printed beside it.
//!
//! `RS_LIVE_URL` (with `RS_LIVE_PID` for RSS) drives a broker started by
//! hand instead, e.g. under a heap profiler; it is left running.
//! `RS_LIVE_KEEP=path` copies the store the parking broker left (stopped)
//! to `path` before the restarts.
//! `RS_LIVE_RESTART_DIR=dir` only restarts: the binary on a store kept from
//! an earlier run (stopped), nothing parked first (the store is written to
//! by the restarts: copy it to repeat a first restart).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ricochet_client::{Admin, Client, ErrorKind};
use ricochet_proto::{
    Ack, AckType, FailedDelivery, FailureReason, Redeliver, consume_request, reconsume_later,
};
use ricochet_testkit::BrokerProcess;

use crate::broker::{broker_bin, spawn_broker};
use crate::memory::rss;
use crate::raw::{RawConsumer, publish};
use crate::{BoxError, env_or, quick};

const TOPIC: &str = "live";
const HOUR_MS: u64 = 3_600_000;

/// Entries stored in the subscription's retry tier (its topic's next entry
/// id): cheap to ask, unlike the subscription stats, which scan the whole
/// schedule index (and so page it through sled's cache) on every call.
async fn retry_tier_entries(url: &str) -> Result<u64, BoxError> {
    let s = admin(url)
        .await?
        .topic_stats(&format!("persistent://public/default/{TOPIC}-s-RETRY"))
        .await;
    match s {
        Ok(s) => Ok(s.next_entry_id),
        // Not created before the first retry.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// The typed admin API of the broker at `url`.
async fn admin(url: &str) -> Result<Admin, BoxError> {
    Ok(Client::connect(url).await?.admin())
}

/// The subscription's scheduled retries, from its stats (a full scan of the
/// schedule index: asked once the figures are taken).
async fn scheduled(url: &str) -> Result<u64, BoxError> {
    let s = admin(url)
        .await?
        .subscription_stats(&format!("persistent://public/default/{TOPIC}"), "s")
        .await?;
    Ok(s.scheduled_retries)
}

/// `RS_LIVE_COUNTS=200000,1000000,5000000` (or the older `RS_LIVE_RETRIES=n`);
/// 200 000 by default, 50 000 with `RS_QUICK`.
pub(crate) fn counts() -> Vec<usize> {
    if let Ok(s) = std::env::var("RS_LIVE_COUNTS") {
        return s.split(',').filter_map(|v| v.trim().parse().ok()).collect();
    }
    vec![env_or(
        "RS_LIVE_RETRIES",
        if quick() { 50_000 } else { 200_000 },
    )]
}

/// `RS_LIVE_NACK_FRAME`: messages per nack frame (unset: one frame per
/// received batch).
fn nack_frame() -> Option<usize> {
    std::env::var("RS_LIVE_NACK_FRAME")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// How a parked message is parked.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// `reconsume_later(1 h)`: a retry in the retry tier.
    Reconsume,
    /// A nack with a 1 h delay the broker holds, in place.
    Nack,
    /// A retry of a retry: each message `reconsume_later(10 ms)` first
    /// (untimed), then received from the retry tier and
    /// `reconsume_later(1 h)` again; the second pass is the one measured.
    ReconsumeAgain,
}

/// `RS_LIVE_KIND=reconsume|nack|reconsume2` (a comma list runs each);
/// `reconsume` by default.
fn kinds() -> Vec<Kind> {
    std::env::var("RS_LIVE_KIND")
        .unwrap_or_else(|_| "reconsume".into())
        .split(',')
        .filter_map(|k| match k.trim() {
            "reconsume" => Some(Kind::Reconsume),
            "nack" => Some(Kind::Nack),
            "reconsume2" => Some(Kind::ReconsumeAgain),
            _ => None,
        })
        .collect()
}

/// The broker a count runs against: a child on a fresh directory, or the
/// one named by `RS_LIVE_URL`.
struct Target {
    url: String,
    pid: Option<u32>,
    child: Option<BrokerProcess>,
    dir: Option<tempfile::TempDir>,
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

struct Row {
    kind: Kind,
    n: usize,
    idle: u64,
    published: u64,
    parked: u64,
    hwm: u64,
    /// How long SIGTERM took, and the restarts per `verify_on_start` mode.
    restart: Option<(Duration, Vec<RestartFigures>)>,
}

/// Restarts with one `verify_on_start` mode.
struct RestartFigures {
    mode: String,
    listening: Vec<Duration>,
    dispatched: Vec<Duration>,
    rss: Vec<u64>,
}

/// `RS_LIVE_VERIFY`: the `verify_on_start` values restarts are run with.
fn verify_modes() -> Vec<String> {
    std::env::var("RS_LIVE_VERIFY")
        .unwrap_or_else(|_| "before,background,off".into())
        .split(',')
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// The one-minute load average, for the record beside a timing.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

pub(crate) async fn live_parked_retries() -> Result<(), BoxError> {
    let counts = counts();
    let restarts: usize = env_or("RS_LIVE_RESTARTS", 3);
    println!(
        "\n4. memory per parked retry in a live broker: n x 100 B published, each received once and reconsume_later(1 h), pipelined; the release ricochet-broker binary, sync durability, default cache unless RS_LIVE_CONFIG; n = {counts:?}"
    );
    let external = std::env::var("RS_LIVE_URL").ok();
    let bin = match (&external, broker_bin()) {
        (Some(_), _) => None,
        (None, Ok(bin)) => Some(bin),
        (None, Err(e)) => {
            println!("  skipped: {e}");
            return Ok(());
        }
    };
    // RS_LIVE_CONFIG: a broker config file (e.g. a smaller cache_capacity).
    let config = std::env::var_os("RS_LIVE_CONFIG").map(PathBuf::from);
    if let Some(c) = &config {
        println!(
            "  broker config: {}",
            std::fs::read_to_string(c)?.trim().replace('\n', "; ")
        );
    }
    if let Some(dir) = std::env::var_os("RS_LIVE_RESTART_DIR") {
        let Some(bin) = &bin else {
            return Err("RS_LIVE_RESTART_DIR needs the broker binary, not RS_LIVE_URL".into());
        };
        let restarts = env_or("RS_LIVE_RESTARTS", 3);
        println!(
            "  restarts only, on the kept store {}",
            Path::new(&dir).display()
        );
        let figures = restart(bin, None, Path::new(&dir), config.as_deref(), restarts).await?;
        print_restarts("(kept store)", None, &figures.1);
        return Ok(());
    }
    let largest = counts.iter().copied().max().unwrap_or(0);
    let mut rows = Vec::new();
    for (kind, n) in kinds()
        .into_iter()
        .flat_map(|k| counts.iter().map(move |&n| (k, n)))
    {
        let target = match (&external, &bin) {
            (Some(url), _) => Target {
                url: url.clone(),
                pid: std::env::var("RS_LIVE_PID")
                    .ok()
                    .and_then(|p| p.parse().ok()),
                child: None,
                dir: None,
            },
            (None, Some(bin)) => {
                let dir = tempfile::tempdir()?;
                let child = spawn_broker(bin, dir.path(), config.as_deref()).await;
                Target {
                    url: child.url().to_owned(),
                    pid: Some(child.pid()),
                    child: Some(child),
                    dir: Some(dir),
                }
            }
            (None, None) => unreachable!("no binary and no URL returned above"),
        };
        let mut row = park(&target, kind, n).await?;
        if n == largest
            && restarts > 0
            && let (Some(child), Some(dir), Some(bin)) = (target.child, &target.dir, &bin)
        {
            row.restart =
                Some(restart(bin, Some(child), dir.path(), config.as_deref(), restarts).await?);
        }
        rows.push(row);
    }
    println!(
        "\n  | kind | parked | RSS idle → published → parked (peak) | per parked retry above idle (above published) |"
    );
    for r in &rows {
        let per = |a: u64, b: u64| (a as f64 - b as f64) / r.n.max(1) as f64;
        println!(
            "  | {:?} | {} | {:.0} → {:.0} → {:.0} MB ({:.0} MB) | {:.0} B ({:.0} B) |",
            r.kind,
            r.n,
            mb(r.idle),
            mb(r.published),
            mb(r.parked),
            mb(r.hwm),
            per(r.parked, r.idle),
            per(r.parked, r.published),
        );
    }
    for r in &rows {
        if let Some((stop, figures)) = &r.restart {
            print_restarts(&format!("{} ({:?})", r.n, r.kind), Some(*stop), figures);
        }
    }
    Ok(())
}

/// Publishes `n`, parks every one for 1 h, and reads RSS at each stage.
async fn park(target: &Target, kind: Kind, n: usize) -> Result<Row, BoxError> {
    let url = target.url.as_str();
    let rss_now = || target.pid.map_or((0, 0), rss);
    let mut c = RawConsumer::subscribe(url, TOPIC, None).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (idle, _) = rss_now();

    let t = Instant::now();
    publish(url, TOPIC, n).await?;
    let published = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (after_publish, _) = rss_now();

    if kind == Kind::ReconsumeAgain {
        first_retries(&mut c, url, n).await?;
    }
    let before = retry_tier_entries(url).await?;
    let scheduled_before = scheduled(url).await?;
    let t = Instant::now();
    c.flow(n).await?;
    let mut parked = 0usize;
    let mut frames = 0usize;
    while parked < n {
        let Some(batch) = c.messages(Duration::from_secs(60)).await? else {
            return Err(format!("only {parked} of {n} messages arrived").into());
        };
        parked += batch.len();
        if kind == Kind::Nack {
            let per_frame = nack_frame().unwrap_or(batch.len()).max(1);
            for frame in batch.chunks(per_frame) {
                frames += 1;
                let messages = frame
                    .iter()
                    .map(|m| FailedDelivery {
                        id: m.id.clone(),
                        reason: FailureReason::Nack as i32,
                        detail: String::new(),
                        delay_ms: HOUR_MS,
                        ahead: false,
                        local: false,
                        delay_us: 0,
                    })
                    .collect();
                c.send(consume_request::Request::Redeliver(Redeliver {
                    request_id: frames as u64,
                    messages,
                }))
                .await?;
            }
            continue;
        }
        for m in batch {
            c.send(reconsume(m.id, HOUR_MS)).await?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(1_800);
    if kind == Kind::Nack {
        // Each frame is confirmed once its counts are durable.
        c.confirmed(frames, Duration::from_secs(1_800)).await?;
    }
    if kind != Kind::Nack {
        loop {
            let s = retry_tier_entries(url).await? - before;
            if s >= n as u64 {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("only {s} of {n} retries parked after 30 min").into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let parking = t.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (parked_rss, hwm) = rss_now();
    // Every retry parked (durably: sync mode), checked once the RSS is read.
    // (A retry of a retry replaces its first retry in the schedule.)
    let now_scheduled = scheduled(url).await?
        - if kind == Kind::ReconsumeAgain {
            0
        } else {
            scheduled_before
        };
    if now_scheduled != n as u64 {
        return Err(format!("{now_scheduled} of {n} retries scheduled").into());
    }
    let per = |a: u64, b: u64| (a as f64 - b as f64) / n.max(1) as f64;
    println!(
        "  {kind:?} {n}: published in {published:.1?} ({:.0} msg/s); parked in {parking:.1?} ({:.0} retries/s){}",
        n as f64 / published.as_secs_f64(),
        n as f64 / parking.as_secs_f64(),
        if kind == Kind::Nack {
            format!("; {frames} nack frames")
        } else {
            String::new()
        }
    );
    println!(
        "  {kind:?} {n}: RSS idle {:.1} MB, after publishing {:.1} MB, with {n} parked {:.1} MB (peak {:.1} MB); per parked retry {:.0} B above idle ({:.0} B above the published state); target <= 150 B",
        mb(idle),
        mb(after_publish),
        mb(parked_rss),
        mb(hwm),
        per(parked_rss, idle),
        per(parked_rss, after_publish)
    );
    Ok(Row {
        kind,
        n,
        idle,
        published: after_publish,
        parked: parked_rss,
        hwm,
        restart: None,
    })
}

/// A `reconsume_later` of `id` with `delay_ms`, no confirmation asked.
fn reconsume(id: Option<ricochet_proto::MessageId>, delay_ms: u64) -> consume_request::Request {
    consume_request::Request::ReconsumeLater(ricochet_proto::ReconsumeLater {
        request_id: 0,
        id,
        delay: Some(reconsume_later::Delay::DelayMs(delay_ms)),
        properties: Default::default(),
        detail: String::new(),
        waited_us: 0,
    })
}

/// The untimed first pass of [`Kind::ReconsumeAgain`]: all `n` received
/// and retried after 10 ms, then left due (no permits) in the retry tier.
async fn first_retries(c: &mut RawConsumer, url: &str, n: usize) -> Result<(), BoxError> {
    c.flow(n).await?;
    let mut retried = 0usize;
    while retried < n {
        let Some(batch) = c.messages(Duration::from_secs(60)).await? else {
            return Err(format!("only {retried} of {n} messages arrived").into());
        };
        retried += batch.len();
        for m in batch {
            c.send(reconsume(m.id, 10)).await?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(1_800);
    while retry_tier_entries(url).await? < n as u64 {
        if Instant::now() > deadline {
            return Err("the first retries were not all parked after 30 min".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

/// One line per `verify_on_start` mode: the ranges over its restarts.
fn print_restarts(parked: &str, stop: Option<Duration>, figures: &[RestartFigures]) {
    let range = |v: &[Duration]| {
        let lo = v.iter().min().copied().unwrap_or_default();
        let hi = v.iter().max().copied().unwrap_or_default();
        format!("{:.2}–{:.2} s", lo.as_secs_f64(), hi.as_secs_f64())
    };
    let stop = stop.map_or(String::new(), |s| format!("; SIGTERM took {s:.2?}"));
    for s in figures {
        let lo = s.rss.iter().min().copied().unwrap_or(0);
        let hi = s.rss.iter().max().copied().unwrap_or(0);
        println!(
            "  restart with {parked} parked (verify_on_start = {}{stop}), {} restarts: listening {}, a fresh message dispatched {} (target < 3 s); RSS once idle {:.0}–{:.0} MB",
            s.mode,
            s.listening.len(),
            range(&s.listening),
            range(&s.dispatched),
            mb(lo),
            mb(hi),
        );
    }
}

/// Stops `child` (SIGTERM) if given, then restarts the binary on `dir`
/// `times` times per mode of [`verify_modes`].
async fn restart(
    bin: &Path,
    child: Option<BrokerProcess>,
    dir: &Path,
    config: Option<&Path>,
    times: usize,
) -> Result<(Duration, Vec<RestartFigures>), BoxError> {
    let t = Instant::now();
    if let Some(child) = child {
        let status = child.stop().await;
        if !status.success() {
            return Err(format!("the broker exited with {status} on SIGTERM").into());
        }
    }
    let stop = t.elapsed();
    // RS_LIVE_KEEP=path: a copy of the store as the parking broker left it,
    // before any restart writes to it (for RS_LIVE_RESTART_DIR or a profile).
    if let Some(keep) = std::env::var_os("RS_LIVE_KEEP") {
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir)
            .arg(&keep)
            .status()?;
        if !status.success() {
            return Err(format!("cp -a {} {keep:?}: {status}", dir.display()).into());
        }
        println!("  the stopped store copied to {keep:?}");
    }
    let base = config.map(std::fs::read_to_string).transpose()?;
    let mut out = Vec::new();
    for mode in verify_modes() {
        // A bare `true`/`false` for an older binary, else a mode's name.
        let value = match mode.as_str() {
            "true" | "false" => mode.clone(),
            m => format!("{m:?}"),
        };
        let file = tempfile::NamedTempFile::new()?;
        std::fs::write(
            file.path(),
            format!(
                "{}\nverify_on_start = {value}\n",
                base.clone().unwrap_or_default()
            ),
        )?;
        let mut figures = RestartFigures {
            mode: mode.clone(),
            listening: Vec::new(),
            dispatched: Vec::new(),
            rss: Vec::new(),
        };
        for round in 1..=times {
            // sled takes a moment to release its files after the process exits.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let load = load_average();
            let t = Instant::now();
            let child = spawn_broker(bin, dir, Some(file.path())).await;
            let listening = t.elapsed();
            let url = child.url().to_owned();
            let mut c = RawConsumer::subscribe(&url, TOPIC, None).await?;
            c.flow(10).await?;
            publish(&url, TOPIC, 1).await?;
            let got = c.messages(Duration::from_secs(60)).await?;
            let dispatched = t.elapsed();
            let Some(ids) = got.map(|m| m.into_iter().filter_map(|m| m.id).collect::<Vec<_>>())
            else {
                return Err("the fresh message was not dispatched".into());
            };
            c.send(consume_request::Request::Ack(Ack {
                request_id: 0,
                ack_type: AckType::Individual as i32,
                ids,
            }))
            .await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let (idle, _) = rss(child.pid());
            println!(
                "  restart {round} (verify_on_start = {mode}, load average {load}): listening {listening:.2?}, a fresh message dispatched {dispatched:.2?}, RSS once idle {:.1} MB",
                mb(idle)
            );
            drop(c);
            let status = child.stop().await;
            if !status.success() {
                return Err(format!("the broker exited with {status} on SIGTERM").into());
            }
            figures.listening.push(listening);
            figures.dispatched.push(dispatched);
            figures.rss.push(idle);
        }
        out.push(figures);
    }
    Ok((stop, out))
}
