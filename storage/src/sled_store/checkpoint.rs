//! Producer sequence ids of topics whose entries live in the segment log,
//! checkpointed to `prodseq` lazily rather than on every append.
//!
//! Every log entry carries its producer's name and sequence id, so the log
//! itself is the durable record of de-duplication state: `prodseq` holds a
//! checkpoint (each producer's last id, and under the empty producer name
//! [`COVERED`] the log position the checkpoint covers, in one sled batch),
//! and `LogStorage::producer_sequences` adds what the log holds past that
//! position. Writing the checkpoint on every append dirtied sled on every
//! flush round — an `fdatasync` of sled's data file beside the segment's
//! on each `sync` publish round (issue #21). Instead the ids of a topic's
//! appends gather here in memory and go to sled in one batch once
//! [`CHECKPOINT_ENTRIES`] entries or [`CHECKPOINT_BYTES`] bytes have been
//! appended since the last checkpoint — which bounds what a start after a
//! crash reads back from the log — and always before entries leave the
//! local log (a retention trim or an offload's local drop), whose files go
//! only after the sled flush that makes the checkpoint durable.

use super::*;

/// The producer name under which `prodseq` keeps the log position a
/// logged topic's checkpoint covers (an empty name never takes part in
/// de-duplication).
pub(crate) const COVERED: &str = "";

/// Entries appended since a topic's last checkpoint that make the next
/// append write one.
pub(crate) const CHECKPOINT_ENTRIES: u64 = 64 * 1024;

/// Entry bytes appended since a topic's last checkpoint that make the next
/// append write one.
pub(crate) const CHECKPOINT_BYTES: u64 = 8 << 20;

/// What a logged topic's appends added since its last checkpoint.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Each producer's last sequence id in those appends.
    sequences: BTreeMap<String, u64>,
    /// The log position after the last of them.
    covered: u64,
    entries: u64,
    bytes: u64,
}

impl SledStorage {
    /// Notes a batch appended to `topic`'s log at `first_id` (its entries'
    /// `count` and `bytes`), whose producer `name`'s last sequence id is
    /// `seq`; writes the topic's checkpoint when enough has gathered. The
    /// caller serialises a topic's appends (its writer lock).
    pub(crate) fn note_logged_sequence(
        &self,
        topic: &str,
        (name, seq): (&str, u64),
        first_id: u64,
        count: u64,
        bytes: u64,
    ) -> Result<()> {
        let mut pending = crate::util::lock(&self.pending_sequences);
        let p = pending.entry(topic.to_owned()).or_default();
        let last = p.sequences.entry(name.to_owned()).or_insert(seq);
        *last = (*last).max(seq);
        p.covered = p.covered.max(first_id + count);
        p.entries += count;
        p.bytes += bytes;
        if p.entries >= CHECKPOINT_ENTRIES || p.bytes >= CHECKPOINT_BYTES {
            let p = pending.remove(topic).unwrap_or_default();
            self.write_checkpoint(topic, p)?;
        }
        Ok(())
    }

    /// Writes `topic`'s pending checkpoint to sled now (durable with the
    /// next flush), if its appends gathered one.
    pub(crate) fn checkpoint_sequences(&self, topic: &str) -> Result<()> {
        let mut pending = crate::util::lock(&self.pending_sequences);
        match pending.remove(topic) {
            Some(p) => self.write_checkpoint(topic, p),
            None => Ok(()),
        }
    }

    /// The producer sequence ids `topic`'s appends gathered since its last
    /// checkpoint (what the live store knows beyond sled and the log's
    /// messages: an entry that is not a message names no producer).
    pub(crate) fn pending_sequences(&self, topic: &str) -> Vec<(String, u64)> {
        crate::util::lock(&self.pending_sequences)
            .get(topic)
            .map(|p| p.sequences.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    /// Checkpoints the ids read back from `topic`'s log past its last
    /// checkpoint, up to `end`, with whatever appends gathered: after a
    /// crash they are nowhere else, a later checkpoint's position would
    /// skip them, and the next start reads back only what follows `end`.
    /// One sled write when there were any (a topic's open, not a publish).
    pub(crate) fn carry_sequences(
        &self,
        topic: &str,
        ids: &BTreeMap<String, u64>,
        end: u64,
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        // Written under the lock, so no checkpoint of later appends goes
        // in between.
        let mut pending = crate::util::lock(&self.pending_sequences);
        let mut p = pending.remove(topic).unwrap_or_default();
        for (name, seq) in ids {
            let last = p.sequences.entry(name.clone()).or_insert(*seq);
            *last = (*last).max(*seq);
        }
        p.covered = p.covered.max(end);
        self.write_checkpoint(topic, p)
    }

    /// Forgets what `topic`'s appends gathered (the topic is deleted).
    pub(super) fn forget_pending_sequences(&self, topic: &str) {
        crate::util::lock(&self.pending_sequences).remove(topic);
    }

    /// How many entries `topic`'s appends added since its last checkpoint
    /// (tests).
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn pending_sequence_entries(&self, topic: &str) -> u64 {
        crate::util::lock(&self.pending_sequences)
            .get(topic)
            .map_or(0, |p| p.entries)
    }

    /// How many times a flush synced sled's data file (tests).
    #[cfg(test)]
    pub(crate) fn data_syncs(&self) -> u64 {
        self.sync.data_syncs()
    }

    fn write_checkpoint(&self, topic: &str, p: Pending) -> Result<()> {
        let mut ids: Vec<(String, u64)> = p.sequences.into_iter().collect();
        ids.push((COVERED.to_owned(), p.covered));
        self.write_producer_sequences(topic, &ids)
    }
}
