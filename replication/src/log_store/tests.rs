//! The segment-file Raft log: reopen, torn tail, damage, truncate then
//! append, purge, the sled upgrade (the `kill -9` test is
//! `tests/raft_log_crash.rs`: a process of its own).

use super::*;
use crate::{Command, NodeSettings, open_db};
use openraft::CommittedLeaderId;

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Command(payload(term, index))),
    }
}

/// The command bytes of entry `index` written in `term` (sizes vary).
fn payload(term: u64, index: u64) -> Vec<u8> {
    let len = 50 + (index * 37 % 900) as usize;
    (0..len)
        .map(|k| (index as usize * 31 + k + term as usize) as u8)
        .collect()
}

fn batch(term: u64, from: u64, to: u64) -> Vec<Entry<TypeConfig>> {
    (from..=to).map(|i| entry(term, i)).collect()
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

fn open(dir: &Path, segment_bytes: u64) -> (RaftDb, LogStore) {
    let db = reopen_db(dir);
    let log = LogStore::open_with(&db, "g", &NodeSettings::default(), segment_bytes).expect("log");
    (db, log)
}

/// Every entry of `log` in `from..=to`, checked against what `term_of`
/// says it was written in.
async fn check(log: &mut LogStore, from: u64, to: u64, term_of: impl Fn(u64) -> u64) {
    let got = log.try_get_log_entries(from..=to).await.expect("read");
    let want: Vec<u64> = (from..=to).collect();
    let indexes: Vec<u64> = got.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, want);
    for e in got {
        let i = e.log_id.index;
        assert_eq!(e.log_id.leader_id.term, term_of(i), "term of {i}");
        match e.payload {
            EntryPayload::Normal(c) => assert_eq!(c.0, payload(term_of(i), i), "entry {i}"),
            _ => panic!("entry {i} is no command"),
        }
    }
}

async fn last_index(log: &mut LogStore) -> Option<u64> {
    log.get_log_state()
        .await
        .expect("state")
        .last_log_id
        .map(|l| l.index)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let d = group_log_dir(&dir.join("raft-log"), "g");
    let mut out: Vec<PathBuf> = std::fs::read_dir(d)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    out.sort();
    out
}

#[tokio::test]
async fn appended_batches_come_back_after_a_reopen_across_segments() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (_db, mut log) = open(dir.path(), 16 << 10);
        for k in 0..20 {
            log.append_entries(batch(1, k * 10 + 1, k * 10 + 10))
                .await
                .expect("append");
        }
        check(&mut log, 1, 200, |_| 1).await;
        check(&mut log, 55, 57, |_| 1).await;
    }
    assert!(segments(dir.path()).len() > 3, "the log rolled no segment");
    let (_db, mut log) = open(dir.path(), 16 << 10);
    assert_eq!(last_index(&mut log).await, Some(200));
    check(&mut log, 1, 200, |_| 1).await;
    log.append_entries(batch(2, 201, 203))
        .await
        .expect("append");
    check(&mut log, 199, 203, |i| if i > 200 { 2 } else { 1 }).await;
}

#[tokio::test]
async fn a_torn_tail_is_dropped_and_never_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (_db, log) = open(dir.path(), 1 << 20);
        log.append_entries(batch(1, 1, 5)).await.expect("append");
        log.append_entries(batch(1, 6, 9)).await.expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let whole = std::fs::metadata(&seg).expect("len").len();
    // Half of a third record, as a crash part-way through its write leaves.
    let rec =
        ricochet_storage::segments::record::encode(10, &[encode(&entry(1, 10)).expect("encode")]);
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes.extend_from_slice(&rec[..rec.len() / 2]);
    std::fs::write(&seg, &bytes).expect("write");
    let (db, mut log) = open(dir.path(), 1 << 20);
    assert_eq!(last_index(&mut log).await, Some(9));
    assert!(
        log.try_get_log_entries(10..=10)
            .await
            .expect("read")
            .is_empty()
    );
    assert_eq!(
        std::fs::metadata(&seg).expect("len").len(),
        whole,
        "tail not cut"
    );
    log.append_entries(batch(2, 10, 11)).await.expect("append");
    drop((db, log));
    let (_db, mut log) = open(dir.path(), 1 << 20);
    check(&mut log, 1, 11, |i| if i >= 10 { 2 } else { 1 }).await;
}

#[tokio::test]
async fn a_bad_record_in_the_middle_refuses_the_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (_db, log) = open(dir.path(), 1 << 20);
        log.append_entries(batch(1, 1, 5)).await.expect("append");
        log.append_entries(batch(1, 6, 9)).await.expect("append");
    }
    let seg = segments(dir.path()).pop().expect("a segment");
    let mut bytes = std::fs::read(&seg).expect("read");
    // A bit of the first record's body: a whole record follows it.
    let at = record::FILE_HEADER_LEN as usize + record::RECORD_HEADER_LEN + 40;
    bytes[at] ^= 0x10;
    std::fs::write(&seg, &bytes).expect("write");
    let db = reopen_db(dir.path());
    let err = LogStore::open(&db, "g", &NodeSettings::default()).expect_err("damage accepted");
    assert!(err.to_string().contains("whole record follows"), "{err}");
    // The file is left as it was, for an operator to look at.
    assert_eq!(std::fs::read(&seg).expect("read"), bytes);
}

