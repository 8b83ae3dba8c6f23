//! Ricochet's workloads run against NATS JetStream on the same machine, so
//! that the side-by-side table in `docs/src/measuring.md` can be taken in one
//! sitting: this binary starts one or three `nats-server` processes
//! (Debian's package, JetStream on, file storage in a temp directory, each
//! server's defaults otherwise: it acknowledges a publish before an fsync)
//! and prints one line per figure.
//!
//! Workloads, chosen with `PEER_WORKLOAD` (comma-separated, default all):
//! - `publish`: one publisher, `PEER_WINDOW` (256) acknowledgements in
//!   flight, `PEER_N` (200 000) messages of `PEER_SIZE` (1024) bytes: msg/s.
//! - `consume`: the stream read back by a pull consumer that acks each
//!   message (explicit acks): msg/s.
//! - `nack`: `PEER_BURST` (1 000) messages delivered, each NAKed with a delay
//!   of `PEER_DELAY_MS` (1 000) ms at once (`NakWithDelay`): the lateness of
//!   each redelivery after its NAK call plus the delay, p50 / p99 / max.
//!
//! `PEER_SERVERS=3` runs a three-server JetStream cluster on loopback and
//! replicates the stream on all three (R3); the default is one server (R1).

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::{self, AckKind, consumer::pull, stream};
use bytes::Bytes;
use futures::StreamExt;
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `nats-server` child processes, killed on drop.
struct Servers {
    children: Vec<Child>,
    urls: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Servers {
    fn start(n: usize) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_>>()?;
        let routes = ports
            .iter()
            .map(|(_, c)| format!("nats://127.0.0.1:{c}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut children = Vec::new();
        let mut urls = Vec::new();
        for (i, (port, cluster)) in ports.iter().enumerate() {
            let store = dir.path().join(format!("n{i}"));
            let mut cmd = Command::new("nats-server");
            cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
                .arg("-sd")
                .arg(&store)
                .args(["-n", &format!("n{i}")]);
            if n > 1 {
                cmd.args(["--cluster_name", "bench"])
                    .args(["--cluster", &format!("nats://127.0.0.1:{cluster}")])
                    .args(["--routes", &routes]);
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting nats-server (Debian package `nats-server`)")?;
            children.push(child);
            urls.push(format!("nats://127.0.0.1:{port}"));
        }
        Ok(Self {
            children,
            urls,
            _dir: dir,
        })
    }
}

/// Connects and (re)creates the stream `BENCH` on subject `bench` with
/// `replicas` copies, retrying while the cluster elects its meta leader.
async fn stream_ready(url: &str, replicas: usize) -> Result<(jetstream::Context, stream::Stream)> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = async {
            let client = async_nats::connect(url).await?;
            let js = jetstream::new(client);
            let _ = js.delete_stream("BENCH").await;
            let s = js
                .create_stream(stream::Config {
                    name: "BENCH".into(),
                    subjects: vec!["bench".into()],
                    num_replicas: replicas,
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await?;
            Ok::<_, anyhow::Error>((js, s))
        };
        match attempt.await {
            Ok(r) => return Ok(r),
            Err(e) if Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("JetStream not ready after 30 s: {e}"),
        }
    }
}

async fn publish(js: &jetstream::Context, n: usize, size: usize, window: usize) -> Result<f64> {
    let payload = Bytes::from(vec![b'x'; size]);
    let mut inflight = VecDeque::with_capacity(window);
    let start = Instant::now();
    for _ in 0..n {
        if inflight.len() == window {
            let ack: jetstream::context::PublishAckFuture = inflight.pop_front().unwrap();
            ack.await?;
        }
        inflight.push_back(js.publish("bench", payload.clone()).await?);
    }
    for ack in inflight {
        ack.await?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn consumer(s: &stream::Stream, name: &str, max_pending: i64) -> Result<pull::Stream> {
    let c = s
        .create_consumer(pull::Config {
            durable_name: Some(name.into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(120),
            max_ack_pending: max_pending,
            ..Default::default()
        })
        .await?;
    Ok(c.messages().await?)
}

async fn consume(s: &stream::Stream, n: usize) -> Result<f64> {
    let mut messages = consumer(s, "consume", 100_000).await?;
    let start = Instant::now();
    for _ in 0..n {
        let m = messages.next().await.context("stream ended")??;
        m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn nack_burst(
    js: &jetstream::Context,
    s: &stream::Stream,
    n: usize,
    delay: Duration,
) -> Result<Histogram<u64>> {
    // Fresh messages for this burst: the consumer starts at the stream's end.
    let first = s.clone().info().await?.state.last_sequence + 1;
    let mut messages = s
        .create_consumer(pull::Config {
            durable_name: Some("nack".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(120),
            max_ack_pending: (n as i64) * 2,
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: first,
            },
            ..Default::default()
        })
        .await?
        .messages()
        .await?;
    for _ in 0..n {
        js.publish("bench", Bytes::from_static(&[0u8; 100]))
            .await?
            .await?;
    }
    let mut due = std::collections::HashMap::with_capacity(n);
    for _ in 0..n {
        let m = messages.next().await.context("stream ended")??;
        let seq = m
            .info()
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .stream_sequence;
        let at = Instant::now();
        m.ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        due.insert(seq, at + delay);
    }
    let mut late = Histogram::<u64>::new(3)?;
    while !due.is_empty() {
        let m = messages.next().await.context("stream ended")??;
        let now = Instant::now();
        let seq = m
            .info()
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .stream_sequence;
        if let Some(d) = due.remove(&seq) {
            late.record(now.saturating_duration_since(d).as_micros() as u64)?;
        }
        m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(late)
}

#[tokio::main]
async fn main() -> Result<()> {
    let servers: usize = env_or("PEER_SERVERS", 1);
    let n: usize = env_or("PEER_N", 200_000);
    let size: usize = env_or("PEER_SIZE", 1024);
    let window: usize = env_or("PEER_WINDOW", 256);
    let burst: usize = env_or("PEER_BURST", 1_000);
    let delay = Duration::from_millis(env_or("PEER_DELAY_MS", 1_000));
    let workloads =
        std::env::var("PEER_WORKLOAD").unwrap_or_else(|_| "publish,consume,nack".into());
    let version = Command::new("nats-server").arg("--version").output()?;
    println!(
        "{} x{servers} (R{servers}), JetStream file storage, default sync",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let cluster = Servers::start(servers)?;
    let (js, s) = stream_ready(&cluster.urls[0], servers).await?;
    for w in workloads.split(',') {
        match w.trim() {
            "publish" => {
                let rate = publish(&js, n, size, window).await?;
                println!(
                    "publish {size} B, one publisher, {window} in flight: {rate:.0} msg/s ({n} messages)"
                );
            }
            "consume" => {
                // Reads the first `n` messages (published by `publish`, or here).
                let stored = s.clone().info().await?.state.messages as usize;
                if stored < n {
                    publish(&js, n - stored, size, window).await?;
                }
                let rate = consume(&s, n).await?;
                println!(
                    "consume + ack {size} B, one pull consumer: {rate:.0} msg/s ({n} messages)"
                );
            }
            "nack" => {
                let late = nack_burst(&js, &s, burst, delay).await?;
                println!(
                    "{burst} NAKed at once, delay {} ms: lateness p50 {:.1} / p99 {:.1} / max {:.1} ms",
                    delay.as_millis(),
                    late.value_at_quantile(0.5) as f64 / 1000.0,
                    late.value_at_quantile(0.99) as f64 / 1000.0,
                    late.max() as f64 / 1000.0
                );
            }
            other => bail!("unknown workload {other:?} (publish, consume, nack)"),
        }
    }
    Ok(())
}
