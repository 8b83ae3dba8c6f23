//! Producer sequence ids of a topic in the segment log ([`LogStorage`]):
//! appends gather them in memory and checkpoint them to sled only now and
//! then (`sled_store::checkpoint`), so a store dropped without a
//! checkpoint — what a crash leaves — must rebuild them from the log's
//! messages, and a trim must checkpoint the ids of the entries it removes.

use super::*;
use prost::Message as _;
use ricochet_proto::Message;
use std::path::Path;
use std::sync::Arc;

const T: &str = "persistent://public/default/seq";

/// The engine on `dir` (segments of 16 entries); the topic record is put
/// by the first open.
fn open(dir: &Path) -> (LogStorage, Arc<SledStorage>) {
    let settings = segments::LogSettings {
        segment_entries: 16,
        max_bytes: 64 << 20,
        max_age: std::time::Duration::from_secs(3600),
    };
    let sled = Arc::new(crate::sled_store::reopen_waiting(dir, 16));
    let store = LogStorage::with(
        sled.clone(),
        segments::SegmentLog::open(dir, settings, true).unwrap(),
    )
    .unwrap();
    if store.list_topics().unwrap().is_empty() {
        store
            .put_topic(&TopicRecord {
                name: T.into(),
                created_ms: 0,
                kind: TopicKind::Normal,
                replicas: 1,
                trimmed_below: 0,
            })
            .unwrap();
    }
    (store, sled)
}

fn flush(s: &LogStorage) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(s.flush())
        .unwrap();
}

/// `n` messages of `size` payload bytes from `producer`, sequence ids
/// from `first_seq`, appended at `first_id`.
fn append(s: &LogStorage, first_id: u64, producer: &str, first_seq: u64, n: u64, size: usize) {
    let entries: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            Message {
                payload: vec![b'x'; size],
                producer_name: producer.into(),
                sequence_id: first_seq + i,
                ..Default::default()
            }
            .encode_to_vec()
        })
        .collect();
    s.append(T, first_id, &entries, Some((producer, first_seq + n - 1)))
        .unwrap();
}

/// What sled's `prodseq` holds for [`T`] (the checkpoint, with the
/// position it covers under the empty name).
fn checkpoint(sled: &SledStorage) -> Vec<(String, u64)> {
    sled.producer_sequences(T).unwrap()
}

fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect()
}

#[test]
fn ids_since_the_last_checkpoint_come_back_from_the_log_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (s, sled) = open(dir.path());
    append(&s, 0, "q", 0, 4, 10);
    append(&s, 4, "p", 0, 8, 10);
    append(&s, 12, "p", 8, 8, 10);
    assert_eq!(checkpoint(&sled), vec![], "no sled write per append");
    assert_eq!(sled.pending_sequence_entries(T), 20);
    flush(&s);
    assert_eq!(checkpoint(&sled), vec![], "nor per flush");
    // Dropped without a checkpoint: all a crash leaves is the log.
    drop((s, sled));
    let (s, sled) = open(dir.path());
    assert_eq!(checkpoint(&sled), vec![]);
    assert_eq!(
        s.producer_sequences(T).unwrap(),
        pairs(&[("p", 15), ("q", 3)])
    );
}

