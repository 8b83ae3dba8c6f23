//! [`MemoryStorage`]: the [`Storage`] contract in plain maps, for tests of
//! dispatch, the failure path and the scheduler that need no disk (and run
//! on virtual time). Nothing survives the process; `flush` only counts.

use super::*;
use crate::util::lock;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
struct Log {
    /// Entry id → bytes; `None` once removed (a purged dead letter).
    entries: BTreeMap<u64, Option<Vec<u8>>>,
    /// Ids below this were handed out, even if their entries are gone.
    floor: u64,
}

impl Log {
    fn next(&self) -> u64 {
        self.entries
            .last_key_value()
            .map_or(self.floor, |(k, _)| (k + 1).max(self.floor))
    }
}

#[derive(Debug, Default)]
struct State {
    topics: BTreeMap<String, TopicRecord>,
    partitioned: BTreeMap<String, PartitionedRecord>,
    logs: HashMap<String, Log>,
    sequences: BTreeMap<(String, String), u64>,
    subscriptions: BTreeMap<(String, String), SubscriptionRecord>,
    failures: BTreeMap<SubMessage, FailureRecord>,
    /// A retry's failure record rides in its schedule entry, as in sled.
    schedule: BTreeMap<ScheduleKey, Option<FailureRecord>>,
    dead_letters: BTreeMap<(u64, u64), DeadLetterRecord>,
    replay_jobs: BTreeMap<u64, ReplayJobRecord>,
    grants: BTreeMap<(String, String), GrantRecord>,
    retention: BTreeMap<String, RetentionRecord>,
    next_id: u64,
    store_id: Option<String>,
    manifest: Option<Manifest>,
}

/// Storage in memory.
#[derive(Debug, Default)]
pub struct MemoryStorage {
    state: Mutex<State>,
    flushes: AtomicU64,
    entries_read: AtomicU64,
    entries_read_by_id: AtomicU64,
    failure_reads: AtomicU64,
    failure_batches: AtomicU64,
}

impl State {
    /// [`SubscriptionStore::failure`] under the lock.
    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Option<FailureRecord> {
        if let Some(r) = self.failures.get(&message) {
            return Some(r.clone());
        }
        self.schedule
            .get(&ScheduleKey {
                due_ms: due_ms?,
                message,
            })
            .cloned()
            .flatten()
    }
}

impl MemoryStorage {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times `flush` was called.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// How many log entries range reads ([`LogStore::read`]) returned.
    pub fn entries_read(&self) -> u64 {
        self.entries_read.load(Ordering::Relaxed)
    }

    /// How many log entries were asked for by id ([`LogStore::read_one`],
    /// and [`LogStore::read_many`] through it), found or not.
    pub fn entries_read_by_id(&self) -> u64 {
        self.entries_read_by_id.load(Ordering::Relaxed)
    }

    /// How many failure records were read one at a time
    /// ([`SubscriptionStore::failure`]).
    pub fn failure_reads(&self) -> u64 {
        self.failure_reads.load(Ordering::Relaxed)
    }

    /// How many batched failure-record reads
    /// ([`SubscriptionStore::failures_many`]) were made, of any size.
    pub fn failure_batches(&self) -> u64 {
        self.failure_batches.load(Ordering::Relaxed)
    }
}

