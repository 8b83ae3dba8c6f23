//! A full disk: the broker (the real binary) keeps its data on a 48 MiB
//! tmpfs mounted for the test, most of it taken by a filler file; it is
//! published to until it refuses. The refusal must be RESOURCE_EXHAUSTED
//! naming the data directory and the space left, with the
//! `ricochet_storage_disk_full` gauge at 1 and a WARN line; once the filler
//! is deleted, publishes must succeed again without a restart; after a
//! SIGKILL and a restart every receipted message is there and
//! `ricochet-broker check` passes. Mounting needs root (CI runs as root): without it the test says
//! so loudly and does nothing.

use crate::common;
use common::*;
use ricochet_proto::produce_response::Response;
use ricochet_proto::*;
use ricochet_testkit::net::free_addr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ricochet-broker");
const TOPIC: &str = "full";
/// `min_free_space` for the test: publishes stop with this much left.
const MIN_FREE: u64 = 8 << 20;
const PAYLOAD: usize = 32 * 1024;
const BATCH: usize = 16;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount_tmpfs(at: &Path, size: &str) -> Result<Mount, String> {
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(Mount(at.to_owned()))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The broker on `data` with `config`, metrics on `metrics`; its log lines
/// are collected.
struct Broker {
    child: Child,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Broker {
    fn start(data: &Path, config: &Path, metrics: std::net::SocketAddr) -> Self {
        let mut child = Command::new(BIN)
            .arg("--data-dir")
            .arg(data)
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen"])
            .arg(metrics.to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the broker");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| ricochet_testkit::listening_addr(&l).map(|a| format!("http://{a}")))
            .expect("the broker listens");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        Self { child, url, log }
    }

    /// Whether a line containing every one of `what` was logged within 5 s
    /// (the lines are read from the broker's stdout by a thread of their
    /// own, which may lag behind what the test sees through the API).
    async fn logged(&self, what: &[&str]) -> bool {
        for _ in 0..50 {
            let seen = self
                .log
                .lock()
                .unwrap()
                .iter()
                .any(|l| what.iter().all(|w| l.contains(w)));
            if seen {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Prometheus page at `addr`.
async fn metrics_page(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Waits until the metrics page has a line starting with `line`.
async fn wait_metric(addr: std::net::SocketAddr, line: &str) {
    for _ in 0..50 {
        if metrics_page(addr)
            .await
            .lines()
            .any(|l| l.starts_with(line))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no `{line}` on /metrics:\n{}", metrics_page(addr).await);
}

#[tokio::test]
async fn a_full_disk_refuses_publishes_clearly_and_they_resume_once_space_returns() {
    let root = tempfile::tempdir().unwrap();
    let mnt = root.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let _mount = match mount_tmpfs(&mnt, "48m") {
        Ok(m) => m,
        Err(why) => {
            eprintln!(
                "\n*** SKIPPED a_full_disk_refuses_publishes_clearly_and_they_resume_once_space_returns: \
                 cannot mount a 48 MiB tmpfs ({why}); run the test as root ***\n"
            );
            return;
        }
    };
    let data = mnt.join("data");
    let config = root.path().join("broker.toml");
    std::fs::write(&config, format!("min_free_space = {MIN_FREE}\n")).unwrap();
    // Most of the disk is taken by something else.
    let filler = mnt.join("filler");
    std::fs::write(&filler, vec![7u8; 24 << 20]).unwrap();
    let metrics = free_addr();
    let broker = Broker::start(&data, &config, metrics);

    let mut p = RawProducer::open(&broker.url, TOPIC, "p").await.unwrap();
    let mut receipted = Vec::new();
    let mut refusal = None;
    for _ in 0..200 {
        let msgs = (0..BATCH)
            .map(|i| p.msg(vec![(receipted.len() + i) as u8; PAYLOAD]))
            .collect();
        match p.send_batch(msgs).await {
            Response::Receipts(r) => receipted.extend(
                r.receipts
                    .into_iter()
                    .map(|r| r.message_id.expect("an id").entry_id),
            ),
            Response::Error(e) => {
                refusal = Some(e);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let refusal = refusal.expect("the broker refuses publishes on a full disk");
    assert_eq!(
        refusal.code,
        tonic::Code::ResourceExhausted as i32,
        "{refusal:?}"
    );
    let msg = &refusal.message;
    assert!(msg.contains(&data.display().to_string()), "{msg}");
    assert!(
        msg.contains("free, below min_free_space (8.0 MiB)"),
        "{msg}"
    );
    assert!(!receipted.is_empty(), "some publishes fit");
    wait_metric(metrics, "ricochet_storage_disk_full 1").await;
    assert!(
        metrics_page(metrics)
            .await
            .contains("ricochet_storage_free_bytes"),
        "the free-space gauge"
    );
    assert!(
        broker
            .logged(&["WARN", "disk full", &data.display().to_string()])
            .await
    );
    // Still refusing, and still answering admin calls.
    let more = vec![p.msg(vec![1u8; PAYLOAD])];
    assert!(matches!(p.send_batch(more).await, Response::Error(_)));
    let mut admin = ricochet_proto::admin_client::AdminClient::new(channel(&broker.url).await);
    admin
        .list_topics(ListTopicsRequest::default())
        .await
        .expect("admin calls are answered");

    // Space returns: publishes resume by themselves.
    std::fs::remove_file(&filler).unwrap();
    let msgs = (0..BATCH).map(|_| p.msg(vec![9u8; PAYLOAD])).collect();
    match p.send_batch(msgs).await {
        Response::Receipts(r) => receipted.extend(
            r.receipts
                .into_iter()
                .map(|r| r.message_id.expect("an id").entry_id),
        ),
        other => panic!("publishes did not resume once space returned: {other:?}"),
    }
    wait_metric(metrics, "ricochet_storage_disk_full 0").await;
    assert!(broker.logged(&["INFO", "disk space is back"]).await);
    drop(p);
    // Killed (SIGKILL): what was receipted was durable.
    drop(broker);

    // Everything receipted is there after a restart, and the store checks.
    let broker = Broker::start(&data, &config, free_addr());
    let mut c = RawConsumer::subscribe(
        &broker.url,
        TOPIC,
        "all",
        SubOpts {
            sub_type: SubscriptionType::Exclusive,
            initial: InitialPosition::Earliest,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // A hundred at a time: a delivery batch stays under the client's 4 MiB frame limit.
    let mut got: Vec<u64> = Vec::new();
    while got.len() < receipted.len() {
        let n = (receipted.len() - got.len()).min(100);
        c.flow(n as u32).await;
        got.extend(
            c.take(n, WAIT)
                .await
                .iter()
                .map(|m| m.id.as_ref().unwrap().entry_id),
        );
    }
    assert_eq!(got, receipted);
    drop(c);
    drop(broker);
    let out = Command::new(BIN)
        .args(["check", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
