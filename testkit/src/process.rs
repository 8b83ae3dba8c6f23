//! Brokers as child processes: the real `ricochet-broker` binary on a data
//! directory, for what only a process gives a test — SIGKILL with no clean
//! shutdown and no final flush, SIGTERM's clean shutdown, SIGSTOP/SIGCONT, a
//! restart that reads the directory back from disk. Owns finding the binary
//! from any crate's tests or benches ([`broker_bin`]), starting it on a port
//! it picks itself and reading that port back ([`BrokerProcess::spawn`]),
//! and killing and reaping it however the test ends.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, kill_process, waitid};

/// The line the broker prints on stdout once it listens, before the address
/// (which is followed by whether TLS and authentication are on).
const LISTENING: &str = "ricochet-broker listening on ";

/// The address in the broker's start line (`ricochet-broker listening on
/// ADDR (TLS off, authentication off)`), if `line` is that line.
pub fn listening_addr(line: &str) -> Option<&str> {
    line.strip_prefix(LISTENING)
        .and_then(|rest| rest.split(' ').next())
}

/// Names the broker binary when no path is given.
pub const BIN_ENV: &str = "RICOCHET_BROKER_BIN";
const BIN_NAME: &str = "ricochet-broker";
/// How long [`BrokerProcess::stop`] waits for the exit after SIGTERM.
const STOP_WAIT: Duration = Duration::from_secs(60);
/// How long [`BrokerProcess::freeze`] waits for the broker to stop after
/// SIGSTOP (a thread in an uninterruptible disk write stops only once the
/// write is done, which a loaded disk can make slow).
const FREEZE_WAIT: Duration = Duration::from_secs(60);

/// The broker binary could not be found; the message says where it looked
/// and how to build it.
#[derive(Debug, Clone)]
pub struct BrokerBinNotFound(String);

impl std::fmt::Display for BrokerBinNotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BrokerBinNotFound {}

/// The `ricochet-broker` binary: `explicit` if given (the broker's own tests
/// pass `env!("CARGO_BIN_EXE_ricochet-broker")`), else `$RICOCHET_BROKER_BIN`,
/// else the one cargo built next to the running executable
/// (`target/<profile>/deps/<test>-<hash>` → `target/<profile>/ricochet-broker`;
/// a bench runs from `target/release`). Panics, saying what to build, when
/// there is none.
pub fn broker_bin(explicit: Option<&Path>) -> PathBuf {
    find_broker_bin(explicit).unwrap_or_else(|e| panic!("{e}"))
}

/// Like [`broker_bin`], with an error instead of a panic (a bench that skips
/// a part without the binary).
pub fn find_broker_bin(explicit: Option<&Path>) -> Result<PathBuf, BrokerBinNotFound> {
    let given = explicit
        .map(|p| (p.to_owned(), "the given path".to_owned()))
        .or_else(|| std::env::var_os(BIN_ENV).map(|p| (p.into(), format!("${BIN_ENV}"))));
    if let Some((path, from)) = given {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(BrokerBinNotFound(format!(
                "no ricochet-broker binary at {} ({from})",
                path.display()
            )))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| BrokerBinNotFound(format!("cannot tell the running executable: {e}")))?;
    let (path, build) = next_to(&exe);
    if path.is_file() {
        Ok(path)
    } else {
        Err(BrokerBinNotFound(format!(
            "no ricochet-broker binary at {} (next to {}): run `{build}` first, or set {BIN_ENV}",
            path.display(),
            exe.display()
        )))
    }
}

/// Where cargo puts the broker binary for the profile that built `exe`, and
/// the command that builds it there.
fn next_to(exe: &Path) -> (PathBuf, String) {
    let dir = exe.parent().unwrap_or(Path::new("."));
    // Tests and benches run from target/<profile>/deps, examples from
    // target/<profile>/examples.
    let profile_dir = match dir.file_name().and_then(|n| n.to_str()) {
        Some("deps" | "examples") => dir.parent().unwrap_or(dir),
        _ => dir,
    };
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => String::new(),
        Some("release") => " --release".to_owned(),
        Some(other) => format!(" --profile {other}"),
    };
    (
        profile_dir.join(format!("{BIN_NAME}{}", std::env::consts::EXE_SUFFIX)),
        format!("cargo build{profile} -p {BIN_NAME}"),
    )
}

