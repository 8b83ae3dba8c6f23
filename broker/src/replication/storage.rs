//! [`ReplicatedStorage`]: the [`Storage`] a replicated partition's topic
//! and subscription actors write through on the group's leader.
//! Every mutating call a topic's actors make is proposed to the group as a
//! [`PartitionCommand`], through one ordered queue per partition
//! ([`super::pipeline`]) that keeps many commands in flight (the leader
//! appends and replicates those that arrive together at once); reads go to
//! this replica's local store.
//!
//! Most calls wait in place until their command is committed by a majority
//! and applied here (the `Storage` trait is synchronous: the wait is a
//! [`tokio::task::block_in_place`]; on a current-thread runtime that cannot
//! be done and the call fails). Two are queued and not awaited, because
//! their callers wait for [`MetaStore::flush`] before they report anything:
//! `append` (the topic's writer queues its batches in id order under its
//! lock, and `Topic::settle` waits for the flush after releasing it) and
//! `put_subscription_queued` (a subscription's cursor moves, whose acks are
//! confirmed after its flusher's `durable`, which waits for this storage's
//! `flush`). `flush` waits until every command queued before it was
//! committed and applied; a failed command fails it.
//!
//! Covered (a command each): `append`, `put_subscription`,
//! `delete_subscription`, `put_failures`, `put_schedule`, `move_messages`,
//! `put_topic` (tier topics), `delete_topic`, `remove_entries`, the
//! dead-letter edits (`remove_dead_letters`, `put_dead_letters`,
//! `return_dead_letters`) and replay jobs (`put_replay_job`,
//! `remove_replay_job`), the topic's own retention policy (`put_retention`,
//! `delete_retention`), a segment the leader offloaded
//! (`put_offload_record`, [`PartitionCommand::Offloaded`]), a seal of the
//! log's active segment (`seal_segment`, [`PartitionCommand::SealBelow`])
//! and the topic's own offload policy (`put_offload_policy`); an empty
//! `put_failures` or
//! `put_schedule` writes
//! nothing and proposes nothing. `next_id` reads this replica's counter, which
//! every replica raises past the ids the group's commands carry. `trim`
//! (retention, or segments every subscription consumed) is a command too,
//! [`PartitionCommand::trim_log`]: every replica drops its segments below
//! the trim point, the leader's copy only by applying it like the others,
//! and reads here skip ids below the trim point its copy applied (a
//! replica whose segments end elsewhere may hold a few more; none is
//! served). Every other mutating method fails with
//! [`StorageError::Replication`] naming it: restores, grants, namespaces'
//! retention, partition counts and the manifest are not replicated, and must not be
//! written to one replica silently.

