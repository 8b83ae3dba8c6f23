//! Tests of the log's value layout: a large batch is stored as several values
//! of at most [`frame::MAX_VALUE`] bytes and reads back whole through every
//! read path (checked against the in-memory engine), values cut across
//! segment trees are trimmed with them, stores written when a batch was
//! always one value read alongside the new layout, and log leaves of 1 KiB
//! messages no longer become sled blob files.

use super::codec::{be, read_be, seal, unseal};
use super::frame;
use super::*;
use crate::MemoryStorage;

const T: &str = "persistent://public/default/big";

/// Entries `from..to` of 1 KiB, each starting with its id.
fn kib(from: u64, to: u64) -> Vec<Vec<u8>> {
    (from..to)
        .map(|id| {
            let mut e = vec![id as u8; 1024];
            e[..8].copy_from_slice(&id.to_be_bytes());
            e
        })
        .collect()
}

/// Every stored value of `topic`'s log: (segment, first id, slots, stored bytes).
fn values(s: &SledStorage, topic: &str) -> Vec<(u64, u64, u64, usize)> {
    let mut out = Vec::new();
    for (seg, tree) in s.segments_of(topic).unwrap() {
        for kv in tree.iter() {
            let (k, v) = kv.unwrap();
            let n = frame::count(unseal(&k, &v).unwrap()).unwrap();
            out.push((seg, read_be(&k).unwrap(), n as u64, v.len()));
        }
    }
    out
}

/// Each read path of `sled` answers as `mem` does, from the ids in `froms`.
fn same_reads(sled: &SledStorage, mem: &MemoryStorage, froms: &[u64], ids: &[u64]) {
    let all = usize::MAX;
    for &from in froms {
        for (max, max_bytes) in [
            (all, all),
            (1, all),
            (7, all),
            (all, 1),
            (all, 10 * 1024),
            (all, 10 * 1024 + 1),
            (all, 3 * frame::MAX_VALUE),
            (50, 20 * 1024),
        ] {
            assert_eq!(
                sled.read(T, from, max, max_bytes).unwrap(),
                mem.read(T, from, max, max_bytes).unwrap(),
                "read from {from}, max {max}, max_bytes {max_bytes}"
            );
        }
    }
    assert_eq!(
        sled.read_many(T, ids).unwrap(),
        mem.read_many(T, ids).unwrap()
    );
    for &id in ids {
        assert_eq!(
            sled.read_one(T, id).unwrap(),
            mem.read_one(T, id).unwrap(),
            "{id}"
        );
    }
    assert_eq!(sled.entry_range(T).unwrap(), mem.entry_range(T).unwrap());
}

#[tokio::test]
async fn a_large_batch_is_stored_as_values_within_the_limit_and_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledStorage::open(dir.path(), 16_384, 8 << 20).unwrap();
    let mem = MemoryStorage::new();
    let batch = kib(0, 1000);
    for s in [&sled as &dyn Storage, &mem] {
        s.append(T, 0, &batch, Some(("p", 1))).unwrap();
    }

    // Several values, each within the limit, covering 0..1000 back to back.
    let stored = values(&sled, T);
    assert!(stored.len() >= 140, "{} values", stored.len());
    let mut next = 0;
    for (seg, first, n, len) in &stored {
        assert_eq!((*seg, *first), (0, next));
        assert!(*len <= frame::MAX_VALUE, "value at {first}: {len} B");
        assert!(*n > 1);
        next += n;
    }
    assert_eq!(next, 1000);

    // Whole and in order.
    let all = sled.read(T, 0, usize::MAX, usize::MAX).unwrap();
    assert_eq!(all.len(), 1000);
    assert!(all.iter().map(|(i, _)| *i).eq(0..1000));
    assert!(all.iter().map(|(_, e)| e).eq(batch.iter()));
    // A byte cut-off inside a value ends the read there: 10 KiB is reached
    // by the tenth entry, one byte more by the eleventh.
    let ids = |v: Vec<(u64, Vec<u8>)>| v.into_iter().map(|(i, _)| i).collect::<Vec<_>>();
    assert_eq!(
        ids(sled.read(T, 5, usize::MAX, 10 * 1024).unwrap()),
        (5..15).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(sled.read(T, 5, usize::MAX, 10 * 1024 + 1).unwrap()),
        (5..16).collect::<Vec<_>>()
    );
    assert_eq!(sled.producer_sequences(T).unwrap(), [("p".to_owned(), 1)]);

    let froms = [0, 1, 5, 6, 7, 12, 500, 995, 999, 1000, 2000];
    let asked = [999, 0, 6, 5, 12, 11, 500, 1000, 5000, 6, 17, 18];
    same_reads(&sled, &mem, &froms, &asked);

    // Removals across a value boundary (5 | 6), a whole value (12..18) and
    // the last entry.
    let (_, first12, n12, _) = stored[2];
    assert_eq!((first12, n12), (12, 6));
    let gone: Vec<u64> = [5, 6, 999].into_iter().chain(12..18).collect();
    for s in [&sled as &dyn Storage, &mem] {
        s.remove_entries(T, &gone).unwrap();
    }
    assert!(
        sled.segment(T, 0).unwrap().get(be(12)).unwrap().is_none(),
        "an emptied value stays"
    );
    same_reads(&sled, &mem, &froms, &asked);
    assert_eq!(sled.read_one(T, 6).unwrap(), None);
    assert_eq!(sled.read_one(T, 7).unwrap().as_deref(), Some(&batch[7][..]));

    // The same after a reopen.
    sled.flush().await.unwrap();
    drop(sled);
    let sled = super::reopen_waiting(dir.path(), 16_384);
    same_reads(&sled, &mem, &froms, &asked);
}

