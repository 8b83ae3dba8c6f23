//! Snapshots of a replicated partition: what a replica holds of it, as one
//! file another replica installs in place of its own copy.
//!
//! A snapshot holds the partition's topic and the retry and dead-letter
//! tiers of its subscriptions: each log's record (with the group's trim
//! point: entries below it are left out), entry range and producer
//! sequences; each subscription's record (cursors, policy, key order) and
//! state (failure records, schedule entries, dead letters) — what
//! `transfer::capture` collects for a topic move — the topic's replay
//! jobs and its own retention policy; then every entry of each log, except
//! those in ranges the group offloaded to the object store (the log's
//! records of them travel instead, format 2). It is written as CBOR records in
//! checksummed frames ([`ricochet_replication::snapshot`]).
//!
//! Capture ([`capture`]) runs between two applies and reads only the
//! records, which change in place; the entries are read afterwards, while
//! applies go on, up to each log's end at capture: entries never change
//! once written, and one removed meanwhile (a purged dead letter) is
//! removed again by the command that follows the snapshot in the log.
//!
//! Install ([`install`]) deletes the replica's copy (the logs, the
//! subscriptions with their state, the replay jobs) and writes the
//! snapshot's; subscription ids are the group's (every replica stores the
//! ids the commands carry), so they are kept, and the store's id counter
//! is raised past them. Installing the same snapshot twice gives the same
//! store: a replica that died part-way installs it again at its start.

use crate::storage::{
    ReplayJobRecord, RetentionRecord, Storage, SubscriptionRecord, SubscriptionState, TopicRecord,
};
use ricochet_replication::snapshot::{FrameReader, FrameWriter};
use ricochet_replication::{ReplicationError, Result, SnapshotWriter};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;

/// The snapshot format this broker writes and reads.
const FORMAT: u32 = 1;
/// The format of a snapshot whose logs carry offload records (a broker
/// that reads format 1 only refuses it, rather than install the log
/// without the offloaded ranges).
const FORMAT_OFFLOADED: u32 = 2;

/// Entries read per chunk when a log is written.
const CHUNK_ENTRIES: usize = 1_000;
/// Bytes read per chunk (about).
const CHUNK_BYTES: usize = 1 << 20;

/// One log's head in a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogHead {
    /// Its record.
    pub record: TopicRecord,
    /// First entry id held at capture.
    pub first: u64,
    /// The id after the last held at capture.
    pub next: u64,
    /// Producers' last stored sequence ids.
    pub sequences: Vec<(String, u64)>,
    /// The group's offload records of the log (ranges in objects, with
    /// their keys): carried instead of their entries, which `first` then
    /// starts after.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offloaded: Vec<crate::storage::tiered::SegmentState>,
    /// The log's own offload policy (the group's record), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_policy: Option<crate::storage::tiered::policy::OffloadPolicy>,
}

/// A record of a snapshot file, in the order written.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum Record {
    /// The partition (its topic's name), first.
    Begin { topic: String, format: u32 },
    /// A log: the topic's first, then its tiers.
    Log(LogHead),
    /// A subscription with its state.
    Subscription(Box<(SubscriptionRecord, SubscriptionState)>),
    /// A replay job of the topic.
    ReplayJob(ReplayJobRecord),
    /// The topic's own retention policy, when it has one (after the
    /// replay jobs; a snapshot of a topic without one is what a broker
    /// that predates replicated policies reads).
    Retention(RetentionRecord),
    /// Consecutive entries of a log.
    Entries {
        topic: String,
        first_id: u64,
        entries: Vec<serde_bytes::ByteBuf>,
    },
    /// The end, with the counts written (a snapshot without it, or with
    /// other counts, is refused).
    End { logs: u64, entries: u64 },
}

fn store(e: crate::storage::StorageError) -> ReplicationError {
    ReplicationError::Apply(e.to_string())
}

