//! [`LogStorage`]: the production engine, two stores each for what it is
//! good at. Ordinary topics' entries live in the segment-file log
//! ([`super::segments`]); sled keeps everything else: topic and
//! subscription records, producer sequence ids, failure records, the
//! retry schedule, dead letters, grants, and the retry and dead-letter
//! tiers' entries (a tier move stays one sled transaction).
//!
//! A topic's entries go to the log when its record says it is ordinary
//! ([`TopicKind::Normal`]); [`Storage::flush`] fsyncs the segment files
//! written since the last flush and flushes sled, together, so the
//! flusher's one round covers both.
//!
//! Producer sequence ids: every log entry carries its producer and
//! sequence id, so the log is their durable record. Sled's `prodseq` is a
//! checkpoint: beside each producer's id it keeps, in the same sled batch,
//! the log position it covers (under the empty producer name, which
//! de-duplication never uses), and [`Storage::producer_sequences`] adds
//! what the log holds past that position. The checkpoint is written
//! lazily — once a topic's appends since the last one reach a bound, and
//! before a trim — not on every append, which would dirty sled (and cost
//! its data file's `fdatasync`) on every flush round (see
//! `sled_store::checkpoint`). A resend of a batch the log kept is
//! recognised whether or not a checkpoint covers it.
//!
//! With a `[tiered]` section, sealed segments may also live in an object
//! store ([`super::tiered`]): reads below the first local segment go
//! there, retention and topic deletion cover both tiers.

use super::segments::{LogSettings, SegmentLog, upgrade};
use super::tiered::{Tiered, TieredConfig};
use super::*;
use prost::Message as _;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Segment-file log for ordinary topics, sled for the rest.
#[derive(Debug)]
pub struct LogStorage {
    pub(super) sled: Arc<SledStorage>,
    log: Arc<SegmentLog>,
    /// Ordinary topics (their entries are in the log).
    logged: RwLock<HashSet<String>>,
    /// The object-store tier, when configured.
    tiered: Option<Arc<Tiered>>,
    /// Held to write retry-tier references (shared) and to trim a topic
    /// (alone), so no reference is written into a segment a trim is
    /// dropping ([`super::refs`]).
    refs_lock: RwLock<()>,
}

impl LogStorage {
    /// Opens the log beside `sled` in `data_dir`, after moving entries a
    /// store written before the log keeps in sled (once; see
    /// [`upgrade`]). A damaged segment refuses the store
    /// ([`StorageError::Corrupt`]).
    pub async fn open(
        sled: Arc<SledStorage>,
        data_dir: &Path,
        settings: LogSettings,
        tiered: Option<&TieredConfig>,
    ) -> Result<Self> {
        upgrade::run(&sled, data_dir, settings).await?;
        let log = SegmentLog::open(data_dir, settings, true)?;
        Self::joined(sled, log, tiered)
    }