#[test]
fn values_never_span_segments_and_trim_drops_them_with_their_segment() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledStorage::open(dir.path(), 256, 8 << 20).unwrap();
    let mem = MemoryStorage::new();
    // 1000 entries from id 0 over segments of 256, then 20 from 1000
    // across the boundary at 1024.
    for s in [&sled as &dyn Storage, &mem] {
        s.append(T, 0, &kib(0, 1000), None).unwrap();
        s.append(T, 1000, &kib(1000, 1020), None).unwrap();
        s.append(T, 1020, &kib(1020, 1030), None).unwrap();
    }
    let stored = values(&sled, T);
    for (seg, first, n, len) in &stored {
        assert!(*len <= frame::MAX_VALUE);
        assert_eq!(first / 256, *seg);
        assert_eq!(
            (first + n - 1) / 256,
            *seg,
            "value at {first} spans segments"
        );
    }
    assert!(stored.iter().any(|v| v.1 == 1024), "{stored:?}");
    assert_eq!(stored.iter().map(|v| v.2).sum::<u64>(), 1030);
    same_reads(
        &sled,
        &mem,
        &[0, 255, 256, 1000, 1023, 1024],
        &[0, 255, 256, 1023, 1024, 1029],
    );

    // Trimming below 600 drops the segments 0 and 1 whole.
    sled.trim(T, 600).unwrap();
    assert_eq!(sled.entry_range(T).unwrap(), (512, 1030));
    let rest = sled.read(T, 0, usize::MAX, usize::MAX).unwrap();
    assert!(rest.iter().map(|(i, _)| *i).eq(512..1030));
    assert_eq!(
        sled.read_many(T, &[100, 511, 512, 599, 600, 1029])
            .unwrap()
            .iter()
            .map(Option::is_some)
            .collect::<Vec<_>>(),
        [false, false, true, true, true, true]
    );
    // What is left reads as the memory engine's log trimmed at 512.
    mem.trim(T, 512).unwrap();
    same_reads(&sled, &mem, &[0, 512, 513, 1000], &[511, 512, 700, 1029]);
}

/// A store written before batches were cut: one value per batch, here of
/// 200 KiB (a sled blob), next to batches appended in runs.
#[tokio::test]
async fn old_one_value_batches_read_next_to_split_ones() {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledStorage::open(dir.path(), 16_384, 8 << 20).unwrap();
    let mem = MemoryStorage::new();
    let old = |first: u64, to: u64| {
        let tree = sled.segment(T, 0).unwrap();
        let body = frame::encode(&kib(first, to));
        tree.insert(be(first), seal(&be(first), &body)).unwrap();
    };
    old(0, 200);
    sled.append(T, 200, &kib(200, 400), None).unwrap();
    old(400, 600);
    sled.append(T, 600, &kib(600, 610), None).unwrap();
    mem.append(T, 0, &kib(0, 610), None).unwrap();
    let stored = values(&sled, T);
    assert_eq!(stored[0].1..stored[0].1 + stored[0].2, 0..200);
    assert!(stored[0].3 > 200 * 1024);
    assert!(stored.len() > 30);

    let froms = [0, 150, 199, 200, 201, 399, 400, 599, 600, 609, 610];
    let asked = [609, 0, 199, 200, 399, 400, 401, 600, 610, 150, 250];
    same_reads(&sled, &mem, &froms, &asked);
    // Removals across both kinds of boundary and inside an old value.
    let gone = [100, 199, 200, 399, 400, 599, 600];
    for s in [&sled as &dyn Storage, &mem] {
        s.remove_entries(T, &gone).unwrap();
    }
    same_reads(&sled, &mem, &froms, &asked);
    sled.flush().await.unwrap();
    drop(sled);
    let sled = super::reopen_waiting(dir.path(), 16_384);
    same_reads(&sled, &mem, &froms, &asked);
}

