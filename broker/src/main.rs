//! `ricochet-broker`: the broker binary. Parses flags and the optional TOML
//! config, sets up logging (text or JSON on stdout, filtered by `RUST_LOG`,
//! coloured only when stdout is a terminal), and runs
//! [`ricochet_broker::Broker`] until SIGINT or SIGTERM;
//! `ricochet-broker check --data-dir D` verifies a stopped store instead. A
//! broker that cannot start says why in one line on stderr.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ricochet_broker::{Broker, BrokerConfig, Durability, LogFormat, VerifyOnStart};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

mod allocator;
#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
mod jemalloc_tuning;
use allocator::{IdleMemory, allocator_settings, return_idle_memory, set_allocator_defaults};

/// The Ricochet message broker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Something other than serving (none: serve).
    #[command(subcommand)]
    command: Option<Command>,
    /// TOML config file; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Data directory (default ./data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// gRPC listen address (default 127.0.0.1:6650).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Prometheus listen address (default 127.0.0.1:9464).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// `sync` (receipt after fsync, the default) or `interval`.
    #[arg(long, value_parser = parse_durability)]
    durability: Option<Durability>,
    /// sled's page cache: bytes, or with a KiB, MiB or GiB suffix (default
    /// 16MiB; see `cache_capacity` in the config).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    cache_capacity: Option<u64>,
    /// Start even when the store lacks what its manifest records (each loss
    /// is logged, and what is left becomes the record).
    #[arg(long)]
    accept_data_loss: bool,
    /// When every stored value is read and checked: `before` serving (a
    /// damaged store is refused), in the `background` once serving (the
    /// default: damage is reported), or `off`.
    #[arg(long, value_name = "WHEN")]
    verify_on_start: Option<VerifyOnStart>,
    /// `text` (the default) or `json` (one object per line).
    #[arg(long)]
    log_format: Option<LogFormat>,
    /// Serve the web console on this address (off by default; loopback
    /// only unless --console-allow-remote).
    #[arg(long)]
    console_listen: Option<SocketAddr>,
    /// Allow a non-loopback --console-listen (use it with [auth], and
    /// [tls], which the console is served with too).
    #[arg(long)]
    console_allow_remote: bool,
    /// On jemalloc (the default build): `on` (the default) starts
    /// jemalloc's background purging threads with a 1 s dirty decay and
    /// flushes an idle runtime worker's cache at most once a second;
    /// `eager` a 0 decay (every freed page goes back at once); `off`
    /// jemalloc's own (no background threads, 10 s); `_RJEM_MALLOC_CONF`
    /// still wins. Built with `--no-default-features` (mimalloc): `on`: a
    /// runtime worker going idle gives what it freed back to the system,
    /// at most once a second (mimalloc's own 1 s purge delay); `eager`:
    /// that, and mimalloc's purge delay 0 (unless MIMALLOC_PURGE_DELAY sets
    /// it), for about a quarter to a third less throughput on the paths
    /// that churn memory; `off`: mimalloc's own defaults, and no collect on
    /// idle workers.
    #[arg(
        long,
        value_name = "ON|EAGER|OFF",
        env = "RICOCHET_RETURN_IDLE_MEMORY",
        default_value = "on"
    )]
    return_idle_memory: IdleMemory,
    /// Cluster flags (override the config's `advertise` and `[cluster]`).
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Security flags (override the config's `[auth]`).
    #[command(flatten)]
    security: SecurityArgs,
}

