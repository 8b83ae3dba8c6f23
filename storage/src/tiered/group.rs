//! Offload of a replicated topic: the group's, not one broker's.
//!
//! A replicated topic's segments are offloaded by its group's leader only
//! ([`Tiered::offload_through`]): an on-demand offload first seals the
//! active segment through the group ([`GroupRecorder::seal`], every
//! replica at the same id), then it uploads a sealed segment and checks
//! the object's size and CRC-32C as the background offloader does, then
//! hands the object's record (a [`SegmentState`] with `group` set) to the
//! topic's storage, which proposes it to the group; nothing is recorded
//! here until the group's command is applied. Every replica applies it
//! through [`Tiered::record_group`]: the offloaded range is recorded and
//! the replica's local segments lying wholly inside the recorded ranges
//! are dropped, oldest first (segment boundaries are the same on every
//! replica whose segment settings are equal, but may differ otherwise or
//! after a snapshot, so the rule is a range rule: a local segment straddling a
//! range's end stays, and the local segments left always follow the
//! ranges without a gap). The background offloader skips these topics
//! ([`Tiered::set_grouped`]); the leader's own pass applies the
//! topic's offload policy ([`Tiered::offload_due_through`]), whose
//! topic-level record is the group's too.
//!
//! A replica's local copies of recorded ranges go as `keep_local` and
//! `delete_lag` say, counted from the offload time the leader stamped in
//! the record ([`Tiered::drop_due_group`]). Which `keep_local` and
//! `delete_lag`: the topic's own policy if it has one (the group's, the
//! same on every replica), else those the leader stamped in the record
//! ([`SegmentState::local`], resolved from its policy in force: the
//! namespace's or the `[tiered]` default, each broker's own), so every
//! replica drops at the same moment whatever its own defaults; a record
//! without a stamp (written by an older leader) follows this replica's
//! policy in force, as before.
//!
//! A group's objects are deleted only by the group's commands: a trim
//! below them ([`Tiered::trim`]) or the topic's delete
//! ([`Tiered::delete_group_objects`]), and by its leader's sweep of
//! objects no record names (`upkeep`). A replica that drops its copy on
//! its own (it left the group, a snapshot replaces its copy, its open
//! finds no topic for the records) forgets the records and leaves the
//! objects alone ([`Tiered::forget_topic`]).

