//! A `kill -9` of a process in the middle of Raft log appends: every entry
//! it reported flushed is there, whole, when the log is opened again.
//!
//! A test binary of its own: the child is this binary re-run, and no other
//! test of the process holds a sled database it could inherit.

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader};
use ricochet_replication::log_store::{LogStore, group_log_dir};
use ricochet_replication::{Command, NodeSettings, RaftDb, TypeConfig, open_db};
use std::io::BufRead;
use std::path::Path;

const CHILD_DIR: &str = "RICOCHET_RAFTLOG_CRASH_DIR";
const SEGMENT_BYTES: u64 = 64 << 10;

fn payload(index: u64) -> Vec<u8> {
    let len = 50 + (index * 37 % 900) as usize;
    (0..len).map(|k| (index as usize * 31 + k) as u8).collect()
}

fn entry(index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command(payload(index).into())),
    }
}

/// The node's Raft database, waiting (up to 5 s) for the previous
/// handle's lock to go: sled 0.34 releases it from a background thread a
/// moment after the last handle is dropped.
fn reopen_db(dir: &Path) -> RaftDb {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match open_db(dir, &NodeSettings::default()) {
            Ok(db) => return db,
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("db: {e}"),
        }
    }
}

fn open(dir: &Path) -> (RaftDb, LogStore) {
    let db = reopen_db(dir);
    let log = LogStore::open_with(&db, "g", &NodeSettings::default(), SEGMENT_BYTES).expect("log");
    (db, log)
}

/// The child (ignored unless run by the test below): appends batches of
/// 1-7 entries in `sync` mode until killed, printing the last index of
/// each batch once `append_entries` returned (what openraft is told is
/// flushed).
#[tokio::test]
#[ignore = "the child process of the kill -9 test"]
async fn crash_child_appends_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let (_db, log) = open(Path::new(&dir));
    let mut next = 1u64;
    for k in 0u64.. {
        let n = 1 + k % 7;
        let batch = (next..next + n).map(entry).collect();
        log.append_entries(batch).await.expect("append");
        next += n;
        println!("flushed {}", next - 1);
    }
}

fn reported(line: std::io::Result<String>) -> Option<u64> {
    line.ok()?.strip_prefix("flushed ")?.parse().ok()
}

#[tokio::test]
async fn entries_reported_flushed_survive_a_kill_9() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    let mut child = std::process::Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "crash_child_appends_until_killed",
            "--nocapture",
        ])
        .env(CHILD_DIR, dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("child");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut last_reported = 0u64;
    while last_reported < 3000 {
        let line = lines.next().expect("the child ended before the kill");
        if let Some(n) = reported(line) {
            last_reported = n;
        }
    }
    child.kill().expect("kill -9"); // SIGKILL
    // What it printed before it died was reported flushed too.
    for line in lines {
        if let Some(n) = reported(line) {
            last_reported = n;
        }
    }
    child.wait().expect("wait");
    let segs = std::fs::read_dir(group_log_dir(&dir.path().join("raft-log"), "g"))
        .expect("log dir")
        .count();
    assert!(segs > 2, "no segment rolled before the kill ({segs})");
    let (_db, mut log) = open(dir.path());
    let state = log.get_log_state().await.expect("state");
    let last = state.last_log_id.map_or(0, |l| l.index);
    assert!(
        last >= last_reported,
        "reported {last_reported}, found {last}"
    );
    let got = log.try_get_log_entries(1..=last).await.expect("read");
    assert_eq!(got.len() as u64, last);
    for (k, e) in got.into_iter().enumerate() {
        assert_eq!(e.log_id.index, k as u64 + 1);
        match e.payload {
            EntryPayload::Normal(c) => assert_eq!(c.0, payload(k as u64 + 1)),
            _ => panic!("entry {} is no command", k + 1),
        }
    }
}