/// Cluster mode: brokers coordinated through etcd.
#[derive(Debug, clap::Args)]
struct ClusterArgs {
    /// Join the cluster of this name (turns cluster mode on; needs
    /// --advertise and etcd).
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// etcd client URLs, comma-separated (default http://127.0.0.1:2379).
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The URL clients and other brokers reach this broker at
    /// (default http://<listen>).
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// This broker's id in the cluster (default: its store id).
    #[arg(long, value_name = "ID")]
    broker_id: Option<String>,
    /// The etcd lease TTL (default 10s; at least 2s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    lease_ttl: Option<std::time::Duration>,
    /// Replace a replication group's member whose broker is down this long
    /// (default 5m; "0s": never).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    replace_after: Option<std::time::Duration>,
    /// Raft entries between snapshots of a replicated partition (default
    /// 10000; 0: never).
    #[arg(long, value_name = "N")]
    snapshot_every: Option<u64>,
    /// How long creating a replicated partitioned topic waits for its
    /// partitions' groups to form (default 30s).
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = humantime::parse_duration,
        env = "RICOCHET_PARTITION_FORM_TIMEOUT"
    )]
    partition_form_timeout: Option<std::time::Duration>,
}

impl ClusterArgs {
    fn apply(self, config: &mut BrokerConfig) -> anyhow::Result<()> {
        if let Some(a) = self.advertise {
            config.advertise = Some(a);
        }
        if let Some(name) = self.cluster {
            config.cluster.get_or_insert_with(Default::default).name = name;
        }
        let given = !self.etcd.is_empty()
            || self.broker_id.is_some()
            || self.lease_ttl.is_some()
            || self.replace_after.is_some()
            || self.snapshot_every.is_some()
            || self.partition_form_timeout.is_some();
        let Some(cluster) = config.cluster.as_mut() else {
            anyhow::ensure!(
                !given,
                "--etcd, --broker-id, --lease-ttl, --replace-after, --snapshot-every and --partition-form-timeout (RICOCHET_PARTITION_FORM_TIMEOUT) need --cluster NAME (or a [cluster] table in the config)"
            );
            return Ok(());
        };
        if !self.etcd.is_empty() {
            cluster.etcd = self.etcd;
        }
        if let Some(id) = self.broker_id {
            cluster.broker_id = Some(id);
        }
        if let Some(ttl) = self.lease_ttl {
            cluster.lease_ttl = ttl;
        }
        if let Some(after) = self.replace_after {
            cluster.replace_after = after;
        }
        if let Some(n) = self.snapshot_every {
            cluster.snapshot_every = n;
        }
        if let Some(d) = self.partition_form_timeout {
            cluster.partition_form_timeout = d;
        }
        Ok(())
    }
}

/// Authentication flags; each overrides its `[auth]` setting.
#[derive(Debug, clap::Args)]
struct SecurityArgs {
    /// Require HS256 tokens signed with the secret in this file (turns
    /// authentication on).
    #[arg(long, value_name = "FILE", conflicts_with = "auth_public_key_file")]
    auth_secret_file: Option<PathBuf>,
    /// Require RS256/ES256 tokens verified with this PEM public key (turns
    /// authentication on).
    #[arg(long, value_name = "FILE")]
    auth_public_key_file: Option<PathBuf>,
    /// A role that may do everything (repeatable).
    #[arg(long = "superuser", value_name = "ROLE")]
    superusers: Vec<String>,
    /// Serve a non-loopback address without authentication.
    #[arg(long)]
    allow_insecure: bool,
    /// `/metrics` requires the bearer token in this file.
    #[arg(long, value_name = "FILE")]
    metrics_token_file: Option<PathBuf>,
    /// Serve TLS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Verify client certificates against these PEM CA certificates.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Refuse clients without a certificate the client CA signed.
    #[arg(long, requires = "tls_client_ca")]
    tls_require_client_cert: bool,
}