use super::{Phase, SegmentState, Tiered};
use crate::segments::SegmentInfo;
use crate::{StorageError, StorageResult as Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Writes a group's offload record of `topic` (what its storage proposes
/// and every replica applies).
pub trait GroupRecorder: Send + Sync {
    /// Records `state` through the group; returns once it was applied here.
    fn record(&self, state: &SegmentState) -> Result<()>;

    /// Seals `topic`'s active segment through the group if it holds an
    /// entry below `below` (`Storage::seal_segment`, every replica at the
    /// same id); returns once it was applied here.
    fn seal(&self, topic: &str, below: u64) -> Result<()>;
}

impl Tiered {
    /// Marks `topic` as replicated (`true`): the background offloader
    /// leaves it to its group's leader.
    pub fn set_grouped(&self, topic: &str, grouped: bool) {
        let mut g = crate::util::lock(&self.grouped);
        if grouped {
            g.insert(topic.to_owned());
        } else {
            g.remove(topic);
        }
    }

    /// Whether `topic` is offloaded by its group only.
    pub fn is_grouped(&self, topic: &str) -> bool {
        crate::util::lock(&self.grouped).contains(topic)
            || crate::util::lock(&self.states)
                .get(topic)
                .is_some_and(|m| m.values().any(|s| s.group))
    }

    /// One past the last id of `topic`'s recorded group ranges (0: none).
    pub fn covered_end(&self, topic: &str) -> u64 {
        crate::util::lock(&self.states)
            .get(topic)
            .map_or(0, |m| m.values().map(|s| s.next).max().unwrap_or(0))
    }

    /// The group's offload records of `topic`, oldest first (what a
    /// snapshot carries).
    pub fn group_states(&self, topic: &str) -> Vec<SegmentState> {
        crate::util::lock(&self.states)
            .get(topic)
            .map(|m| m.values().filter(|s| s.group).cloned().collect())
            .unwrap_or_default()
    }

    /// The leader's offload of replicated `topic`: its active segment is
    /// sealed through `recorder` (the group: every replica seals it at the
    /// same id, so every replica's copy of it lies inside the range
    /// recorded next and goes), then each sealed local segment above the
    /// ranges recorded already is uploaded, verified and recorded through
    /// `recorder`, oldest first; the local copies go when the group's
    /// record is applied here ([`Tiered::record_group`]). A segment
    /// starting below the recorded end (a straddling one kept) is not
    /// offloaded.
    pub async fn offload_through(
        self: &Arc<Self>,
        topic: &str,
        recorder: &dyn GroupRecorder,
    ) -> Result<super::offload::Outcome> {
        let _one_pass = self.offloading.lock().await;
        let done = self.offload_group_locked(topic, recorder).await;
        self.note_outcome(topic, done)
    }

    async fn offload_group_locked(
        self: &Arc<Self>,
        topic: &str,
        recorder: &dyn GroupRecorder,
    ) -> Result<super::offload::Outcome> {
        if let Some(below) = self.log.seal_point(topic, None) {
            recorder.seal(topic, below)?;
        }
        self.upload_and_record(topic, recorder, usize::MAX).await
    }

    /// The sealed local segments of `topic` above the recorded end, oldest
    /// first, and the bytes of all its local segments.
    pub(super) fn candidates(&self, topic: &str) -> (Vec<SegmentInfo>, u64) {
        let covered = self.covered_end(topic);
        let all = self.log.segment_infos(topic);
        let bytes = all.iter().map(|s| s.len).sum();
        let sealed = all
            .into_iter()
            .filter(|s| !s.active && s.header.first >= covered && s.first_entry.is_some())
            .collect();
        (sealed, bytes)
    }

    /// The leader's pass over replicated `topic` by its offload policy
    /// (the topic's own, a record of the group; else its namespace's or
    /// the `[tiered]` default, this broker's): the oldest sealed segments
    /// above the recorded end the policy chooses, up to the first it does
    /// not, are uploaded and recorded through `recorder` as
    /// [`Tiered::offload_through`] does. Nothing without a policy.
    pub async fn offload_due_through(
        self: &Arc<Self>,
        topic: &str,
        recorder: &dyn GroupRecorder,
    ) -> Result<super::offload::Outcome> {
        let _one_pass = self.offloading.lock().await;
        self.restamp(topic, recorder)?;
        let Some((policy, _)) = self.effective(topic) else {
            return Ok(super::offload::Outcome::default());
        };
        let (sealed, local_bytes) = self.candidates(topic);
        let tuples: Vec<(u64, u64, bool)> = sealed
            .iter()
            .map(|s| (s.header.created_ms, s.len, false))
            .collect();
        let chosen = policy.choose(crate::util::wall_ms(), local_bytes, &tuples);
        // Oldest first and without a hole: the chosen prefix only.
        let due = chosen
            .iter()
            .enumerate()
            .take_while(|(n, i)| *n == **i)
            .count();
        if due == 0 {
            return Ok(super::offload::Outcome::default());
        }
        let done = self.upload_and_record(topic, recorder, due).await;
        self.note_outcome(topic, done)
    }

    /// The leader's pass brings the stamps of `topic`'s records whose
    /// range it still holds locally up to its policy in force (a changed
    /// namespace policy or `[tiered]` default, the topic's own cleared, a
    /// record of an older leader without a stamp): each is recorded again
    /// through the group with the new stamp and its offload time kept, so
    /// every replica's copies follow the change as a factor-1 topic's do.
    /// Returns how many were recorded again.
    fn restamp(&self, topic: &str, recorder: &dyn GroupRecorder) -> Result<u32> {
        let in_force = Some(
            self.effective(topic)
                .map(|(p, _)| p.local_copies())
                .unwrap_or_default(),
        );
        let local_start = self.log.segment_starts(topic).first().copied();
        let Some(local_start) = local_start else {
            return Ok(0);
        };
        let stale: Vec<SegmentState> = self
            .group_states(topic)
            .into_iter()
            .filter(|s| s.next > local_start && s.local != in_force)
            .collect();
        for mut s in stale.iter().cloned() {
            s.local = in_force;
            recorder.record(&s)?;
        }
        Ok(stale.len() as u32)
    }

    /// Uploads and records through the group at most `most` of `topic`'s
    /// sealed segments above the recorded end, oldest first.
    async fn upload_and_record(
        self: &Arc<Self>,
        topic: &str,
        recorder: &dyn GroupRecorder,
        most: usize,
    ) -> Result<super::offload::Outcome> {
        let mut outcome = super::offload::Outcome::default();
        let before = self.log.segment_starts(topic).len();
        for _ in 0..most {
            let Some(seg) = self.candidates(topic).0.into_iter().next() else {
                break;
            };
            let state = self.upload(topic, &seg).await?;
            recorder.record(&state)?;
            if self.covered_end(topic) < state.next {
                return Err(StorageError::Replication(format!(
                    "the group's offload of {topic} segment {} was not applied here",
                    state.first
                )));
            }
            outcome.segments += 1;
            outcome.bytes += seg.len;
        }
        let after = self.log.segment_starts(topic).len();
        outcome.local_deleted = before.saturating_sub(after) as u32;
        if outcome.local_deleted > 0 {
            // The records the apply wrote are made durable and the dropped
            // files go now, as a factor-1 offload's do (only trims made
            // before the flush); the other replicas' go at their next
            // flush.
            self.release_dropped_files().await?;
        }
        Ok(outcome)
    }

    /// Writes sealed segment `seg` as an object and reads it back (size and
    /// CRC-32C): its record, not stored anywhere yet. An upload a crash
    /// interrupts leaves an object no record names (redone onto the same
    /// key by the same leader).
    async fn upload(self: &Arc<Self>, topic: &str, seg: &SegmentInfo) -> Result<SegmentState> {
        let key = self.object_key(topic, seg);
        let mut state = SegmentState::of(topic, seg, key.clone());
        let (size, crc) = self.upload_object(topic, seg, &key).await?;
        state.phase = Phase::Offloaded;
        state.object_size = size;
        state.object_crc = crc;
        state.offloaded_ms = crate::util::wall_ms();
        state.group = true;
        // The leader's decision on local copies, for every replica.
        state.local = Some(
            self.effective(topic)
                .map(|(p, _)| p.local_copies())
                .unwrap_or_default(),
        );
        metrics::counter!("ricochet_tiered_offloaded_bytes_total").increment(seg.len);
        metrics::counter!("ricochet_tiered_offloaded_segments_total").increment(1);
        Ok(state)
    }

    /// Applies a group's offload record on this replica: the range is
    /// recorded (durable with the next flush), then the local segments
    /// lying wholly inside the recorded ranges are dropped as the policy
    /// lets them go ([`Tiered::drop_due_group`]: at once without a lag).
    /// A record of a range recorded already is a replay: recorded again,
    /// nothing else.
    pub fn record_group(&self, state: &SegmentState) -> Result<()> {
        if state.phase != Phase::Offloaded || !state.group || state.next <= state.first {
            return Err(StorageError::Corrupt(format!(
                "log of {}: a group's offload record of segment {} that is not one",
                state.topic, state.first
            )));
        }
        let topic = state.topic.as_str();
        self.set_grouped(topic, true);
        self.put_state(state)?;
        self.drop_due_group(topic, crate::util::wall_ms())?;
        Ok(())
    }

    /// Drops `topic`'s local segments lying wholly inside its recorded
    /// ranges, oldest first and never the active one, as far as the
    /// records covering each let it go at `now_ms`: never with
    /// `keep_local`, else once `delete_lag` passed since the offload time
    /// the leader stamped in each record covering the segment. The topic's
    /// own policy (the group's) decides if it has one, else each record's
    /// stamp ([`SegmentState::local`]: the leader's policy in force at the
    /// offload), else (a record without one) this broker's policy in
    /// force. So every replica decides alike whenever it applies the
    /// record, and a replica restarted within the lag drops them at a
    /// later pass (the background offloader's, every `interval`). Their
    /// files go after the next flush, as a trim's. Returns how many went.
    pub fn drop_due_group(&self, topic: &str, now_ms: u64) -> Result<u32> {
        let own = self.policies.get(topic).map(|p| p.local_copies());
        let in_force = self
            .effective(topic)
            .map(|(p, _)| p.local_copies())
            .unwrap_or_default();
        let mut dropped = 0;
        loop {
            let local = self.log.segment_infos(topic);
            let Some(oldest) = local.first() else { break };
            if oldest.active {
                break;
            }
            let Some(covering) = self.covering(topic, oldest.header.first, oldest.next) else {
                break;
            };
            let due = covering
                .iter()
                .all(|(at, stamp)| own.or(*stamp).unwrap_or(in_force).may_delete(now_ms, *at));
            if !due {
                break;
            }
            if dropped == 0 {
                // Producer ids of entries leaving the local log reach sled
                // first (durable with the same flush, before the files go).
                self.sled.checkpoint_sequences(topic)?;
            }
            if !self.log.drop_local(topic, oldest.header.first)? {
                break;
            }
            dropped += 1;
        }
        Ok(dropped)
    }

    /// When ids `first..next` all lie in `topic`'s recorded ranges: the
    /// offload time and stamp of each record covering them (`None`: not
    /// all recorded).
    fn covering(
        &self,
        topic: &str,
        first: u64,
        next: u64,
    ) -> Option<Vec<(u64, Option<super::policy::LocalCopies>)>> {
        let states = crate::util::lock(&self.states);
        let m = states.get(topic)?;
        let (mut at, mut out) = (first, Vec::new());
        for s in m.values() {
            if s.first <= at && at < s.next {
                at = s.next;
                out.push((s.offloaded_ms, s.local));
            }
            if at >= next {
                return Some(out);
            }
        }
        (at >= next).then_some(out)
    }

    /// Forgets `topic`'s records without deleting any object (this
    /// replica drops its copy on its own: the objects are the group's).
    pub fn forget_topic(&self, topic: &str) -> Result<Vec<String>> {
        self.set_grouped(topic, false);
        let Some(m) = crate::util::lock(&self.states).remove(topic) else {
            return Ok(Vec::new());
        };
        let mut keys = Vec::with_capacity(m.len());
        for s in m.values() {
            self.sled.remove_tiered(&s.stored_key())?;
            keys.push(s.key.clone());
        }
        Ok(keys)
    }

    /// Deletes the objects `keys` of a group's deleted topic, once a flush
    /// made the removal of their records durable (the group's delete,
    /// applied on every replica: each deletes the same keys).
    pub fn delete_group_objects(&self, keys: Vec<String>) {
        self.delete_after_flush(keys, Vec::new());
    }

    /// The open's check of a replicated topic's records (`logged`: its log
    /// is held here): offloaded ranges and local segments must cover the
    /// ids from the first range on without a gap. Records of a topic not
    /// held here are forgotten, their objects left to the group.
    pub(super) fn check_group_topic(
        &self,
        topic: &str,
        segs: BTreeMap<u64, SegmentState>,
        logged: bool,
    ) -> Result<BTreeMap<u64, SegmentState>> {
        if !logged {
            tracing::info!(%topic, "tiered: a replicated topic this broker no longer holds; forgetting its offload records (its objects are the group's)");
            for s in segs.values() {
                self.sled.remove_tiered(&s.stored_key())?;
            }
            return Ok(BTreeMap::new());
        }
        let local = self.log.segment_infos(topic);
        let local_start = local.first().map_or(u64::MAX, |s| s.header.first);
        let mut at: Option<u64> = None;
        for s in segs.values() {
            if s.phase != Phase::Offloaded {
                return Err(StorageError::Corrupt(format!(
                    "log of {topic}: the group's offload record of segment {} was never verified",
                    s.first
                )));
            }
            if let Some(end) = at
                && s.first > end
                && end < local_start
            {
                return Err(StorageError::Corrupt(format!(
                    "log of {topic}: ids {end}..{} are neither local nor offloaded: a segment is missing",
                    s.first.min(local_start)
                )));
            }
            at = Some(at.map_or(s.next, |e| e.max(s.next)));
        }
        if let (Some(end), Some(l)) = (at, local.first())
            && end < l.header.first
        {
            return Err(StorageError::Corrupt(format!(
                "log of {topic}: ids {end}..{} are neither local nor offloaded: a segment is missing",
                l.header.first
            )));
        }
        self.set_grouped(topic, true);
        Ok(segs)
    }
}