/// How [`BrokerProcess::spawn`] runs the binary. Always `--data-dir DIR
/// --listen 127.0.0.1:0`; the rest is set here.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    bin: Option<PathBuf>,
    args: Vec<OsString>,
    listen: SocketAddr,
    metrics_listen: SocketAddr,
    rust_log: String,
    echo_log: bool,
    start_timeout: Duration,
    envs: Vec<(OsString, OsString)>,
    ready_when: Option<String>,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        Self {
            bin: None,
            args: Vec::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            rust_log: "warn".to_owned(),
            echo_log: false,
            start_timeout: Duration::from_secs(10),
            envs: Vec::new(),
            ready_when: None,
        }
    }
}

impl SpawnOptions {
    /// An environment variable for the broker (say, a test failpoint).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Without the environment variable `key` (a failpoint armed for the
    /// first start, say, dropped for the restart).
    pub fn without_env(mut self, key: impl Into<OsString>) -> Self {
        let key = key.into();
        self.envs.retain(|(k, _)| *k != key);
        self
    }

    /// The defaults: the binary from [`broker_bin`], metrics on a port the
    /// broker picks, `RUST_LOG=warn` with the log discarded, 10 s to listen.
    pub fn new() -> Self {
        Self::default()
    }

    /// This binary instead of [`broker_bin`]'s search.
    pub fn bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.bin = Some(path.into());
        self
    }

    /// More arguments, after the fixed ones (`["--durability", "interval"]`,
    /// `["--config", path]`).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the broker with the config file at `path` (`--config`).
    pub fn config(self, path: impl AsRef<Path>) -> Self {
        self.args([OsString::from("--config"), path.as_ref().into()])
    }

    /// Serves gRPC on `addr` (default: a port the broker picks); to come
    /// back on the port of a broker that was killed, so clients reconnect.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Serves metrics on `addr` (e.g. from [`crate::free_addr`], to scrape it).
    pub fn metrics_listen(mut self, addr: SocketAddr) -> Self {
        self.metrics_listen = addr;
        self
    }

    /// The broker's `RUST_LOG`.
    pub fn rust_log(mut self, filter: impl Into<String>) -> Self {
        self.rust_log = filter.into();
        self
    }

    /// Copies the broker's log (its stdout) to this process's stderr, past
    /// the test harness's capture; otherwise it is read and discarded.
    pub fn echo_log(mut self, echo: bool) -> Self {
        self.echo_log = echo;
        self
    }

    /// How long the broker may take to listen before `spawn` panics.
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// `spawn` returns once the broker prints a line containing `text`
    /// (a step inside its start, say a failpoint's line), not once it
    /// listens; its [`url`](BrokerProcess::url) is then empty.
    pub fn ready_when(mut self, text: impl Into<String>) -> Self {
        self.ready_when = Some(text.into());
        self
    }
}

/// A running `ricochet-broker` child process. Killed (SIGKILL) and reaped
/// when dropped, on a panic included.
#[derive(Debug)]
pub struct BrokerProcess {
    child: Child,
    url: String,
    /// The last lines of the broker's log, shown when a stop is not clean.
    tail: LogTail,
}

/// The last [`TAIL_LINES`] lines the broker printed on stdout.
type LogTail = std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>;

/// How many addresses [`BrokerProcess::spawn_on_free_addr`] tries.
pub const PORT_ATTEMPTS: usize = 4;

/// How many of the broker's last log lines a failed stop shows.
const TAIL_LINES: usize = 40;