/// The partition `topic`'s state in `storage`, captured between two
/// applies; its entries are read when the snapshot is written.
pub(super) fn capture(storage: &Arc<dyn Storage>, topic: &str) -> Result<Box<dyn SnapshotWriter>> {
    let records: Vec<TopicRecord> = storage.list_topics().map_err(store)?;
    let mut logs = Vec::new();
    let mut subscriptions = Vec::new();
    let mut jobs = Vec::new();
    let mut retention = None;
    if let Some(main) = records.iter().find(|r| r.name == topic) {
        let subs = storage.list_subscriptions(topic).map_err(store)?;
        let mut names = vec![main.clone()];
        for s in &subs {
            let (retry, dlq) = crate::tier_owners::tier_names(s)
                .map_err(|e| ReplicationError::Apply(e.to_string()))?;
            for tier in [retry, dlq] {
                if let Some(r) = records.iter().find(|r| r.name == tier) {
                    names.push(r.clone());
                }
            }
        }
        for record in names {
            let (first, next) = storage.entry_range(&record.name).map_err(store)?;
            // Nothing below the group's trim point (this copy may hold a
            // few such entries in a segment it kept); the record carries
            // the point to the installing replica.
            let first = first.max(record.trimmed_below).min(next);
            // The offloaded ranges travel as records, not entries.
            let offloaded = storage.offload_records(&record.name).map_err(store)?;
            let first = first.max(contiguous_end(&offloaded)).min(next);
            logs.push(LogHead {
                first,
                next,
                offloaded,
                offload_policy: storage.offload_policy(&record.name).map_err(store)?,
                sequences: storage.producer_sequences(&record.name).map_err(store)?,
                record,
            });
        }
        for s in subs {
            let state = storage.subscription_state(s.id).map_err(store)?;
            subscriptions.push((s, state));
        }
        jobs = storage
            .replay_jobs(true)
            .map_err(store)?
            .into_iter()
            .filter(|j| j.topic == topic)
            .collect();
        retention = storage
            .retention_policies()
            .map_err(store)?
            .into_iter()
            .find(|r| r.target == topic);
    }
    Ok(Box::new(Captured {
        storage: storage.clone(),
        topic: topic.to_owned(),
        logs,
        subscriptions,
        jobs,
        retention,
    }))
}

/// Where the offload records, oldest first, stop covering ids without a
/// hole (0: none): the entries from there on travel in the snapshot. A
/// range past a hole (a leader skipped a local segment straddling the
/// recorded end, which it then kept) does not cover the hole's ids.
pub(super) fn contiguous_end(records: &[crate::storage::tiered::SegmentState]) -> u64 {
    let mut end: Option<u64> = None;
    for s in records {
        match end {
            Some(e) if s.first > e => break,
            _ => end = Some(end.map_or(s.next, |e| e.max(s.next))),
        }
    }
    end.unwrap_or(0)
}

/// A captured partition, to be written.
struct Captured {
    storage: Arc<dyn Storage>,
    topic: String,
    logs: Vec<LogHead>,
    subscriptions: Vec<(SubscriptionRecord, SubscriptionState)>,
    jobs: Vec<ReplayJobRecord>,
    retention: Option<RetentionRecord>,
}

impl SnapshotWriter for Captured {
    fn write_to(self: Box<Self>, out: &mut dyn std::io::Write) -> Result<()> {
        let mut w = FrameWriter::new(out);
        let format = if self
            .logs
            .iter()
            .any(|l| !l.offloaded.is_empty() || l.offload_policy.is_some())
        {
            FORMAT_OFFLOADED
        } else {
            FORMAT
        };
        w.put(&Record::Begin {
            topic: self.topic.clone(),
            format,
        })?;
        for log in &self.logs {
            w.put(&Record::Log(log.clone()))?;
        }
        for s in self.subscriptions {
            w.put(&Record::Subscription(Box::new(s)))?;
        }
        for j in self.jobs {
            w.put(&Record::ReplayJob(j))?;
        }
        if let Some(r) = self.retention {
            w.put(&Record::Retention(r))?;
        }
        let mut total = 0u64;
        for log in &self.logs {
            let mut from = log.first;
            while from < log.next {
                let chunk = self
                    .storage
                    .read(&log.record.name, from, CHUNK_ENTRIES, CHUNK_BYTES)
                    .map_err(store)?;
                let mut run: Vec<serde_bytes::ByteBuf> = Vec::new();
                let mut run_first = 0;
                let mut last = None;
                for (id, bytes) in chunk {
                    if id >= log.next {
                        break;
                    }
                    if last.is_some_and(|l: u64| l + 1 != id) && !run.is_empty() {
                        total += run.len() as u64;
                        w.put(&Record::Entries {
                            topic: log.record.name.clone(),
                            first_id: run_first,
                            entries: std::mem::take(&mut run),
                        })?;
                    }
                    if run.is_empty() {
                        run_first = id;
                    }
                    run.push(serde_bytes::ByteBuf::from(bytes));
                    last = Some(id);
                }
                if !run.is_empty() {
                    total += run.len() as u64;
                    w.put(&Record::Entries {
                        topic: log.record.name.clone(),
                        first_id: run_first,
                        entries: run,
                    })?;
                }
                match last {
                    Some(l) => from = l + 1,
                    // Nothing more below the end at capture (removed since).
                    None => break,
                }
            }
        }
        w.put(&Record::End {
            logs: self.logs.len() as u64,
            entries: total,
        })?;
        Ok(())
    }
}

