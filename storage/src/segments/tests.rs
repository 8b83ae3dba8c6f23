//! The segment-file log on its own: appends, reads from any id, rolls,
//! trims, torn tails cut at open, damage refused.

use super::*;

fn settings() -> LogSettings {
    LogSettings {
        segment_entries: 10,
        max_bytes: 64 << 20,
        max_age: Duration::from_secs(3600),
    }
}

const T: &str = "persistent://public/default/t";

fn batch(first: u64, n: u64) -> Vec<Vec<u8>> {
    (first..first + n)
        .map(|i| format!("e{i}").into_bytes())
        .collect()
}

fn ids(got: &[(u64, Vec<u8>)]) -> Vec<u64> {
    got.iter().map(|(i, _)| *i).collect()
}

#[test]
fn appends_read_back_from_any_id_across_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    for first in (0..45).step_by(3) {
        log.append(T, first, &batch(first, 3)).unwrap();
    }
    // A batch starting in the next block of 10 ids opens a segment.
    assert_eq!(log.segment_starts(T), vec![0, 12, 21, 30, 42]);
    assert_eq!(log.range(T), Some((0, 45)));
    let got = log.read(T, 7, 8, usize::MAX).unwrap();
    assert_eq!(ids(&got), (7..15).collect::<Vec<_>>());
    assert_eq!(got[0].1, b"e7");
    assert_eq!(log.read(T, 44, 10, usize::MAX).unwrap().len(), 1);
    assert!(log.read(T, 45, 10, usize::MAX).unwrap().is_empty());
    // max_bytes stops after the entry that reaches it.
    assert_eq!(log.read(T, 0, 100, 5).unwrap().len(), 3);
    let many = log.read_many(T, &[44, 3, 3, 99, 13]).unwrap();
    assert_eq!(many[0].as_deref(), Some(&b"e44"[..]));
    assert_eq!(many[1], many[2]);
    assert_eq!(many[3], None);
    assert_eq!(many[4].as_deref(), Some(&b"e13"[..]));
    // Reopened, the same.
    drop(log);
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert!(log.torn.is_empty());
    assert_eq!(log.range(T), Some((0, 45)));
    assert_eq!(
        ids(&log.read(T, 20, 3, usize::MAX).unwrap()),
        vec![20, 21, 22]
    );
}

#[test]
fn a_size_roll_and_gaps_keep_ids() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogSettings {
        segment_entries: 1 << 40,
        max_bytes: 4096,
        ..settings()
    };
    let log = SegmentLog::open(dir.path(), s, true).unwrap();
    let big = vec![vec![7u8; 3000]];
    log.append(T, 0, &big).unwrap();
    log.append(T, 1, &big).unwrap();
    log.append(T, 5, &big).unwrap(); // a gap (ids skipped after a crash)
    // A record is some 3 KiB: the second fills the first segment past 4 KiB.
    assert_eq!(log.segment_starts(T), vec![0, 5]);
    assert_eq!(ids(&log.read(T, 2, 10, usize::MAX).unwrap()), vec![5]);
    assert!(log.append(T, 3, &big).is_err(), "below the end");
    drop(log);
    let log = SegmentLog::open(dir.path(), s, true).unwrap();
    assert_eq!(log.range(T), Some((0, 6)));
}

#[test]
fn trim_deletes_whole_sealed_files_and_never_the_active_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    for first in (0..30).step_by(5) {
        log.append(T, first, &batch(first, 5)).unwrap();
    }
    assert_eq!(log.segment_starts(T), vec![0, 10, 20]);
    log.trim(T, 15).unwrap();
    assert_eq!(log.segment_starts(T), vec![10, 20]);
    assert_eq!(log.range(T), Some((10, 30)), "no longer served");
    assert!(
        log.segment_path(T, 0).exists(),
        "on disk until the trims finish"
    );
    log.finish_trims().unwrap();
    assert!(!log.segment_path(T, 0).exists(), "the file is gone");
    log.trim(T, 1000).unwrap();
    log.finish_trims().unwrap();
    assert_eq!(log.segment_starts(T), vec![20], "the active segment stays");
    assert_eq!(log.range(T), Some((20, 30)));
    drop(log);
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert_eq!(log.range(T), Some((20, 30)));
    log.delete_topic(T).unwrap();
    assert_eq!(log.range(T), None);
    assert!(!dir.path().join(DIR_NAME).join(dir_name(T)).exists());
}

