//! The broker under test: in this process on a temporary directory, or
//! (`RS_E2E_CHILD=1`) the release `ricochet-broker` binary in a child
//! process; also how that binary is found and spawned (shared with part 3).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ricochet_broker::Durability;
use ricochet_testkit::{
    BrokerBinNotFound, BrokerProcess, InProcessBroker, SpawnOptions, find_broker_bin,
};

use crate::BoxError;

/// The broker under test, on a temporary directory: in this process, or
/// (`RS_E2E_CHILD=1`) the release binary in a child process.
pub(crate) struct Broker {
    pub(crate) url: String,
    pub(crate) kind: &'static str,
    in_process: Option<InProcessBroker>,
    _child: Option<(BrokerProcess, tempfile::TempDir)>,
}

impl Broker {
    pub(crate) async fn start(
        durability: Durability,
        max_unacked: usize,
    ) -> Result<Self, BoxError> {
        if std::env::var_os("RS_E2E_CHILD").is_some() {
            let bin = broker_bin().map_err(|e| format!("RS_E2E_CHILD: {e}"))?;
            let dir = tempfile::tempdir()?;
            let config = dir.path().join("broker.toml");
            let mode = match durability {
                Durability::Sync => "sync",
                Durability::Interval => "interval",
            };
            std::fs::write(
                &config,
                format!("durability = \"{mode}\"\nmax_unacked_per_consumer = {max_unacked}\n"),
            )?;
            let child = spawn_broker(&bin, &dir.path().join("data"), Some(&config)).await;
            return Ok(Self {
                url: child.url().to_owned(),
                kind: "child process",
                in_process: None,
                _child: Some((child, dir)),
            });
        }
        let broker = InProcessBroker::start_with(|c| {
            c.durability = durability;
            c.max_unacked_per_consumer = max_unacked;
        })
        .await;
        Ok(Self {
            url: broker.url(),
            kind: "in process",
            in_process: Some(broker),
            _child: None,
        })
    }

    pub(crate) async fn stop(self) -> Result<(), BoxError> {
        if let Some(b) = self.in_process {
            let storage = Arc::downgrade(&b.core.storage);
            b.shutdown().await;
            // The next broker in this process must not start while this one's
            // sled database is still closing: sled 0.34's transaction lock is
            // process-wide (a hang was seen otherwise).
            let t = Instant::now();
            while storage.upgrade().is_some() {
                if t.elapsed() > Duration::from_secs(120) {
                    return Err("the broker's storage is still open 120 s after shutdown".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }
}

/// `RS_BROKER_BIN`, else the testkit's search: `RICOCHET_BROKER_BIN`, then
/// `target/release/ricochet-broker` next to this bench.
pub(crate) fn broker_bin() -> Result<PathBuf, BrokerBinNotFound> {
    find_broker_bin(
        std::env::var_os("RS_BROKER_BIN")
            .map(PathBuf::from)
            .as_deref(),
    )
}

/// The broker binary `bin` on `dir`, with `--config` when given; returns
/// once it listens (on a port of its own choosing).
pub(crate) async fn spawn_broker(bin: &Path, dir: &Path, config: Option<&Path>) -> BrokerProcess {
    let mut options = SpawnOptions::new()
        .bin(bin)
        .rust_log("error")
        .start_timeout(Duration::from_secs(600));
    if let Some(c) = config {
        options = options.args([Path::new("--config"), c]);
    }
    BrokerProcess::spawn(dir, &options).await
}