impl LogStore for MemoryStorage {
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        let mut s = lock(&self.state);
        let log = s.logs.entry(topic.to_owned()).or_default();
        for (i, e) in entries.iter().enumerate() {
            log.entries.insert(first_id + i as u64, Some(e.clone()));
        }
        if let Some((name, seq)) = producer {
            s.sequences.insert((topic.to_owned(), name.to_owned()), seq);
        }
        Ok(())
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let s = lock(&self.state);
        let mut out = Vec::new();
        let mut bytes = 0;
        let Some(log) = s.logs.get(topic) else {
            return Ok(out);
        };
        for (id, e) in log.entries.range(from..) {
            let Some(e) = e else { continue };
            bytes += e.len();
            out.push((*id, e.clone()));
            if out.len() >= max || bytes >= max_bytes {
                break;
            }
        }
        self.entries_read
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(out)
    }

    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>> {
        self.entries_read_by_id.fetch_add(1, Ordering::Relaxed);
        Ok(lock(&self.state)
            .logs
            .get(topic)
            .and_then(|l| l.entries.get(&id).cloned().flatten()))
    }

    fn entry_range(&self, topic: &str) -> Result<(u64, u64)> {
        let s = lock(&self.state);
        let Some(log) = s.logs.get(topic) else {
            return Ok((0, 0));
        };
        let next = log.next();
        let first = log.entries.first_key_value().map_or(next, |(k, _)| *k);
        Ok((first.min(next), next))
    }

    fn trim(&self, topic: &str, below: u64) -> Result<()> {
        if let Some(log) = lock(&self.state).logs.get_mut(topic) {
            log.floor = log.next();
            log.entries = log.entries.split_off(&below);
        }
        Ok(())
    }

    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()> {
        if let Some(log) = lock(&self.state).logs.get_mut(topic) {
            log.floor = log.next();
            for id in ids {
                if let Some(e) = log.entries.get_mut(id) {
                    *e = None;
                }
            }
        }
        Ok(())
    }

    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>> {
        Ok(lock(&self.state)
            .sequences
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|((_, p), s)| (p.clone(), *s))
            .collect())
    }

    fn restore_producer_sequences(&self, topic: &str, sequences: &[(String, u64)]) -> Result<()> {
        let mut s = lock(&self.state);
        for (name, seq) in sequences {
            s.sequences.insert((topic.to_owned(), name.clone()), *seq);
        }
        Ok(())
    }
}

