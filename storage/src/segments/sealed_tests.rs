//! Sealed segments checked whole against the CRC recorded at their seal
//! ([`super::sealed`]): the check reads each sealed file once without
//! checking its records one by one, refuses any flipped byte with the
//! error the per-record check gives, and segments without a sum (sealed
//! by an older broker) or with a damaged one are checked record by record.

use super::*;

fn settings() -> LogSettings {
    LogSettings {
        segment_entries: 100,
        max_bytes: 64 << 20,
        max_age: Duration::from_secs(3600),
    }
}

const T: &str = "persistent://public/default/sealed";

/// A log of three sealed segments (0, 100, 200) of 10 records each and an
/// active one (300) of 4 records; the path of its topic directory.
fn four_segments() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    for first in (0..340).step_by(10) {
        let batch: Vec<Vec<u8>> = (first..first + 10).map(entry).collect();
        log.append(T, first, &batch).unwrap();
    }
    log.sync().unwrap();
    assert_eq!(log.segment_starts(T), vec![0, 100, 200, 300]);
    let topic_dir = dir.path().join(DIR_NAME).join(dir_name(T));
    (dir, topic_dir)
}

/// Entry `i`'s bytes (100 of them: a sealed segment spans 3 points of
/// the sparse index).
fn entry(i: u64) -> Vec<u8> {
    format!("entry {i:>3} of the sealed test {}", "x".repeat(70)).into_bytes()
}

fn flip(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x10;
    std::fs::write(path, &bytes).unwrap();
}

fn seg(topic_dir: &Path, first: u64) -> PathBuf {
    topic_dir.join(segment::file_name(first))
}

fn refused(dir: &Path) -> String {
    match SegmentLog::open(dir, settings(), true) {
        Err(StorageError::Corrupt(m)) => m,
        Err(e) => panic!("refused, but not as corrupt: {e}"),
        Ok(_) => panic!("a damaged store was opened"),
    }
}

#[test]
fn sealed_segments_are_checked_whole_and_only_the_active_ones_records_one_by_one() {
    let (dir, topic_dir) = four_segments();
    for first in [0, 100, 200] {
        let sum = sealed::read(&seg(&topic_dir, first)).unwrap().unwrap();
        let bytes = std::fs::read(seg(&topic_dir, first)).unwrap();
        assert_eq!(sum.len, bytes.len() as u64);
        assert_eq!(sum.crc, crc32c::crc32c(&bytes), "segment {first}");
    }
    assert!(!sealed::path_of(&seg(&topic_dir, 300)).exists());
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    // The active segment's 4 records; the 30 sealed ones not one by one.
    assert_eq!(log.records_checked_at_open(), 4);
    // What the whole-file open found serves as the per-record one did.
    assert_eq!(log.range(T), Some((0, 340)));
    assert_eq!(log.entries(), 340);
    let got = log.read(T, 95, 10, usize::MAX).unwrap();
    assert_eq!(got.first().unwrap().0, 95);
    assert_eq!(got.last().unwrap().0, 104);
    assert_eq!(got[0].1, entry(95));
    let many = log.read_many(T, &[7, 150, 299]).unwrap();
    assert_eq!(many[1], Some(entry(150)));
    // And the log keeps appending and rolling after it.
    log.append(T, 400, &[b"next".to_vec()]).unwrap();
    assert!(sealed::read(&seg(&topic_dir, 300)).unwrap().is_some());
}

#[test]
fn a_flipped_byte_in_a_sealed_segments_middle_is_refused_as_before() {
    let (dir, topic_dir) = four_segments();
    let path = seg(&topic_dir, 100);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    flip(&path, len / 2);
    let m = refused(dir.path());
    // The per-record check's error, with the offset of the damaged record.
    assert!(m.contains("sealed segment 100 is damaged at offset"), "{m}");
}

#[test]
fn a_flipped_byte_no_record_covers_is_refused_through_the_whole_file_sum() {
    // The file header's last 4 bytes are padding: neither the header's CRC
    // nor any record's covers them, only the whole-file sum does.
    let (dir, topic_dir) = four_segments();
    flip(&seg(&topic_dir, 0), 45);
    let m = refused(dir.path());
    assert!(m.contains("segment 0: not the file that was sealed"), "{m}");
}

#[test]
fn a_segment_sealed_without_a_sum_is_still_checked_record_by_record() {
    let (dir, topic_dir) = four_segments();
    // As an older broker sealed it: no sidecar.
    std::fs::remove_file(sealed::path_of(&seg(&topic_dir, 200))).unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert_eq!(log.records_checked_at_open(), 10 + 4);
    assert_eq!(log.range(T), Some((0, 340)));
    drop(log);
    // Its sum was recorded once that check passed: the next start checks
    // it whole.
    let bytes = std::fs::read(seg(&topic_dir, 200)).unwrap();
    let sum = sealed::read(&seg(&topic_dir, 200)).unwrap().unwrap();
    assert_eq!(
        (sum.len, sum.crc),
        (bytes.len() as u64, crc32c::crc32c(&bytes))
    );
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert_eq!(log.records_checked_at_open(), 4);
    drop(log);
    // A read-only open (`check`) records nothing.
    std::fs::remove_file(sealed::path_of(&seg(&topic_dir, 200))).unwrap();
    let log = SegmentLog::open(dir.path(), settings(), false).unwrap();
    assert_eq!(log.records_checked_at_open(), 10 + 4);
    drop(log);
    assert!(!sealed::path_of(&seg(&topic_dir, 200)).exists());
    // Damage in it is refused by that check.
    let path = seg(&topic_dir, 200);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    flip(&path, len - 3);
    let m = refused(dir.path());
    assert!(m.contains("sealed segment 200 is damaged at offset"), "{m}");
}