    /// [`Self::open`], with the log opened (every segment read and
    /// checked) on a thread of its own while `open_sled` opens sled on
    /// this one: the two read different files, so a start pays the longer
    /// of the two rather than their sum. A store the upgrade moves entries
    /// from (sled's trees into segment files, once) has its log opened
    /// again after the upgrade. `open_sled`'s error, or else the log's,
    /// is returned (either way once both have ended); the took-times are
    /// logged.
    pub async fn open_beside<E>(
        open_sled: impl FnOnce() -> std::result::Result<Arc<SledStorage>, E>,
        data_dir: &Path,
        settings: LogSettings,
        tiered: Option<&TieredConfig>,
    ) -> std::result::Result<Self, E>
    where
        E: From<StorageError>,
    {
        let (sled, log) = std::thread::scope(|scope| {
            let log = std::thread::Builder::new()
                .name("log-open".into())
                .spawn_scoped(scope, || {
                    let started = std::time::Instant::now();
                    let log = SegmentLog::open(data_dir, settings, true);
                    tracing::info!(
                        took_ms = started.elapsed().as_millis() as u64,
                        bytes = log.as_ref().map_or(0, |l| l.size()),
                        records_checked = log.as_ref().map_or(0, |l| l.records_checked_at_open()),
                        "start: segment-file log opened (every segment checked: sealed ones whole against their seal's CRC, the rest record by record), beside sled's open"
                    );
                    log
                });
            let sled = open_sled();
            let log = match log {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p)),
                // No thread to be had: opened here, after sled.
                Err(_) => SegmentLog::open(data_dir, settings, true),
            };
            (sled, log)
        });
        let sled = sled?;
        let mut log = log?;
        if upgrade::run(&sled, data_dir, settings).await? > 0 {
            drop(log);
            log = SegmentLog::open(data_dir, settings, true)?;
        }
        Ok(Self::joined(sled, log, tiered)?)
    }

    /// Joins an opened log and sled, and the object-store tier when
    /// configured.
    fn joined(
        sled: Arc<SledStorage>,
        log: SegmentLog,
        tiered: Option<&TieredConfig>,
    ) -> Result<Self> {
        let mut me = Self::with(sled, log)?;
        if let Some(config) = tiered {
            let logged = crate::util::read(&me.logged).clone();
            let t = Tiered::open(config.clone(), me.sled.clone(), me.log.clone(), &logged)?;
            // Replicated topics are offloaded by their groups' leaders.
            for r in me.sled.list_topics()? {
                if r.replicas > 1 && r.kind == TopicKind::Normal {
                    t.set_grouped(&r.name, true);
                }
            }
            me.tiered = Some(t);
        }
        Ok(me)
    }

    /// Joins an opened log and sled.
    pub fn with(sled: Arc<SledStorage>, log: SegmentLog) -> Result<Self> {
        let logged = sled
            .list_topics()?
            .into_iter()
            .filter(|t| t.kind == TopicKind::Normal)
            .map(|t| t.name)
            .collect();
        Ok(Self {
            sled,
            log: Arc::new(log),
            logged: RwLock::new(logged),
            tiered: None,
            refs_lock: RwLock::new(()),
        })
    }

    /// The object-store tier, when configured.
    pub fn tiered(&self) -> Option<&Arc<Tiered>> {
        self.tiered.as_ref()
    }

    /// A read from `from` over both tiers: the offloaded segments first,
    /// then the local ones. Retried when a local copy went in between (an
    /// offload's local delete), so no entry is skipped.
    fn read_both(
        &self,
        tiered: &Tiered,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        loop {
            let local_start = self.log.segment_starts(topic).first().copied();
            let mut bytes = 0;
            let mut out = tiered.read(topic, from, max, max_bytes, &mut bytes)?;
            if out.len() >= max || bytes >= max_bytes {
                return Ok(out);
            }
            let at = out.last().map_or(from, |(id, _)| id + 1);
            if let (Some(start), Some((_, remote_end))) = (local_start, tiered.remote_range(topic))
                && at < start
                && remote_end < start
                && at >= remote_end
            {
                // Never a shorter answer across a hole between the tiers.
                return Err(StorageError::Corrupt(format!(
                    "log of {topic}: ids {remote_end}..{start} are neither local nor offloaded"
                )));
            }
            let rest = self
                .log
                .read(topic, at, max - out.len(), max_bytes - bytes)?;
            if self.log.segment_starts(topic).first().copied() != local_start {
                continue;
            }
            out.extend(rest);
            return Ok(out);
        }
    }

    /// The segment-file log.
    pub fn log(&self) -> &SegmentLog {
        &self.log
    }

    /// Stores `topic`'s entries in the log without a topic record (the
    /// contract tests' engines).
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn route_to_log(&self, topic: &str) {
        crate::util::write(&self.logged).insert(topic.to_owned());
    }

    pub(super) fn logged(&self, topic: &str) -> bool {
        crate::util::read(&self.logged).contains(topic)
    }

    /// A test failpoint on the publish path: when `RICOCHET_FAILPOINT`
    /// names `name`, makes what sled holds durable (as a concurrent
    /// writer's flush could at that instant) and aborts; the log's writes
    /// are in the file already.
    fn crash_point(&self, name: &str) {
        if crate::util::failpoint_armed(name) {
            self.sled.flush_blocking();
            crate::util::failpoint(name);
        }
    }

    /// Adds to `sequences` the producers' sequence ids of `topic`'s log
    /// entries from `from` on.
    fn sequences_from(
        &self,
        topic: &str,
        from: u64,
        sequences: &mut BTreeMap<String, u64>,
    ) -> Result<()> {
        let Some((first, end)) = self.log.range(topic) else {
            return Ok(());
        };
        let mut at = from.max(first);
        while at < end {
            let read = self.log.read(topic, at, 4096, 16 << 20)?;
            let Some(&(last, _)) = read.last() else { break };
            for (_, bytes) in &read {
                // The record's CRC vouches for the bytes; an entry that is
                // not a message (an imported test entry) names no producer.
                let Ok(m) = ricochet_proto::Message::decode(bytes.as_slice()) else {
                    continue;
                };
                if !m.producer_name.is_empty() {
                    let seq = sequences.entry(m.producer_name).or_insert(0);
                    *seq = (*seq).max(m.sequence_id);
                }
            }
            at = last + 1;
        }
        Ok(())
    }

    /// An append to `topic`'s segment-file log (rolling its segment by
    /// age too when `by_age`); the caller sends a topic not in the log to
    /// sled.
    fn append_to_log<E: AsRef<[u8]>>(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[E],
        producer: Option<(&str, u64)>,
        by_age: bool,
    ) -> Result<()> {
        self.crash_point("publish.append.first_segment");
        if by_age {
            self.log.append(topic, first_id, entries)?;
        } else {
            self.log.append_replicated(topic, first_id, entries)?;
        }
        self.crash_point("publish.append.entries");
        if let Some(producer) = producer {
            // Gathered in memory, checkpointed to sled now and then: the
            // entries just written carry the id.
            let bytes = entries.iter().map(|e| e.as_ref().len() as u64).sum();
            self.sled.note_logged_sequence(
                topic,
                producer,
                first_id,
                entries.len() as u64,
                bytes,
            )?;
            self.crash_point("publish.append.sequence");
        }
        Ok(())
    }
}

