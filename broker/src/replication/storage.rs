//! [`ReplicatedStorage`]: the [`Storage`] a replicated partition's topic
//! and subscription actors would write through on the group's leader.
//! Every mutating call a topic's actors make is proposed to the group as a
//! [`PartitionCommand`] and returns only once a majority committed it and
//! this replica applied it to its local store; reads go to that local
//! store. A call is synchronous (the `Storage` trait is), so the proposal
//! is awaited in place ([`tokio::task::block_in_place`]); on a
//! current-thread runtime that cannot be done and the call fails.
//!
//! Covered (a command each): `append`, `put_subscription`,
//! `delete_subscription`, `put_failures`, `put_schedule`, `move_messages`,
//! `put_topic` (tier topics), `delete_topic`, `remove_entries`, the
//! dead-letter edits (`remove_dead_letters`, `put_dead_letters`,
//! `return_dead_letters`) and replay jobs (`put_replay_job`,
//! `remove_replay_job`). `next_id` reads this replica's counter, which
//! every replica raises past the ids the group's commands carry. `trim` is
//! applied locally only (it drops segments every subscription consumed, by
//! cursors that are themselves replicated; a follower keeps them until it
//! leads). Every other mutating method fails with
//! [`StorageError::Replication`] naming it: restores, grants, retention,
//! partition counts and the manifest are not replicated, and must not be
//! written to one replica silently.

use super::{AppendBatch, PartitionCommand, PartitionReply, ReplicatedPartition};
use crate::storage::{
    DeadLetterRecord, DeadLetterReturn, FailureHead, FailureRecord, GrantRecord, Inventory,
    LogStore, Manifest, MetaStore, PartitionedRecord, ReplayJobRecord, RetentionRecord,
    ScheduleKey, Storage, StorageError, SubMessage, SubscriptionRecord, SubscriptionState,
    SubscriptionStore, TierId, TierMove, TopicRecord,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

type Result<T> = std::result::Result<T, StorageError>;

/// The store of one replicated partition on its leader (see the module).
#[derive(Debug, Clone)]
pub struct ReplicatedStorage {
    partition: Arc<ReplicatedPartition>,
    local: Arc<dyn Storage>,
    timeout: Duration,
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
}

impl ReplicatedStorage {
    /// Writes through `partition`'s group, reads its local store; a write
    /// the group did not commit within `timeout` fails (it may still
    /// commit later: the caller answers nobody it succeeded).
    pub fn new(partition: Arc<ReplicatedPartition>, timeout: Duration) -> Self {
        let local = partition.storage().clone();
        Self {
            partition,
            local,
            timeout,
            poisoned: Arc::default(),
            raft: None,
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

    /// Refuses every later write (this broker stopped leading the group).
    pub fn retire(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    fn propose(&self, command: PartitionCommand) -> Result<()> {
        if self.is_poisoned() {
            return Err(StorageError::Replication(
                "this replica's topic is being reopened or no longer leads; write again".into(),
            ));
        }
        let r = self.propose_now(command);
        if r.is_err() {
            self.retire();
        }
        r
    }

    /// Proposes `command` and waits for its reply in place.
    fn propose_now(&self, command: PartitionCommand) -> Result<()> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            StorageError::Replication("a replicated write outside a tokio runtime".into())
        })?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(StorageError::Replication(
                "a replicated write needs the multi-thread tokio runtime".into(),
            ));
        }
        let proposal =
            async { tokio::time::timeout(self.timeout, self.partition.propose(&command)).await };
        let on = self.raft.as_ref().unwrap_or(&handle);
        match tokio::task::block_in_place(|| on.block_on(proposal)) {
            Ok(Ok(PartitionReply::Refused(why))) => Err(StorageError::Replication(format!(
                "the group refused the write: {why}"
            ))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StorageError::Replication(e.to_string())),
            Err(_) => Err(StorageError::Replication(format!(
                "not committed by a majority within {:?}",
                self.timeout
            ))),
        }
    }
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
        self.propose(PartitionCommand::Append(AppendBatch {
            topic: topic.to_owned(),
            first_id,
            entries: entries
                .iter()
                .map(|e| serde_bytes::ByteBuf::from(e.clone()))
                .collect(),
            producer: producer.map(|(p, s)| (p.to_owned(), s)),
        }))
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        self.local.read(topic, from, max, max_bytes)
    }

    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>> {
        self.local.read_one(topic, id)
    }

    fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        self.local.read_many(topic, ids)
    }

    fn entry_range(&self, topic: &str) -> Result<(u64, u64)> {
        self.local.entry_range(topic)
    }

    fn trim(&self, topic: &str, below: u64) -> Result<()> {
        self.local.trim(topic, below)
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
}

impl SubscriptionStore for ReplicatedStorage {
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>> {
        self.local.list_subscriptions(topic)
    }

    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.propose(PartitionCommand::PutSubscription(record.clone()))
    }

    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.propose(PartitionCommand::DeleteSubscription(record.clone()))
    }

    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>> {
        self.local.failure(message, due_ms)
    }

    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>> {
        self.local.failures_of(sub_id, tier)
    }

    fn failure_heads(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureHead)>> {
        self.local.failure_heads(sub_id, tier)
    }

    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()> {
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
        self.propose(PartitionCommand::DeleteTopic(name.to_owned()))
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

    fn put_retention(&self, _record: &RetentionRecord) -> Result<()> {
        Err(not_replicated("put_retention"))
    }

    fn delete_retention(&self, _target: &str) -> Result<()> {
        Err(not_replicated("delete_retention"))
    }

    fn size_on_disk(&self) -> Result<u64> {
        self.local.size_on_disk()
    }

    /// Every write was committed by a majority before it returned, and
    /// the state machine flushes what it applies (`sync`): nothing to do.
    async fn flush(&self) -> Result<()> {
        Ok(())
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