#[test]
fn a_damaged_sum_falls_back_to_the_per_record_check() {
    let (dir, topic_dir) = four_segments();
    let sum = sealed::path_of(&seg(&topic_dir, 0));
    flip(&sum, 17);
    let log = SegmentLog::open(dir.path(), settings(), false).unwrap();
    assert_eq!(log.records_checked_at_open(), 10 + 4);
    drop(log);
    // And a damaged record beside it is still refused.
    flip(&seg(&topic_dir, 0), 60);
    let m = refused(dir.path());
    assert!(m.contains("sealed segment 0 is damaged at offset"), "{m}");
}

#[test]
fn a_sum_left_beside_the_active_segment_is_removed_never_trusted() {
    let (dir, topic_dir) = four_segments();
    // A crash after the sum was written but before the next segment was
    // created leaves it beside the last segment, which then grows.
    let active = seg(&topic_dir, 300);
    std::fs::copy(
        sealed::path_of(&seg(&topic_dir, 200)),
        sealed::path_of(&active),
    )
    .unwrap();
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert!(!sealed::path_of(&active).exists());
    assert_eq!(log.range(T), Some((0, 340)));
    // A trim deletes sums with their segments.
    log.trim(T, 200).unwrap();
    log.finish_trims().unwrap();
    assert!(!seg(&topic_dir, 0).exists());
    assert!(!sealed::path_of(&seg(&topic_dir, 0)).exists());
    assert!(!sealed::path_of(&seg(&topic_dir, 100)).exists());
    assert!(sealed::path_of(&seg(&topic_dir, 200)).exists());
}

#[test]
fn a_sealed_file_cut_or_grown_is_refused() {
    let (dir, topic_dir) = four_segments();
    let path = seg(&topic_dir, 100);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0u8; 7]);
    std::fs::write(&path, &bytes).unwrap();
    let m = refused(dir.path());
    assert!(m.contains("sealed segment 100 is damaged at offset"), "{m}");
}

#[test]
fn the_whole_file_pass_finds_the_same_records_whatever_its_read_size() {
    let (dir, topic_dir) = four_segments();
    let by_record = |first| {
        Segment::open(&seg(&topic_dir, first), first, false)
            .unwrap()
            .0
    };
    for size in [1, 5, 24, 37, 48, 49, 997, 4 << 20] {
        sealed::READ_SIZE.with(|s| s.set(size));
        for first in [0, 100, 200] {
            let path = seg(&topic_dir, first);
            let sum = sealed::read(&path).unwrap().unwrap();
            let whole = sealed::open(&path, first, false, sum)
                .unwrap_or_else(|r| panic!("read size {size}, segment {first}: {r:?}"));
            let want = by_record(first);
            assert_eq!(
                (
                    whole.len,
                    whole.next,
                    whole.first_entry,
                    whole.entries,
                    whole.crc
                ),
                (
                    want.len,
                    want.next,
                    want.first_entry,
                    want.entries,
                    want.crc
                ),
                "read size {size}"
            );
            assert!(whole.offset_for(first + 99) > whole.offset_for(first + 40));
            for id in [first, first + 13, first + 57, first + 99] {
                assert_eq!(
                    whole.offset_for(id),
                    want.offset_for(id),
                    "read size {size}"
                );
            }
        }
        // A flipped byte is found at any read size.
        let path = seg(&topic_dir, 100);
        flip(&path, 1000);
        let sum = sealed::read(&path).unwrap().unwrap();
        assert!(matches!(
            sealed::open(&path, 100, false, sum),
            Err(sealed::Refused::Mismatch(_))
        ));
        flip(&path, 1000);
    }
    sealed::READ_SIZE.with(|s| s.set(4 << 20));
    drop(dir);
}

#[test]
fn one_read_buffer_serves_every_sealed_segment_of_an_open_and_is_freed_after() {
    let (dir, topic_dir) = four_segments();
    sealed::BUFFERS_MADE.with(|n| n.set(0));
    let log = SegmentLog::open(dir.path(), settings(), true).unwrap();
    assert_eq!(
        log.records_checked_at_open(),
        4,
        "three sealed segments checked whole"
    );
    // The three sealed files are of one size: one buffer for all three.
    assert_eq!(sealed::BUFFERS_MADE.with(|n| n.get()), 1);
    // Freed once the log is open: the next pass makes one again.
    let path = seg(&topic_dir, 100);
    let sum = sealed::read(&path).unwrap().unwrap();
    sealed::open(&path, 100, false, sum).unwrap();
    assert_eq!(sealed::BUFFERS_MADE.with(|n| n.get()), 2);
}
