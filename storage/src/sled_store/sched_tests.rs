//! Tests of the chunked retry schedule (`sched.rs`): chunk layout, inline
//! and big records, the upgrade from one key per entry, chunk writes.

use super::*;

fn main(sub: u64, id: u64) -> SubMessage {
    TierEntry::main(id).of(sub)
}

fn reopen(dir: &std::path::Path) -> SledStorage {
    super::reopen_waiting(dir, 64)
}

fn record(count: u32, until: u64) -> FailureRecord {
    let mut r = crate::records::sample_history(count);
    r.hold_until_ms = until;
    r
}

#[test]
fn a_burst_due_at_once_is_many_bounded_chunks_and_big_records_go_aside() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
    let n = 10_000u64;
    let held: Vec<(ScheduleKey, FailureRecord)> = (0..n)
        .map(|i| {
            let k = ScheduleKey {
                due_ms: 50_000,
                message: main(1, i),
            };
            (k, record(1, 50_000))
        })
        .collect();
    for part in held.chunks(1_000) {
        s.put_held(part, &[]).unwrap();
    }
    // A record over the inline limit (64 attempts with details).
    let mut big = record(64, 50_000);
    for a in &mut big.attempts {
        a.detail = "x".repeat(40);
    }
    assert!(encode_failures(&big).len() > INLINE_MAX);
    let bk = ScheduleKey {
        due_ms: 50_000,
        message: main(1, n),
    };
    s.put_held(&[(bk, big.clone())], &[]).unwrap();
    assert_eq!(s.sched.len() as u64, n / CHUNK_ENTRIES + 1);
    assert_eq!(s.sched_big.len(), 1);
    let largest = s.sched.iter().map(|kv| kv.unwrap().1.len()).max().unwrap();
    assert!(largest < 40 << 10, "largest chunk {largest} B");
    assert_eq!(s.failure(bk.message, Some(50_000)).unwrap(), Some(big));
    assert_eq!(
        s.failure(main(1, 7), Some(50_000)).unwrap(),
        Some(record(1, 50_000))
    );
    // Due order, paged.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = s.scheduled(after, u64::MAX, 999).unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().copied();
        seen.extend(page);
    }
    let mut want: Vec<ScheduleKey> = held.iter().map(|(k, _)| *k).collect();
    want.push(bk);
    assert_eq!(seen, want);
    // Unscheduled: chunks and the record aside are gone.
    let all: Vec<ScheduleKey> = want.clone();
    s.put_held(&[], &all).unwrap();
    assert_eq!((s.sched.len(), s.sched_big.len()), (0, 0));
}

#[test]
fn entries_are_in_due_order_across_buckets_and_subscriptions() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
    let keys = [
        (2_500, 2, 1),
        (1_999, 1, 500),
        (2_000, 1, 3),
        (2_000, 2, 0),
        (900, 3, 70),
        (2_999, 1, 64),
    ]
    .map(|(due_ms, sub, id)| ScheduleKey {
        due_ms,
        message: main(sub, id),
    });
    let adds: Vec<_> = keys.iter().map(|k| (*k, true)).collect();
    s.put_schedule(&adds).unwrap();
    let mut want = keys.to_vec();
    want.sort_by_key(ScheduleKey::key);
    assert_eq!(s.scheduled(None, u64::MAX, 100).unwrap(), want);
    assert_eq!(s.scheduled(None, 2_000, 100).unwrap(), want[..2].to_vec());
    assert_eq!(
        s.scheduled(Some(want[1]), 2_600, 2).unwrap(),
        want[2..4].to_vec()
    );
    // Adding an entry that is there keeps its record.
    s.put_held(&[(keys[0], record(2, 2_500))], &[]).unwrap();
    s.put_schedule(&[(keys[0], true)]).unwrap();
    assert_eq!(
        s.failure(keys[0].message, Some(2_500)).unwrap(),
        Some(record(2, 2_500))
    );
    s.put_schedule(&[(keys[0], false)]).unwrap();
    assert_eq!(s.failure(keys[0].message, Some(2_500)).unwrap(), None);
    assert_eq!(s.scheduled(None, u64::MAX, 100).unwrap().len(), 5);
}