impl BrokerProcess {
    /// Starts the broker with data in `dir`, by default on a port of its own
    /// choosing (so no other process can take it between choosing and
    /// binding); returns once it listens. Panics if it cannot be started or does not listen in
    /// time.
    pub async fn spawn(dir: &Path, options: &SpawnOptions) -> Self {
        Self::try_spawn(dir, options)
            .await
            .unwrap_or_else(|| panic!("the broker exited before listening (see its stderr)"))
    }

    /// [`BrokerProcess::spawn`] on an address chosen ahead by
    /// [`crate::free_addr`]: `options(addr)` builds the options for it. Such a
    /// port is free when chosen but another process (a client's outgoing
    /// connection, say) can take it before the broker binds it; a broker that
    /// exits before listening is started again on a fresh address, up to
    /// [`PORT_ATTEMPTS`] times. Returns the process, the address it listens
    /// on and the options it was started with.
    pub async fn spawn_on_free_addr(
        dir: &Path,
        options: impl Fn(SocketAddr) -> SpawnOptions,
    ) -> (Self, SocketAddr, SpawnOptions) {
        for attempt in 1..=PORT_ATTEMPTS {
            let addr = crate::free_addr();
            let chosen = options(addr);
            if let Some(process) = Self::try_spawn(dir, &chosen).await {
                return (process, addr, chosen);
            }
            eprintln!(
                "testkit: the broker on {addr} exited before listening (attempt {attempt} of {PORT_ATTEMPTS})"
            );
        }
        panic!("the broker exited before listening {PORT_ATTEMPTS} times (see its stderr)")
    }

