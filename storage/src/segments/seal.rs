//! Seals a topic's active segment on request rather than at an append:
//! the age roll of an idle topic (the background offloader's pass), an
//! offload's seal of the segment it uploads, and a replicated topic's
//! seal, its group's command. Also what the tiered store sees of a
//! topic's segments ([`SegmentInfo`]).
//!
//! A replicated topic's segments roll at an append by id block and size
//! only ([`SegmentLog::append_replicated`]): both follow from the entries
//! the group's log carries, so every replica whose settings are equal
//! rolls at the same ids. Its age roll is its leader's decision
//! ([`SegmentLog::age_due`]), applied by every replica at the same place
//! in the log ([`SegmentLog::seal_below`]), so every replica seals at the
//! same id whatever its clock says.

use super::record::FileHeader;
use super::{SegmentLog, TopicLog};
use crate::StorageResult as Result;
use std::path::PathBuf;
use std::time::Duration;

/// A segment as the tiered store sees it (see `storage::tiered`).
#[derive(Debug, Clone)]
pub struct SegmentInfo {
    pub header: FileHeader,
    pub path: PathBuf,
    /// The file's valid length.
    pub len: u64,
    pub next: u64,
    pub first_entry: Option<u64>,
    pub entries: u64,
    /// The active segment (being written; never offloaded).
    pub active: bool,
}

impl SegmentLog {
    /// A topic's local segments, oldest first, the active one last.
    pub fn segment_infos(&self, topic: &str) -> Vec<SegmentInfo> {
        let Some(t) = self.topic(topic) else {
            return Vec::new();
        };
        let tl = crate::util::lock(&t);
        let last = tl.segments.keys().next_back().copied();
        tl.segments
            .iter()
            .map(|(k, s)| SegmentInfo {
                header: s.header,
                path: s.path.clone(),
                len: s.len,
                next: s.next,
                first_entry: s.first_entry,
                entries: s.entries,
                active: Some(*k) == last,
            })
            .collect()
    }

    /// Seals `topic`'s active segment when it holds entries and, with
    /// `older_than`, was created at least that long ago (the age roll of
    /// an idle topic, which no append triggers): the next append goes to
    /// a new segment. Returns whether it sealed one.
    pub fn seal_active(&self, topic: &str, older_than: Option<Duration>) -> Result<bool> {
        let Some(t) = self.topic(topic) else {
            return Ok(false);
        };
        let mut tl = crate::util::lock(&t);
        let Some(next) = sealable(&tl, older_than) else {
            return Ok(false);
        };
        self.roll(&mut tl, next)?;
        Ok(true)
    }

    /// Where `topic`'s active segment ends if it holds entries (and, with
    /// `older_than`, was created that long ago): the `below` of a seal of
    /// it ([`Self::seal_below`]).
    pub fn seal_point(&self, topic: &str, older_than: Option<Duration>) -> Option<u64> {
        self.topic(topic)
            .and_then(|t| sealable(&crate::util::lock(&t), older_than))
    }

    /// Where `topic`'s active segment ends if it holds entries and is
    /// `segment_max_age` old: what an age roll seals, busy topic or idle
    /// (a replicated topic's leader seals it through its group, which
    /// carries this as the seal's `below`).
    pub fn age_due(&self, topic: &str) -> Option<u64> {
        self.seal_point(topic, Some(self.settings.max_age))
    }

    /// A replicated topic's seal, its group's command: seals `topic`'s
    /// active segment if it holds an entry below `below` (where the
    /// leader's log ended when it decided). Every replica applies it after
    /// the same entries, so each seals at the same id; applied again after
    /// a restart (the store already past the seal: its active segment
    /// starts at or above `below`) it seals nothing, where an unconditional
    /// seal would end that replica's later segment early. Returns whether
    /// it sealed one.
    pub fn seal_below(&self, topic: &str, below: u64) -> Result<bool> {
        let Some(t) = self.topic(topic) else {
            return Ok(false);
        };
        let mut tl = crate::util::lock(&t);
        let holds_below = tl
            .segments
            .values()
            .next_back()
            .and_then(|a| a.first_entry)
            .is_some_and(|first| first < below);
        let Some(next) = sealable(&tl, None).filter(|_| holds_below) else {
            return Ok(false);
        };
        self.roll(&mut tl, next)?;
        Ok(true)
    }

    /// Age rolls of idle topics: seals every active segment older than
    /// `segment_max_age` that holds entries, but those of topics `skip`
    /// names (replicated ones: their leader seals through the group).
    pub fn seal_idle(&self, skip: impl Fn(&str) -> bool) -> Result<usize> {
        let mut sealed = 0;
        for topic in self.topics() {
            if !skip(&topic) && self.seal_active(&topic, Some(self.settings.max_age))? {
                sealed += 1;
            }
        }
        Ok(sealed)
    }
}

/// Where the next segment of `tl` starts if its active segment holds
/// entries (and, with `older_than`, was created that long ago).
fn sealable(tl: &TopicLog, older_than: Option<Duration>) -> Option<u64> {
    let active = tl.segments.values().next_back()?;
    if active.first_entry.is_none() || active.cut_pending {
        return None;
    }
    let age = crate::util::wall_ms().saturating_sub(active.header.created_ms);
    older_than
        .is_none_or(|o| age >= o.as_millis() as u64)
        .then_some(active.next)
}
