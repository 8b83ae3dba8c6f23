//! Storage: the interface dispatch logic uses (three traits by concern:
//! [`LogStore`], [`SubscriptionStore`], [`MetaStore`]), and its records.
//!
//! Everything the broker persists goes through [`Storage`]: topic logs (in
//! segments that are dropped whole once consumed), subscription cursors,
//! producer sequence ids for de-duplication, per-message failure records
//! (delivery counts and attempt history), the retry schedule, and dead-letter
//! records. [`LogStorage`] is the implementation: ordinary topics' entries
//! in segment files ([`segments`]), everything else in [`SledStorage`]
//! (which alone is the engine with `log_engine = "sled"`, the layout before
//! the segment files); [`MemoryStorage`] is for tests. Another engine can
//! replace them without touching dispatch logic.
//!
//! Writes are not durable until [`Storage::flush`] returns; the broker's
//! flusher groups concurrent writers onto one flush.
//!
//! Integrity: every stored value carries a checksum verified on read (a
//! mismatch is [`StorageError::Corrupt`]), and a [`manifest::Manifest`]
//! kept apart from the store says what the store must hold; [`Watched`]
//! remembers that a read found damage, for the health gauge.

pub mod cursor;
mod error;
mod hybrid;
pub mod manifest;
mod memory;
mod records;
pub mod refs;
pub mod segments;
mod sled_store;
pub mod sled_sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tiered;
pub mod util;
mod watch;

pub use cursor::Cursor;
use error::StorageResult as Result;
pub use error::{StorageError, StorageResult};
pub use hybrid::LogStorage;
pub use manifest::{Inventory, Manifest, TopicInventory};
pub use memory::MemoryStorage;
pub use records::*;
pub use sled_store::{SledStorage, VerifyReport};
pub use watch::Watched;

/// The storage traits, to call their methods on a `dyn Storage`: `use ricochet_storage::prelude::*;`.
pub mod prelude {
    pub use super::{LogStore, MetaStore, Storage, SubscriptionStore};
}

/// The persistence interface the broker's dispatch logic is written against:
/// the three concerns below, which every engine implements. Callers import
/// [`prelude`] to call their methods on a `dyn Storage`.
pub trait Storage: LogStore + SubscriptionStore + MetaStore {}

impl<T: LogStore + SubscriptionStore + MetaStore> Storage for T {}

