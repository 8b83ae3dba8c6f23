//! The steady-state soak (issue #12, item 5): memory and disk of a live
//! broker under a mixed load held for minutes (a plain `main` that prints
//! its figures).
//!
//! The release `ricochet-broker` binary on a fresh temporary data
//! directory (`sync` durability, default cache), a retention policy on the
//! namespace `public/default` set through the `ricochet` CLI, then two
//! `ricochet perf` processes side by side for the run's duration:
//! `perf produce --rate 20000 --size 1024` on one topic and
//! `perf redeliver --rate 5000 --consumers 2` (128 B, nack → 100 ms →
//! redelivery → ack) on another. Every 5 s the broker's resident memory
//! (`VmRSS`), the data directory's size (allocated blocks) and the load
//! average are sampled; at the end it prints per minute the RSS and disk
//! range and the worst per-second p99 of each load, the RSS slope over the
//! last 5 minutes, and the two runs' summaries (publish latency,
//! redelivery lateness: p50 / p99 / p999), each against issue #21's
//! target: RSS ≤ the configured cache + 100 MB, the data directory ≤ 1.2x
//! the retention limit, publish p99 ≤ 10 ms, redelivery lateness p99
//! ≤ 20 ms. (Issue #12 had cache + 150 MB and 10 ms for both.)
//!
//! `cargo build --release -p ricochet-broker -p ricochet-cli && cargo bench
//! -p ricochet-benches --bench soak`. Environment: `SOAK_SECS` (duration,
//! default 600), `SOAK_QUICK=1` (60 s), `SOAK_MAX_SIZE` / `SOAK_MAX_AGE`
//! (the namespace policy, default `256MiB` / `2m`), `SOAK_PRODUCE_RATE`,
//! `SOAK_REDELIVER_RATE`, `SOAK_CONFIG` (extra broker config lines, e.g.
//! `cache_capacity = 67108864`), `SOAK_CLI` / `RICOCHET_BROKER_BIN` (the
//! binaries; by default next to this bench in `target/release`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ricochet_testkit::{BrokerProcess, SpawnOptions, find_broker_bin, free_addr};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const SAMPLE: Duration = Duration::from_secs(5);
/// Issue #21's targets.
const TARGET_ABOVE_CACHE: u64 = 100_000_000;
const TARGET_DISK_RATIO: f64 = 1.2;
const TARGET_PUBLISH_P99_MS: f64 = 10.0;
const TARGET_LATENESS_P99_MS: f64 = 20.0;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// One sample of the broker and its data directory.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: f64,
    rss: u64,
    disk: u64,
    /// Of `disk`, sled's `blobs/` directory (values over its blob threshold).
    blobs: u64,
    load1: f64,
}