fn three_segments() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    for first in (0..30).step_by(5) {
        log.append(T, first, &batch(first, 5)).unwrap();
    }
    log.sync().unwrap();
    let last = log.segment_path(T, 20);
    (dir, last)
}

#[test]
fn a_torn_or_zeroed_tail_is_cut_and_reported_never_served() {
    for tail in [&b"\x42\x52\x43\x52partial"[..], &[0u8; 100][..]] {
        let (dir, last) = three_segments();
        let whole = std::fs::metadata(&last).unwrap().len();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&last)
            .unwrap();
        std::io::Write::write_all(&mut f, tail).unwrap();
        drop(f);
        let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
        assert_eq!(log.torn.len(), 1, "{:?}", log.torn);
        assert_eq!(log.range(T), Some((0, 30)));
        assert_eq!(log.read(T, 25, 100, usize::MAX).unwrap().len(), 5);
        assert!(
            std::fs::metadata(&last).unwrap().len() > whole,
            "not cut yet"
        );
        // The first append cuts it (here, then seals it: ids 30.. roll).
        log.append(T, 30, &batch(30, 2)).unwrap();
        assert_eq!(std::fs::metadata(&last).unwrap().len(), whole, "cut back");
        drop(log);
        let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
        assert!(log.torn.is_empty());
        assert_eq!(log.range(T), Some((0, 32)));
    }
}

#[test]
fn a_half_written_last_record_is_cut_with_its_batch_whole_or_absent() {
    let (dir, last) = three_segments();
    let len = std::fs::metadata(&last).unwrap().len();
    // The last record (ids 25..30) loses its last 3 bytes.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert_eq!(log.range(T), Some((0, 25)), "the whole batch is gone");
    assert_eq!(log.torn.len(), 1);
}

#[test]
fn damage_before_the_last_record_of_the_active_segment_is_refused_not_cut() {
    let (dir, last) = three_segments();
    let mut bytes = std::fs::read(&last).unwrap();
    // Inside the first record (ids 20..25); the second (25..30) is whole.
    bytes[record::FILE_HEADER_LEN as usize + 30] ^= 0x01;
    std::fs::write(&last, &bytes).unwrap();
    let err = SegmentLog::open(dir.path(), settings(), true).unwrap_err();
    assert!(
        matches!(err, StorageError::Corrupt(ref m) if m.contains("before a whole record")),
        "{err}"
    );
    assert_eq!(std::fs::read(&last).unwrap(), bytes, "nothing cut");
}

#[test]
fn damage_in_a_sealed_segment_or_a_missing_one_is_refused() {
    // A flipped bit inside a sealed segment.
    let (dir, _) = three_segments();
    let sealed = dir
        .path()
        .join(DIR_NAME)
        .join(dir_name(T))
        .join(segment::file_name(10));
    let mut bytes = std::fs::read(&sealed).unwrap();
    let at = bytes.len() - 2;
    bytes[at] ^= 0x20;
    std::fs::write(&sealed, &bytes).unwrap();
    let err = SegmentLog::open(dir.path(), settings(), true).unwrap_err();
    assert!(
        matches!(err, StorageError::Corrupt(ref m) if m.contains("sealed segment 10")),
        "{err}"
    );
    // The middle segment deleted, then the first.
    assert_refused_without(10, "missing");
    assert_refused_without(0, "first segment (0) is missing");
}

/// Opening the three-segment log with segment `first_id` deleted is refused
/// as corrupt, saying `why`.
fn assert_refused_without(first_id: u64, why: &str) {
    let (dir, _) = three_segments();
    std::fs::remove_file(
        dir.path()
            .join(DIR_NAME)
            .join(dir_name(T))
            .join(segment::file_name(first_id)),
    )
    .unwrap();
    let err = SegmentLog::open(dir.path(), settings(), true).unwrap_err();
    assert!(
        matches!(err, StorageError::Corrupt(ref m) if m.contains(why)),
        "{err}"
    );
}

