//! The log fits production: a poison storm writes a few summary lines at
//! INFO, not one per message; the binary writes JSON when asked, and plain
//! text without colour codes when its output is not a terminal; its start
//! lines say what the book says, and which allocator settings are in force
//! (by default jemalloc's background threads and decay times,
//! `_RJEM_MALLOC_CONF` still winning; built with `--no-default-features`,
//! mimalloc's own purge delay with `on` and `off`, 0 with `eager`, the
//! environment's `MIMALLOC_PURGE_DELAY` still winning).

#[path = "it/common/mod.rs"]
mod common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Everything the test's log subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The number after `key=` in a text log line.
fn field(line: &str, key: &str) -> u64 {
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("{key} in {line}"));
    line[at + key.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

#[tokio::test]
async fn a_poison_storm_writes_a_few_summary_lines() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    let b =
        InProcessBroker::start_with(|c| c.failure_summary_interval = Duration::from_millis(300))
            .await;
    let mut c = RawConsumer::simple(&b.url(), "storm", "s", SubscriptionType::Shared).await;
    c.flow(1200).await;
    let mut p = RawProducer::open(&b.url(), "storm", "p").await.unwrap();
    for _ in 0..12 {
        let batch: Vec<_> = (0..100).map(|i| p.msg(format!("poison {i}"))).collect();
        p.send_messages(batch).await;
    }
    let got = c.take(1200, WAIT).await;
    // 700 go to the retry tier (for an hour), 500 straight to the DLQ.
    for (i, m) in got.into_iter().enumerate() {
        let id = m.id.unwrap();
        let rid = i as u64 + 1;
        if i < 700 {
            c.reconsume_later(id, reconsume_later::Delay::DelayMs(3_600_000), rid)
                .await;
        } else {
            c.terminate(id, "poison", rid).await;
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..1200 {
        let Some(r) = c.result(WAIT).await else {
            let missing: Vec<u64> = (1..=1200).filter(|r| !seen.contains(r)).collect();
            panic!("result {i}: missing {missing:?}");
        };
        assert_eq!(r.code, 0, "{r:?}");
        assert!(seen.insert(r.request_id), "twice: {r:?}");
    }
    // Two summary intervals pass.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let lines = log.lines();
    let per_message: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("retry scheduled") || l.contains("message dead-lettered"))
        .collect();
    assert!(
        per_message.is_empty(),
        "{} per-message lines",
        per_message.len()
    );
    let summaries: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("failures since the last summary"))
        .collect();
    // A few lines, not one per message: at most one per summary interval
    // (300 ms; how many depends on how long the storm takes on a loaded
    // machine, so the spacing is checked, not the count).
    assert!(!summaries.is_empty(), "no summary line");
    let at: Vec<f64> = summaries.iter().map(|l| seconds_of_day(l)).collect();
    for pair in at.windows(2) {
        assert!(
            (pair[1] - pair[0]).rem_euclid(86_400.0) >= 0.25,
            "summaries closer than the interval: {summaries:#?}"
        );
    }
    let retried: u64 = summaries.iter().map(|l| field(l, "retried")).sum();
    let dead: u64 = summaries.iter().map(|l| field(l, "dead_lettered")).sum();
    assert_eq!((retried, dead), (700, 500), "{summaries:#?}");
    assert!(
        summaries
            .iter()
            .all(|l| l.contains("INFO") && l.contains("sub=s"))
    );
    assert!(
        lines.len() < 40,
        "{} lines at INFO for a storm of 1200: {lines:#?}",
        lines.len()
    );
}

/// Runs the broker binary with `args` until it logs that it serves;
/// returns its stdout up to there.
async fn broker_output(args: &[&str]) -> Vec<String> {
    broker_output_with(args, &[]).await
}

/// [`broker_output`] with `env` added to its environment (and no
/// allocator settings inherited from the test's own).
async fn broker_output_with(args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_RESET_DELAY")
        .env_remove("_RJEM_MALLOC_CONF")
        .env_remove("RICOCHET_RETURN_IDLE_MEMORY")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(line) = out.next_line().await.unwrap() {
            let done = line.contains("ricochet broker serving");
            lines.push(line);
            if done {
                break;
            }
        }
    })
    .await
    .expect("the broker logs that it serves");
    child.kill().await.unwrap();
    lines
}

