//! [`LogStorage::open_beside`]: the segment-file log is opened (every
//! segment read and checked) on a thread of its own while sled opens, and
//! its checks still refuse a damaged store.

use super::*;
use prost::Message as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: &str = "persistent://public/default/beside";

fn settings() -> segments::LogSettings {
    segments::LogSettings {
        segment_entries: 16,
        max_bytes: 64 << 20,
        max_age: Duration::from_secs(3600),
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// `open_beside` with sled opened by `before_sled` then
/// [`crate::sled_store::reopen_waiting`].
fn open_beside(
    dir: &Path,
    before_sled: impl FnOnce(),
) -> std::result::Result<LogStorage, StorageError> {
    block_on(LogStorage::open_beside(
        || {
            before_sled();
            Ok(Arc::new(crate::sled_store::reopen_waiting(dir, 16)))
        },
        dir,
        settings(),
        None,
    ))
}

/// A topic of 40 entries in three segments (two sealed), flushed.
fn write_three_segments(dir: &Path) {
    let s = open_beside(dir, || {}).unwrap();
    s.put_topic(&TopicRecord {
        name: T.into(),
        created_ms: 0,
        kind: TopicKind::Normal,
        replicas: 1,
        trimmed_below: 0,
    })
    .unwrap();
    for first in [0u64, 16, 32] {
        let n = if first == 32 { 8 } else { 16 };
        let entries: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                ricochet_proto::Message {
                    payload: vec![b'x'; 20 + i as usize],
                    ..Default::default()
                }
                .encode_to_vec()
            })
            .collect();
        s.append(T, first, &entries, None).unwrap();
    }
    block_on(s.flush()).unwrap();
}

#[test]
fn the_log_is_opened_while_sled_opens() {
    let dir = tempfile::tempdir().unwrap();
    write_three_segments(dir.path());
    // A topic deletion a crash interrupted: the log's open finishes it
    // (removes the directory), which sled's open can watch for.
    let gone = dir.path().join(segments::DIR_NAME).join("old~deleted");
    std::fs::create_dir_all(&gone).unwrap();
    let mut seen_before_sled = false;
    let s = open_beside(dir.path(), || {
        let until = Instant::now() + Duration::from_secs(20);
        while gone.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        seen_before_sled = !gone.exists();
    })
    .unwrap();
    assert!(
        seen_before_sled,
        "the log was not opened until sled's open had ended"
    );
    let got = s.read(T, 0, 100, usize::MAX).unwrap();
    assert_eq!(got.len(), 40);
    let last = ricochet_proto::Message::decode(got[39].1.as_slice()).unwrap();
    assert_eq!(last.payload.len(), 27);
}

#[test]
fn a_damaged_sealed_segment_still_refuses_the_store() {
    let dir = tempfile::tempdir().unwrap();
    write_three_segments(dir.path());
    let sealed = dir
        .path()
        .join(segments::DIR_NAME)
        .join(segments::dir_name(T))
        .join(segments::segment::file_name(0));
    let mut bytes = std::fs::read(&sealed).unwrap();
    let at = bytes.len() - 2;
    bytes[at] ^= 0x20;
    std::fs::write(&sealed, &bytes).unwrap();
    let mut sled_opened = false;
    let err = open_beside(dir.path(), || sled_opened = true).unwrap_err();
    assert!(
        matches!(err, StorageError::Corrupt(ref m) if m.contains("sealed segment 0")),
        "{err}"
    );
    assert!(sled_opened);
    // And the store opens again once the damage is gone (sled's lock was let go).
    bytes[at] ^= 0x20;
    std::fs::write(&sealed, &bytes).unwrap();
    assert_eq!(
        open_beside(dir.path(), || {})
            .unwrap()
            .read(T, 0, 100, usize::MAX)
            .unwrap()
            .len(),
        40
    );
}