/// Files under `dir/blobs`.
fn blob_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("blobs")).map_or(0, |d| d.flatten().count())
}

/// 300 producer batches of 16 × 1 KiB (4.8 MB): written as single values,
/// sled writes their leaves (17 × 16 KiB) as blob files; cut into runs, it
/// writes none.
#[tokio::test]
async fn log_leaves_of_1kib_batches_are_not_blob_files() {
    let split = tempfile::tempdir().unwrap();
    let s = SledStorage::open(split.path(), 16_384, 8 << 20).unwrap();
    for b in 0..300u64 {
        s.append(T, b * 16, &kib(b * 16, b * 16 + 16), None)
            .unwrap();
    }
    s.flush().await.unwrap();
    assert_eq!(s.read(T, 0, usize::MAX, usize::MAX).unwrap().len(), 4800);
    assert_eq!(blob_files(split.path()), 0);

    // The same batches as one value each (the old layout) are blobs.
    let whole = tempfile::tempdir().unwrap();
    let s = SledStorage::open(whole.path(), 16_384, 8 << 20).unwrap();
    let tree = s.segment(T, 0).unwrap();
    for b in 0..300u64 {
        let body = frame::encode(&kib(b * 16, b * 16 + 16));
        tree.insert(be(b * 16), seal(&be(b * 16), &body)).unwrap();
    }
    s.flush().await.unwrap();
    assert!(
        blob_files(whole.path()) > 10,
        "{}",
        blob_files(whole.path())
    );
}

/// A failure record of 64 attempts with 4 KiB reasons (the most the broker
/// accepts) is about 260 KiB: sled writes it as a blob file, which its own
/// flush never fsyncs. The store's flush does, before sled's.
#[tokio::test]
async fn the_stores_flush_makes_sled_blob_files_durable_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 16_384, 8 << 20).unwrap();
    let mut record = crate::records::sample_history(64);
    for a in &mut record.attempts {
        a.detail = "x".repeat(4096);
    }
    let at = crate::records::TierEntry::retry(7).of(3);
    s.put_failures(&[(at, Some(record.clone()))]).unwrap();
    assert!(
        blob_files(dir.path()) >= 1,
        "no blob file: the test needs one"
    );
    s.flush().await.unwrap();
    // Everything sled wrote as a blob was synced by the flush: nothing is
    // left for another pass to sync.
    assert_eq!(s.sync.sync_new().unwrap(), 0);
    drop(s);
    let s = super::reopen_waiting(dir.path(), 16_384);
    assert_eq!(s.failure(at, None).unwrap(), Some(record));
}

/// sled's flush ends with `sync_file_range`, which leaves the written pages
/// in the device's write cache: the store's flush `fdatasync`s sled's data
/// file after every flush that wrote something (the store is sled's only
/// flusher, so one that wrote nothing has nothing unsynced to cover).
#[tokio::test]
async fn a_durable_flush_fdatasyncs_sleds_data_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 16_384, 8 << 20).unwrap();
    s.flush().await.unwrap();
    let before = s.sync.data_syncs();
    let record = crate::records::sample_history(2);
    for (n, entry) in [3, 4].into_iter().enumerate() {
        let at = crate::records::TierEntry::retry(7).of(entry);
        s.put_failures(&[(at, Some(record.clone()))]).unwrap();
        s.flush().await.unwrap();
        assert_eq!(
            s.sync.data_syncs(),
            before + n as u64 + 1,
            "a write, a sync"
        );
        s.flush().await.unwrap();
        assert_eq!(s.sync.data_syncs(), before + n as u64 + 1, "nothing new");
    }
}
