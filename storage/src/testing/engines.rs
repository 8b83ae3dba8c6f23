//! The engines the [`contract`](super::contract) suite runs against: how to
//! open a store of each (sled, memory, the segment-file log), and what each
//! says about itself (persistence, manifest file, segments, integrity check).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::contract::TOPIC;
use crate::*;

/// How long a reopen waits for the lock of the store just dropped
/// ([`SledStorage::open_waiting`]).
pub const REOPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An engine under test: how to open a store of it.
pub trait Engine {
    /// Opens the engine's store in `dir` (an empty directory the first time;
    /// the same directory again to reopen it, after the previous store was
    /// dropped).
    fn open(&self, dir: &Path) -> Box<dyn Storage>;

    /// Whether a reopened store keeps what was flushed (false for an
    /// in-memory engine, whose reopened store is empty).
    fn persistent(&self) -> bool {
        true
    }

    /// Where the store in `dir` keeps its manifest file, for the check that
    /// a damaged one is refused (`None`: not in a file).
    fn manifest_file(&self, dir: &Path) -> Option<PathBuf> {
        self.persistent().then(|| dir.join(manifest::FILE_NAME))
    }

    /// The segment numbers the inventory lists for [`TOPIC`] after one
    /// batch of 40 entries (ids 0..40) into a fresh store; `None` checks
    /// only that they ascend.
    fn segments_of_one_batch(&self) -> Option<Vec<u64>> {
        None
    }

    /// How many problems the engine's own integrity check finds in the
    /// (closed) store in `dir`; `None` when it has no such check.
    fn verify(&self, _dir: &Path) -> Option<u64> {
        None
    }
}

/// The sled engine (`log_engine = "sled"`), 16 entries per segment.
#[derive(Debug, Default, Clone, Copy)]
pub struct SledEngine;

impl Engine for SledEngine {
    fn open(&self, dir: &Path) -> Box<dyn Storage> {
        Box::new(SledStorage::open_waiting(dir, 16, 8 << 20, REOPEN_WAIT).expect("open sled"))
    }

    fn segments_of_one_batch(&self) -> Option<Vec<u64>> {
        // 16 entries per segment.
        Some(vec![0, 1, 2])
    }

    fn verify(&self, dir: &Path) -> Option<u64> {
        let s = SledStorage::open_waiting(dir, 16, 8 << 20, REOPEN_WAIT).expect("reopen sled");
        Some(s.verify().problem_count)
    }
}

/// The in-memory engine.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryEngine;

impl Engine for MemoryEngine {
    fn open(&self, _dir: &Path) -> Box<dyn Storage> {
        Box::new(MemoryStorage::new())
    }

    fn persistent(&self) -> bool {
        false
    }

    fn segments_of_one_batch(&self) -> Option<Vec<u64>> {
        Some(Vec::new())
    }
}

/// The production engine: [`TOPIC`]'s entries in segment files of 16
/// entries, everything else in sled.
#[derive(Debug, Default, Clone, Copy)]
pub struct SegmentsEngine;

impl Engine for SegmentsEngine {
    fn open(&self, dir: &Path) -> Box<dyn Storage> {
        let settings = segments::LogSettings {
            segment_entries: 16,
            max_bytes: 64 << 20,
            max_age: std::time::Duration::from_secs(3600),
        };
        let log = LogStorage::with(
            Arc::new(SledStorage::open_waiting(dir, 16, 8 << 20, REOPEN_WAIT).expect("open sled")),
            segments::SegmentLog::open(dir, settings, true).expect("open the log"),
        )
        .expect("open the engine");
        log.route_to_log(TOPIC);
        Box::new(log)
    }

    fn segments_of_one_batch(&self) -> Option<Vec<u64>> {
        // One batch is one record in one segment file.
        Some(vec![0])
    }

    fn verify(&self, dir: &Path) -> Option<u64> {
        SledEngine.verify(dir)
    }
}
