//! `ricochet-broker`: the broker binary. Parses flags and the optional TOML
//! config, sets up logging (text or JSON on stdout, filtered by `RUST_LOG`,
//! coloured only when stdout is a terminal), and runs
//! [`ricochet_broker::Broker`] until SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use ricochet_broker::{Broker, BrokerConfig, Durability, LogFormat};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

// sled copies tree nodes on every write; glibc's allocator was a third of the
// broker's profile, mimalloc makes that churn cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The Ricochet message broker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
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
    /// `text` (the default) or `json` (one object per line).
    #[arg(long)]
    log_format: Option<LogFormat>,
}

/// Logs to stdout in `format`, at `RUST_LOG` (default `info`); colours only
/// when stdout is a terminal, so files and collectors get plain text.
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stdout().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
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

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown signal received");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut config = match &args.config {
        Some(path) => BrokerConfig::from_file(path)?,
        None => BrokerConfig::default(),
    };
    if let Some(f) = args.log_format {
        config.log_format = f;
    }
    init_logging(config.log_format);
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
    let data_dir = config.data_dir.clone();
    let (listen, metrics) = (config.listen, config.metrics_listen);
    // The recorder goes in first: metric handles taken before it exists are
    // no-ops, and opening the broker starts the stored subscriptions.
    if let Some(addr) = metrics {
        ricochet_broker::install_prometheus(addr)?;
    }
    let broker = Broker::builder(config)
        .open()
        .await
        .with_context(|| format!("cannot open the broker's data in {}", data_dir.display()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // One line on stdout with the bound address (useful with port 0).
    println!("ricochet-broker listening on {}", listener.local_addr()?);
    broker.serve(listener, shutdown_signal()).await?;
    Ok(())
}
