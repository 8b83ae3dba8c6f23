//! [`Watched`]: any [`Storage`] with a memory for damage. Every call goes
//! through to the engine; a call that fails with [`StorageError::Corrupt`]
//! (a checksum mismatch, a record that does not decode, sled's own
//! corruption report) is logged once and turns [`Storage::intact`] false
//! for good, which the broker's health task reports as
//! `ricochet_storage_healthy 0` and a NOT_SERVING health status. The read
//! itself still fails; nothing is served in its place.

use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A storage engine whose corrupt reads are remembered.
#[derive(Debug)]
pub struct Watched {
    inner: Arc<dyn Storage>,
    damaged: AtomicBool,
}

impl Watched {
    /// Watches `inner`.
    pub fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            damaged: AtomicBool::new(false),
        }
    }

    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(StorageError::Corrupt(what)) = &r
            && !self.damaged.swap(true, Ordering::AcqRel)
        {
            tracing::error!(
                damage = %what,
                "storage holds damaged data: the read fails and storage health turns bad \
                 (stop the broker and run `ricochet-broker check`)"
            );
        }
        r
    }
}

impl LogStore for Watched {
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        self.note(self.inner.append(topic, first_id, entries, producer))
    }

    fn append_replicated(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[&[u8]],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        self.note(
            self.inner
                .append_replicated(topic, first_id, entries, producer),
        )
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        self.note(self.inner.read(topic, from, max, max_bytes))
    }

    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>> {
        self.note(self.inner.read_one(topic, id))
    }

    fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        self.note(self.inner.read_many(topic, ids))
    }

    fn entry_range(&self, topic: &str) -> Result<(u64, u64)> {
        self.note(self.inner.entry_range(topic))
    }

    fn trim(&self, topic: &str, below: u64) -> Result<()> {
        self.note(self.inner.trim(topic, below))
    }

    fn lowest_reference(&self, topic: &str) -> Result<Option<u64>> {
        self.note(self.inner.lowest_reference(topic))
    }

    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()> {
        self.note(self.inner.remove_entries(topic, ids))
    }

    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>> {
        self.note(self.inner.producer_sequences(topic))
    }

    fn restore_producer_sequences(&self, topic: &str, sequences: &[(String, u64)]) -> Result<()> {
        self.note(self.inner.restore_producer_sequences(topic, sequences))
    }

    fn seal_segment(&self, topic: &str, below: u64) -> Result<()> {
        self.note(self.inner.seal_segment(topic, below))
    }

    fn seal_due(&self, topic: &str) -> Result<Option<u64>> {
        self.note(self.inner.seal_due(topic))
    }

    fn offload_records(&self, topic: &str) -> Result<Vec<tiered::SegmentState>> {
        self.note(self.inner.offload_records(topic))
    }

    fn put_offload_record(&self, state: &tiered::SegmentState) -> Result<()> {
        self.note(self.inner.put_offload_record(state))
    }

    fn offload_policy(&self, topic: &str) -> Result<Option<tiered::policy::OffloadPolicy>> {
        self.inner.offload_policy(topic)
    }

    fn put_offload_policy(
        &self,
        topic: &str,
        policy: &tiered::policy::OffloadPolicy,
    ) -> Result<()> {
        self.note(self.inner.put_offload_policy(topic, policy))
    }

    fn delete_offloaded_objects(&self, keys: Vec<String>) -> Result<()> {
        self.inner.delete_offloaded_objects(keys)
    }
}