#[test]
fn a_store_with_one_schedule_key_per_entry_is_converted_at_open_once() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2 * UPGRADE_ROUND as u64 + 5;
    let mut big = record(64, 7_000);
    for a in &mut big.attempts {
        a.detail = "y".repeat(40);
    }
    // What the previous layout held: one key per entry in `schedule`,
    // a held record as its value, or nothing.
    let legacy: Vec<(ScheduleKey, Option<FailureRecord>)> = (0..n)
        .map(|i| {
            let k = ScheduleKey {
                due_ms: 5_000 + (i % 5) * 700,
                message: if i % 4 == 3 {
                    TierEntry::retry(i).of(2)
                } else {
                    main(1 + i % 2, i)
                },
            };
            let r = match i % 3 {
                0 => None,
                _ if i == 10 => Some(big.clone()),
                _ => Some(record(2, k.due_ms)),
            };
            (k, r)
        })
        .collect();
    let heads_before;
    {
        let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
        for (k, r) in &legacy {
            let body = r.as_ref().map(encode_failures).unwrap_or_default();
            s.schedule.insert(k.key(), seal(&k.key(), &body)).unwrap();
        }
        // Opened with legacy keys written after the open: converted by
        // the next open only. What the per-key layout read gives:
        let mut want: Vec<ScheduleKey> = legacy.iter().map(|(k, _)| *k).collect();
        want.sort_by_key(ScheduleKey::key);
        heads_before = want;
        s.flush_blocking();
    }
    let s = reopen(dir.path());
    assert_eq!(s.schedule.len(), 0, "nothing left in the per-key layout");
    assert!(s.sched.len() < n as usize / 4, "{} chunks", s.sched.len());
    assert_eq!(
        s.scheduled(None, u64::MAX, usize::MAX).unwrap(),
        heads_before
    );
    for (k, r) in &legacy {
        assert_eq!(&s.failure(k.message, Some(k.due_ms)).unwrap(), r, "{k:?}");
    }
    let report = s.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
    assert_eq!(report.scheduled, n);
    let counts = s.counts_by_subscription().unwrap();
    let legacy_of = |sub| {
        legacy
            .iter()
            .filter(|(k, _)| k.message.sub_id == sub)
            .count() as u64
    };
    for sub in 1..=2 {
        assert_eq!(counts[&sub].scheduled, legacy_of(sub));
    }
    // Once: the next open moves nothing.
    drop(s);
    let mut s = reopen(dir.path());
    assert_eq!(s.upgrade_schedule().unwrap(), 0);
    assert_eq!(
        s.scheduled(None, u64::MAX, usize::MAX).unwrap(),
        heads_before
    );
}

#[test]
fn an_upgrade_cut_midway_is_finished_by_the_next_open() {
    // What a kill -9 during an upgrade leaves: entries 0..200 in chunks
    // only (an earlier release's upgrade, whose transactions removed
    // what they added, cut between two of them), 200..300 in both
    // layouts (this one's, cut after writing chunks and before clearing
    // the old keys), 300..700 in the per-key layout only.
    let dir = tempfile::tempdir().unwrap();
    let key = |i: u64| ScheduleKey {
        due_ms: 10_000 + i * 37,
        message: main(1, i),
    };
    {
        let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
        let moved: Vec<_> = (0..300)
            .map(|i| (key(i), record(1, key(i).due_ms)))
            .collect();
        s.put_held(&moved, &[]).unwrap();
        for i in 200..700 {
            let k = key(i);
            let count = if i < 300 { 1 } else { 2 };
            let body = encode_failures(&record(count, k.due_ms));
            s.schedule.insert(k.key(), seal(&k.key(), &body)).unwrap();
        }
        s.flush_blocking();
    }
    let s = reopen(dir.path());
    assert_eq!(s.schedule.len(), 0);
    let want: Vec<ScheduleKey> = (0..700).map(key).collect();
    assert_eq!(s.scheduled(None, u64::MAX, usize::MAX).unwrap(), want);
    for i in 0..700 {
        let count = if i < 300 { 1 } else { 2 };
        let k = key(i);
        assert_eq!(
            s.failure(k.message, Some(k.due_ms)).unwrap(),
            Some(record(count, k.due_ms))
        );
    }
    assert_eq!(s.counts_by_subscription().unwrap()[&1].scheduled, 700);
}

#[test]
fn a_damaged_chunk_is_reported_by_the_verify_pass_and_refused_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
    let k = ScheduleKey {
        due_ms: 3_000,
        message: main(1, 5),
    };
    s.put_held(&[(k, record(1, 3_000))], &[]).unwrap();
    let ck = chunk_key(&k);
    let mut v = s.sched.get(ck).unwrap().unwrap().to_vec();
    v[9] ^= 0x01;
    s.sched.insert(ck, v).unwrap();
    assert!(s.failure(k.message, Some(3_000)).is_err());
    assert!(s.scheduled(None, u64::MAX, 10).is_err());
    let report = s.verify();
    assert_eq!(report.problem_count, 1, "{:?}", report.problems);
}