impl LogStore for LogStorage {
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        if !self.logged(topic) {
            return self.sled.append(topic, first_id, entries, producer);
        }
        self.append_to_log(topic, first_id, entries, producer, true)
    }

    /// As `append`, the log rolling by id block and size only (a topic in
    /// sled takes a copy of the entries).
    fn append_replicated(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[&[u8]],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        if !self.logged(topic) {
            let owned: Vec<Vec<u8>> = entries.iter().map(|e| e.to_vec()).collect();
            return self.sled.append(topic, first_id, &owned, producer);
        }
        self.append_to_log(topic, first_id, entries, producer, false)
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        if self.logged(topic) {
            match &self.tiered {
                Some(t) if t.has_states(topic) => self.read_both(t, topic, from, max, max_bytes),
                Some(t) => {
                    let out = self.log.read(topic, from, max, max_bytes)?;
                    // A first offload that dropped a local copy since the
                    // test above: read again over both tiers.
                    if out.first().is_none_or(|(id, _)| *id > from) && t.has_states(topic) {
                        return self.read_both(t, topic, from, max, max_bytes);
                    }
                    Ok(out)
                }
                None => self.log.read(topic, from, max, max_bytes),
            }
        } else {
            let mut out = self.sled.read(topic, from, max, max_bytes)?;
            let mut entries: Vec<&mut Vec<u8>> = out.iter_mut().map(|(_, e)| e).collect();
            self.resolve_entries(&mut entries)?;
            Ok(out)
        }
    }

    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>> {
        if self.logged(topic) {
            Ok(self.read_many(topic, &[id])?.pop().flatten())
        } else {
            let mut one = self.sled.read_one(topic, id)?;
            if let Some(e) = one.as_mut() {
                self.resolve_entries(&mut [e])?;
            }
            Ok(one)
        }
    }

    fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        if self.logged(topic) {
            let mut found = self.log.read_many(topic, ids)?;
            if let Some(t) = &self.tiered
                && found.iter().any(Option::is_none)
            {
                // Entries below the first local segment, from the object
                // store.
                let missing: Vec<u64> = ids
                    .iter()
                    .zip(&found)
                    .filter(|(_, f)| f.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                let mut remote = t.read_many(topic, &missing)?.into_iter();
                for f in found.iter_mut().filter(|f| f.is_none()) {
                    *f = remote.next().flatten();
                }
            }
            Ok(found)
        } else {
            let mut found = self.sled.read_many(topic, ids)?;
            let mut entries: Vec<&mut Vec<u8>> = found.iter_mut().flatten().collect();
            self.resolve_entries(&mut entries)?;
            Ok(found)
        }
    }

    fn entry_range(&self, topic: &str) -> Result<(u64, u64)> {
        // sled's answer for a logged topic is its id floor (raised by the
        // upgrade to where the moved entries ended).
        let (floor, floor_next) = self.sled.entry_range(topic)?;
        if !self.logged(topic) {
            return Ok((floor, floor_next));
        }
        let remote_first = self
            .tiered
            .as_ref()
            .and_then(|t| t.remote_range(topic))
            .map(|(first, _)| first);
        Ok(match self.log.range(topic) {
            Some((first, next)) => {
                let next = next.max(floor_next);
                let first = remote_first.map_or(first, |r| r.min(first));
                (first.min(next), next)
            }
            // Every local segment offloaded and none written since (a
            // replica installed from a snapshot of offloaded ranges).
            None => match self.tiered.as_ref().and_then(|t| t.remote_range(topic)) {
                Some((first, next)) => (first, next.max(floor_next)),
                None => (floor_next, floor_next),
            },
        })
    }

    fn trim(&self, topic: &str, below: u64) -> Result<()> {
        if self.logged(topic) {
            let _alone = crate::util::write(&self.refs_lock);
            self.copy_references_below(topic, below)?;
            // The ids of the entries going are in sled before their files
            // go (after the next flush, as the trimmed files do).
            self.sled.checkpoint_sequences(topic)?;
            self.log.trim(topic, below)?;
            match &self.tiered {
                Some(t) => t.trim(topic, below),
                None => Ok(()),
            }
        } else {
            self.sled.trim(topic, below)
        }
    }

    fn lowest_reference(&self, topic: &str) -> Result<Option<u64>> {
        if !self.logged(topic) {
            return Ok(None);
        }
        self.lowest_live_reference(topic)
    }

    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()> {
        if self.logged(topic) {
            // Only dead-letter tiers are purged entry by entry; an
            // ordinary topic's segments are immutable.
            return Err(StorageError::Missing(format!(
                "{topic} is an ordinary topic: its entries are removed by retention, not one by one"
            )));
        }
        self.sled.remove_entries(topic, ids)
    }

    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>> {
        let mut sequences: BTreeMap<String, u64> =
            self.sled.producer_sequences(topic)?.into_iter().collect();
        let covered = sequences.remove(crate::sled_store::COVERED);
        if self.logged(topic) {
            // Entries past the checkpoint carry their producers' ids (the
            // appends since it, or all a crash left); without a
            // checkpoint, read the whole log. They are checkpointed now: a
            // later checkpoint's position would skip what only the log
            // holds, and the next start reads less.
            let end = self.log.range(topic).map_or(0, |(_, end)| end);
            let mut past = BTreeMap::new();
            self.sequences_from(topic, covered.unwrap_or(0), &mut past)?;
            self.sled.carry_sequences(topic, &past, end)?;
            for (name, seq) in past {
                let at = sequences.entry(name).or_insert(seq);
                *at = (*at).max(seq);
            }
            // The ids appends gathered since the checkpoint (a live store).
            for (name, seq) in self.sled.pending_sequences(topic) {
                let at = sequences.entry(name).or_insert(seq);
                *at = (*at).max(seq);
            }
        }
        Ok(sequences.into_iter().collect())
    }

    fn restore_producer_sequences(&self, topic: &str, sequences: &[(String, u64)]) -> Result<()> {
        self.sled.restore_producer_sequences(topic, sequences)
    }

    fn offload_records(&self, topic: &str) -> Result<Vec<super::tiered::SegmentState>> {
        Ok(self
            .tiered
            .as_ref()
            .map(|t| t.group_states(topic))
            .unwrap_or_default())
    }

    fn put_offload_record(&self, state: &super::tiered::SegmentState) -> Result<()> {
        let Some(t) = &self.tiered else {
            return Err(StorageError::Replication(format!(
                "{} was offloaded by its group, and this broker has no [tiered] section to record it",
                state.topic
            )));
        };
        if !self.logged(&state.topic) {
            return Err(StorageError::Missing(format!(
                "an offload record of {}, which is no ordinary topic here",
                state.topic
            )));
        }
        // Retry-tier references into the dropped segments resolve through
        // `read_many`, which reads the recorded objects (as after a
        // factor-1 offload).
        t.record_group(state)
    }

    fn seal_segment(&self, topic: &str, below: u64) -> Result<()> {
        self.log.seal_below(topic, below).map(|_| ())
    }

    fn seal_due(&self, topic: &str) -> Result<Option<u64>> {
        Ok(self.log.age_due(topic))
    }

    fn offload_policy(&self, topic: &str) -> Result<Option<super::tiered::policy::OffloadPolicy>> {
        Ok(self.tiered.as_ref().and_then(|t| t.policies().get(topic)))
    }

    fn put_offload_policy(
        &self,
        topic: &str,
        policy: &super::tiered::policy::OffloadPolicy,
    ) -> Result<()> {
        match &self.tiered {
            Some(t) => t.set_policy(topic, policy.clone()),
            None => Err(StorageError::Replication(format!(
                "the offload policy of {topic}: this broker has no [tiered] section to store it"
            ))),
        }
    }

    fn delete_offloaded_objects(&self, keys: Vec<String>) -> Result<()> {
        if let Some(t) = &self.tiered {
            t.delete_group_objects(keys);
        }
        Ok(())
    }
}