    /// [`BrokerProcess::spawn`], but `None` when the broker exits before it
    /// listens (a port taken, a store refused) instead of a panic.
    pub async fn try_spawn(dir: &Path, options: &SpawnOptions) -> Option<Self> {
        let bin = broker_bin(options.bin.as_deref());
        let mut child = Command::new(&bin)
            .arg("--data-dir")
            .arg(dir)
            .arg("--listen")
            .arg(options.listen.to_string())
            .arg("--metrics-listen")
            .arg(options.metrics_listen.to_string())
            .args(&options.args)
            .env("RUST_LOG", &options.rust_log)
            .envs(options.envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        // Owned from here on, so it is killed and reaped on any panic.
        let tail = LogTail::default();
        let mut process = Self {
            child,
            url: String::new(),
            tail: tail.clone(),
        };
        let addr = tokio::time::timeout(
            options.start_timeout,
            read_stdout(stdout, options.echo_log, options.ready_when.clone(), tail),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the broker did not listen within {:?}",
                options.start_timeout
            )
        })
        .ok()?;
        if !addr.is_empty() {
            process.url = format!("http://{addr}");
        }
        Some(process)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The last lines (at most 40) the broker printed on stdout (its log)
    /// so far.
    pub fn log_tail(&self) -> Vec<String> {
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.iter().cloned().collect()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (a failpoint's abort, say).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL, then reaps it: no signal handler runs, nothing is flushed on
    /// the way out.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL the broker");
        self.child.wait().expect("reap the broker");
    }

    /// SIGTERM (the broker's clean shutdown), then waits for it to exit and
    /// returns how it did. Panics if it is still running a minute later
    /// (it is then SIGKILLed on the way out). An exit other than 0 prints
    /// the broker's last log lines on stderr (its own error line is there
    /// already: stderr is inherited), so a failed stop says why.
    pub async fn stop(mut self) -> ExitStatus {
        self.signal(Signal::TERM);
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the broker") {
                if !status.success() {
                    // Give the reader thread a moment to take the last lines.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    self.print_tail(&format!("exited with {status} after SIGTERM"));
                }
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the broker did not exit within {STOP_WAIT:?} of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGSTOP, then waits until the kernel reports the broker stopped: from
    /// then on none of its threads runs, so it reads, answers and writes
    /// nothing (connections stay open) until [`thaw`](Self::thaw).
    ///
    /// Sending the signal is not enough: `kill` returns once the signal is
    /// queued, and the broker stops only when one of its threads has taken
    /// it and every other thread has joined the stop. On a loaded machine
    /// that can take a scheduling round or more, in which the broker goes on
    /// serving (it was seen applying and confirming acks sent after `kill`
    /// returned). Panics if the broker exits instead, or has not stopped
    /// within a minute.
    pub fn freeze(&self) {
        self.signal(Signal::STOP);
        let deadline = std::time::Instant::now() + FREEZE_WAIT;
        loop {
            // `NOWAIT`: only looks, so the stop stays reported and an exit
            // stays for `Child::wait` to reap.
            let seen = waitid(
                WaitId::Pid(self.raw_pid()),
                WaitIdOptions::STOPPED
                    | WaitIdOptions::EXITED
                    | WaitIdOptions::NOWAIT
                    | WaitIdOptions::NOHANG,
            )
            .unwrap_or_else(|e| panic!("waitid on the broker: {e}"));
            match seen {
                Some(status) if status.stopped() => return,
                Some(status) if status.exited() || status.killed() || status.dumped() => {
                    panic!("the broker exited instead of stopping")
                }
                _ => {}
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the broker did not stop within {FREEZE_WAIT:?} of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT: a frozen broker runs on.
    pub fn thaw(&self) {
        self.signal(Signal::CONT);
    }

    fn raw_pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    /// Writes `what` and the broker's last log lines to stderr (not through
    /// `eprintln!`, which the test harness captures).
    fn print_tail(&self, what: &str) {
        let tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "broker {} {what}; its last log lines:", self.pid());
        for line in tail.iter() {
            let _ = writeln!(err, "  | {line}");
        }
    }

    fn signal(&self, signal: Signal) {
        kill_process(self.raw_pid(), signal)
            .unwrap_or_else(|e| panic!("signal {signal:?} to the broker {}: {e}", self.pid()));
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        // Both no-ops once `kill9` or `stop` reaped it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the broker's stdout until it exits, on a thread of its own (so the
/// broker never blocks on a full pipe): the address line goes to the
/// returned receiver (or an empty string, at the first line containing
/// `ready`), the log to stderr when `echo`, and its last lines to `tail`.
fn read_stdout(
    stdout: ChildStdout,
    echo: bool,
    ready: Option<String>,
    tail: LogTail,
) -> tokio::sync::oneshot::Receiver<String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(text) = &ready
                && line.contains(text.as_str())
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(String::new());
            }
            if let Some(addr) = listening_addr(&line)
                && ready.is_none()
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(addr.to_owned());
                continue;
            }
            if echo {
                // Not `eprintln!`: the harness would capture it.
                let _ = writeln!(std::io::stderr(), "{line}");
            }
            let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(dir: &str) -> PathBuf {
        Path::new(dir).join(format!("{BIN_NAME}{}", std::env::consts::EXE_SUFFIX))
    }

    #[test]
    fn the_binary_sits_in_the_profile_directory_of_the_running_one() {
        assert_eq!(
            next_to(Path::new("/w/target/debug/deps/crash_moves-0123abcd")),
            (
                bin("/w/target/debug"),
                "cargo build -p ricochet-broker".to_owned()
            )
        );
        assert_eq!(
            next_to(Path::new("/w/target/release/deps/retry_scheduler-0123abcd")),
            (
                bin("/w/target/release"),
                "cargo build --release -p ricochet-broker".to_owned()
            )
        );
        assert_eq!(
            next_to(Path::new("/w/target/fast/examples/walk")),
            (
                bin("/w/target/fast"),
                "cargo build --profile fast -p ricochet-broker".to_owned()
            )
        );
        assert_eq!(
            next_to(Path::new("/w/target/debug/ricochet")).0,
            bin("/w/target/debug")
        );
    }

    #[test]
    fn a_given_path_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = find_broker_bin(Some(&missing)).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("the given path"), "{e}");
        let present = dir.path().join("ricochet-broker");
        std::fs::write(&present, b"").unwrap();
        assert_eq!(find_broker_bin(Some(&present)).unwrap(), present);
    }
}
