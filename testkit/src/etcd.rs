//! etcd for cluster tests: [`EtcdProcess`] runs Debian's `etcd` binary
//! (package `etcd-server`) from `PATH` on free loopback ports with a
//! temporary data directory, waits until it answers, and kills it when
//! dropped; [`etcd_or_skip`] decides whether a test without etcd is
//! skipped (printing why) or fails (`RICOCHET_REQUIRE_ETCD=1`, as `.ci/run`
//! sets); [`spawn_cluster`] starts brokers as child processes in cluster
//! mode against it.

use crate::net::free_addr;
use crate::process::{BrokerProcess, SpawnOptions};
use ricochet_cluster::proto::{RangeRequest, kv_client::KvClient};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Set to `1` to make a missing `etcd` fail cluster tests instead of
/// skipping them.
pub const REQUIRE_ENV: &str = "RICOCHET_REQUIRE_ETCD";
/// How long etcd may take to answer after it starts.
const START_WAIT: Duration = Duration::from_secs(60);

/// Whether an `etcd` binary is on `PATH`.
pub fn etcd_installed() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running etcd, killed (SIGKILL) and its data removed when dropped.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

/// Starts etcd for `test`, or `None` (after printing a line saying the
/// test is skipped) when it is not installed and `RICOCHET_REQUIRE_ETCD`
/// is not `1`. Panics when it is required and missing.
pub async fn etcd_or_skip(test: &str) -> Option<EtcdProcess> {
    if !etcd_installed() {
        if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
            panic!(
                "{test}: etcd is not installed (apt-get install etcd-server) and {REQUIRE_ENV}=1"
            );
        }
        println!(
            "{test}: skipped: no etcd on PATH (apt-get install etcd-server; set {REQUIRE_ENV}=1 to fail instead)"
        );
        return None;
    }
    Some(EtcdProcess::start().await)
}