impl SubscriptionStore for Watched {
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>> {
        self.note(self.inner.list_subscriptions(topic))
    }

    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.note(self.inner.put_subscription(record))
    }

    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        self.note(self.inner.delete_subscription(record))
    }

    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>> {
        self.note(self.inner.failure(message, due_ms))
    }

    fn failures_many(
        &self,
        keys: &[(SubMessage, Option<u64>)],
    ) -> Result<Vec<Option<FailureRecord>>> {
        self.note(self.inner.failures_many(keys))
    }

    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>> {
        self.note(self.inner.failures_of(sub_id, tier))
    }

    fn held_heads_due(
        &self,
        sub_id: u64,
        after_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, FailureHead)>> {
        self.note(self.inner.held_heads_due(sub_id, after_ms, to_ms))
    }

    fn main_failure_heads_by(&self, sub_id: u64, horizon_ms: u64) -> Result<MainHeads> {
        self.note(self.inner.main_failure_heads_by(sub_id, horizon_ms))
    }

    fn main_failure_heads(&self, sub_id: u64) -> Result<Vec<(u64, FailureHead)>> {
        self.note(self.inner.main_failure_heads(sub_id))
    }

    fn failure_heads(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureHead)>> {
        self.note(self.inner.failure_heads(sub_id, tier))
    }

    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()> {
        self.note(self.inner.put_failures(records))
    }

    fn put_held(
        &self,
        held: &[(ScheduleKey, FailureRecord)],
        unschedule: &[ScheduleKey],
    ) -> Result<()> {
        self.note(self.inner.put_held(held, unschedule))
    }

    fn scheduled(
        &self,
        after: Option<ScheduleKey>,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<ScheduleKey>> {
        self.note(self.inner.scheduled(after, to_ms, limit))
    }

    fn put_schedule(&self, keys: &[(ScheduleKey, bool)]) -> Result<()> {
        self.note(self.inner.put_schedule(keys))
    }

    fn subscription_state(&self, sub_id: u64) -> Result<SubscriptionState> {
        self.note(self.inner.subscription_state(sub_id))
    }

    fn restore_subscription_state(&self, sub_id: u64, state: &SubscriptionState) -> Result<()> {
        self.note(self.inner.restore_subscription_state(sub_id, state))
    }

    fn move_messages(&self, mv: &TierMove) -> Result<()> {
        self.note(self.inner.move_messages(mv))
    }

    fn dead_letters(
        &self,
        sub_id: u64,
        after: Option<u64>,
    ) -> Result<Vec<(u64, DeadLetterRecord)>> {
        self.note(self.inner.dead_letters(sub_id, after))
    }

    fn count_dead_letters(&self, sub_id: u64) -> Result<u64> {
        self.note(self.inner.count_dead_letters(sub_id))
    }

    fn remove_dead_letters(&self, sub_id: u64, ids: &[u64]) -> Result<()> {
        self.note(self.inner.remove_dead_letters(sub_id, ids))
    }

    fn dead_letters_by_id(&self, sub_id: u64, ids: &[u64]) -> Result<Vec<(u64, DeadLetterRecord)>> {
        self.note(self.inner.dead_letters_by_id(sub_id, ids))
    }

    fn put_dead_letters(&self, sub_id: u64, records: &[(u64, DeadLetterRecord)]) -> Result<()> {
        self.note(self.inner.put_dead_letters(sub_id, records))
    }

    fn return_dead_letters(&self, mv: &DeadLetterReturn) -> Result<()> {
        self.note(self.inner.return_dead_letters(mv))
    }

    fn replay_jobs(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>> {
        self.note(self.inner.replay_jobs(with_ids))
    }

    fn put_replay_job(&self, job: &ReplayJobRecord) -> Result<()> {
        self.note(self.inner.put_replay_job(job))
    }

    fn remove_replay_job(&self, id: u64) -> Result<()> {
        self.note(self.inner.remove_replay_job(id))
    }
}

#[async_trait::async_trait]
impl MetaStore for Watched {
    fn grants(&self) -> Result<Vec<GrantRecord>> {
        self.note(self.inner.grants())
    }

    fn put_grant(&self, record: &GrantRecord) -> Result<()> {
        self.note(self.inner.put_grant(record))
    }

    fn delete_grant(&self, role: &str, resource: &str) -> Result<()> {
        self.note(self.inner.delete_grant(role, resource))
    }

    fn retention_policies(&self) -> Result<Vec<RetentionRecord>> {
        self.note(self.inner.retention_policies())
    }

    fn put_retention(&self, record: &RetentionRecord) -> Result<()> {
        self.note(self.inner.put_retention(record))
    }

    fn delete_retention(&self, target: &str) -> Result<()> {
        self.note(self.inner.delete_retention(target))
    }

    fn list_topics(&self) -> Result<Vec<TopicRecord>> {
        self.note(self.inner.list_topics())
    }

    fn put_topic(&self, record: &TopicRecord) -> Result<()> {
        self.note(self.inner.put_topic(record))
    }

    fn delete_topic(&self, name: &str) -> Result<()> {
        self.note(self.inner.delete_topic(name))
    }

    fn list_partitioned(&self) -> Result<Vec<PartitionedRecord>> {
        self.note(self.inner.list_partitioned())
    }

    fn put_partitioned(&self, record: &PartitionedRecord) -> Result<()> {
        self.note(self.inner.put_partitioned(record))
    }

    fn delete_partitioned(&self, name: &str) -> Result<()> {
        self.note(self.inner.delete_partitioned(name))
    }

    fn next_id(&self) -> Result<u64> {
        self.note(self.inner.next_id())
    }

    fn size_on_disk(&self) -> Result<u64> {
        self.note(self.inner.size_on_disk())
    }

    async fn flush(&self) -> Result<()> {
        let r = self.inner.flush().await;
        self.note(r)
    }

    fn inventory(&self, counts: bool) -> Result<Inventory> {
        self.note(self.inner.inventory(counts))
    }

    fn set_store_id(&self, id: &str) -> Result<()> {
        self.note(self.inner.set_store_id(id))
    }

    fn load_manifest(&self) -> Result<Option<Manifest>> {
        self.note(self.inner.load_manifest())
    }

    async fn save_manifest(&self, manifest: &Manifest) -> Result<()> {
        let r = self.inner.save_manifest(manifest).await;
        self.note(r)
    }

    fn intact(&self) -> bool {
        !self.damaged.load(Ordering::Acquire) && self.inner.intact()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_read_fails_and_turns_the_store_unhealthy_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let sled = SledStorage::open(dir.path(), 16, 8 << 20).unwrap();
        sled.append("good", 0, &[b"x".to_vec()], None).unwrap();
        sled.append("bad", 0, &[b"y".to_vec()], None).unwrap();
        sled.damage_entry("bad", 0, 7);
        let s = Watched::new(Arc::new(sled));
        assert_eq!(s.read("good", 0, 10, usize::MAX).unwrap().len(), 1);
        assert!(s.intact());
        assert!(matches!(
            s.read("bad", 0, 10, usize::MAX),
            Err(StorageError::Corrupt(_))
        ));
        assert!(!s.intact());
        assert_eq!(s.read("good", 0, 10, usize::MAX).unwrap().len(), 1);
        assert!(!s.intact(), "stays unhealthy");
    }
}