use super::pipeline::Pipeline;
use super::{AppendRef, PartitionCommand, ReplicatedPartition};
use crate::storage::{
    DeadLetterRecord, DeadLetterReturn, FailureHead, FailureRecord, GrantRecord, Inventory,
    LogStore, MainHeads, Manifest, MetaStore, PartitionedRecord, ReplayJobRecord, RetentionRecord,
    ScheduleKey, Storage, StorageError, SubMessage, SubscriptionRecord, SubscriptionState,
    SubscriptionStore, TierId, TierMove, TopicRecord,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Result<T> = std::result::Result<T, StorageError>;

/// The store of one replicated partition on its leader (see the module).
#[derive(Debug, Clone)]
pub struct ReplicatedStorage {
    local: Arc<dyn Storage>,
    /// Set once a write failed or its outcome is unknown, or the broker
    /// stopped leading: every later write fails, and the topic must be
    /// opened again from the applied store (its writer's next id and the
    /// actors' state may be behind what the group committed).
    poisoned: Arc<AtomicBool>,
    /// The runtime the group's Raft node runs on, when not the caller's:
    /// the proposal is awaited there, so a caller's runtime whose workers
    /// all wait (on a lock held across this very write) cannot hold up the
    /// commit it waits for.
    raft: Option<tokio::runtime::Handle>,
    /// The ordered queue every write goes through.
    pipeline: Arc<Pipeline>,
    /// The trim points of the partition's logs this replica applied, by
    /// topic (read from its store at first use: a leader applied every
    /// trim committed before it took the topic, and every later one is
    /// its own, [`LogStore::trim`] here).
    floors: Arc<Mutex<Option<HashMap<String, u64>>>>,
}

impl ReplicatedStorage {
    /// Writes through `partition`'s group, reads its local store; a write
    /// the group did not commit within `timeout` fails (it may still
    /// commit later: the caller answers nobody it succeeded).
    pub fn new(partition: Arc<ReplicatedPartition>, timeout: Duration) -> Self {
        let local = partition.storage().clone();
        let poisoned: Arc<AtomicBool> = Arc::default();
        let pipeline = Arc::new(Pipeline::new(partition, timeout, poisoned.clone()));
        Self {
            local,
            poisoned,
            raft: None,
            pipeline,
            floors: Arc::default(),
        }
    }

    /// Awaits proposals on `raft`, the runtime the group's node runs on.
    pub fn with_raft_runtime(mut self, raft: tokio::runtime::Handle) -> Self {
        self.raft = Some(raft);
        self
    }

    /// Whether a write failed (or [`ReplicatedStorage::retire`] was
    /// called): no write goes through any more.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Confirms with a majority that this broker still leads the group and
    /// waits until everything committed so far is applied here (openraft's
    /// `ensure_linearizable`): what the local store says afterwards is the
    /// group's state as of now, not a deposed leader's or one behind its
    /// own log. A step that acts on an absence (a sweep deleting what no
    /// record names) goes after it.
    pub async fn confirm_leading(&self) -> Result<()> {
        let raft = self.pipeline.partition().node().raft().clone();
        let barrier = async move { raft.ensure_linearizable().await.map(|_| ()) };
        let done = match &self.raft {
            Some(rt) => rt
                .spawn(barrier)
                .await
                .map_err(|e| StorageError::Replication(format!("the barrier task ended: {e}")))?,
            None => barrier.await,
        };
        done.map_err(|e| StorageError::Replication(format!("not confirmed as leader: {e}")))
    }

    /// Whether writes queued together may be proposed as one coalesced
    /// entry (`PartitionCommand::Sequence`): only while every member of the
    /// group advertises [`super::gate::COALESCED`]; off until set. Returns
    /// the previous setting.
    pub fn set_coalescing(&self, on: bool) -> bool {
        self.pipeline.set_coalescing(on)
    }

    /// Counts the coalesced entries this storage's write queue proposes in
    /// `topic`'s series (`ricochet_raft_coalesced_entries_total` and
    /// `ricochet_raft_coalesced_commands_total`); set before the first
    /// write (the queue's task takes the counters when it starts).
    pub fn count_as(&self, topic: &str) {
        self.pipeline.count_as(topic);
    }

    /// Refuses every later write (this broker stopped leading the group).
    pub fn retire(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Proposes `command` behind every write queued before it and waits
    /// in place until it is committed and applied here.
    fn propose(&self, command: PartitionCommand) -> Result<()> {
        let handle = self.runtime()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.pipeline
            .submit(&command, Some(tx), self.raft.as_ref())
            .map_err(StorageError::Replication)?;
        match tokio::task::block_in_place(|| handle.block_on(rx)) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(why)) => Err(StorageError::Replication(why)),
            Err(_) => Err(StorageError::Replication(
                "the write queue ended before the write was answered".into(),
            )),
        }
    }

    /// The trim point of `topic` this replica applied (0: none); nothing
    /// below it is served.
    fn floor(&self, topic: &str) -> Result<u64> {
        let mut floors = crate::util::lock(&self.floors);
        let floors = match &mut *floors {
            Some(f) => f,
            none => none.insert(trim_points(self.local.as_ref())?),
        };
        Ok(floors.get(topic).copied().unwrap_or(0))
    }

    /// The caller's runtime, if a write may wait in place on it.
    fn runtime(&self) -> Result<tokio::runtime::Handle> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            StorageError::Replication("a replicated write outside a tokio runtime".into())
        })?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(StorageError::Replication(
                "a replicated write needs the multi-thread tokio runtime".into(),
            ));
        }
        Ok(handle)
    }

    /// Queues `command` behind every write queued before it and returns at
    /// once: [`MetaStore::flush`] waits until it is committed and applied
    /// (a failure then poisons the storage and fails that wait).
    fn propose_later(&self, command: PartitionCommand) -> Result<()> {
        self.pipeline
            .submit(&command, None, self.raft.as_ref())
            .map(|_| ())
            .map_err(StorageError::Replication)
    }
}