impl SecurityArgs {
    fn apply(self, config: &mut BrokerConfig) {
        let tls = &mut config.tls;
        if let Some(f) = self.tls_cert {
            tls.cert_file = Some(f);
        }
        if let Some(f) = self.tls_key {
            tls.key_file = Some(f);
        }
        if let Some(f) = self.tls_client_ca {
            tls.client_ca_file = Some(f);
        }
        if self.tls_require_client_cert {
            tls.require_client_cert = true;
        }
        let auth = &mut config.auth;
        if let Some(f) = self.auth_secret_file {
            auth.enabled = true;
            auth.token_secret_file = Some(f);
            auth.token_public_key_file = None;
        }
        if let Some(f) = self.auth_public_key_file {
            auth.enabled = true;
            auth.token_public_key_file = Some(f);
            auth.token_secret_file = None;
        }
        if !self.superusers.is_empty() {
            auth.superusers = self.superusers;
        }
        if self.allow_insecure {
            auth.allow_insecure = true;
        }
        if let Some(f) = self.metrics_token_file {
            auth.metrics_token_file = Some(f);
        }
    }
}

/// Logs to stdout in `format`, at `RUST_LOG` (default `info`); colours only
/// when stdout is a terminal, so files and collectors get plain text.
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A closed stdout (`| head`) loses the log; it is not reported on
    // stderr once per event.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stdout().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Verify a stopped store: the manifest, and every stored value's
    /// checksum; print what it holds; exit 1 on any problem.
    Check {
        /// Data directory (default: the config file's, else ./data).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// TOML config file (for its data directory and segment size).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// `67108864`, `65536KiB`, `64MiB` or `1GiB`.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?}: use KiB, MiB or GiB")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("not a size: {s:?}"))
}

fn parse_durability(s: &str) -> Result<Durability, String> {
    match s {
        "sync" => Ok(Durability::Sync),
        "interval" => Ok(Durability::Interval),
        other => Err(format!(
            "unknown durability {other:?}: use sync or interval"
        )),
    }
}