#[test]
fn a_checkpoint_is_written_once_enough_has_gathered_and_the_log_adds_what_follows() {
    let dir = tempfile::tempdir().unwrap();
    let (s, sled) = open(dir.path());
    append(&s, 0, "q", 0, 1, 1024);
    // 1 KiB messages, 64 a batch, until the byte bound makes an append
    // write the checkpoint (8 MiB: about 128 batches with the messages'
    // own bytes).
    let per_batch = 64;
    let bound = crate::sled_store::checkpoint::CHECKPOINT_BYTES / (per_batch * 1024);
    let mut next = 1;
    let mut batches = 0;
    while sled.pending_sequence_entries(T) > 0 {
        assert!(batches <= bound, "no checkpoint after {batches} batches");
        append(&s, next, "p", batches * per_batch, per_batch, 1024);
        next += per_batch;
        batches += 1;
    }
    assert!(
        batches > bound * 9 / 10,
        "a checkpoint after {batches} batches"
    );
    let p_last = batches * per_batch - 1;
    assert_eq!(
        checkpoint(&sled),
        pairs(&[("", next), ("p", p_last), ("q", 0)]),
        "the checkpoint: every producer so far and the position it covers"
    );
    assert_eq!(sled.pending_sequence_entries(T), 0);
    // After it: a new producer and more of `p`, not checkpointed.
    append(&s, next, "r", 100, 3, 1024);
    append(&s, next + 3, "p", p_last + 1, 5, 1024);
    assert_eq!(sled.pending_sequence_entries(T), 8);
    flush(&s);
    drop((s, sled));
    let (s, _sled) = open(dir.path());
    assert_eq!(
        s.producer_sequences(T).unwrap(),
        pairs(&[("p", p_last + 5), ("q", 0), ("r", 102)])
    );
}

#[test]
fn a_trim_checkpoints_the_ids_of_the_entries_it_removes() {
    let dir = tempfile::tempdir().unwrap();
    let (s, sled) = open(dir.path());
    // `q`'s only entries are in the first segment, which the trim removes.
    append(&s, 0, "q", 0, 16, 10);
    append(&s, 16, "p", 0, 16, 10);
    append(&s, 32, "p", 16, 16, 10);
    assert_eq!(checkpoint(&sled), vec![]);
    s.trim(T, 32).unwrap();
    assert_eq!(
        checkpoint(&sled),
        pairs(&[("", 48), ("p", 31), ("q", 15)]),
        "checkpointed by the trim"
    );
    // The flush makes the checkpoint durable, then deletes the files.
    flush(&s);
    drop((s, sled));
    let (s, _sled) = open(dir.path());
    assert_eq!(s.entry_range(T).unwrap(), (32, 48), "q's entries are gone");
    assert_eq!(
        s.producer_sequences(T).unwrap(),
        pairs(&[("p", 31), ("q", 15)])
    );
}

#[test]
fn flush_rounds_of_appends_below_the_bound_leave_sleds_data_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (s, sled) = open(dir.path());
    append(&s, 0, "q", 0, 4, 1024);
    flush(&s);
    let before = sled.data_syncs();
    // What a `sync` publisher's rounds do: an append, a flush, again.
    for n in 0..20 {
        append(&s, 4 + n * 8, "p", n * 8, 8, 1024);
        flush(&s);
    }
    assert_eq!(
        sled.data_syncs(),
        before,
        "a publish round wrote to sled (its flush synced the data file)"
    );
    assert_eq!(
        s.producer_sequences(T).unwrap(),
        pairs(&[("p", 159), ("q", 3)])
    );
}

#[test]
fn ids_read_back_after_a_crash_go_into_the_next_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (s, sled) = open(dir.path());
    append(&s, 0, "q", 0, 4, 1024);
    drop((s, sled));
    // The start after the crash reads `q`'s id back from the log (as a
    // topic's open does); then `p` crosses the bound.
    let (s, sled) = open(dir.path());
    assert_eq!(s.producer_sequences(T).unwrap(), pairs(&[("q", 3)]));
    assert_eq!(
        checkpoint(&sled),
        pairs(&[("", 4), ("q", 3)]),
        "what was read back is checkpointed at once"
    );
    let mut next = 4;
    let mut n = 0;
    while sled.pending_sequence_entries(T) > 0 || n == 0 {
        assert!(n < 200, "no checkpoint after {n} batches");
        append(&s, next, "p", n * 64, 64, 1024);
        next += 64;
        n += 1;
    }
    assert_eq!(
        checkpoint(&sled),
        pairs(&[("", next), ("p", n * 64 - 1), ("q", 3)]),
        "the checkpoint past q's entries names q"
    );
    drop((s, sled));
    let (s, _sled) = open(dir.path());
    assert_eq!(
        s.producer_sequences(T).unwrap(),
        pairs(&[("p", n * 64 - 1), ("q", 3)])
    );
}