/// The trim points stored in `storage`'s records of logs, by topic.
fn trim_points(storage: &dyn Storage) -> Result<HashMap<String, u64>> {
    Ok(storage
        .list_topics()?
        .into_iter()
        .filter(|t| t.trimmed_below > 0)
        .map(|t| (t.name, t.trimmed_below))
        .collect())
}

/// The error of a mutating method no command replicates.
fn not_replicated(method: &str) -> StorageError {
    StorageError::Replication(format!(
        "{method} is not replicated yet: refused on a replicated partition"
    ))
}

impl LogStore for ReplicatedStorage {
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        // Not awaited here: the topic's writer queues its batches in id
        // order under its lock and waits for them after releasing it
        // (`Topic::settle` calls `flush`).
        // Encoded from the borrowed entries: the bytes of
        // `PartitionCommand::Append(AppendBatch { .. })`.
        let append = AppendRef {
            topic,
            first_id,
            entries,
            producer,
        };
        let command = ricochet_replication::encode_sized(&append, append.size_hint())
            .map_err(|e| StorageError::Replication(e.to_string()))?;
        self.pipeline
            .submit_encoded(command, None, self.raft.as_ref())
            .map(|_| ())
            .map_err(StorageError::Replication)
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let from = from.max(self.floor(topic)?);
        self.local.read(topic, from, max, max_bytes)
    }

    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>> {
        if id < self.floor(topic)? {
            return Ok(None);
        }
        self.local.read_one(topic, id)
    }

    fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        let floor = self.floor(topic)?;
        let mut read = self.local.read_many(topic, ids)?;
        for (id, entry) in ids.iter().zip(read.iter_mut()) {
            if *id < floor {
                *entry = None;
            }
        }
        Ok(read)
    }

    fn entry_range(&self, topic: &str) -> Result<(u64, u64)> {
        let (first, next) = self.local.entry_range(topic)?;
        Ok((first.max(self.floor(topic)?).min(next), next))
    }

    /// The group's trim ([`PartitionCommand::trim_log`]), proposed behind
    /// every write queued before it (the cursors that allow it may have
    /// been queued just now, and no replica may drop entries the group's
    /// committed cursors still need) and awaited in place; this replica
    /// drops its segments when it applies it, as every other does. A trim
    /// point not above the one applied here proposes nothing.
    fn trim(&self, topic: &str, below: u64) -> Result<()> {
        if below <= self.floor(topic)? {
            return Ok(());
        }
        let Some(record) = self
            .local
            .list_topics()?
            .into_iter()
            .find(|t| t.name == topic)
        else {
            return Ok(());
        };
        self.propose(PartitionCommand::trim_log(&record, below))?;
        // What the apply stored (it never passes the log's end).
        let applied = trim_points(self.local.as_ref())?;
        *crate::util::lock(&self.floors) = Some(applied);
        Ok(())
    }

    fn lowest_reference(&self, topic: &str) -> Result<Option<u64>> {
        self.local.lowest_reference(topic)
    }

    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()> {
        self.propose(PartitionCommand::RemoveEntries {
            topic: topic.to_owned(),
            ids: ids.to_vec(),
        })
    }

    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>> {
        self.local.producer_sequences(topic)
    }

    fn restore_producer_sequences(&self, _topic: &str, _s: &[(String, u64)]) -> Result<()> {
        Err(not_replicated("restore_producer_sequences"))
    }

    fn offload_records(&self, topic: &str) -> Result<Vec<crate::storage::tiered::SegmentState>> {
        self.local.offload_records(topic)
    }

    /// The leader's offload of a segment it uploaded and verified: proposed
    /// behind every write queued before it and awaited in place; this
    /// replica records it and drops its copy when it applies it, as every
    /// other does.
    fn put_offload_record(&self, state: &crate::storage::tiered::SegmentState) -> Result<()> {
        self.propose(PartitionCommand::Offloaded(state.clone()))
    }

    /// The leader's age roll, or its seal before an offload: a command of
    /// the group ([`PartitionCommand::SealBelow`]), behind every write
    /// queued before it, awaited in place; every replica seals its active
    /// segment where it applies it, if it holds an id below `below`.
    fn seal_segment(&self, topic: &str, below: u64) -> Result<()> {
        self.propose(PartitionCommand::SealBelow {
            topic: topic.to_owned(),
            below,
        })
    }

    /// This replica's (the leader's) applied log says.
    fn seal_due(&self, topic: &str) -> Result<Option<u64>> {
        self.local.seal_due(topic)
    }

    fn offload_policy(
        &self,
        topic: &str,
    ) -> Result<Option<crate::storage::tiered::policy::OffloadPolicy>> {
        self.local.offload_policy(topic)
    }

    /// The topic's own offload policy, a command of the group
    /// ([`PartitionCommand::PutOffloadPolicy`]).
    fn put_offload_policy(
        &self,
        topic: &str,
        policy: &crate::storage::tiered::policy::OffloadPolicy,
    ) -> Result<()> {
        self.propose(PartitionCommand::PutOffloadPolicy {
            topic: topic.to_owned(),
            policy: policy.clone(),
        })
    }

    fn delete_offloaded_objects(&self, _keys: Vec<String>) -> Result<()> {
        Err(not_replicated("delete_offloaded_objects"))
    }
}

