//! The segment-file Raft log: reopen, torn tail, damage, truncate then
//! append, purge, the sled upgrade (the `kill -9` test is
//! `tests/raft_log_crash.rs`: a process of its own).

use super::*;
use crate::{Command, NodeSettings, open_db};
use openraft::CommittedLeaderId;

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Command(payload(term, index).into())),
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
    // What the files hold, whether or not the read above came from the
    // cache of recent entries.
    let stored: Vec<Entry<TypeConfig>> = log
        .raw_entries(from, to + 1)
        .expect("raw read")
        .iter()
        .map(|(_, b)| decode_entry(b).expect("decode"))
        .collect();
    assert_eq!(stored, got, "the cache and the files disagree");
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

/// The command encoding before it held `Bytes` (`#[serde(with =
/// "serde_bytes")] Vec<u8>`, derived), as earlier brokers wrote it.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename = "Command")]
struct OldCommand(#[serde(with = "serde_bytes")] Vec<u8>);

#[test]
fn a_command_encodes_as_before_and_decodes_what_older_brokers_wrote() {
    for len in [0, 1, 23, 24, 255, 256, 5_000, 70_000] {
        let bytes: Vec<u8> = (0..len).map(|k| (k * 7 + 3) as u8).collect();
        let old = encode(&OldCommand(bytes.clone())).expect("old encode");
        assert_eq!(encode(&Command(bytes.clone().into())).expect("encode"), old);
        assert_eq!(decode::<Command>(&old).expect("decode").0, bytes);
        // And inside an entry, as the log and AppendEntries carry it.
        let e = entry(3, 9);
        let EntryPayload::Normal(c) = &e.payload else {
            unreachable!()
        };
        let old_entry = Entry::<OldTypes> {
            log_id: e.log_id,
            payload: EntryPayload::Normal(OldCommand(c.0.to_vec())),
        };
        let written = encode(&old_entry).expect("old entry");
        assert_eq!(encode(&e).expect("entry"), written);
        assert_eq!(decode_entry(&written).expect("decode entry"), e);
    }
}

openraft::declare_raft_types!(
    /// [`TypeConfig`] with [`OldCommand`].
    OldTypes:
        D = OldCommand,
        R = crate::Reply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<OldTypes>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

fn cached(r: &Recent, from: u64, to: u64) -> Option<Vec<u64>> {
    r.get(from, to)
        .map(|v| v.iter().map(|e| e.log_id.index).collect())
}

#[test]
fn recent_entries_follow_appends_truncations_purges_and_gaps() {
    let mut r = Recent::default();
    assert_eq!(cached(&r, 1, 2), None);
    r.push(1, batch(1, 1, 5), 500);
    r.push(6, batch(1, 6, 8), 300);
    assert_eq!(cached(&r, 1, 9), Some((1..9).collect()));
    assert_eq!(cached(&r, 4, 7), Some(vec![4, 5, 6]));
    assert_eq!(cached(&r, 0, 3), None, "below what is held");
    assert_eq!(cached(&r, 7, 10), None, "past what is held");
    // A conflicting append from 4 on (after a truncation the store made).
    r.truncate(4);
    assert_eq!(cached(&r, 1, 4), Some(vec![1, 2, 3]));
    assert_eq!(cached(&r, 3, 5), None);
    r.push(4, batch(2, 4, 4), 100);
    let got = r.get(3, 5).expect("held");
    assert_eq!(got, vec![entry(1, 3), entry(2, 4)]);
    // An append that overlaps without a truncation first replaces the tail.
    r.push(3, batch(3, 3, 3), 100);
    assert_eq!(r.get(1, 4).expect("held")[2], entry(3, 3));
    assert_eq!(cached(&r, 1, 5), None);
    r.purge(2);
    assert_eq!(cached(&r, 2, 4), None);
    assert_eq!(cached(&r, 3, 4), Some(vec![3]));
    // A gap (a snapshot installed past the log): only what follows it.
    r.push(50, batch(4, 50, 51), 200);
    assert_eq!(cached(&r, 3, 4), None);
    assert_eq!(cached(&r, 50, 52), Some(vec![50, 51]));
    r.purge(60);
    assert_eq!(cached(&r, 50, 52), None);
    r.push(61, batch(4, 61, 61), 100);
    assert_eq!(cached(&r, 61, 62), Some(vec![61]));
}

#[test]
fn recent_entries_keep_at_most_their_byte_budget() {
    let mut r = Recent::default();
    let each = RECENT_BYTES / 10;
    for i in 1..=30 {
        r.push(i, batch(1, i, i), each);
    }
    assert_eq!(cached(&r, 30, 31), Some(vec![30]));
    assert_eq!(cached(&r, 21, 31), Some((21..31).collect()));
    assert_eq!(cached(&r, 20, 31), None, "over the budget");
    // One entry larger than the budget is still kept (the last append).
    r.push(31, batch(1, 31, 31), RECENT_BYTES * 2);
    assert_eq!(cached(&r, 31, 32), Some(vec![31]));
    assert_eq!(cached(&r, 30, 32), None);
}

#[tokio::test]
async fn reads_after_a_truncation_and_a_purge_match_the_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_db, mut log) = open(dir.path(), 16 << 10);
    for k in 0..6 {
        log.append_entries(batch(1, k * 5 + 1, k * 5 + 5))
            .await
            .expect("append");
    }
    check(&mut log, 1, 30, |_| 1).await;
    log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 13))
        .await
        .expect("truncate");
    assert!(
        log.try_get_log_entries(13..=14)
            .await
            .expect("read")
            .is_empty(),
        "a truncated entry was served"
    );
    log.append_entries(batch(2, 13, 20)).await.expect("append");
    check(&mut log, 1, 20, |i| if i >= 13 { 2 } else { 1 }).await;
    log.purge(LogId::new(CommittedLeaderId::new(2, 1), 15))
        .await
        .expect("purge");
    assert!(
        log.try_get_log_entries(10..=15)
            .await
            .expect("read")
            .is_empty(),
        "a purged entry was served"
    );
    check(&mut log, 16, 20, |_| 2).await;
}

/// After a failed `fsync` (recorded by the store when a sync of an append
/// or the interval flush fails) the log refuses every write: the kernel
/// may have dropped the pages that sync was for.
#[test]
fn after_a_failed_fsync_the_log_refuses_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = FileLog::open(dir.path(), None).unwrap();
    log.append(1, &[b"a".to_vec()]).unwrap();
    log.fail(&std::io::Error::other("EIO"));
    let refused = [
        log.append(2, &[b"b".to_vec()]).unwrap_err(),
        log.truncate(1).unwrap_err(),
        log.purge(1).unwrap_err(),
    ];
    for e in refused {
        assert!(e.to_string().contains("failed earlier (EIO)"), "{e}");
    }
    assert_eq!(log.next_index(), Some(2), "nothing was written after");
}