#[tokio::test]
async fn the_binary_logs_json_or_plain_text() {
    let text = broker_output(&[]).await;
    assert!(
        text.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in a piped log: {text:#?}"
    );
    assert!(
        text.iter()
            .any(|l| l.contains("INFO") && l.contains("ricochet broker serving")),
        "{text:#?}"
    );
    let json = broker_output(&["--log-format", "json"]).await;
    let events: Vec<serde_json::Value> = json
        .iter()
        .filter(|l| !l.starts_with("ricochet-broker listening on"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let serving = events
        .iter()
        .find(|e| e["fields"]["message"] == "ricochet broker serving")
        .unwrap_or_else(|| panic!("{json:#?}"));
    assert_eq!(serving["level"], "INFO");
    assert!(serving["fields"]["addr"].is_string(), "{serving}");
}

/// Seconds since midnight of a log line's leading RFC 3339 timestamp
/// (`2026-12-01T00:57:17.404423Z …`).
fn seconds_of_day(line: &str) -> f64 {
    let time = line
        .split_whitespace()
        .next()
        .and_then(|ts| ts.split('T').nth(1))
        .map(|t| t.trim_end_matches('Z'))
        .unwrap_or_else(|| panic!("no timestamp: {line}"));
    time.split(':')
        .map(|part| {
            part.parse::<f64>()
                .unwrap_or_else(|_| panic!("bad time: {line}"))
        })
        .fold(0.0, |acc, part| acc * 60.0 + part)
}

/// The start line says whether TLS and authentication are on, after the
/// address (so `… listening on ADDR` still begins it).
#[tokio::test]
async fn the_start_line_says_whether_tls_and_authentication_are_on() {
    let start_line = |lines: Vec<String>| {
        lines
            .into_iter()
            .find(|l| l.starts_with("ricochet-broker listening on 127.0.0.1:"))
            .expect("a start line")
    };
    let plain = start_line(broker_output(&[]).await);
    assert!(plain.ends_with(" (TLS off, authentication off)"), "{plain}");
    let dir = tempfile::tempdir().unwrap();
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let files = [
        ("b.pem", cert.pem()),
        ("b.key", signing_key.serialize_pem()),
        ("secret.key", "a-secret-of-some-length".to_owned()),
    ];
    for (name, text) in &files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let secured = start_line(
        broker_output(&[
            "--tls-cert",
            &path("b.pem"),
            "--tls-key",
            &path("b.key"),
            "--auth-secret-file",
            &path("secret.key"),
        ])
        .await,
    );
    assert!(
        secured.ends_with(" (TLS on, authentication on)"),
        "{secured}"
    );
}

/// The lines the book shows after a broker start command (`$ …` in a
/// console block of `page` whose command starts with `start`), ports masked.
fn documented_start(page: &str, start: &str) -> Vec<String> {
    let page = ricochet_testkit::docs::page(std::path::Path::new(page));
    let block = page
        .code_blocks()
        .into_iter()
        .find(|b| b.lang == "console" && b.text.contains(start))
        .unwrap_or_else(|| panic!("{} shows no `{start}`", page.path.display()));
    let lines: Vec<String> = block
        .text
        .lines()
        .skip_while(|l| !l.starts_with(&format!("$ {start}")))
        .skip(1)
        .skip_while(|l| l.starts_with("    ")) // the command's continuation
        .take_while(|l| !l.starts_with("$ "))
        .map(mask_ports)
        .collect();
    assert!(!lines.is_empty(), "no output shown after `{start}`");
    lines
}

/// `line` with the digits after each `127.0.0.1:` and `0.0.0.0:` made `<port>`.
fn mask_ports(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = ["127.0.0.1:", "0.0.0.0:"]
        .iter()
        .filter_map(|host| rest.find(host).map(|i| i + host.len()))
        .min()
    {
        out.push_str(&rest[..at]);
        rest = rest[at..].trim_start_matches(|c: char| c.is_ascii_digit());
        out.push_str("<port>");
    }
    out.push_str(rest);
    out
}

/// The broker start commands the book shows with their output print that
/// output: the web console page's start, and the security page's refusal
/// to listen beyond loopback without authentication.
#[tokio::test]
async fn the_books_broker_start_lines_are_what_the_broker_prints() {
    let console = documented_start(
        "docs/src/console.md",
        "cargo run --release -p ricochet-broker -- --data-dir ./data --console-listen",
    );
    let printed: Vec<String> = broker_output(&["--console-listen", "127.0.0.1:0"])
        .await
        .iter()
        .filter(|l| l.starts_with("ricochet-broker "))
        .map(|l| mask_ports(l))
        .collect();
    assert_eq!(printed, console);

    let refusal = documented_start("docs/src/security.md", "ricochet-broker --listen 0.0.0.0:");
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
        .arg("--listen")
        .arg(
            ricochet_testkit::free_addr()
                .to_string()
                .replace("127.0.0.1", "0.0.0.0"),
        )
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let said: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&out.stdout).lines())
        .map(mask_ports)
        .collect();
    assert_eq!(said, refusal);
}

/// `ricochet-broker | head -1`: the reader of the broker's stdout goes
/// away after the first line, before the broker prints that it listens.
/// The broker goes on and serves (it panicked on the closed pipe).
#[tokio::test]
async fn a_broker_whose_stdout_is_closed_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let addr = ricochet_testkit::free_addr();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--listen")
        .arg(addr.to_string())
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = out.next_line().await.unwrap();
    assert!(first.is_some(), "the broker printed nothing");
    drop(out);
    let mut err = child.stderr.take().unwrap();
    let url = format!("http://{addr}");
    let started = std::time::Instant::now();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the broker exited once its stdout was closed: {:?}",
            child.try_wait()
        );
        if let Ok(mut admin) = ricochet_proto::admin_client::AdminClient::connect(url.clone()).await
            && admin
                .list_topics(ricochet_proto::ListTopicsRequest::default())
                .await
                .is_ok()
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the broker did not serve within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And it keeps serving: still running a moment later, with nothing
    // said on stderr about the log it could not write.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(child.try_wait().unwrap().is_none(), "the broker exited");
    child.kill().await.unwrap();
    let mut said = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut err, &mut said)
        .await
        .unwrap();
    assert_eq!(said, "", "stderr");
}