/// Deletes this replica's copy of partition `topic` from `storage`: its
/// subscriptions with their state and tiers, the topic, its replay jobs,
/// its own retention and offload policies (its offload records go with
/// the topic, their objects stay: they are the group's).
pub(super) fn delete_copy(storage: &Arc<dyn Storage>, topic: &str) -> Result<()> {
    let stored: HashSet<String> = storage
        .list_topics()
        .map_err(store)?
        .into_iter()
        .map(|t| t.name)
        .collect();
    for sub in storage.list_subscriptions(topic).map_err(store)? {
        let (retry, dlq) = crate::tier_owners::tier_names(&sub)
            .map_err(|e| ReplicationError::Apply(e.to_string()))?;
        storage.delete_subscription(&sub).map_err(store)?;
        for tier in [retry, dlq] {
            if stored.contains(&tier) {
                storage.delete_topic(&tier).map_err(store)?;
            }
        }
    }
    if stored.contains(topic) {
        storage.delete_topic(topic).map_err(store)?;
    }
    for job in storage.replay_jobs(false).map_err(store)? {
        if job.topic == topic {
            storage.remove_replay_job(job.id).map_err(store)?;
        }
    }
    storage.delete_retention(topic).map_err(store)?;
    if storage.offload_policy(topic).map_err(store)?.is_some() {
        storage
            .put_offload_policy(topic, &Default::default())
            .map_err(store)?;
    }
    Ok(())
}

/// Replaces partition `topic`'s copy in `storage` with the snapshot read
/// from `from`. Answers the largest id the snapshot carries that the
/// store's id counter must pass (subscription and replay job ids, replay
/// intents' sequence ids).
pub(super) fn install(
    storage: &Arc<dyn Storage>,
    topic: &str,
    from: &mut dyn std::io::Read,
) -> Result<u64> {
    let mut r = FrameReader::new(from);
    match r.read::<Record>()? {
        Some(Record::Begin { topic: t, format })
            if t == topic && (format == FORMAT || format == FORMAT_OFFLOADED) => {}
        Some(Record::Begin { topic: t, format }) => {
            return Err(ReplicationError::Codec(format!(
                "a snapshot of {t} (format {format}) offered for {topic} (format {FORMAT})"
            )));
        }
        other => {
            return Err(ReplicationError::Codec(format!(
                "a snapshot that does not begin with its topic: {other:?}"
            )));
        }
    }
    delete_copy(storage, topic)?;
    let mut heads: Vec<LogHead> = Vec::new();
    let mut highest = 0u64;
    let mut entries = 0u64;
    loop {
        let Some(record) = r.read::<Record>()? else {
            return Err(ReplicationError::Codec("a snapshot without its end".into()));
        };
        match record {
            Record::Begin { .. } => {
                return Err(ReplicationError::Codec("a snapshot begins twice".into()));
            }
            Record::Log(head) => {
                storage.put_topic(&head.record).map_err(store)?;
                if let Some(p) = &head.offload_policy {
                    storage
                        .put_offload_policy(&head.record.name, p)
                        .map_err(store)?;
                }
                for state in &head.offloaded {
                    if state.topic != head.record.name {
                        return Err(ReplicationError::Codec(format!(
                            "a snapshot's log {} carries an offload record of {}",
                            head.record.name, state.topic
                        )));
                    }
                    storage.put_offload_record(state).map_err(store)?;
                }
                heads.push(head);
            }
            Record::Subscription(b) => {
                let (rec, state) = *b;
                highest = highest.max(rec.id);
                for (_, d) in &state.dead_letters {
                    if let Some(i) = &d.replay {
                        highest = highest.max(i.sequence_id);
                    }
                }
                storage.put_subscription(&rec).map_err(store)?;
                storage
                    .restore_subscription_state(rec.id, &state)
                    .map_err(store)?;
            }
            Record::ReplayJob(job) => {
                highest = highest.max(job.id);
                storage.put_replay_job(&job).map_err(store)?;
            }
            Record::Retention(r) if r.target == topic => {
                storage.put_retention(&r).map_err(store)?;
            }
            Record::Retention(r) => {
                return Err(ReplicationError::Codec(format!(
                    "a snapshot of {topic} holds the retention policy of {}",
                    r.target
                )));
            }
            Record::Entries {
                topic: log,
                first_id,
                entries: batch,
            } => {
                if !heads.iter().any(|h| h.record.name == log) {
                    return Err(ReplicationError::Codec(format!(
                        "a snapshot holds entries of {log}, not one of its logs"
                    )));
                }
                let batch: Vec<&[u8]> = batch.iter().map(|b| b.as_slice()).collect();
                entries += batch.len() as u64;
                storage
                    .append_replicated(&log, first_id, &batch, None)
                    .map_err(store)?;
            }
            Record::End { logs, entries: n } => {
                if logs != heads.len() as u64 || n != entries {
                    return Err(ReplicationError::Codec(format!(
                        "a snapshot ends with {logs} logs and {n} entries; it held {} and {entries}",
                        heads.len()
                    )));
                }
                break;
            }
        }
    }
    for head in &heads {
        storage
            .restore_producer_sequences(&head.record.name, &head.sequences)
            .map_err(store)?;
    }
    Ok(highest)
}