/// Topic logs: entries appended in batches with their producers' sequence ids,
/// read in order or by id, trimmed by whole segments.
pub trait LogStore: Send + Sync + std::fmt::Debug + 'static {
    /// Writes entries `first_id..first_id + len` (not durable until flushed),
    /// and records `producer`'s last sequence id with them, atomically
    /// against a crash: after one, all of the entries and the sequence id
    /// are there, or none of them, whatever segments the entries span
    /// (a resend of what was kept must be recognised, and no half batch
    /// may survive).
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()>;

    /// [`Self::append`] of a replicated partition's entries, applied from
    /// its group's log: a segment-file log rolls its active segment by id
    /// block and size only, never by its own clock (the group's leader
    /// seals by age, [`Self::seal_segment`]), so every replica's segments
    /// end at the same ids. Other engines append as `append` (a copy of
    /// each entry). The entries are borrowed (the applier slices them out
    /// of the group's command without copying them).
    fn append_replicated(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[&[u8]],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        let owned: Vec<Vec<u8>> = entries.iter().map(|e| e.to_vec()).collect();
        self.append(topic, first_id, &owned, producer)
    }

    /// Up to `max` entries with id `>= from`, in order, stopping early once
    /// `max_bytes` is exceeded.
    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>>;

    /// One entry.
    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>>;

    /// The entries `ids` (any order, duplicates allowed), each `None` when
    /// missing, in the order asked. An engine that stores entries in
    /// frames reads (and checks) each frame once, however many of its
    /// entries are asked for.
    fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        ids.iter().map(|&id| self.read_one(topic, id)).collect()
    }

    /// `(first, next)` entry ids stored for a topic (`first == next` when empty).
    fn entry_range(&self, topic: &str) -> Result<(u64, u64)>;

    /// Drops whole segments that hold only ids `< below`. An engine whose
    /// retry tiers hold references into `topic` ([`refs`]) first replaces
    /// those pointing below `below` with copies.
    fn trim(&self, topic: &str, below: u64) -> Result<()>;

    /// The lowest entry of `topic` a retry-tier reference still points to
    /// (a consumer-driven drop keeps it); `None` when there is none.
    fn lowest_reference(&self, _topic: &str) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Removes entries with ids in `ids` from a topic (dead-letter purge).
    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()>;

    /// Last stored sequence id per producer name.
    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>>;

    /// Sets producers' last stored sequence ids on `topic` (a moved topic's
    /// de-duplication state; not durable until flushed).
    fn restore_producer_sequences(&self, topic: &str, sequences: &[(String, u64)]) -> Result<()>;

    /// Seals `topic`'s active segment if it holds an entry below `below`
    /// (where the leader's log ended when it decided): a replicated
    /// topic's age roll or an offload's seal, its group's command applied
    /// by every replica at the same place in the log, so each seals at the
    /// same id, and applied again after a restart seals nothing (a
    /// replicated store proposes it). An engine without segment files has
    /// nothing to seal.
    fn seal_segment(&self, _topic: &str, _below: u64) -> Result<()> {
        Ok(())
    }

    /// Where `topic`'s active segment ends if it holds entries and is
    /// `segment_max_age` old: the `below` of the age roll its group's
    /// leader proposes ([`Self::seal_segment`]). `None` on an engine
    /// without segment files.
    fn seal_due(&self, _topic: &str) -> Result<Option<u64>> {
        Ok(None)
    }

    /// A replicated topic's offload records (ranges of ids in objects the
    /// group recorded, [`tiered::SegmentState`] with `group` set), oldest
    /// first: what a snapshot carries instead of their entries. None on an
    /// engine without tiered storage.
    fn offload_records(&self, _topic: &str) -> Result<Vec<tiered::SegmentState>> {
        Ok(Vec::new())
    }

    /// Records a replicated topic's offloaded range (its group's command,
    /// applied by every replica) and drops the local segments lying wholly
    /// inside the recorded ranges. An engine without tiered storage
    /// refuses: it could serve neither the range nor its entries.
    fn put_offload_record(&self, state: &tiered::SegmentState) -> Result<()> {
        Err(StorageError::Replication(format!(
            "{} was offloaded by its group, and this broker has no [tiered] section to record it",
            state.topic
        )))
    }

    /// `topic`'s own offload policy, if it has one (a snapshot carries a
    /// replicated topic's). None on an engine without tiered storage.
    fn offload_policy(&self, _topic: &str) -> Result<Option<tiered::policy::OffloadPolicy>> {
        Ok(None)
    }

    /// Sets (or, when empty, clears) `topic`'s own offload policy (a
    /// replicated topic's is its group's command, applied by every
    /// replica). An engine without tiered storage refuses.
    fn put_offload_policy(
        &self,
        topic: &str,
        _policy: &tiered::policy::OffloadPolicy,
    ) -> Result<()> {
        Err(StorageError::Replication(format!(
            "the offload policy of {topic}: this broker has no [tiered] section to store it"
        )))
    }

    /// Deletes the objects `keys` of a replicated topic its group deleted,
    /// once the removal of their records is durable (the group's delete
    /// command; nothing else deletes a group's objects).
    fn delete_offloaded_objects(&self, _keys: Vec<String>) -> Result<()> {
        Ok(())
    }
}