/// The broker binary on a fresh data dir at its default log level
/// (`RUST_LOG` unset), its stdout lines gathered as they come.
struct LoggingBroker {
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl LoggingBroker {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let gathered = lines.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            while let Ok(Some(line)) = out.next_line().await {
                if let Some(addr) = line
                    .strip_prefix("ricochet-broker listening on ")
                    .and_then(|rest| rest.split_whitespace().next())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(format!("http://{addr}"));
                }
                gathered.lock().unwrap().push(line);
            }
        });
        let url = tokio::time::timeout(WAIT, rx)
            .await
            .expect("the broker listens")
            .expect("the broker prints its address");
        LoggingBroker {
            url,
            lines,
            _child: child,
            _dir: dir,
        }
    }

    /// Waits until a line containing `what` is logged; returns it.
    async fn line(&self, what: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what:?} line: {:#?}",
                self.lines.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The outage breaker's opening (WARN), its probes, a failed probe and its
/// closing (INFO) are log lines at the default level, each naming the
/// subscription.
#[tokio::test]
async fn the_breaker_logs_opening_probing_and_closing() {
    let b = LoggingBroker::start().await;
    let topic = "persistent://public/default/payments";
    let mut c = RawConsumer::simple(&b.url, topic, "s", SubscriptionType::Shared).await;
    let spec: ricochet_policy::PolicySpec = "backoff:fixed=100ms,max=5".parse().unwrap();
    ricochet_proto::admin_client::AdminClient::new(channel(&b.url).await)
        .set_policy(SetPolicyRequest {
            topic: topic.into(),
            subscription: "s".into(),
            policy: Some(DeadLetterPolicyConfig {
                breaker: Some(BreakerConfig {
                    failures: 2,
                    within_ms: 10_000,
                    probe_interval_ms: 300,
                    max_probe_interval_ms: 600,
                    ..Default::default()
                }),
                ..DeadLetterPolicyConfig::from(&spec)
            }),
        })
        .await
        .unwrap();
    c.flow(100).await;
    let mut p = RawProducer::open(&b.url, topic, "p").await.unwrap();
    p.send(&["a", "b"]).await;
    let mut rid = 0;
    for m in c.take(2, WAIT).await {
        rid += 1;
        c.nack(m.id.unwrap(), "gateway down", rid).await;
    }
    let opened = b.line("breaker opened").await;
    assert!(
        opened.contains(" WARN ") && opened.contains("sub=s"),
        "{opened}"
    );
    // The first probe fails, the second is acked.
    let probe = c.next(WAIT).await.expect("a probe");
    let probing = b.line("breaker probing").await;
    assert!(
        probing.contains(" INFO ") && probing.contains("sub=s"),
        "{probing}"
    );
    rid += 1;
    c.nack(probe.id.unwrap(), "still down", rid).await;
    let failed = b.line("breaker probe failed").await;
    assert!(
        failed.contains(" INFO ") && failed.contains("sub=s"),
        "{failed}"
    );
    let probe = c.next(WAIT).await.expect("a second probe");
    rid += 1;
    c.ack(vec![probe.id.unwrap()], rid).await;
    let closed = b.line("breaker closed").await;
    assert!(
        closed.contains(" INFO ") && closed.contains("sub=s"),
        "{closed}"
    );
    assert!(closed.contains("probe acked"), "{closed}");
}

/// The binary's "memory allocator" start line, run with `args` and `env`.
#[cfg(not(feature = "system-alloc"))]
async fn allocator_line(args: &[&str], env: &[(&str, &str)]) -> String {
    broker_output_with(args, env)
        .await
        .into_iter()
        .find(|l| l.contains("memory allocator"))
        .expect("the broker logs its allocator at start")
}

#[cfg(not(any(feature = "system-alloc", feature = "jemalloc")))]
#[tokio::test]
async fn the_purge_delay_is_mimallocs_by_default_zero_when_eager_and_the_environment_still_sets_it()
{
    let default = allocator_line(&[], &[]).await;
    assert!(default.contains("allocator=\"mimalloc\""), "{default}");
    assert_eq!(field(&default, "purge_delay_ms"), 1000, "{default}");

    let eager = allocator_line(&["--return-idle-memory", "eager"], &[]).await;
    assert_eq!(field(&eager, "purge_delay_ms"), 0, "{eager}");

    // mimalloc reads the variable itself; `eager` does not override it
    // (and the value read back is the option the variable names, so the
    // option's index in the binary is right).
    let set = allocator_line(
        &["--return-idle-memory", "eager"],
        &[("MIMALLOC_PURGE_DELAY", "250")],
    )
    .await;
    assert_eq!(field(&set, "purge_delay_ms"), 250, "{set}");

    // `off` is the allocator's own behaviour: mimalloc's 1 s default.
    let off = allocator_line(&["--return-idle-memory", "off"], &[]).await;
    assert_eq!(field(&off, "purge_delay_ms"), 1000, "{off}");
}

/// The value of a `true`/`false` field of `line`.
#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
fn flag(line: &str, key: &str) -> bool {
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("{key} in {line}"));
    let value = &line[at + key.len() + 1..];
    if value.starts_with("true") {
        true
    } else if value.starts_with("false") {
        false
    } else {
        panic!("{key} in {line}")
    }
}

