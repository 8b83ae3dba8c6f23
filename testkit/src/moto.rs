//! An S3-compatible object store for tiered-storage tests and benches:
//! [`MotoServer`] runs `moto_server` (Python's `moto[server]`) on a
//! loopback port, waits until it answers, creates a bucket, and kills it
//! when dropped. The binary comes from `RICOCHET_MOTO_SERVER` or `PATH`;
//! [`moto_or_skip`] decides whether a test without it is skipped (printing
//! why) or fails (`RICOCHET_REQUIRE_S3=1`, as `.ci/run` sets).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set to `1` to make a missing `moto_server` fail tests instead of
/// skipping them.
pub const REQUIRE_ENV: &str = "RICOCHET_REQUIRE_S3";
/// The `moto_server` binary to run (default: the one on `PATH`).
pub const BIN_ENV: &str = "RICOCHET_MOTO_SERVER";
/// The bucket every server gets.
pub const BUCKET: &str = "ricochet-test";
/// How long moto may take to answer after it starts.
const START_WAIT: Duration = Duration::from_secs(60);

/// The `moto_server` binary, if there is one.
pub fn moto_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(BIN_ENV) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("moto_server"))
            .find(|p| p.is_file())
    })
}

/// A running `moto_server`, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct MotoServer {
    child: Option<Child>,
    addr: SocketAddr,
    bin: PathBuf,
}

/// Starts moto for `test`, or `None` (after printing a line saying the
/// test is skipped) when it is not installed and `RICOCHET_REQUIRE_S3` is
/// not `1`. Panics when it is required and missing.
pub fn moto_or_skip(test: &str) -> Option<MotoServer> {
    let Some(bin) = moto_bin() else {
        if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
            panic!(
                "{test}: moto_server is not installed (pip install 'moto[server]', or set {BIN_ENV}) and {REQUIRE_ENV}=1"
            );
        }
        println!(
            "{test}: skipped: no moto_server on PATH (pip install 'moto[server]'; set {REQUIRE_ENV}=1 to fail instead)"
        );
        return None;
    };
    Some(MotoServer::start_at(bin, crate::free_addr()))
}

impl MotoServer {
    /// Starts `bin` on `addr` and creates [`BUCKET`]; panics if it does
    /// not answer in time.
    pub fn start_at(bin: PathBuf, addr: SocketAddr) -> Self {
        let mut s = Self {
            child: None,
            addr,
            bin,
        };
        s.start();
        s
    }

    fn start(&mut self) {
        let child = Command::new(&self.bin)
            .args([
                "-H",
                &self.addr.ip().to_string(),
                "-p",
                &self.addr.port().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some(status) = self.http("PUT", &format!("/{BUCKET}")) {
                assert!(
                    status < 300,
                    "moto_server refused to create the bucket: HTTP {status}"
                );
                return;
            }
            assert!(
                started.elapsed() < START_WAIT,
                "moto_server did not answer on {} within {START_WAIT:?}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One request without a body; the status code, `None` if no answer.
    fn http(&self, method: &str, path: &str) -> Option<u16> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut head = [0u8; 64];
        let n = s.read(&mut head).ok()?;
        let line = std::str::from_utf8(&head[..n]).ok()?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the server (SIGKILL): the object store is down (and what it
    /// held is gone: moto keeps it in memory).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, with an empty bucket.
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }

    /// A credentials file for the broker's `tiered.credentials_file`
    /// (moto accepts any keys), written in `dir`.
    pub fn credentials_file(dir: &std::path::Path) -> PathBuf {
        let p = dir.join("aws-credentials");
        std::fs::write(
            &p,
            "[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n",
        )
        .expect("write the credentials file");
        p
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        self.kill();
    }
}
