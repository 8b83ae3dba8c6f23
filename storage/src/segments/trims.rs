//! Retention's side of the segment log: trims drop whole sealed segments
//! from what is served at once, and delete their files later, once a flush
//! made durable what allowed them ([`SegmentLog::trim_mark`],
//! [`SegmentLog::finish_trims_before`]); the `start` file is written first,
//! so a crash in between is told apart from a missing segment.

use super::{Result, SegmentLog, remove_if_there, sync_dir, write_start};
use std::path::PathBuf;

/// Segments dropped from a topic's log whose files are still on disk.
#[derive(Debug)]
pub(super) struct PendingTrim {
    /// Its place in the order trims were made.
    seq: u64,
    dir: PathBuf,
    /// The first segment kept (the `start` file's new value).
    keep: u64,
    files: Vec<PathBuf>,
}

impl SegmentLog {
    /// Drops the sealed segments, oldest first, that hold only ids
    /// `< below` (never the active one): at once from what is served, and
    /// from disk by [`Self::finish_trims_before`] after the next flush that
    /// starts after it — so the cursors that allowed the trim are durable
    /// before the files go (a crash in between keeps the files).
    pub fn trim(&self, topic: &str, below: u64) -> Result<()> {
        let Some(t) = self.topic(topic) else {
            return Ok(());
        };
        let mut tl = crate::util::lock(&t);
        let last = tl.segments.keys().next_back().copied();
        let doomed: Vec<u64> = tl
            .segments
            .iter()
            .take_while(|(k, s)| Some(**k) != last && s.next <= below)
            .map(|(k, _)| *k)
            .collect();
        if doomed.is_empty() {
            return Ok(());
        }
        let files = doomed
            .iter()
            .filter_map(|k| tl.segments.remove(k))
            .map(|s| s.path)
            .collect();
        let Some(keep) = tl.segments.keys().next().copied() else {
            return Ok(());
        };
        self.push_trim(tl.dir.clone(), keep, files);
        Ok(())
    }

    /// Queues the deletion of a trim's files (see [`Self::finish_trims_before`]).
    fn push_trim(&self, dir: PathBuf, keep: u64, files: Vec<PathBuf>) {
        let mut trims = crate::util::lock(&self.trims);
        // Numbered under the lock, so the queue is in number order.
        let seq = self
            .trim_seq
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        trims.push(PendingTrim {
            seq,
            dir,
            keep,
            files,
        });
    }

    /// Marks the trims made so far. A flush takes the mark *before* it
    /// starts and then finishes only the trims before it
    /// ([`Self::finish_trims_before`]): what allowed those (the cursors, the
    /// producer-id checkpoint, written before each trim) was written before
    /// the flush started, so the flush made it durable. A trim made while
    /// the flush ran waits for the next one.
    pub fn trim_mark(&self) -> TrimMark {
        TrimMark(self.trim_seq.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Deletes the files of every trim made so far (a caller that made
    /// what allowed them durable itself, and tests).
    pub fn finish_trims(&self) -> std::io::Result<()> {
        self.finish_trims_before(TrimMark(u64::MAX))
    }

    /// Deletes the files of the trims made before `mark`: per topic the
    /// `start` file first (durably), then the files, then the directory
    /// fsynced. A trim of a topic deleted since is skipped. A failure keeps
    /// the trims not finished for the next call.
    pub fn finish_trims_before(&self, mark: TrimMark) -> std::io::Result<()> {
        let _one_at_a_time = crate::util::lock(&self.finishing);
        let ready: Vec<PendingTrim> = {
            let mut trims = crate::util::lock(&self.trims);
            let n = trims.iter().take_while(|t| t.seq < mark.0).count();
            trims.drain(..n).collect()
        };
        let mut ready = ready.into_iter();
        while let Some(trim) = ready.next() {
            if let Err(e) = finish_trim(&trim) {
                let mut trims = crate::util::lock(&self.trims);
                let back: Vec<PendingTrim> = std::iter::once(trim).chain(ready).collect();
                trims.splice(0..0, back);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Drops the local copy of `topic`'s oldest segment, which must start
    /// at `first` and be sealed (its copy elsewhere verified and durable):
    /// at once from what is served, from disk by the next
    /// [`Self::finish_trims`], as a retention trim. Returns whether it did.
    pub fn drop_local(&self, topic: &str, first: u64) -> Result<bool> {
        let Some(t) = self.topic(topic) else {
            return Ok(false);
        };
        let mut tl = crate::util::lock(&t);
        let mut keys = tl.segments.keys().copied();
        let (Some(oldest), Some(keep)) = (keys.next(), keys.next()) else {
            return Ok(false);
        };
        if oldest != first {
            return Ok(false);
        }
        let Some(seg) = tl.segments.remove(&first) else {
            return Ok(false);
        };
        self.push_trim(tl.dir.clone(), keep, vec![seg.path]);
        Ok(true)
    }
}

/// A point in the order trims were made ([`SegmentLog::trim_mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrimMark(u64);

/// Deletes one trim's files: the `start` file first (durably), then the
/// files, then the directory fsynced; nothing when the topic went.
fn finish_trim(trim: &PendingTrim) -> std::io::Result<()> {
    if !trim.dir.is_dir() {
        return Ok(());
    }
    write_start(&trim.dir, trim.keep)?;
    crate::util::failpoint("log.trim.after_start");
    for f in &trim.files {
        remove_if_there(f)?;
        remove_if_there(&super::sealed::path_of(f))?;
    }
    sync_dir(&trim.dir)
}