#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
#[tokio::test]
async fn jemalloc_purges_in_the_background_at_once_when_eager_and_the_environment_wins() {
    let default = allocator_line(&[], &[]).await;
    assert!(default.contains("allocator=\"jemalloc\""), "{default}");
    assert!(flag(&default, "background_thread"), "{default}");
    assert_eq!(field(&default, "dirty_decay_ms"), 1000, "{default}");
    assert_eq!(field(&default, "muzzy_decay_ms"), 0, "{default}");

    let eager = allocator_line(&["--return-idle-memory", "eager"], &[]).await;
    assert!(flag(&eager, "background_thread"), "{eager}");
    assert_eq!(field(&eager, "dirty_decay_ms"), 0, "{eager}");

    // jemalloc reads the variable itself; `eager` does not override what
    // it sets, and sets what it does not.
    let set = allocator_line(
        &["--return-idle-memory", "eager"],
        &[(
            "_RJEM_MALLOC_CONF",
            "dirty_decay_ms:250,background_thread:false",
        )],
    )
    .await;
    assert_eq!(field(&set, "dirty_decay_ms"), 250, "{set}");
    assert!(!flag(&set, "background_thread"), "{set}");
    assert_eq!(field(&set, "muzzy_decay_ms"), 0, "{set}");

    // `off` is the allocator's own behaviour: no background thread, 10 s.
    let off = allocator_line(&["--return-idle-memory", "off"], &[]).await;
    assert!(!flag(&off, "background_thread"), "{off}");
    assert_eq!(field(&off, "dirty_decay_ms"), 10_000, "{off}");
}