#[test]
fn topic_names_round_trip_through_directory_names() {
    for name in [T, "persistent://a/b/c%d~e f", "x.upgrading"] {
        let d = dir_name(name);
        assert!(!d.contains('/') && !d.contains('~'));
        assert_eq!(topic_of(&d).as_deref(), Some(name));
    }
}

#[test]
fn an_idle_segment_past_its_age_is_sealed_and_a_local_copy_goes_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogSettings {
        max_age: Duration::from_millis(1),
        ..settings()
    };
    let log = SegmentLog::open(dir.path(), s, true).unwrap();
    assert_eq!(log.seal_idle(|_| false).unwrap(), 0);
    log.append(T, 0, &batch(0, 3)).unwrap();
    // Younger than the age asked: not sealed.
    assert!(!log.seal_active(T, Some(Duration::from_secs(3600))).unwrap());
    std::thread::sleep(Duration::from_millis(5));
    // A topic skipped (a replicated one) is not sealed, but is due.
    assert_eq!(log.age_due(T), Some(3));
    assert_eq!(log.seal_idle(|t| t == T).unwrap(), 0);
    assert_eq!(log.seal_idle(|_| false).unwrap(), 1);
    assert_eq!(log.age_due(T), None);
    assert_eq!(log.segment_starts(T), vec![0, 3]);
    // The new active segment holds nothing: a second pass seals nothing.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(log.seal_idle(|_| false).unwrap(), 0);
    log.append(T, 3, &batch(3, 2)).unwrap();
    assert_eq!(log.segment_starts(T), vec![0, 3]);
    let infos = log.segment_infos(T);
    assert_eq!(
        infos.iter().map(|i| i.active).collect::<Vec<_>>(),
        vec![false, true]
    );
    // Only the oldest segment, never the active one, may go.
    assert!(!log.drop_local(T, 3).unwrap());
    assert!(log.drop_local(T, 0).unwrap());
    assert!(!log.drop_local(T, 3).unwrap());
    assert_eq!(log.range(T), Some((3, 5)));
    log.finish_trims().unwrap();
    drop(log);
    // Reopened: the start file names the kept segment, the file is gone.
    let log = SegmentLog::open(dir.path(), s, true).unwrap();
    assert_eq!(log.segment_starts(T), vec![3]);
    assert!(!log.segment_path(T, 0).exists());
    assert_eq!(ids(&log.read(T, 0, 10, usize::MAX).unwrap()), vec![3, 4]);
}

/// A replicated topic's appends roll its segment by id block and size
/// only, never by age (an ordinary topic's roll by age too); its age roll
/// is the group's seal below where the leader's log ended, which seals
/// once: applied again after the log moved on (a restart's replay), it
/// seals nothing.
#[test]
fn a_replicated_topic_rolls_by_block_and_size_and_by_the_groups_seal_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = LogSettings {
        max_age: Duration::from_millis(1),
        max_bytes: 4096,
        ..settings()
    };
    let log = SegmentLog::open(dir.path(), s, true).unwrap();
    const U: &str = "persistent://public/default/ordinary";
    log.append_replicated(T, 0, &batch(0, 2)).unwrap();
    log.append(U, 0, &batch(0, 2)).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    log.append_replicated(T, 2, &batch(2, 2)).unwrap();
    log.append(U, 2, &batch(2, 2)).unwrap();
    assert_eq!(log.segment_starts(T), vec![0], "no age roll at an append");
    assert_eq!(log.segment_starts(U), vec![0, 2], "an ordinary topic's");
    // Past its age, busy or not: due for the group's seal, at its end.
    assert_eq!(log.age_due(T), Some(4));
    assert!(log.seal_below(T, 4).unwrap());
    assert_eq!(log.segment_starts(T), vec![0, 4]);
    log.append_replicated(T, 4, &batch(4, 3)).unwrap();
    // The same seal again (a replay): [4,7) holds nothing below 4.
    assert!(!log.seal_below(T, 4).unwrap());
    // A seal proposed when the leader's log ended at 7 seals [4,7) even
    // if more entries came before it was applied.
    log.append_replicated(T, 7, &[vec![b'x'; 5000]]).unwrap();
    assert!(log.seal_below(T, 7).unwrap());
    assert_eq!(log.segment_starts(T), vec![0, 4, 8]);
    // By size: a segment holding `max_bytes` rolls at the next append,
    // inside its block of ids.
    log.append_replicated(T, 8, &[vec![b'y'; 5000]]).unwrap();
    log.append_replicated(T, 9, &batch(9, 1)).unwrap();
    assert_eq!(log.segment_starts(T), vec![0, 4, 8, 9]);
    assert_eq!(
        ids(&log.read(T, 0, 20, usize::MAX).unwrap()),
        (0..10).collect::<Vec<_>>()
    );
}