/// Chunks stored with the fixed 33-byte item headers (`CHUNK_V1`, every
/// store written before the varint layout) read as before, through every
/// reader and after a reopen, and a chunk changed later is written in the
/// new layout beside the old ones.
#[test]
fn chunks_with_fixed_headers_read_as_before_and_are_rewritten_compact() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
    let held: Vec<(ScheduleKey, FailureRecord)> = (0..300u64)
        .map(|i| {
            let due_ms = 10_000 + i * 7;
            let k = ScheduleKey {
                due_ms,
                message: main(1 + i % 2, i),
            };
            (k, record(1 + (i % 3) as u32, due_ms))
        })
        .collect();
    s.put_held(&held, &[]).unwrap();
    let mut big = record(64, 10_000);
    for a in &mut big.attempts {
        a.detail = "x".repeat(40);
    }
    let bk = ScheduleKey {
        due_ms: 10_000,
        message: main(1, 999),
    };
    s.put_held(&[(bk, big.clone())], &[]).unwrap();
    let bare = ScheduleKey {
        due_ms: 12_345,
        message: main(3, 5),
    };
    s.put_schedule(&[(bare, true)]).unwrap();
    let reads = |s: &SledStorage| {
        let due = s.scheduled(None, u64::MAX, 10_000).unwrap();
        let records: Vec<Option<FailureRecord>> = due
            .iter()
            .map(|k| s.failure(k.message, Some(k.due_ms)).unwrap())
            .collect();
        let report = s.verify();
        assert_eq!(report.problem_count, 0, "{:?}", report.problems);
        (due, records)
    };
    let want = reads(&s);
    assert_eq!(want.0.len(), 302);
    let stored = |s: &SledStorage| -> Vec<(sled::IVec, sled::IVec)> {
        s.sched.iter().map(|kv| kv.unwrap()).collect()
    };
    let compact: usize = stored(&s).iter().map(|(_, v)| v.len()).sum();
    // The store as it was written before: every chunk in the old layout.
    for (k, v) in stored(&s) {
        let chunk = read_chunk(&k, &v).unwrap();
        s.sched.insert(&k, seal(&k, &chunk.encode_v1())).unwrap();
    }
    let old: usize = stored(&s).iter().map(|(_, v)| v.len()).sum();
    assert!(old > compact + 300 * 20, "{old} B old against {compact} B");
    assert_eq!(reads(&s), want);
    drop(s);
    let s = reopen(dir.path());
    assert_eq!(reads(&s), want);
    // One more entry: its chunk is written anew, in the new layout, and
    // holds the old entries beside it.
    let extra = ScheduleKey {
        due_ms: 10_001,
        message: main(1, 998),
    };
    s.put_held(&[(extra, record(1, 10_001))], &[]).unwrap();
    let layouts: Vec<(u8, bool)> = stored(&s)
        .iter()
        .map(|(k, v)| {
            (
                unseal(k, v).unwrap()[0],
                k.as_ref() == &chunk_key(&extra)[..],
            )
        })
        .collect();
    assert!(layouts.contains(&(CHUNK_V2, true)), "{layouts:?}");
    assert!(layouts.contains(&(CHUNK_V1, false)), "{layouts:?}");
    let (mut due, mut records) = want;
    let at = due.iter().position(|k| k.key() > extra.key()).unwrap();
    due.insert(at, extra);
    records.insert(at, Some(record(1, 10_001)));
    assert_eq!(reads(&s), (due, records));
}

/// A chunk of parked retries (consecutive ids, due a few ms apart) spends
/// a few bytes per entry besides its record, not 33.
#[test]
fn a_chunk_of_parked_retries_has_small_item_headers() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
    let now = 1_765_000_000_000u64;
    let held: Vec<(ScheduleKey, FailureRecord)> = (0..CHUNK_ENTRIES)
        .map(|i| {
            let k = ScheduleKey {
                due_ms: now + 3_600_000 + i / 8,
                message: main(1, 64 + i),
            };
            (k, record(1, 0))
        })
        .collect();
    s.put_held(&held, &[]).unwrap();
    let stored: Vec<usize> = s.sched.iter().map(|kv| kv.unwrap().1.len()).collect();
    assert_eq!(stored.len(), 1);
    let records: usize = held.iter().map(|(_, r)| encode_failures(r).len()).sum();
    let per_item = (stored[0] - 5 - 5 - records) as f64 / CHUNK_ENTRIES as f64;
    assert!(per_item < 10.0, "{per_item:.1} B of header per item");
}
