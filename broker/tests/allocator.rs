//! The broker binary's allocator settings at start: mimalloc's own purge
//! delay (1 s) by default and with `--return-idle-memory off`, 0 with
//! `--return-idle-memory eager` (freed pages go back to the system at
//! once, which keeps a parked retry's memory smallest after a burst, at a
//! cost in throughput), and the environment's `MIMALLOC_PURGE_DELAY` still
//! sets it.
#![cfg(not(feature = "system-alloc"))]

use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The binary's "memory allocator" start line, run with `args` and `env`
/// (and no allocator settings inherited from the test's environment).
async fn allocator_line(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .env_remove("MIMALLOC_RESET_DELAY")
        .env_remove("RICOCHET_RETURN_IDLE_MEMORY")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = out.next_line().await.unwrap() {
            if line.contains("memory allocator") {
                return line;
            }
        }
        panic!("the broker ended without its allocator line");
    })
    .await
    .expect("the broker logs its allocator at start");
    child.kill().await.unwrap();
    line
}

/// The number after `purge_delay_ms=` in the line.
fn purge_delay_ms(line: &str) -> i64 {
    let at = line
        .find("purge_delay_ms=")
        .unwrap_or_else(|| panic!("no purge delay in {line}"));
    line[at + "purge_delay_ms=".len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '-'))
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no purge delay in {line}"))
}

#[tokio::test]
async fn the_purge_delay_is_mimallocs_by_default_zero_when_eager_and_the_environment_still_sets_it()
{
    let default = allocator_line(&[], &[]).await;
    assert!(default.contains("allocator=\"mimalloc\""), "{default}");
    assert_eq!(purge_delay_ms(&default), 1000, "{default}");

    let eager = allocator_line(&["--return-idle-memory", "eager"], &[]).await;
    assert_eq!(purge_delay_ms(&eager), 0, "{eager}");

    // mimalloc reads the variable itself; `eager` does not override it
    // (and the value read back is the option the variable names, so the
    // option's index in the binary is right).
    let set = allocator_line(
        &["--return-idle-memory", "eager"],
        &[("MIMALLOC_PURGE_DELAY", "250")],
    )
    .await;
    assert_eq!(purge_delay_ms(&set), 250, "{set}");

    // `off` is the allocator's own behaviour: mimalloc's 1 s default.
    let off = allocator_line(&["--return-idle-memory", "off"], &[]).await;
    assert_eq!(purge_delay_ms(&off), 1000, "{off}");
}