#[test]
fn lookups_skip_whole_records_by_header_and_still_refuse_a_damaged_target() {
    let dir = tempfile::tempdir().unwrap();
    let roomy = LogSettings {
        segment_entries: 10_000,
        ..settings()
    };
    let log = SegmentLog::open(dir.path(), roomy, true).unwrap();
    // 300 one-entry records of ~100 B: several records per index point.
    let entry = |i: u64| format!("{i:0>100}").into_bytes();
    for i in 0..300 {
        log.append(T, i, &[entry(i)]).unwrap();
    }
    log.sync().unwrap();
    let wanted: Vec<u64> = (0..300).rev().step_by(7).collect();
    let got = log.read_many(T, &wanted).unwrap();
    for (id, e) in wanted.iter().zip(&got) {
        assert_eq!(e.as_deref(), Some(entry(*id).as_slice()), "entry {id}");
    }
    // The body of entry 150's record damaged under the open log (opening
    // would refuse it): a lookup of 150 is refused, one of 151 (its record
    // follows, skipped by the header) is served.
    let file = dir
        .path()
        .join(DIR_NAME)
        .join(dir_name(T))
        .join(segment::file_name(0));
    let mut bytes = std::fs::read(&file).unwrap();
    let needle = entry(150);
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap();
    bytes[at + 50] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let err = log.read_many(T, &[150]).unwrap_err();
    assert!(
        matches!(err, StorageError::Corrupt(ref m) if m.contains("checksum")),
        "{err}"
    );
    assert_eq!(
        log.read_many(T, &[151]).unwrap()[0].as_deref(),
        Some(entry(151).as_slice())
    );
}

#[test]
fn a_trim_made_while_a_flush_runs_waits_for_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    for first in (0..30).step_by(5) {
        log.append(T, first, &batch(first, 5)).unwrap();
    }
    // A flush starts (takes its mark), then a trim is made: the flush did
    // not make what allowed that trim durable, so its files stay.
    let flush = log.trim_mark();
    log.trim(T, 15).unwrap();
    log.finish_trims_before(flush).unwrap();
    assert!(log.segment_path(T, 0).exists(), "kept until a later flush");
    assert_eq!(log.range(T), Some((10, 30)), "no longer served");
    let next = log.trim_mark();
    log.finish_trims_before(next).unwrap();
    assert!(
        !log.segment_path(T, 0).exists(),
        "gone after the next flush"
    );
}

#[test]
fn a_failed_sync_keeps_its_files_dirty_and_refuses_later_syncs_and_appends() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    log.append(T, 0, &batch(0, 5)).unwrap();
    log.append("persistent://public/default/u", 0, &batch(0, 5))
        .unwrap();
    assert_eq!(crate::util::lock(&log.dirty).len(), 2);
    log.fail_next_sync
        .store(true, std::sync::atomic::Ordering::Release);
    let e = log.sync().unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert_eq!(
        crate::util::lock(&log.dirty).len(),
        2,
        "neither file is reported synced"
    );
    assert!(log.failed().is_some());
    // The injection is spent: a sync that would now succeed still fails.
    let e = log.sync().unwrap_err();
    assert!(e.to_string().contains("failed earlier"), "{e}");
    let e = log.append(T, 5, &batch(5, 5)).unwrap_err();
    assert!(e.to_string().contains("failed earlier"), "{e}");
    assert_eq!(
        log.range(T),
        Some((0, 5)),
        "the refused append wrote nothing"
    );
}
