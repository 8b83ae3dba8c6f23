//! Dropping a segment tree so that sled gives its disk space back.
//!
//! sled 0.34 stores a page larger than a quarter of its log segment
//! (128 KiB) as a separate file under `blobs/`. A log leaf holds up to 16
//! stored batches, so a leaf of 1 KiB messages (or of big batches of small
//! ones) is such a blob. sled deletes a blob file when the page that points
//! at it is *replaced*, but not when the page is *freed* while its whole
//! state is that one blob (`mark_replace` skips the removal for a
//! single-blob page, meant for a page merely relocated): `Db::drop_tree`
//! frees its pages, so every consolidated leaf of a dropped segment left its
//! file behind, for good (sled issue #786). Under retention the data
//! directory grew at the publish rate whatever was dropped.
//!
//! So the tree is emptied first: each removal adds a delta to its leaf (or
//! consolidates it, replacing the blob), after which freeing the page
//! removes its blob like any other fragment. The removals cost one sled
//! delete per stored value, before the drop; a crash between them leaves a
//! segment that is partly emptied below the topic's id floor (raised before
//! a trim), which nothing reads and the next trim drops.
//!
//! Emptying cannot save every file: that test in `mark_replace`
//! (`pagecache/segment.rs`) is the only place sled keeps a replaced blob,
//! and every page rewrite goes through it (`cas_page`: a consolidation, the
//! in-place left half of a split, a merge, a free), not only the cleaner's
//! relocations it is meant for. So a page whose whole state is one blob —
//! a leaf just consolidated (sled rewrites a page whole on every tenth
//! update, and a split writes both halves whole) — leaves its file behind if
//! its next change is such a rewrite rather than an added delta. Those files
//! were the residue the soak showed (about 3% of what retention dropped).
//! The log therefore cuts batches into values of at most 7 KiB
//! ([`super::frame::MAX_VALUE`]): its leaves are blobs only when they hold
//! messages larger than that, and only then does this apply.

use super::{SledStorage, seg_tree_name};
use crate::StorageResult as Result;
use crate::prelude::*;

impl SledStorage {
    /// Empties and drops `topic`'s segment tree `seg`.
    pub(super) fn drop_segment(&self, topic: &str, seg: u64) -> Result<()> {
        let name = seg_tree_name(topic, seg);
        self.db.open_tree(&name)?.clear()?;
        self.db.drop_tree(name)?;
        Ok(())
    }

    /// Topics with entries in segment trees: every topic with a log in
    /// sled (the only layout before the segment-file log, and still that
    /// of the retry and dead-letter tiers).
    pub(crate) fn topics_with_trees(&self) -> Vec<String> {
        crate::util::lock(&self.segments).keys().cloned().collect()
    }

    /// Drops every segment tree of `topic` once its entries live elsewhere
    /// (the upgrade to the segment-file log), its id floor raised to its
    /// end first so the ids stay taken. Not durable until flushed.
    pub(crate) fn retire_trees(&self, topic: &str) -> Result<()> {
        let (_, next) = self.entry_range(topic)?;
        self.raise_id_floor(topic, next)?;
        let segs = crate::util::lock(&self.segments)
            .remove(topic)
            .unwrap_or_default();
        for seg in segs.keys() {
            self.drop_segment(topic, *seg)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir.join("blobs"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Segments of 64 stored values of 20 KiB: leaves split at 17 values,
    /// and each half (a fresh consolidated page of 160-180 KiB) is stored by
    /// sled as one blob file. Trimming all but the last segment must give
    /// their files back (dropping the trees without emptying them kept
    /// 12.3 MB of the 14.4 MB of blob files; now what is left is the last
    /// segment's, about 1.3 MB).
    #[tokio::test]
    async fn trimmed_segments_give_their_blob_files_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
        let entry = vec![7u8; 20 * 1024];
        let n = 10 * 64u64;
        for id in 0..n {
            s.append("t", id, std::slice::from_ref(&entry), None)
                .unwrap();
        }
        s.flush().await.unwrap();
        let written = blob_bytes(dir.path());
        assert!(
            written > 4_000_000,
            "the leaves were not blobs: {written} B"
        );

        s.trim("t", n).unwrap();
        // sled deletes a replaced blob once the log has moved past the
        // segment that recorded the replacement: write on, elsewhere.
        for i in 0..400u64 {
            s.append("other", i, &[vec![1u8; 4096]], None).unwrap();
            if i % 50 == 0 {
                s.flush().await.unwrap();
            }
        }
        s.flush().await.unwrap();
        let left = blob_bytes(dir.path());
        assert!(
            left < written / 4,
            "blob files kept after the trim: {left} B of {written} B written"
        );
        // The last segment is kept whole.
        let (first, next) = s.entry_range("t").unwrap();
        assert_eq!((first, next), (n - 64, n));
        assert_eq!(s.read("t", first, 100, usize::MAX).unwrap().len(), 64);
    }
}