/// Subscription state: cursors' records, failure records (delivery counts and
/// attempt history), the retry schedule, tier moves, dead letters, replay jobs,
/// and a subscription's whole state for a move to another broker.
pub trait SubscriptionStore: Send + Sync + std::fmt::Debug + 'static {
    /// Subscriptions of a topic.
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>>;

    /// Creates or updates a subscription.
    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()>;

    /// [`SubscriptionStore::put_subscription`] for a caller that waits for
    /// [`MetaStore::flush`] (through the broker's group commit) before it
    /// reports the change, as a subscription's cursor moves are: an engine
    /// may queue the write and have `flush` wait for it (a replicated
    /// partition's leader does). By default the same write.
    fn put_subscription_queued(&self, record: &SubscriptionRecord) -> Result<()> {
        self.put_subscription(record)
    }

    /// Removes a subscription with its failure records and schedule.
    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()>;

    /// A message's failure record. A tier move into the retry tier keeps the
    /// record in the message's schedule entry (one stored key fewer per
    /// scheduled retry), so a retry-tier lookup needs its due time;
    /// records written by [`Storage::put_failures`] take precedence.
    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>>;

    /// [`Storage::failure`] of each of `keys` (message and due time), in
    /// the order asked. An engine that keeps several records in one stored
    /// value (the schedule's chunks) reads each value once for all of them:
    /// a burst of retries coming due reads its records in one pass.
    fn failures_many(
        &self,
        keys: &[(SubMessage, Option<u64>)],
    ) -> Result<Vec<Option<FailureRecord>>> {
        keys.iter().map(|&(m, due)| self.failure(m, due)).collect()
    }

    /// All failure records of one tier of a subscription.
    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>>;

    /// The delivery count and hold end of every failure record of one tier
    /// of a subscription, without the attempt histories: what a
    /// subscription's start needs of its held nacks, which can be
    /// millions. Checksums are checked as on every read; an engine that can
    /// skip decoding the histories does.
    fn failure_heads(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureHead)>> {
        Ok(self
            .failures_of(sub_id, tier)?
            .into_iter()
            .map(|(m, f)| (m, FailureHead::of(&f)))
            .collect())
    }

    /// [`Self::failure_heads`] of the main tier by entry id (in no
    /// particular order; sled's are sorted by entry): the form a subscription's start takes its held nacks in
    /// (millions at a time), which an engine that gathers the heads by
    /// entry id hands over without building a second list of them.
    fn main_failure_heads(&self, sub_id: u64) -> Result<Vec<(u64, FailureHead)>> {
        Ok(self
            .failure_heads(sub_id, TierId::Main)?
            .into_iter()
            .map(|(m, h)| (m.entry_id, h))
            .collect())
    }

    /// [`Self::main_failure_heads`] split at `horizon_ms`, the form a
    /// subscription's start takes them in: heads of holds ending by the
    /// cut, entry ids only of later ones (loaded with
    /// [`Self::held_heads_due`] as they come into the retry window). The
    /// engine may split earlier than `horizon_ms` (an engine that gathered
    /// every subscription's heads in one scan at start split them then) or
    /// not at all (`cut_ms` = `u64::MAX`): the caller takes the earlier
    /// of `cut_ms` and its horizon. The default splits
    /// [`Self::main_failure_heads`] at `horizon_ms`.
    fn main_failure_heads_by(&self, sub_id: u64, horizon_ms: u64) -> Result<MainHeads> {
        Ok(MainHeads::split(
            self.main_failure_heads(sub_id)?,
            horizon_ms,
        ))
    }

    /// The heads (count, hold end) of the main-tier records of subscription
    /// `sub_id` whose schedule entries are due after `after_ms` and at or
    /// before `to_ms`, by entry id, in no particular order: what a
    /// subscription loads of its held nacks as their hold ends come into
    /// the retry window (the ones due later stay in storage only). A record
    /// under its own key takes precedence, as in [`Self::failure`]. The
    /// default pages through [`Self::scheduled`] and reads each record; an
    /// engine that keeps heads beside its schedule reads them directly.
    fn held_heads_due(
        &self,
        sub_id: u64,
        after_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, FailureHead)>> {
        const PAGE: usize = 4_096;
        let mut out = Vec::new();
        let mut after = Some(ScheduleKey {
            due_ms: after_ms,
            message: SubMessage {
                sub_id: u64::MAX,
                tier: TierId::Retry,
                entry_id: u64::MAX,
            },
        });
        loop {
            let keys = self.scheduled(after, to_ms.saturating_add(1), PAGE)?;
            let more = keys.len() >= PAGE;
            after = keys.last().copied();
            for k in keys {
                if k.message.sub_id != sub_id || k.message.tier != TierId::Main {
                    continue;
                }
                if let Some(r) = self.failure(k.message, Some(k.due_ms))? {
                    out.push((k.message.entry_id, FailureHead::of(&r)));
                }
            }
            if !more {
                return Ok(out);
            }
        }
    }

    /// Writes (or with `None`, deletes) failure records.
    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()>;

    /// Holds messages in place until their hold ends, atomically against a
    /// crash: removes the schedule entries `unschedule`, then stores each
    /// `(key, record)`'s record (whose `hold_until_ms` is `key.due_ms`)
    /// and its schedule entry `key`. The record is then found by
    /// [`Self::failure`] given `key.due_ms`, and by
    /// [`Self::failure_heads`]; one written later by
    /// [`Self::put_failures`] takes precedence. An engine may keep the
    /// record as the schedule entry's value (sled does: one stored key per
    /// held message).
    fn put_held(
        &self,
        held: &[(ScheduleKey, FailureRecord)],
        unschedule: &[ScheduleKey],
    ) -> Result<()> {
        let records: Vec<_> = held
            .iter()
            .map(|(k, r)| (k.message, Some(r.clone())))
            .collect();
        self.put_failures(&records)?;
        let keys: Vec<_> = unschedule
            .iter()
            .map(|k| (*k, false))
            .chain(held.iter().map(|(k, _)| (*k, true)))
            .collect();
        self.put_schedule(&keys)
    }

    /// Schedule entries after `after` (exclusive; `None` = from the start) with
    /// `due < to_ms`, in key order, at most `limit`.
    fn scheduled(
        &self,
        after: Option<ScheduleKey>,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<ScheduleKey>>;

    /// Adds (`true`, with no failure record) or removes (`false`) schedule entries.
    fn put_schedule(&self, keys: &[(ScheduleKey, bool)]) -> Result<()>;

    /// Applies a batch of tier moves in one transaction.
    fn move_messages(&self, mv: &TierMove) -> Result<()>;

    /// Dead letters of a subscription, in DLQ entry order, from `after` exclusive.
    fn dead_letters(&self, sub_id: u64, after: Option<u64>)
    -> Result<Vec<(u64, DeadLetterRecord)>>;

    /// Number of dead letters a subscription holds (without decoding them).
    fn count_dead_letters(&self, sub_id: u64) -> Result<u64>;

    /// Removes dead-letter records.
    fn remove_dead_letters(&self, sub_id: u64, ids: &[u64]) -> Result<()>;

    /// The dead letters of a subscription among `ids` (those still there).
    fn dead_letters_by_id(&self, sub_id: u64, ids: &[u64]) -> Result<Vec<(u64, DeadLetterRecord)>>;

    /// Replaces dead-letter records (that exist) of a subscription.
    fn put_dead_letters(&self, sub_id: u64, records: &[(u64, DeadLetterRecord)]) -> Result<()>;

    /// Moves dead letters back into the subscription's retry tier in one
    /// transaction (see [`DeadLetterReturn`]); `Missing` (and no change) if
    /// one of them is gone.
    fn return_dead_letters(&self, mv: &DeadLetterReturn) -> Result<()>;

    /// Replay jobs in progress, by id; `with_ids: false` leaves their
    /// (possibly long) id lists out.
    fn replay_jobs(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>>;

    /// Creates a replay job (`cursor == 0`) or updates its progress: the id
    /// list is written with the first put only, so progress updates stay
    /// small. A progress update of a job no longer stored (cancelled) is
    /// ignored.
    fn put_replay_job(&self, job: &ReplayJobRecord) -> Result<()>;

    /// Removes a finished replay job.
    fn remove_replay_job(&self, id: u64) -> Result<()>;

    /// The failure records, schedule entries and dead letters of
    /// subscription `sub_id` (a scan of the schedule), to move it to
    /// another broker.
    fn subscription_state(&self, sub_id: u64) -> Result<SubscriptionState>;

    /// Writes `state` as subscription `sub_id`'s (not durable until
    /// flushed); records already there under the same keys are replaced.
    fn restore_subscription_state(&self, sub_id: u64, state: &SubscriptionState) -> Result<()>;
}

/// Metadata and the store itself: topic and partitioned-topic records, ids,
/// grants, retention policies, size, durability (`flush`) and integrity (the
/// manifest).
#[async_trait::async_trait]
pub trait MetaStore: Send + Sync + std::fmt::Debug + 'static {
    /// All topics.
    fn list_topics(&self) -> Result<Vec<TopicRecord>>;

    /// Creates or updates a topic's record.
    fn put_topic(&self, record: &TopicRecord) -> Result<()>;

    /// Removes a topic, its entries, producer sequences and subscriptions.
    fn delete_topic(&self, name: &str) -> Result<()>;

    /// All partitioned topics' metadata.
    fn list_partitioned(&self) -> Result<Vec<PartitionedRecord>>;

    /// Creates or updates a partitioned topic's metadata (not durable
    /// until flushed).
    fn put_partitioned(&self, record: &PartitionedRecord) -> Result<()>;

    /// Removes a partitioned topic's metadata (not its partitions).
    fn delete_partitioned(&self, name: &str) -> Result<()>;

    /// A fresh broker-unique id.
    fn next_id(&self) -> Result<u64>;

    /// Every authorization grant.
    fn grants(&self) -> Result<Vec<GrantRecord>>;

    /// Creates or replaces the grant of `record.role` on `record.resource`
    /// (not durable until flushed).
    fn put_grant(&self, record: &GrantRecord) -> Result<()>;

    /// Removes a role's grant on a resource (nothing if there is none).
    fn delete_grant(&self, role: &str, resource: &str) -> Result<()>;

    /// Every retention policy (of namespaces and topics).
    fn retention_policies(&self) -> Result<Vec<RetentionRecord>>;

    /// Creates or replaces the retention policy of `record.target` (not
    /// durable until flushed).
    fn put_retention(&self, record: &RetentionRecord) -> Result<()>;

    /// Removes the retention policy of a namespace or topic (nothing if
    /// there is none).
    fn delete_retention(&self, target: &str) -> Result<()>;

    /// Bytes on disk.
    fn size_on_disk(&self) -> Result<u64>;

    /// Makes every write so far durable.
    async fn flush(&self) -> Result<()>;

    /// What the store holds, as the manifest describes it: its identity,
    /// every topic's entry range, segments and subscriptions, and with
    /// `counts` the number of dead letters and schedule entries (a scan).
    fn inventory(&self, counts: bool) -> Result<Inventory>;

    /// Writes the store's identity into it (durable after the next flush).
    fn set_store_id(&self, id: &str) -> Result<()>;

    /// The manifest last saved, if any; `Corrupt` if it does not verify.
    fn load_manifest(&self) -> Result<Option<Manifest>>;

    /// Replaces the manifest durably before returning.
    async fn save_manifest(&self, manifest: &Manifest) -> Result<()>;

    /// False once a read found damaged data.
    fn intact(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod contract_tests;
#[cfg(test)]
mod open_beside_tests;
#[cfg(test)]
mod refs_tests;
#[cfg(test)]
mod sequences_tests;