/// The per-second p99 (ms) a perf process printed, by second of its run.
#[derive(Debug, Default)]
struct Progress {
    p99_by_second: Vec<(u64, f64)>,
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time (user + system) the process has used, in seconds (`/proc/<pid>/stat`,
/// in clock ticks of 1/100 s).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after the name.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Bytes allocated to the files under `dir` (what `du` counts).
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// A metric's value summed over its series, from the broker's
/// Prometheus endpoint.
fn scrape(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `ricochet` next to this bench (`target/release/deps/soak-…` →
/// `target/release/ricochet`), or `SOAK_CLI`.
fn cli_bin() -> Result<PathBuf, BoxError> {
    if let Some(p) = std::env::var_os("SOAK_CLI") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(Path::parent).ok_or("no target dir")?;
    let p = dir.join("ricochet");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "no ricochet CLI at {}: run `cargo build --release -p ricochet-cli` first, or set SOAK_CLI",
            p.display()
        )
        .into())
    }
}

/// Starts `ricochet perf …`, its JSON summary on stdout, its progress
/// lines on stderr read into the returned [`Progress`].
fn spawn_perf(
    cli: &Path,
    url: &str,
    args: &[String],
) -> Result<(Child, Arc<Mutex<Progress>>), BoxError> {
    let mut child = Command::new(cli)
        .args(["--url", url, "-o", "json", "perf"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let progress = Arc::new(Mutex::new(Progress::default()));
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let p = progress.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // "[  12s] label ... | latency ms p50 a p99 b p999 c ..."
            let second = line
                .strip_prefix('[')
                .and_then(|r| r.split('s').next())
                .and_then(|s| s.trim().parse::<u64>().ok());
            let p99 = line
                .split(" p99 ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse::<f64>().ok());
            match (second, p99) {
                (Some(s), Some(v)) => p
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .p99_by_second
                    .push((s, v)),
                _ => eprintln!("  perf: {line}"),
            }
        }
    });
    Ok((child, progress))
}

fn run_cli(cli: &Path, url: &str, args: &[&str]) -> Result<String, BoxError> {
    let out = Command::new(cli).args(["--url", url]).args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "ricochet {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn finish(child: Child, what: &str) -> Result<serde_json::Value, BoxError> {
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!("{what} exited with {}", out.status).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Least-squares slope of `(x, y)` points.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn latency_line(v: &serde_json::Value, target_ms: f64) -> String {
    let f = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    let (p99, p999) = (f("p99"), f("p999"));
    format!(
        "p50 {:.2} / p99 {p99:.2} / p999 {p999:.2} / max {:.2} ms  (p99 target <= {target_ms} ms: {})",
        f("p50"),
        f("max"),
        if p99 <= target_ms { "met" } else { "MISSED" }
    )
}

fn main() -> Result<(), BoxError> {
    let secs: u64 = if std::env::var_os("SOAK_QUICK").is_some() {
        60
    } else {
        env_or("SOAK_SECS", "600").parse()?
    };
    let max_size = env_or("SOAK_MAX_SIZE", "256MiB");
    let max_age = env_or("SOAK_MAX_AGE", "2m");
    let produce_rate = env_or("SOAK_PRODUCE_RATE", "20000");
    let redeliver_rate = env_or("SOAK_REDELIVER_RATE", "5000");
    let extra_config = env_or("SOAK_CONFIG", "").replace(';', "\n");
    let bin = find_broker_bin(None)?;
    let cli = cli_bin()?;
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let config_path = dir.path().join("broker.toml");
    std::fs::write(
        &config_path,
        format!("durability = \"sync\"\n{extra_config}\n"),
    )?;
    let config = ricochet_broker::BrokerConfig::from_file(&config_path)?;
    let cache = config.cache_capacity;
    println!(
        "soak: {secs} s; release ricochet-broker ({}), sync durability, cache_capacity {:.0} MB, segment_entries {}{}; retention on public/default: max size {max_size}, max age {max_age}",
        bin.display(),
        mb(cache),
        config.segment_entries,
        if extra_config.trim().is_empty() {
            String::new()
        } else {
            format!("; config: {}", extra_config.trim().replace('\n', "; "))
        }
    );
    println!(
        "  loads (the ricochet CLI, separate processes): perf produce --rate {produce_rate} --size 1024 on soak-produce; perf redeliver --rate {redeliver_rate} --consumers 2 (128 B, backoff fixed 100 ms) on soak-redeliver"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let metrics = free_addr();
    let broker = rt.block_on(BrokerProcess::spawn(
        &data,
        &SpawnOptions::new()
            .bin(&bin)
            .rust_log("warn")
            .echo_log(true)
            .metrics_listen(metrics)
            .start_timeout(Duration::from_secs(60))
            .args([Path::new("--config"), &config_path]),
    ));
    let url = broker.url().to_owned();
    let pid = broker.pid();
    let set = run_cli(
        &cli,
        &url,
        &[
            "namespaces",
            "set-retention",
            "public/default",
            "--max-size",
            &max_size,
            "--max-age",
            &max_age,
        ],
    )?;
    println!("  {set}");
    let limit = parse_size(&max_size)?;
    std::thread::sleep(Duration::from_secs(2));
    let idle = rss(pid);
    let cpu_before = cpu_secs(pid);

    let duration = format!("{secs}s");
    let (produce, produce_progress) = spawn_perf(
        &cli,
        &url,
        &[
            "produce",
            "--topic",
            "soak-produce",
            "--rate",
            &produce_rate,
            "--size",
            "1024",
            "--duration",
            &duration,
        ]
        .map(String::from),
    )?;
    let (redeliver, redeliver_progress) = spawn_perf(
        &cli,
        &url,
        &[
            "redeliver",
            "--topic",
            "soak-redeliver",
            "--rate",
            &redeliver_rate,
            "--consumers",
            "2",
            "--duration",
            &duration,
        ]
        .map(String::from),
    )?;

    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next = start;
    while start.elapsed() < Duration::from_secs(secs) {
        next += SAMPLE;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let s = Sample {
            at: start.elapsed().as_secs_f64(),
            rss: rss(pid),
            disk: du(&data),
            blobs: du(&data.join("blobs")),
            load1: load1(),
        };
        if std::env::var_os("SOAK_VERBOSE").is_some() {
            eprintln!(
                "  [{:>4.0}s] rss {:.0} MB disk {:.0} MB (blobs {:.0} MB) load {:.1}",
                s.at,
                mb(s.rss),
                mb(s.disk),
                mb(s.blobs),
                s.load1
            );
        }
        samples.push(s);
    }
    let produced = finish(produce, "perf produce")?;
    let redelivered = finish(redeliver, "perf redeliver")?;
    let dropped = scrape(metrics, "ricochet_retention_dropped_bytes_total").unwrap_or(0.0);
    let dropped_segments =
        scrape(metrics, "ricochet_retention_dropped_segments_total").unwrap_or(0.0);
    let end_disk = du(&data);
    let broker_cpu = cpu_secs(pid) - cpu_before;
    let end_blobs = std::fs::read_dir(data.join("blobs")).map_or(0, |d| d.flatten().count());
    let end_blob_bytes = du(&data.join("blobs"));
    rt.block_on(broker.stop());

    print_report(&Report {
        secs,
        idle,
        cache,
        limit,
        samples: &samples,
        produce_p99: &produce_progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .p99_by_second,
        redeliver_p99: &redeliver_progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .p99_by_second,
    });
    println!(
        "  retention dropped {:.0} MB in {dropped_segments} segments; data dir after the loads {:.0} MB",
        dropped / 1e6,
        mb(end_disk)
    );
    println!(
        "  blobs/ after the loads: {end_blobs} files, {:.0} MB; load1 over the run {:.1}-{:.1} (shared machine)",
        mb(end_blob_bytes),
        samples
            .iter()
            .map(|s| s.load1)
            .fold(f64::INFINITY, f64::min),
        samples.iter().map(|s| s.load1).fold(0.0, f64::max),
    );
    println!(
        "  broker CPU time under the loads: {broker_cpu:.1} s user + system ({:.0}% of one core)",
        100.0 * broker_cpu / secs as f64
    );
    for (what, v) in [
        ("perf produce", &produced),
        ("perf redeliver", &redelivered),
    ] {
        println!(
            "  {what}: {} messages at {} msg/s, {} errors",
            v["messages"], v["msg_per_s"], v["errors"]
        );
    }
    println!(
        "  publish latency (send -> receipt): {}",
        latency_line(&produced["latency_ms"], TARGET_PUBLISH_P99_MS)
    );
    println!(
        "  redelivery lateness (beyond the 100 ms delay): {}",
        latency_line(&redelivered["lateness_ms"], TARGET_LATENESS_P99_MS)
    );
    Ok(())
}

/// `256MiB`-style sizes, as the CLI reads them.
fn parse_size(s: &str) -> Result<u64, BoxError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown size unit {other}").into()),
    };
    Ok(n * mult)
}

struct Report<'a> {
    secs: u64,
    idle: u64,
    cache: u64,
    limit: u64,
    samples: &'a [Sample],
    produce_p99: &'a [(u64, f64)],
    redeliver_p99: &'a [(u64, f64)],
}