/// Takes SIGTERM and SIGINT from now on and returns the future that
/// completes at the first of them.
///
/// Called before the store is opened, not when the server starts: a signal
/// that came during a long start (a sled log replay, millions of parked
/// retries) took its default action and killed the broker without a clean
/// stop (so the next start replayed sled's log again). Taken here, the
/// broker finishes opening, serves nothing new and stops cleanly.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some((term, int)),
            _ => None,
        }
    };
    async move {
        #[cfg(unix)]
        match signals {
            Some((mut term, mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received");
    }
}

fn main() -> ExitCode {
    // Before anything else: every later fault obeys it.
    ricochet_broker::process::disable_transparent_huge_pages();
    let args = Args::parse();
    let result = match args.command {
        Some(Command::Check { data_dir, config }) => {
            init_logging(LogFormat::Text);
            check(data_dir, config)
        }
        None => {
            set_allocator_defaults(args.return_idle_memory);
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            runtime.enable_all();
            if let Some(hook) = return_idle_memory(args.return_idle_memory) {
                runtime.on_thread_park(hook);
            }
            runtime
                .build()
                .context("cannot start the async runtime")
                .and_then(|rt| {
                    let stopped = rt.block_on(serve(args));
                    // Every task (and its handle on the store) ends here.
                    rt.shutdown_timeout(STOP_WAIT);
                    stopped
                })
                .map(|data_dir| {
                    snapshot_after_stop(&data_dir);
                    ExitCode::SUCCESS
                })
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("ricochet-broker: {e:#}");
        ExitCode::FAILURE
    })
}

/// How long a clean stop waits for the runtime's last tasks, and then for
/// the store's lock, before [`snapshot_after_stop`].
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// After a clean stop: has sled record where its pages live, so the next
/// start reads that instead of replaying the log written since this one
/// started (see `SledStorage::snapshot_stopped`). A failure only costs the
/// next start that replay: it is logged, and the stop stays clean.
fn snapshot_after_stop(data_dir: &std::path::Path) {
    let started = std::time::Instant::now();
    match ricochet_broker::storage::SledStorage::snapshot_stopped(data_dir, STOP_WAIT) {
        Ok(()) => tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            "stop: sled's log recorded in a snapshot (the next start reads it instead of replaying the log)"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            "stop: sled's snapshot was not taken; the next start replays its log"
        ),
    }
}

fn check(data_dir: Option<PathBuf>, config: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let mut config = match &config {
        Some(path) => BrokerConfig::from_file(path)?,
        None => BrokerConfig::default(),
    };
    if let Some(d) = data_dir {
        config.data_dir = d;
    }
    let report = ricochet_broker::check::check_store(&config.data_dir, config.log_settings())
        .with_context(|| format!("cannot check {}", config.data_dir.display()))?;
    println!("data directory:    {}", config.data_dir.display());
    print!("{report}");
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Serves until a shutdown signal and a clean stop; returns the data
/// directory.
async fn serve(args: Args) -> anyhow::Result<PathBuf> {
    let mut config = match &args.config {
        Some(path) => BrokerConfig::from_file(path)?,
        None => BrokerConfig::default(),
    };
    if let Some(f) = args.log_format {
        config.log_format = f;
    }
    init_logging(config.log_format);
    let shutdown = shutdown_signal();
    if let Some(d) = args.data_dir {
        config.data_dir = d;
    }
    if let Some(l) = args.listen {
        config.listen = l;
    }
    if let Some(m) = args.metrics_listen {
        config.metrics_listen = Some(m);
    }
    if let Some(d) = args.durability {
        config.durability = d;
    }
    if let Some(c) = args.cache_capacity {
        config.cache_capacity = c;
    }
    if args.accept_data_loss {
        config.accept_data_loss = true;
    }
    if let Some(v) = args.verify_on_start {
        config.verify_on_start = v;
    }
    args.security.apply(&mut config);
    args.cluster.apply(&mut config)?;
    if let Some(c) = args.console_listen {
        config.console_listen = Some(c);
    }
    if args.console_allow_remote {
        config.console_allow_remote = true;
    }
    // Flags can make a config invalid (a non-loopback console): say so as
    // such, not as a failure to open the data.
    config.validate()?;
    let a = allocator_settings();
    tracing::info!(
        allocator = a.allocator,
        purge_delay_ms = a.purge_delay_ms,
        background_thread = a.background_thread,
        dirty_decay_ms = a.dirty_decay_ms,
        muzzy_decay_ms = a.muzzy_decay_ms,
        return_idle_memory = ?args.return_idle_memory,
        "memory allocator"
    );
    let data_dir = config.data_dir.clone();
    let (listen, metrics) = (config.listen, config.metrics_listen);
    let security = config.security_summary();
    // The recorder goes in first: metric handles taken before it exists are
    // no-ops, and opening the broker starts the stored subscriptions.
    if let Some(addr) = metrics {
        let token = ricochet_broker::auth::metrics_token(&config.auth)?;
        ricochet_broker::install_prometheus_secured(addr, token)?;
    }
    let broker = Broker::builder(config)
        .open()
        .await
        .with_context(|| format!("cannot open the broker's data in {}", data_dir.display()))?;
    if ricochet_broker::storage::util::failpoint_armed("start.pause_before_listen") {
        // A crash test's window inside a start: the store is open, nothing
        // listens yet.
        say(format_args!(
            "failpoint start.pause_before_listen: pausing 2 s"
        ));
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // One line on stdout with the bound address (useful with port 0) and
    // whether TLS and authentication are on.
    say(format_args!(
        "ricochet-broker listening on {} ({security})",
        listener.local_addr()?
    ));
    if let Some(console) = broker.start_console().await? {
        let scheme = if broker.core().config.tls.enabled() {
            "https"
        } else {
            "http"
        };
        say(format_args!(
            "ricochet-broker console on {scheme}://{console}/"
        ));
    }
    broker.serve(listener, shutdown).await?;
    Ok(data_dir)
}

/// Writes one line to stdout, ignoring a closed stdout (`ricochet-broker
/// | head -3`): `println!` panicked there, and the broker stopped before it
/// served. The log (on stdout too) already ignores write errors.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_in_bytes_or_binary_units() {
        assert_eq!(parse_size("67108864"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("64MB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }
}