use ricochet_storage::segments::record;

#[tokio::test]
async fn truncate_then_append_replaces_the_suffix_durably() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (_db, mut log) = open(dir.path(), 8 << 10);
        for k in 0..10 {
            log.append_entries(batch(1, k * 10 + 1, k * 10 + 10))
                .await
                .expect("append");
        }
        let before = segments(dir.path()).len();
        assert!(before > 2, "the test needs several segments");
        // Inside a record of an earlier segment: later segments go.
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 35))
            .await
            .expect("truncate");
        assert_eq!(last_index(&mut log).await, Some(34));
        assert!(segments(dir.path()).len() < before);
        assert!(
            log.try_get_log_entries(35..40)
                .await
                .expect("read")
                .is_empty()
        );
        log.append_entries(batch(2, 35, 42)).await.expect("append");
        check(&mut log, 30, 42, |i| if i >= 35 { 2 } else { 1 }).await;
        // At a record boundary too.
        log.truncate(LogId::new(CommittedLeaderId::new(2, 1), 35))
            .await
            .expect("truncate");
        log.append_entries(batch(3, 35, 36)).await.expect("append");
    }
    let (_db, mut log) = open(dir.path(), 8 << 10);
    assert_eq!(last_index(&mut log).await, Some(36));
    check(&mut log, 1, 36, |i| if i >= 35 { 3 } else { 1 }).await;
}

#[tokio::test]
async fn purge_deletes_whole_segments_below_the_point() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (db, mut log) = open(dir.path(), 8 << 10);
    for k in 0..10 {
        log.append_entries(batch(1, k * 10 + 1, k * 10 + 10))
            .await
            .expect("append");
    }
    let before = segments(dir.path());
    log.purge(LogId::new(CommittedLeaderId::new(1, 1), 55))
        .await
        .expect("purge");
    let after = segments(dir.path());
    assert!(after.len() < before.len(), "no segment deleted");
    // A segment is deleted only when all it holds is purged.
    let first_kept: u64 = after[0]
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.get(..20))
        .and_then(|n| n.parse().ok())
        .expect("a segment name");
    assert!(
        first_kept <= 56,
        "entries above the purge point lost ({first_kept})"
    );
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(55));
    assert!(
        log.try_get_log_entries(50..=55)
            .await
            .expect("read")
            .is_empty()
    );
    check(&mut log, 56, 100, |_| 1).await;
    drop((db, log));
    let (db, mut log) = open(dir.path(), 8 << 10);
    check(&mut log, 56, 100, |_| 1).await;
    // Past the end (a snapshot installed): everything goes, the log goes on
    // from there.
    log.purge(LogId::new(CommittedLeaderId::new(1, 1), 500))
        .await
        .expect("purge");
    assert!(segments(dir.path()).is_empty());
    assert_eq!(last_index(&mut log).await, Some(500));
    log.append_entries(batch(2, 501, 503))
        .await
        .expect("append");
    drop((db, log));
    let (_db, mut log) = open(dir.path(), 8 << 10);
    check(&mut log, 501, 503, |_| 2).await;
    assert_eq!(last_index(&mut log).await, Some(503));
}

#[tokio::test]
async fn a_log_an_earlier_broker_kept_in_sled_is_converted_at_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        // What the sled log store wrote: key the index, value the entry.
        let db = reopen_db(dir.path());
        let tree = db.open_tree("log/g").expect("tree");
        for i in 3u64..=40 {
            tree.insert(i.to_be_bytes(), encode(&entry(1, i)).expect("encode"))
                .expect("insert");
        }
        let meta = db.open_tree("meta/g").expect("meta");
        meta.insert(
            PURGED,
            encode(&LogId::new(CommittedLeaderId::new(1, 1), 2u64)).expect("e"),
        )
        .expect("insert");
        meta.insert(VOTE, encode(&Vote::new(1, 1)).expect("e"))
            .expect("insert");
        db.flush().expect("flush");
    }
    let (db, mut log) = open(dir.path(), 1 << 20);
    assert!(
        !db.tree_names().iter().any(|n| n.as_ref() == b"log/g"),
        "tree kept"
    );
    assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(1, 1)));
    assert_eq!(last_index(&mut log).await, Some(40));
    check(&mut log, 3, 40, |_| 1).await;
    log.append_entries(batch(2, 41, 42)).await.expect("append");
    drop((db, log));
    // A crash after the rename, before the tree was dropped: the tree
    // comes back, stale; the files win and the tree is dropped.
    {
        let db = reopen_db(dir.path());
        let tree = db.open_tree("log/g").expect("tree");
        tree.insert(3u64.to_be_bytes(), encode(&entry(9, 3)).expect("encode"))
            .expect("insert");
        db.flush().expect("flush");
    }
    let (db, mut log) = open(dir.path(), 1 << 20);
    assert!(
        !db.tree_names().iter().any(|n| n.as_ref() == b"log/g"),
        "tree kept"
    );
    check(&mut log, 3, 42, |i| if i > 40 { 2 } else { 1 }).await;
}