impl SubscriptionStore for ReplicatedStorage {
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>> {
        self.local.list_subscriptions(topic)
    }

    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.propose(PartitionCommand::PutSubscription(record.clone()))
    }

    /// Queued, not awaited: the subscription's actor answers its acks
    /// after its flusher's `durable`, which on a replicated topic waits for
    /// [`MetaStore::flush`] here.
    fn put_subscription_queued(&self, record: &SubscriptionRecord) -> Result<()> {
        self.propose_later(PartitionCommand::PutSubscription(record.clone()))
    }

    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.propose(PartitionCommand::DeleteSubscription(record.clone()))
    }

    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>> {
        self.local.failure(message, due_ms)
    }

    fn failures_many(
        &self,
        keys: &[(SubMessage, Option<u64>)],
    ) -> Result<Vec<Option<FailureRecord>>> {
        self.local.failures_many(keys)
    }

    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>> {
        self.local.failures_of(sub_id, tier)
    }

    fn main_failure_heads_by(&self, sub_id: u64, horizon_ms: u64) -> Result<MainHeads> {
        self.local.main_failure_heads_by(sub_id, horizon_ms)
    }

    fn main_failure_heads(&self, sub_id: u64) -> Result<Vec<(u64, FailureHead)>> {
        self.local.main_failure_heads(sub_id)
    }

    fn held_heads_due(
        &self,
        sub_id: u64,
        after_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, FailureHead)>> {
        self.local.held_heads_due(sub_id, after_ms, to_ms)
    }

    fn failure_heads(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureHead)>> {
        self.local.failure_heads(sub_id, tier)
    }

    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.propose(PartitionCommand::PutFailures(records.to_vec()))
    }

    fn scheduled(
        &self,
        after: Option<ScheduleKey>,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<ScheduleKey>> {
        self.local.scheduled(after, to_ms, limit)
    }

    fn put_schedule(&self, keys: &[(ScheduleKey, bool)]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        self.propose(PartitionCommand::PutSchedule(keys.to_vec()))
    }

    fn move_messages(&self, mv: &TierMove) -> Result<()> {
        self.propose(PartitionCommand::MoveMessages(mv.clone()))
    }

    fn dead_letters(
        &self,
        sub_id: u64,
        after: Option<u64>,
    ) -> Result<Vec<(u64, DeadLetterRecord)>> {
        self.local.dead_letters(sub_id, after)
    }

    fn count_dead_letters(&self, sub_id: u64) -> Result<u64> {
        self.local.count_dead_letters(sub_id)
    }

    fn remove_dead_letters(&self, sub_id: u64, ids: &[u64]) -> Result<()> {
        self.propose(PartitionCommand::RemoveDeadLetters {
            sub_id,
            ids: ids.to_vec(),
        })
    }

    fn dead_letters_by_id(&self, sub_id: u64, ids: &[u64]) -> Result<Vec<(u64, DeadLetterRecord)>> {
        self.local.dead_letters_by_id(sub_id, ids)
    }

    fn put_dead_letters(&self, sub_id: u64, records: &[(u64, DeadLetterRecord)]) -> Result<()> {
        self.propose(PartitionCommand::PutDeadLetters {
            sub_id,
            records: records.to_vec(),
        })
    }

    fn return_dead_letters(&self, mv: &DeadLetterReturn) -> Result<()> {
        self.propose(PartitionCommand::ReturnDeadLetters(mv.clone()))
    }

    fn replay_jobs(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>> {
        self.local.replay_jobs(with_ids)
    }

    fn put_replay_job(&self, job: &ReplayJobRecord) -> Result<()> {
        self.propose(PartitionCommand::PutReplayJob(job.clone()))
    }

    fn remove_replay_job(&self, id: u64) -> Result<()> {
        self.propose(PartitionCommand::RemoveReplayJob(id))
    }

    fn subscription_state(&self, sub_id: u64) -> Result<SubscriptionState> {
        self.local.subscription_state(sub_id)
    }

    fn restore_subscription_state(&self, _id: u64, _s: &SubscriptionState) -> Result<()> {
        Err(not_replicated("restore_subscription_state"))
    }
}

#[async_trait::async_trait]
impl MetaStore for ReplicatedStorage {
    fn list_topics(&self) -> Result<Vec<TopicRecord>> {
        self.local.list_topics()
    }

    fn put_topic(&self, record: &TopicRecord) -> Result<()> {
        self.propose(PartitionCommand::CreateTopic(record.clone()))
    }

    fn delete_topic(&self, name: &str) -> Result<()> {
        self.propose(PartitionCommand::DeleteTopic(name.to_owned()))?;
        // A log created again under the name starts untrimmed.
        if let Some(f) = crate::util::lock(&self.floors).as_mut() {
            f.remove(name);
        }
        Ok(())
    }

    fn list_partitioned(&self) -> Result<Vec<PartitionedRecord>> {
        self.local.list_partitioned()
    }

    fn put_partitioned(&self, _record: &PartitionedRecord) -> Result<()> {
        Err(not_replicated("put_partitioned"))
    }

    fn delete_partitioned(&self, _name: &str) -> Result<()> {
        Err(not_replicated("delete_partitioned"))
    }

    /// From this replica's counter: every replica raises its own past the
    /// ids a command carries ([`PartitionCommand::issued_ids`]), so an id
    /// the group committed is never handed out again by a later leader.
    fn next_id(&self) -> Result<u64> {
        self.local.next_id()
    }

    fn grants(&self) -> Result<Vec<GrantRecord>> {
        self.local.grants()
    }

    fn put_grant(&self, _record: &GrantRecord) -> Result<()> {
        Err(not_replicated("put_grant"))
    }

    fn delete_grant(&self, _role: &str, _resource: &str) -> Result<()> {
        Err(not_replicated("delete_grant"))
    }

    fn retention_policies(&self) -> Result<Vec<RetentionRecord>> {
        self.local.retention_policies()
    }

    /// The partition's own policy (its namespace's is stored per broker
    /// and never written through a group).
    fn put_retention(&self, record: &RetentionRecord) -> Result<()> {
        self.propose(PartitionCommand::PutRetention(record.clone()))
    }

    fn delete_retention(&self, target: &str) -> Result<()> {
        self.propose(PartitionCommand::DeleteRetention(target.to_owned()))
    }

    fn size_on_disk(&self) -> Result<u64> {
        self.local.size_on_disk()
    }

    /// Waits until every write queued before the call was committed by a
    /// majority and applied here (a write queued without waiting, as a
    /// topic's appends are); fails if one of them failed. The state
    /// machine flushes what it applies (`sync`).
    async fn flush(&self) -> Result<()> {
        let last = self.pipeline.last_submitted();
        self.pipeline
            .wait_for(last)
            .await
            .map_err(StorageError::Replication)
    }

    fn inventory(&self, counts: bool) -> Result<Inventory> {
        self.local.inventory(counts)
    }

    fn set_store_id(&self, _id: &str) -> Result<()> {
        Err(not_replicated("set_store_id"))
    }

    fn load_manifest(&self) -> Result<Option<Manifest>> {
        self.local.load_manifest()
    }

    async fn save_manifest(&self, _manifest: &Manifest) -> Result<()> {
        Err(not_replicated("save_manifest"))
    }

    fn intact(&self) -> bool {
        self.local.intact()
    }
}