impl SubscriptionStore for LogStorage {
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>> {
        self.sled.list_subscriptions(topic)
    }

    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.sled.put_subscription(record)
    }

    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.sled.delete_subscription(record)?;
        self.sled.forget_references_of(record.id)
    }

    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>> {
        self.sled.failure(message, due_ms)
    }

    fn failures_many(
        &self,
        keys: &[(SubMessage, Option<u64>)],
    ) -> Result<Vec<Option<FailureRecord>>> {
        self.sled.failures_many(keys)
    }

    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>> {
        self.sled.failures_of(sub_id, tier)
    }

    fn held_heads_due(
        &self,
        sub_id: u64,
        after_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, FailureHead)>> {
        self.sled.held_heads_due(sub_id, after_ms, to_ms)
    }

    fn main_failure_heads_by(&self, sub_id: u64, horizon_ms: u64) -> Result<MainHeads> {
        self.sled.main_failure_heads_by(sub_id, horizon_ms)
    }

    fn main_failure_heads(&self, sub_id: u64) -> Result<Vec<(u64, FailureHead)>> {
        self.sled.main_failure_heads(sub_id)
    }

    fn failure_heads(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureHead)>> {
        self.sled.failure_heads(sub_id, tier)
    }

    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()> {
        self.sled.put_failures(records)
    }

    fn put_held(
        &self,
        held: &[(ScheduleKey, FailureRecord)],
        unschedule: &[ScheduleKey],
    ) -> Result<()> {
        self.sled.put_held(held, unschedule)
    }

    fn scheduled(
        &self,
        after: Option<ScheduleKey>,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<ScheduleKey>> {
        self.sled.scheduled(after, to_ms, limit)
    }

    fn put_schedule(&self, keys: &[(ScheduleKey, bool)]) -> Result<()> {
        self.sled.put_schedule(keys)
    }

    fn move_messages(&self, mv: &TierMove) -> Result<()> {
        if mv.items.iter().all(|i| i.source.is_none()) {
            return self.sled.move_messages(mv);
        }
        let _shared = crate::util::read(&self.refs_lock);
        match self.with_references(mv)? {
            Some(with_refs) => self.sled.move_messages(&with_refs),
            None => self.sled.move_messages(mv),
        }
    }

    fn dead_letters(
        &self,
        sub_id: u64,
        after: Option<u64>,
    ) -> Result<Vec<(u64, DeadLetterRecord)>> {
        self.sled.dead_letters(sub_id, after)
    }

    fn count_dead_letters(&self, sub_id: u64) -> Result<u64> {
        self.sled.count_dead_letters(sub_id)
    }

    fn remove_dead_letters(&self, sub_id: u64, ids: &[u64]) -> Result<()> {
        self.sled.remove_dead_letters(sub_id, ids)
    }

    fn dead_letters_by_id(&self, sub_id: u64, ids: &[u64]) -> Result<Vec<(u64, DeadLetterRecord)>> {
        self.sled.dead_letters_by_id(sub_id, ids)
    }

    fn put_dead_letters(&self, sub_id: u64, records: &[(u64, DeadLetterRecord)]) -> Result<()> {
        self.sled.put_dead_letters(sub_id, records)
    }

    fn return_dead_letters(&self, mv: &DeadLetterReturn) -> Result<()> {
        self.sled.return_dead_letters(mv)
    }

    fn replay_jobs(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>> {
        self.sled.replay_jobs(with_ids)
    }

    fn put_replay_job(&self, job: &ReplayJobRecord) -> Result<()> {
        self.sled.put_replay_job(job)
    }

    fn remove_replay_job(&self, id: u64) -> Result<()> {
        self.sled.remove_replay_job(id)
    }

    fn subscription_state(&self, sub_id: u64) -> Result<SubscriptionState> {
        self.sled.subscription_state(sub_id)
    }

    fn restore_subscription_state(&self, sub_id: u64, state: &SubscriptionState) -> Result<()> {
        self.sled.restore_subscription_state(sub_id, state)
    }
}

#[async_trait::async_trait]
impl MetaStore for LogStorage {
    fn list_topics(&self) -> Result<Vec<TopicRecord>> {
        self.sled.list_topics()
    }

    fn put_topic(&self, record: &TopicRecord) -> Result<()> {
        if record.kind == TopicKind::Normal && !self.logged(&record.name) {
            // A new topic: a directory left by a delete a crash
            // interrupted (its record gone) is not its log.
            self.log.delete_topic(&record.name)?;
        }
        self.sled.put_topic(record)?;
        if record.kind == TopicKind::Normal {
            crate::util::write(&self.logged).insert(record.name.clone());
            if record.replicas > 1
                && let Some(t) = &self.tiered
            {
                t.set_grouped(&record.name, true);
            }
        }
        Ok(())
    }

    fn delete_topic(&self, name: &str) -> Result<()> {
        for sub in self.sled.list_subscriptions(name)? {
            self.sled.forget_references_of(sub.id)?;
        }
        self.sled.delete_topic(name)?;
        if crate::util::write(&self.logged).remove(name) {
            self.log.delete_topic(name)?;
            if let Some(t) = &self.tiered {
                t.delete_topic(name)?;
            }
        }
        Ok(())
    }

    fn list_partitioned(&self) -> Result<Vec<PartitionedRecord>> {
        self.sled.list_partitioned()
    }

    fn put_partitioned(&self, record: &PartitionedRecord) -> Result<()> {
        self.sled.put_partitioned(record)
    }

    fn delete_partitioned(&self, name: &str) -> Result<()> {
        self.sled.delete_partitioned(name)
    }

    fn next_id(&self) -> Result<u64> {
        self.sled.next_id()
    }

    fn grants(&self) -> Result<Vec<GrantRecord>> {
        self.sled.grants()
    }

    fn put_grant(&self, record: &GrantRecord) -> Result<()> {
        self.sled.put_grant(record)
    }

    fn delete_grant(&self, role: &str, resource: &str) -> Result<()> {
        self.sled.delete_grant(role, resource)
    }

    fn retention_policies(&self) -> Result<Vec<RetentionRecord>> {
        self.sled.retention_policies()
    }

    fn put_retention(&self, record: &RetentionRecord) -> Result<()> {
        self.sled.put_retention(record)
    }

    fn delete_retention(&self, target: &str) -> Result<()> {
        self.sled.delete_retention(target)
    }

    fn size_on_disk(&self) -> Result<u64> {
        Ok(self.sled.size_on_disk()? + self.log.size())
    }

    /// One round: the segment files written since the last round are
    /// fsynced while sled flushes; both must succeed. Then the files of
    /// the segments trimmed before the round started are deleted.
    async fn flush(&self) -> Result<()> {
        // Trimmed segments' files go once what let them go (the cursors,
        // the producer-id checkpoint) is durable: only trims made before
        // this flush started are covered by it.
        let mark = self.log.trim_mark();
        let log = self.log.clone();
        let synced = tokio::task::spawn_blocking(move || log.sync());
        let sled = self.sled.flush().await;
        synced.await.map_err(StorageError::joined)??;
        sled?;
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || log.finish_trims_before(mark))
            .await
            .map_err(StorageError::joined)??;
        Ok(())
    }

    fn inventory(&self, counts: bool) -> Result<Inventory> {
        let mut inv = self.sled.inventory(counts)?;
        inv.has_data |= !self.log.topics().is_empty();
        for (name, t) in inv.topics.iter_mut() {
            if !self.logged(name) {
                continue;
            }
            (t.first, t.next) = self.entry_range(name)?;
            t.segments = self.log.segment_numbers(name);
            if let Some(tiered) = &self.tiered {
                let remote: Vec<u64> = tiered.remote(name).iter().map(|s| s.seq).collect();
                t.segments.splice(0..0, remote);
            }
        }
        Ok(inv)
    }

    fn set_store_id(&self, id: &str) -> Result<()> {
        self.sled.set_store_id(id)
    }

    fn load_manifest(&self) -> Result<Option<Manifest>> {
        self.sled.load_manifest()
    }

    async fn save_manifest(&self, manifest: &Manifest) -> Result<()> {
        self.sled.save_manifest(manifest).await
    }

    fn intact(&self) -> bool {
        self.sled.intact()
    }
}