fn print_report(r: &Report<'_>) {
    let minutes = r.secs.div_ceil(60);
    println!(
        "  broker RSS idle {:.0} MB; per minute (5 s samples; p99 = the worst per-second p99 the perf process printed):",
        mb(r.idle)
    );
    println!(
        "    min  RSS min-max MB   data dir min-max MB   load1   publish p99 ms   redeliver p99 ms"
    );
    let worst = |v: &[(u64, f64)], m: u64| {
        v.iter()
            .filter(|(s, _)| s / 60 == m)
            .map(|p| p.1)
            .fold(f64::NAN, f64::max)
    };
    for m in 0..minutes {
        let in_min: Vec<&Sample> = r
            .samples
            .iter()
            .filter(|s| ((s.at - 0.001) / 60.0) as u64 == m)
            .collect();
        if in_min.is_empty() {
            continue;
        }
        let lo = |f: fn(&Sample) -> u64| in_min.iter().map(|s| f(s)).min().unwrap_or(0);
        let hi = |f: fn(&Sample) -> u64| in_min.iter().map(|s| f(s)).max().unwrap_or(0);
        let load = in_min.iter().map(|s| s.load1).sum::<f64>() / in_min.len() as f64;
        println!(
            "    {:>3}  {:>5.0} - {:<5.0}      {:>6.0} - {:<6.0}        {:>5.1}   {:>8.1}         {:>8.1}",
            m + 1,
            mb(lo(|s| s.rss)),
            mb(hi(|s| s.rss)),
            mb(lo(|s| s.disk)),
            mb(hi(|s| s.disk)),
            load,
            worst(r.produce_p99, m),
            worst(r.redeliver_p99, m),
        );
    }
    let max_rss = r.samples.iter().map(|s| s.rss).max().unwrap_or(0);
    let target = r.cache + TARGET_ABOVE_CACHE;
    println!(
        "  RSS max {:.0} MB; configured cache {:.0} MB, target cache + 100 MB = {:.0} MB: {}",
        mb(max_rss),
        mb(r.cache),
        mb(target),
        if max_rss <= target { "met" } else { "MISSED" }
    );
    let window = (r.secs as f64 - 300.0).max(r.secs as f64 / 2.0);
    let tail: Vec<(f64, f64)> = r
        .samples
        .iter()
        .filter(|s| s.at >= window)
        .map(|s| (s.at / 60.0, mb(s.rss)))
        .collect();
    let k = slope(&tail);
    println!(
        "  RSS slope over the last {:.0} s: {k:+.2} MB/min ({} samples, {:.0} -> {:.0} MB){}",
        r.secs as f64 - window,
        tail.len(),
        tail.first().map_or(0.0, |p| p.1),
        tail.last().map_or(0.0, |p| p.1),
        if k < 1.0 {
            ": not growing"
        } else {
            ": GROWING"
        }
    );
    let max_disk = r.samples.iter().map(|s| s.disk).max().unwrap_or(0);
    let disk_tail: Vec<(f64, f64)> = r
        .samples
        .iter()
        .filter(|s| s.at >= window)
        .map(|s| (s.at / 60.0, mb(s.disk)))
        .collect();
    let ratio = max_disk as f64 / r.limit.max(1) as f64;
    println!(
        "  data dir max {:.0} MB against a retention max size of {:.0} MB per topic: {ratio:.2}x (target <= {TARGET_DISK_RATIO}x: {}); slope over the same window {:+.1} MB/min",
        mb(max_disk),
        mb(r.limit),
        if ratio <= TARGET_DISK_RATIO {
            "met"
        } else {
            "MISSED"
        },
        slope(&disk_tail)
    );
}