impl SubscriptionStore for MemoryStorage {
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>> {
        Ok(lock(&self.state)
            .subscriptions
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|(_, r)| r.clone())
            .collect())
    }

    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        lock(&self.state)
            .subscriptions
            .insert((record.topic.clone(), record.name.clone()), record.clone());
        Ok(())
    }

    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        let mut s = lock(&self.state);
        let id = record.id;
        s.failures.retain(|m, _| m.sub_id != id);
        s.schedule.retain(|k, _| k.message.sub_id != id);
        s.dead_letters.retain(|(sub, _), _| *sub != id);
        s.subscriptions
            .remove(&(record.topic.clone(), record.name.clone()));
        Ok(())
    }

    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>> {
        self.failure_reads.fetch_add(1, Ordering::Relaxed);
        Ok(lock(&self.state).failure(message, due_ms))
    }

    fn failures_many(
        &self,
        keys: &[(SubMessage, Option<u64>)],
    ) -> Result<Vec<Option<FailureRecord>>> {
        self.failure_batches.fetch_add(1, Ordering::Relaxed);
        let s = lock(&self.state);
        Ok(keys.iter().map(|&(m, due)| s.failure(m, due)).collect())
    }

    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>> {
        Ok(lock(&self.state)
            .failures
            .iter()
            .filter(|(m, _)| m.sub_id == sub_id && m.tier == tier)
            .map(|(m, r)| (*m, r.clone()))
            .collect())
    }

    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()> {
        let mut s = lock(&self.state);
        for (m, r) in records {
            match r {
                Some(r) => s.failures.insert(*m, r.clone()),
                None => s.failures.remove(m),
            };
        }
        Ok(())
    }

    fn scheduled(
        &self,
        after: Option<ScheduleKey>,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<ScheduleKey>> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(lock(&self.state)
            .schedule
            .range((start, Bound::Unbounded))
            .map(|(k, _)| *k)
            .take_while(|k| k.due_ms < to_ms)
            .take(limit)
            .collect())
    }

    fn put_schedule(&self, keys: &[(ScheduleKey, bool)]) -> Result<()> {
        let mut s = lock(&self.state);
        for (k, add) in keys {
            if *add {
                s.schedule.insert(*k, None);
            } else {
                s.schedule.remove(k);
            }
        }
        Ok(())
    }

    fn subscription_state(&self, sub_id: u64) -> Result<SubscriptionState> {
        let s = lock(&self.state);
        Ok(SubscriptionState {
            failures: s
                .failures
                .iter()
                .filter(|(m, _)| m.sub_id == sub_id)
                .map(|(m, r)| (m.entry(), r.clone()))
                .collect(),
            schedule: s
                .schedule
                .iter()
                .filter(|(k, _)| k.message.sub_id == sub_id)
                .map(|(k, r)| (k.due_ms, k.message.entry(), r.clone()))
                .collect(),
            dead_letters: s
                .dead_letters
                .iter()
                .filter(|((sub, _), _)| *sub == sub_id)
                .map(|((_, id), r)| (*id, r.clone()))
                .collect(),
        })
    }

    fn restore_subscription_state(&self, sub_id: u64, state: &SubscriptionState) -> Result<()> {
        let mut s = lock(&self.state);
        for (e, r) in &state.failures {
            s.failures.insert(e.of(sub_id), r.clone());
        }
        for (due_ms, e, r) in &state.schedule {
            let key = ScheduleKey {
                due_ms: *due_ms,
                message: e.of(sub_id),
            };
            s.schedule.insert(key, r.clone());
        }
        for (id, r) in &state.dead_letters {
            s.dead_letters.insert((sub_id, *id), r.clone());
        }
        Ok(())
    }

    fn move_messages(&self, mv: &TierMove) -> Result<()> {
        // One lock for the whole batch: all or nothing, as a transaction.
        let mut s = lock(&self.state);
        let sub_id = mv.subscription.id;
        s.subscriptions.insert(
            (mv.subscription.topic.clone(), mv.subscription.name.clone()),
            mv.subscription.clone(),
        );
        for item in &mv.items {
            s.failures.remove(&item.from);
            if let Some(k) = &item.from_schedule {
                s.schedule.remove(k);
            }
            s.logs
                .entry(mv.target_topic.clone())
                .or_default()
                .entries
                .insert(item.target_entry_id, Some(item.payload.clone()));
            match &item.arrival {
                Arrival::Retry { due_ms } => {
                    let key = ScheduleKey {
                        due_ms: *due_ms,
                        message: TierEntry::retry(item.target_entry_id).of(sub_id),
                    };
                    s.schedule.insert(key, Some(item.failures.clone()));
                }
                Arrival::DeadLetter(d) => {
                    s.dead_letters
                        .insert((sub_id, item.target_entry_id), d.clone());
                }
            }
        }
        Ok(())
    }

    fn dead_letters(
        &self,
        sub_id: u64,
        after: Option<u64>,
    ) -> Result<Vec<(u64, DeadLetterRecord)>> {
        let start = match after {
            Some(a) => Bound::Excluded((sub_id, a)),
            None => Bound::Included((sub_id, 0)),
        };
        Ok(lock(&self.state)
            .dead_letters
            .range((start, Bound::Included((sub_id, u64::MAX))))
            .map(|((_, id), r)| (*id, r.clone()))
            .collect())
    }

    fn count_dead_letters(&self, sub_id: u64) -> Result<u64> {
        Ok(self.dead_letters(sub_id, None)?.len() as u64)
    }

    fn remove_dead_letters(&self, sub_id: u64, ids: &[u64]) -> Result<()> {
        let mut s = lock(&self.state);
        for id in ids {
            s.dead_letters.remove(&(sub_id, *id));
        }
        Ok(())
    }

    fn dead_letters_by_id(&self, sub_id: u64, ids: &[u64]) -> Result<Vec<(u64, DeadLetterRecord)>> {
        let s = lock(&self.state);
        Ok(ids
            .iter()
            .filter_map(|id| Some((*id, s.dead_letters.get(&(sub_id, *id))?.clone())))
            .collect())
    }

    fn put_dead_letters(&self, sub_id: u64, records: &[(u64, DeadLetterRecord)]) -> Result<()> {
        let mut s = lock(&self.state);
        for (id, rec) in records {
            s.dead_letters.insert((sub_id, *id), rec.clone());
        }
        Ok(())
    }

    fn replay_jobs(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>> {
        Ok(lock(&self.state)
            .replay_jobs
            .values()
            .map(|j| {
                let mut j = j.clone();
                if !with_ids {
                    j.dead_letter_ids.clear();
                }
                j
            })
            .collect())
    }

    fn put_replay_job(&self, job: &ReplayJobRecord) -> Result<()> {
        let mut s = lock(&self.state);
        let ids = match s.replay_jobs.get(&job.id) {
            Some(old) => old.dead_letter_ids.clone(),
            None if job.cursor > 0 => return Ok(()),
            None => job.dead_letter_ids.clone(),
        };
        s.replay_jobs.insert(
            job.id,
            ReplayJobRecord {
                dead_letter_ids: ids,
                ..job.clone()
            },
        );
        Ok(())
    }

    fn remove_replay_job(&self, id: u64) -> Result<()> {
        lock(&self.state).replay_jobs.remove(&id);
        Ok(())
    }

    fn return_dead_letters(&self, mv: &DeadLetterReturn) -> Result<()> {
        // One lock for the whole batch: all or nothing, as a transaction.
        let mut s = lock(&self.state);
        let sub_id = mv.subscription.id;
        if let Some(gone) = mv
            .items
            .iter()
            .find(|i| !s.dead_letters.contains_key(&(sub_id, i.dead_letter_id)))
        {
            return Err(StorageError::Missing(format!(
                "dead letter {} (purged meanwhile?)",
                gone.dead_letter_id
            )));
        }
        s.subscriptions.insert(
            (mv.subscription.topic.clone(), mv.subscription.name.clone()),
            mv.subscription.clone(),
        );
        for item in &mv.items {
            s.dead_letters.remove(&(sub_id, item.dead_letter_id));
            if let Some(log) = s.logs.get_mut(&mv.dead_letter_topic) {
                log.floor = log.next();
                if let Some(e) = log.entries.get_mut(&item.dead_letter_id) {
                    *e = None;
                }
            }
            s.logs
                .entry(mv.retry_topic.clone())
                .or_default()
                .entries
                .insert(item.target_entry_id, Some(item.payload.clone()));
            let key = ScheduleKey {
                due_ms: item.due_ms,
                message: TierEntry::retry(item.target_entry_id).of(sub_id),
            };
            s.schedule.insert(key, Some(item.failures.clone()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl MetaStore for MemoryStorage {
    fn grants(&self) -> Result<Vec<GrantRecord>> {
        Ok(lock(&self.state).grants.values().cloned().collect())
    }

    fn put_grant(&self, record: &GrantRecord) -> Result<()> {
        lock(&self.state).grants.insert(
            (record.role.clone(), record.resource.clone()),
            record.clone(),
        );
        Ok(())
    }

    fn delete_grant(&self, role: &str, resource: &str) -> Result<()> {
        lock(&self.state)
            .grants
            .remove(&(role.to_owned(), resource.to_owned()));
        Ok(())
    }

    fn retention_policies(&self) -> Result<Vec<RetentionRecord>> {
        Ok(lock(&self.state).retention.values().cloned().collect())
    }

    fn put_retention(&self, record: &RetentionRecord) -> Result<()> {
        lock(&self.state)
            .retention
            .insert(record.target.clone(), record.clone());
        Ok(())
    }

    fn delete_retention(&self, target: &str) -> Result<()> {
        lock(&self.state).retention.remove(target);
        Ok(())
    }

    fn list_topics(&self) -> Result<Vec<TopicRecord>> {
        Ok(lock(&self.state).topics.values().cloned().collect())
    }

    fn put_topic(&self, record: &TopicRecord) -> Result<()> {
        lock(&self.state)
            .topics
            .insert(record.name.clone(), record.clone());
        Ok(())
    }

    fn list_partitioned(&self) -> Result<Vec<PartitionedRecord>> {
        Ok(lock(&self.state).partitioned.values().cloned().collect())
    }

    fn put_partitioned(&self, record: &PartitionedRecord) -> Result<()> {
        lock(&self.state)
            .partitioned
            .insert(record.name.clone(), record.clone());
        Ok(())
    }

    fn delete_partitioned(&self, name: &str) -> Result<()> {
        lock(&self.state).partitioned.remove(name);
        Ok(())
    }

    fn delete_topic(&self, name: &str) -> Result<()> {
        for sub in self.list_subscriptions(name)? {
            self.delete_subscription(&sub)?;
        }
        let mut s = lock(&self.state);
        s.topics.remove(name);
        s.logs.remove(name);
        s.sequences.retain(|(t, _), _| t != name);
        Ok(())
    }

    fn next_id(&self) -> Result<u64> {
        let mut s = lock(&self.state);
        s.next_id += 1;
        Ok(s.next_id)
    }

    fn size_on_disk(&self) -> Result<u64> {
        Ok(0)
    }

    async fn flush(&self) -> Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn inventory(&self, counts: bool) -> Result<Inventory> {
        let s = lock(&self.state);
        let has_data = !(s.topics.is_empty()
            && s.logs.is_empty()
            && s.sequences.is_empty()
            && s.subscriptions.is_empty()
            && s.failures.is_empty()
            && s.schedule.is_empty()
            && s.dead_letters.is_empty());
        let topics = s
            .topics
            .values()
            .map(|t| {
                let (first, next) = s.logs.get(&t.name).map_or((0, 0), |log| {
                    let next = log.next();
                    let first = log.entries.first_key_value().map_or(next, |(k, _)| *k);
                    (first.min(next), next)
                });
                let subs: Vec<&SubscriptionRecord> = s
                    .subscriptions
                    .iter()
                    .filter(|((topic, _), _)| *topic == t.name)
                    .map(|(_, rec)| rec)
                    .collect();
                let counts = counts.then(|| {
                    subs.iter()
                        .map(|rec| {
                            let c = manifest::SubCounts {
                                dead_letters: s
                                    .dead_letters
                                    .keys()
                                    .filter(|(sub, _)| *sub == rec.id)
                                    .count() as u64,
                                scheduled: s
                                    .schedule
                                    .keys()
                                    .filter(|k| k.message.sub_id == rec.id)
                                    .count() as u64,
                            };
                            (rec.name.clone(), c)
                        })
                        .collect()
                });
                let inv = TopicInventory {
                    kind: t.kind,
                    first,
                    next,
                    segments: Vec::new(),
                    subscriptions: subs.iter().map(|rec| rec.name.clone()).collect(),
                    counts,
                };
                (t.name.clone(), inv)
            })
            .collect();
        Ok(Inventory {
            store_id: s.store_id.clone(),
            has_data,
            topics,
            dead_letters: counts.then_some(s.dead_letters.len() as u64),
            scheduled: counts.then_some(s.schedule.len() as u64),
        })
    }

    fn set_store_id(&self, id: &str) -> Result<()> {
        lock(&self.state).store_id = Some(id.to_owned());
        Ok(())
    }

    fn load_manifest(&self) -> Result<Option<Manifest>> {
        Ok(lock(&self.state).manifest.clone())
    }

    async fn save_manifest(&self, manifest: &Manifest) -> Result<()> {
        lock(&self.state).manifest = Some(manifest.clone());
        Ok(())
    }
}
