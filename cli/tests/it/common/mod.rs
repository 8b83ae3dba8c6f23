//! What the `ricochet` binary's end-to-end tests share: [`Env`] starts a
//! broker in the test's process (`InProcessBroker` on a fresh data dir and
//! port) and runs the real binary as a child process against it, returning
//! its output, its `--output json` parsed, or asserting its success.
#![allow(dead_code)]

use std::process::{Output, Stdio};
use std::time::Duration;

use ricochet_testkit::InProcessBroker;
use serde_json::Value;

pub struct Env {
    url: String,
    broker: Option<InProcessBroker>,
}

impl Env {
    pub async fn start() -> Env {
        let broker = InProcessBroker::start().await;
        Env {
            url: broker.url(),
            broker: Some(broker),
        }
    }

    /// Runs the binary against `url` (a broker or a stand-in) that the
    /// test owns.
    pub fn at(url: String) -> Env {
        Env { url, broker: None }
    }

    /// Runs `ricochet ARGS` with stdin closed (so never a terminal).
    pub async fn run(&self, args: &[&str]) -> Output {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet"))
            .args(args)
            .env("RICOCHET_URL", &self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ricochet");
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("ricochet {args:?} did not finish in 60 s"))
            .expect("ricochet output")
    }

    /// Starts `ricochet ARGS` (stdin closed, stdout piped) and leaves it
    /// running: for commands that do not stop by themselves (`--follow`).
    /// Killed when dropped.
    pub fn spawn(&self, args: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet"))
            .args(args)
            .env("RICOCHET_URL", &self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ricochet")
    }

    /// Runs `ricochet -o json ARGS`, asserts success, parses stdout.
    pub async fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(&with_json(args)).await;
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ricochet {args:?}: stdout is not JSON ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Consumes `topic` in subscription `billing`, nacking every delivery
    /// with `reason` (`backoff:fixed=100ms,max=1`: one redelivery, then the
    /// dead-letter tier) until nothing comes for 3 s; what it saw.
    pub async fn nack_all(&self, topic: &str, reason: &str) -> Vec<Value> {
        self.json_lines(&[
            "consume",
            topic,
            "-s",
            "billing",
            "-t",
            "shared",
            "-n",
            "0",
            "--nack",
            "--nack-reason",
            reason,
            "--policy",
            "backoff:fixed=100ms,max=1",
            "--timeout",
            "3s",
        ])
        .await
    }

    /// Runs `ricochet -o json ARGS` (a stream), asserts success, parses each line.
    pub async fn json_lines(&self, args: &[&str]) -> Vec<Value> {
        let out = self.ok(&with_json(args)).await;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
            .collect()
    }

    pub async fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "ricochet {args:?} failed ({:?}):\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // `shutdown` may wait on connected clients; a test only needs it gone.
        if let Some(b) = self.broker.take() {
            b.abort();
        }
    }
}

fn with_json<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["-o", "json"];
    v.extend_from_slice(args);
    v
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}