impl EtcdProcess {
    /// Starts etcd on free loopback ports; returns once it answers a read.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir for etcd");
        let (client, peer): (SocketAddr, SocketAddr) = (free_addr(), free_addr());
        let url = format!("http://{client}");
        let peer_url = format!("http://{peer}");
        let child = Command::new("etcd")
            .arg("--name")
            .arg("ricochet-test")
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .arg("--listen-client-urls")
            .arg(&url)
            .arg("--advertise-client-urls")
            .arg(&url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("ricochet-test={peer_url}"))
            .arg("--log-level")
            .arg("error")
            .arg("--logger")
            .arg("zap")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
        let etcd = Self {
            child,
            url,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + START_WAIT;
        loop {
            if etcd.answers().await {
                return etcd;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "etcd did not answer within {START_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn answers(&self) -> bool {
        let Ok(endpoint) = tonic::transport::Endpoint::from_shared(self.url.clone()) else {
            return false;
        };
        let Ok(Ok(channel)) =
            tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await
        else {
            return false;
        };
        let mut kv = KvClient::new(channel);
        let read = kv.range(RangeRequest {
            key: b"/".to_vec(),
            ..Default::default()
        });
        matches!(
            tokio::time::timeout(Duration::from_secs(2), read).await,
            Ok(Ok(_))
        )
    }

    /// `http://127.0.0.1:PORT`, its client URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client of its KV API.
    pub async fn kv(&self) -> KvClient<tonic::transport::Channel> {
        KvClient::new(crate::raw::channel(&self.url).await)
    }

    /// The value and create revision of `key`, if present.
    pub async fn get(&self, key: &str) -> Option<(String, i64)> {
        let r = self
            .kv()
            .await
            .range(RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .expect("read etcd")
            .into_inner();
        r.kvs.into_iter().next().map(|kv| {
            (
                String::from_utf8_lossy(&kv.value).into_owned(),
                kv.create_revision,
            )
        })
    }

    /// The value of `key` once it is there (read every 200 ms); panics
    /// naming `what` if it is not within `within`.
    pub async fn value_within(&self, key: &str, within: std::time::Duration, what: &str) -> String {
        let start = std::time::Instant::now();
        loop {
            if let Some((v, _)) = self.get(key).await {
                return v;
            }
            assert!(
                start.elapsed() < within,
                "{what} never reached etcd ({key})"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A broker of a test cluster: its process, data directory, port and id.
#[derive(Debug)]
pub struct ClusterBroker {
    /// The process (`None` after a test killed it).
    pub process: Option<BrokerProcess>,
    /// Its data directory (kept across restarts).
    pub dir: PathBuf,
    /// Where it listens and what it advertises.
    pub addr: SocketAddr,
    /// Its broker id (`b0`, `b1`, …).
    pub id: String,
    options: SpawnOptions,
}

impl ClusterBroker {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The running process (panics if it was killed).
    pub fn process(&self) -> &BrokerProcess {
        self.process.as_ref().expect("the broker runs")
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(p) = self.process.take() {
            p.kill9();
        }
    }

    /// Starts it again on the same directory, port and id.
    pub async fn restart(&mut self) {
        self.kill9();
        self.process = Some(BrokerProcess::spawn(&self.dir, &self.options).await);
    }

    /// [`Self::restart`] with its options changed by `change` (kept for
    /// later restarts).
    pub async fn restart_with(&mut self, change: impl FnOnce(SpawnOptions) -> SpawnOptions) {
        self.options = change(self.options.clone());
        self.restart().await;
    }
}

/// Starts `n` brokers (ids `b0`..) in cluster `name` against `etcd`, each on
/// a free loopback port it also advertises, with data under `root` and
/// lease TTL `ttl` (whole seconds), from `base` options (the binary, more
/// arguments).
pub async fn spawn_cluster(
    etcd: &EtcdProcess,
    name: &str,
    n: usize,
    root: &Path,
    ttl: Duration,
    base: &SpawnOptions,
) -> Vec<ClusterBroker> {
    spawn_cluster_each(etcd, name, n, root, ttl, base, |_, o| o).await
}

/// [`spawn_cluster`], broker `i`'s options from `each(i, base)` (its own
/// metrics address, say).
pub async fn spawn_cluster_each(
    etcd: &EtcdProcess,
    name: &str,
    n: usize,
    root: &Path,
    ttl: Duration,
    base: &SpawnOptions,
    each: impl Fn(usize, SpawnOptions) -> SpawnOptions,
) -> Vec<ClusterBroker> {
    let mut brokers = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("b{i}");
        let dir = root.join(&id);
        let (process, addr, options) = BrokerProcess::spawn_on_free_addr(&dir, |addr| {
            each(i, base.clone())
                .listen(addr)
                .start_timeout(Duration::from_secs(60))
                .args([
                    "--cluster",
                    name,
                    "--etcd",
                    etcd.url(),
                    "--advertise",
                    &format!("http://{addr}"),
                    "--broker-id",
                    &id,
                    "--lease-ttl",
                    &format!("{}s", ttl.as_secs()),
                ])
        })
        .await;
        brokers.push(ClusterBroker {
            process: Some(process),
            dir,
            addr,
            id,
            options,
        });
    }
    // A broker prints its address before it joins: wait until every one
    // is registered, so placement sees them all.
    let deadline = tokio::time::Instant::now() + START_WAIT;
    loop {
        let live = live_brokers(&brokers[0].url()).await;
        if live >= n {
            return brokers;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {live} of {n} brokers registered within {START_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many live brokers the broker at `url` lists (0 when it cannot say).
pub async fn live_brokers(url: &str) -> usize {
    let mut client =
        ricochet_proto::cluster_client::ClusterClient::new(crate::raw::channel(url).await);
    match client
        .list_brokers(ricochet_proto::ListBrokersRequest { with_topics: false })
        .await
    {
        Ok(r) => r.into_inner().brokers.iter().filter(|b| b.live).count(),
        Err(_) => 0,
    }
}
