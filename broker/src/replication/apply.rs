//! Applying a replicated partition's commands through [`Storage`].
//!
//! Every replica applies the same commands in the same order to its own
//! store and so computes the same entry ids and receipts: ids come from the
//! store's next entry id, de-duplication from its producer sequences (both
//! read once, then kept here). Each command is harmless when applied again
//! after a restart (the Raft state machine's mark may be behind the
//! store): a batch is recognised by its producer sequence ids (an
//! anonymous one by ids derived from its log index), a tier move by its
//! target ids already being stored, a log's trim by its trim point already
//! being stored, an offload record by its range being recorded already
//! (its local segments are gone then), a seal by the active segment
//! holding no id below its `below` any more, and the other commands write
//! values. Entries are appended with `Storage::append_replicated`: a
//! segment rolls by id block and size, both given by the commands, and
//! by age only at the leader's seal, never by this replica's clock.

use super::append_view::AppendView;
use super::{
    ANONYMOUS_PRODUCER, MAX_BATCH, PartitionCommand, PartitionReply, PublishBatch, PublishReceipt,
};
use crate::storage::{DeadLetterReturn, Storage, StorageError, TierMove, TopicRecord};
use prost::Message as _;
use ricochet_replication::{Apply, ReplicationError, SnapshotWriter, decode, encode};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A topic's writer state, as the store says (read once).
#[derive(Debug)]
struct Writer {
    next_id: u64,
    sequences: HashMap<String, u64>,
}

/// Applies [`PartitionCommand`]s to a store.
#[derive(Debug)]
pub struct StorageApplier {
    storage: Arc<dyn Storage>,
    /// The partition's topic (what a snapshot holds), when known.
    topic: Option<String>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    topics: Option<HashSet<String>>,
    writers: HashMap<String, Writer>,
    /// Issued ids seen applied (the id counter passed them).
    issued: HashSet<u64>,
}

type Applied = Result<PartitionReply, StorageError>;

/// The largest distance an issued id may be ahead of this store's id
/// counter for the counter to be raised past it (sled's counter jumps by
/// about a million at each restart).
const MAX_ID_GAP: u64 = 1 << 28;

impl StorageApplier {
    /// An applier writing to `storage`.
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        Self {
            storage,
            topic: None,
            state: Mutex::new(State::default()),
        }
    }

    /// An applier of partition `topic`'s group (it builds and installs
    /// snapshots of that partition, see [`super::snapshot`]).
    pub fn for_partition(storage: Arc<dyn Storage>, topic: &str) -> Self {
        Self {
            topic: Some(topic.to_owned()),
            ..Self::new(storage)
        }
    }

    fn partition(&self) -> ricochet_replication::Result<&str> {
        self.topic.as_deref().ok_or_else(|| {
            ReplicationError::Apply("this applier knows no partition to snapshot".into())
        })
    }

    fn has_topic(&self, state: &mut State, name: &str) -> Result<bool, StorageError> {
        if state.topics.is_none() {
            let names = self.storage.list_topics()?.into_iter().map(|t| t.name);
            state.topics = Some(names.collect());
        }
        Ok(state.topics.as_ref().is_some_and(|t| t.contains(name)))
    }

    fn create_topic(&self, state: &mut State, record: &TopicRecord) -> Applied {
        let held = self.has_topic(state, &record.name)?;
        if record.trimmed_below > 0 {
            // A trim, never a create: a tier deleted before its trim was
            // applied stays deleted.
            return if held {
                self.trim_log(record)
            } else {
                Ok(PartitionReply::Done)
            };
        }
        if !held {
            self.storage.put_topic(record)?;
            if let Some(t) = state.topics.as_mut() {
                t.insert(record.name.clone());
            }
        }
        Ok(PartitionReply::Done)
    }

    /// The group's trim of log `record.name` below `record.trimmed_below`
    /// ([`PartitionCommand::trim_log`]): the whole sealed segments holding
    /// only ids below it are dropped (never the active one), then the
    /// log's record keeps the trim point, below which no replica serves
    /// anything ([`super::ReplicatedStorage`]'s reads, snapshots). A trim
    /// point at or below the one stored is a replay: nothing is done. The
    /// point never passes the entries applied here (every replica applied
    /// the same, so it is the same everywhere). The segments go before the
    /// record is written: a restart between the two applies the command
    /// again, and dropping segments twice drops nothing.
    fn trim_log(&self, record: &TopicRecord) -> Applied {
        let stored = self
            .storage
            .list_topics()?
            .into_iter()
            .find(|t| t.name == record.name);
        let Some(mut stored) = stored else {
            return Ok(PartitionReply::Done);
        };
        let (_, next) = self.storage.entry_range(&record.name)?;
        let below = record.trimmed_below.min(next);
        if below <= stored.trimmed_below {
            return Ok(PartitionReply::Done);
        }
        self.storage.trim(&record.name, below)?;
        stored.trimmed_below = below;
        self.storage.put_topic(&stored)?;
        Ok(PartitionReply::Done)
    }

    fn publish(&self, state: &mut State, index: u64, batch: PublishBatch) -> Applied {
        if !self.has_topic(state, &batch.topic)? {
            return Ok(PartitionReply::Refused(format!(
                "topic {} not found",
                batch.topic
            )));
        }
        if batch.messages.len() > MAX_BATCH {
            return Ok(PartitionReply::Refused(format!(
                "a batch holds at most {MAX_BATCH} messages, not {}",
                batch.messages.len()
            )));
        }
        if !state.writers.contains_key(&batch.topic) {
            let (_, next_id) = self.storage.entry_range(&batch.topic)?;
            let sequences = self.storage.producer_sequences(&batch.topic)?;
            let writer = Writer {
                next_id,
                sequences: sequences.into_iter().collect(),
            };
            state.writers.insert(batch.topic.clone(), writer);
        }
        let Some(w) = state.writers.get_mut(&batch.topic) else {
            return Ok(PartitionReply::Refused("no writer".to_owned()));
        };
        let anonymous = batch.producer.is_empty();
        let producer = if anonymous {
            ANONYMOUS_PRODUCER
        } else {
            batch.producer.as_str()
        };
        let mut last = w.sequences.get(producer).copied();
        let mut receipts = Vec::with_capacity(batch.messages.len());
        let mut encoded = Vec::with_capacity(batch.messages.len());
        for (i, m) in batch.messages.into_iter().enumerate() {
            let sequence_id = if anonymous {
                (index << 16) | i as u64
            } else {
                m.sequence_id
            };
            if last.is_some_and(|l| sequence_id <= l) {
                receipts.push(PublishReceipt {
                    sequence_id,
                    entry_id: None,
                });
                continue;
            }
            last = Some(sequence_id);
            receipts.push(PublishReceipt {
                sequence_id,
                entry_id: Some(w.next_id + encoded.len() as u64),
            });
            let stored = ricochet_proto::Message {
                id: None,
                payload: m.payload,
                key: m.key,
                properties: m.properties,
                publish_time_ms: batch.publish_time_ms,
                event_time_ms: m.event_time_ms,
                delivery_count: 0,
                producer_name: producer.to_owned(),
                sequence_id,
                deliver_at_ms: m.deliver_at_ms,
            };
            encoded.push(stored.encode_to_vec());
        }
        if let (false, Some(l)) = (encoded.is_empty(), last) {
            let entries: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
            self.storage.append_replicated(
                &batch.topic,
                w.next_id,
                &entries,
                Some((producer, l)),
            )?;
            w.next_id += encoded.len() as u64;
            w.sequences.insert(producer.to_owned(), l);
        }
        Ok(PartitionReply::Published(receipts))
    }

    fn move_messages(&self, state: &mut State, mv: &TierMove) -> Applied {
        if !self.has_topic(state, &mv.target_topic)? {
            return Ok(PartitionReply::Refused(format!(
                "tier topic {} not found",
                mv.target_topic
            )));
        }
        let (_, next) = self.storage.entry_range(&mv.target_topic)?;
        let first = mv.items.iter().map(|i| i.target_entry_id).min();
        if first.is_some_and(|f| f < next) {
            // Applied before a restart (the move is one transaction), or a
            // target id already taken: either way, nothing to write.
            return Ok(PartitionReply::Done);
        }
        self.storage.move_messages(mv)?;
        Ok(PartitionReply::Done)
    }

    /// Entries at the leader's ids; a batch whose first id is below the
    /// stored end was applied before a restart (appends are whole).
    fn append(&self, state: &mut State, batch: AppendView<'_>) -> Applied {
        if !self.has_topic(state, batch.topic)? {
            return Ok(PartitionReply::Refused(format!(
                "topic {} not found",
                batch.topic
            )));
        }
        // Publish's cached writer state no longer holds for this log.
        state.writers.remove(batch.topic);
        let (_, next) = self.storage.entry_range(batch.topic)?;
        let Some(&first) = batch.entries.first() else {
            return Ok(PartitionReply::Done);
        };
        if batch.first_id < next {
            // Applied before (a restart re-applies) when the entry there is
            // this one; else a write whose outcome its leader never learned
            // took the ids, and this batch is refused, not dropped.
            let there = self.storage.read_one(batch.topic, batch.first_id)?;
            return Ok(if there.as_deref() == Some(first) {
                PartitionReply::Done
            } else {
                PartitionReply::Refused(format!(
                    "entry ids from {} of {} are taken",
                    batch.first_id, batch.topic
                ))
            });
        }
        self.storage.append_replicated(
            batch.topic,
            batch.first_id,
            &batch.entries,
            batch.producer,
        )?;
        Ok(PartitionReply::Done)
    }

    /// Raises the store's id counter past `id` (an id another replica
    /// handed out, see [`PartitionCommand::issued_ids`]).
    fn raise_ids_past(&self, id: u64) -> Result<(), StorageError> {
        let mut next = self.storage.next_id()?;
        if id.saturating_sub(next) > MAX_ID_GAP {
            // Not an id a broker's counter reaches: leave the counter be
            // rather than spin (the id came from a bad command).
            tracing::warn!(
                id,
                next,
                "an issued id too far ahead of this store's counter"
            );
            return Ok(());
        }
        while next <= id {
            next = self.storage.next_id()?;
        }
        Ok(())
    }

    /// Dead letters back into the retry tier; one whose retry ids are
    /// taken was applied before a restart (the return is one
    /// transaction). One whose dead letters are gone changes nothing.
    fn return_dead_letters(&self, state: &mut State, mv: &DeadLetterReturn) -> Applied {
        if !self.has_topic(state, &mv.retry_topic)? {
            return Ok(PartitionReply::Refused(format!(
                "tier topic {} not found",
                mv.retry_topic
            )));
        }
        let (_, next) = self.storage.entry_range(&mv.retry_topic)?;
        let first = mv.items.iter().map(|i| i.target_entry_id).min();
        if first.is_some_and(|f| f < next) {
            return Ok(PartitionReply::Done);
        }
        self.storage.return_dead_letters(mv)?;
        Ok(PartitionReply::Done)
    }

    /// The group's delete of a log: with it go the objects of its offload
    /// records (every replica deletes the same keys; nothing else deletes
    /// a group's objects, see [`PartitionCommand::Offloaded`]).
    fn delete_topic(&self, state: &mut State, name: &str) -> Applied {
        if self.has_topic(state, name)? {
            let keys = self
                .storage
                .offload_records(name)?
                .into_iter()
                .map(|s| s.key)
                .collect();
            self.storage.delete_topic(name)?;
            self.storage.delete_offloaded_objects(keys)?;
        }
        if let Some(t) = state.topics.as_mut() {
            t.remove(name);
        }
        state.writers.remove(name);
        Ok(PartitionReply::Done)
    }

    fn apply_command(&self, index: u64, command: PartitionCommand) -> Applied {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for id in command.issued_ids() {
            if state.issued.insert(id) {
                self.raise_ids_past(id)?;
            }
        }
        let applied = match command {
            PartitionCommand::CreateTopic(record) => self.create_topic(&mut state, &record),
            PartitionCommand::Publish(batch) => self.publish(&mut state, index, batch),
            PartitionCommand::PutSubscription(record) => {
                self.storage.put_subscription(&record)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::PutFailures(records) => {
                self.storage.put_failures(&records)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::PutSchedule(keys) => {
                self.storage.put_schedule(&keys)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::MoveMessages(mv) => self.move_messages(&mut state, &mv),
            PartitionCommand::Append(batch) => self.append(&mut state, AppendView::of(&batch)),
            PartitionCommand::DeleteSubscription(record) => {
                self.storage.delete_subscription(&record)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::RemoveDeadLetters { sub_id, ids } => {
                self.storage.remove_dead_letters(sub_id, &ids)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::RemoveEntries { topic, ids } => {
                if self.has_topic(&mut state, &topic)? {
                    self.storage.remove_entries(&topic, &ids)?;
                }
                Ok(PartitionReply::Done)
            }
            PartitionCommand::PutDeadLetters { sub_id, records } => {
                self.storage.put_dead_letters(sub_id, &records)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::ReturnDeadLetters(mv) => self.return_dead_letters(&mut state, &mv),
            PartitionCommand::PutReplayJob(job) => {
                self.storage.put_replay_job(&job)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::RemoveReplayJob(id) => {
                self.storage.remove_replay_job(id)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::DeleteTopic(name) => self.delete_topic(&mut state, &name),
            PartitionCommand::PutRetention(record) => {
                self.storage.put_retention(&record)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::DeleteRetention(target) => {
                self.storage.delete_retention(&target)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::PutOffloadPolicy { topic, policy } => {
                self.storage.put_offload_policy(&topic, &policy)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::Seal(topic) => {
                self.storage.seal_segment(&topic, u64::MAX)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::SealBelow { topic, below } => {
                self.storage.seal_segment(&topic, below)?;
                Ok(PartitionReply::Done)
            }
            PartitionCommand::Sequence(_) => Ok(PartitionReply::Refused(
                "a sequence is applied command by command (Apply::apply)".to_owned(),
            )),
            PartitionCommand::Offloaded(record) => {
                // A log deleted before the record, or a range the group
                // trimmed since (a replay after a restart): nothing.
                let trimmed = self
                    .storage
                    .list_topics()?
                    .into_iter()
                    .find(|t| t.name == record.topic)
                    .map(|t| t.trimmed_below);
                if trimmed.is_some_and(|below| record.next > below)
                    && self.has_topic(&mut state, &record.topic)?
                {
                    self.storage.put_offload_record(&record)?;
                }
                Ok(PartitionReply::Done)
            }
        };
        answer(applied)
    }
}

/// What a command's application answers: something the command needs
/// that is not there (dead letters purged meanwhile) is the same on every
/// replica, so an answer, not a failure of the store (which would stop
/// the Raft node).
fn answer(applied: Applied) -> Applied {
    match applied {
        Err(StorageError::Missing(what)) => Ok(PartitionReply::Refused(format!(
            "missing from storage: {what}"
        ))),
        other => other,
    }
}

impl StorageApplier {
    /// A [`PartitionCommand::Sequence`]'s commands, applied in order as
    /// entries of their own at `index` would be; their replies as one
    /// [`PartitionReply::Each`]. A refused command is refused alone (the
    /// next ones apply, as the next entries would); a command the store
    /// fails on fails the whole entry, which a restart applies again whole
    /// (every command is harmless applied twice, see the module).
    fn apply_sequence(
        &self,
        index: u64,
        commands: &[&[u8]],
    ) -> ricochet_replication::Result<Vec<u8>> {
        let mut replies = Vec::with_capacity(commands.len());
        for command in commands {
            let reply = self.apply_one(index, command, true)?;
            replies.push(serde_bytes::ByteBuf::from(reply));
        }
        encode(&PartitionReply::Each(replies))
    }

    /// One command (see [`Apply::apply`]); `in_sequence`: one of a
    /// sequence's, where a `Publish` (its anonymous sequence ids derive
    /// from the index, which the sequence's commands share) and a nested
    /// sequence are refused.
    pub(super) fn apply_one(
        &self,
        index: u64,
        command: &[u8],
        in_sequence: bool,
    ) -> ricochet_replication::Result<Vec<u8>> {
        // A publish batch's entries, applied from the command's bytes in
        // place (every replica applies every batch; see `AppendView`).
        if let Some(view) = AppendView::parse(command) {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let reply = answer(self.append(&mut state, view))
                .map_err(|e| ReplicationError::Apply(e.to_string()))?;
            return encode(&reply);
        }
        // A committed command this broker cannot read was proposed by a
        // newer one (a rolling upgrade): refusing it here while the others
        // apply it would make this replica's state drift from theirs
        // without a trace. Failing stops the group on this node instead
        // (its applied mark stays before the command), and it applies the
        // command once upgraded.
        let command = decode::<PartitionCommand>(command).map_err(|e| {
            tracing::error!(
                index,
                error = %e,
                "a committed command cannot be decoded (proposed by a newer broker?): this replica \
                 stops applying its group until the broker is upgraded"
            );
            ReplicationError::Apply(format!(
                "the command at index {index} cannot be decoded by this broker: {e}"
            ))
        })?;
        match command {
            PartitionCommand::Sequence(_) | PartitionCommand::Publish(_) if in_sequence => {
                return encode(&PartitionReply::Refused(
                    "a publish or a sequence is never proposed inside a sequence".to_owned(),
                ));
            }
            PartitionCommand::Sequence(commands) => {
                let commands: Vec<&[u8]> = commands.iter().map(|c| c.as_slice()).collect();
                return self.apply_sequence(index, &commands);
            }
            _ => {}
        }
        let reply = self
            .apply_command(index, command)
            .map_err(|e| ReplicationError::Apply(e.to_string()))?;
        encode(&reply)
    }
}

#[async_trait::async_trait]
impl Apply for StorageApplier {
    fn apply(&self, index: u64, command: &[u8]) -> ricochet_replication::Result<Vec<u8>> {
        if let Some(commands) = super::append_view::sequence(command) {
            return self.apply_sequence(index, &commands);
        }
        self.apply_one(index, command, false)
    }

    async fn flush(&self) -> ricochet_replication::Result<()> {
        self.storage
            .flush()
            .await
            .map_err(|e| ReplicationError::Apply(e.to_string()))
    }

    fn snapshot(&self) -> ricochet_replication::Result<Box<dyn SnapshotWriter>> {
        super::snapshot::capture(&self.storage, self.partition()?)
    }

    fn install(&self, from: &mut dyn std::io::Read) -> ricochet_replication::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // What was cached of the old copy no longer holds, whatever the
        // install's outcome.
        *state = State::default();
        let highest = super::snapshot::install(&self.storage, self.partition()?, from)?;
        self.raise_ids_past(highest)
            .map_err(|e| ReplicationError::Apply(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::AppendBatch;
    use crate::storage::MemoryStorage;

    /// Bytes no version's `PartitionCommand` decodes from fail the apply (so
    /// the group stops on this node) instead of being answered as refused,
    /// which would let this replica skip what the others apply.
    #[test]
    fn a_command_this_broker_cannot_decode_fails_the_apply() {
        let applier = StorageApplier::new(Arc::new(MemoryStorage::new()));
        let unknown = encode(&("a command from a newer broker", 7u32)).unwrap();
        match applier.apply(12, &unknown) {
            Err(ReplicationError::Apply(why)) => {
                assert!(why.contains("index 12"), "{why}");
            }
            other => panic!("applied or refused: {other:?}"),
        }
    }

    fn apply(applier: &StorageApplier, index: u64, command: &PartitionCommand) {
        let reply = applier.apply(index, &encode(command).unwrap()).unwrap();
        assert!(
            matches!(decode(&reply).unwrap(), PartitionReply::Done),
            "{command:?}"
        );
    }

    /// A topic of factor 3 created at 1 ms, nothing trimmed.
    fn replicated_topic(name: &str) -> TopicRecord {
        TopicRecord {
            name: name.to_owned(),
            created_ms: 1,
            kind: crate::storage::TopicKind::Normal,
            replicas: 3,
            trimmed_below: 0,
        }
    }

    fn trim_point(storage: &Arc<dyn Storage>, name: &str) -> Option<u64> {
        let records = storage.list_topics().unwrap();
        records
            .into_iter()
            .find(|t| t.name == name)
            .map(|t| t.trimmed_below)
    }

    /// A trim drops what lies below its point and stores the point; one
    /// at or below the stored point (a replay) changes nothing; the point
    /// never passes the entries applied; a trim of a log that is gone
    /// does not create it again.
    #[test]
    fn a_trim_is_applied_once_and_never_past_the_applied_end() {
        let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
        let applier = StorageApplier::new(storage.clone());
        let name = "persistent://public/default/t";
        let record = replicated_topic(name);
        apply(&applier, 1, &PartitionCommand::CreateTopic(record.clone()));
        let entries = (0..10u8)
            .map(|i| serde_bytes::ByteBuf::from(vec![i]))
            .collect();
        let batch = AppendBatch {
            topic: name.to_owned(),
            first_id: 0,
            entries,
            producer: None,
        };
        apply(&applier, 2, &PartitionCommand::Append(batch));
        apply(&applier, 3, &PartitionCommand::trim_log(&record, 4));
        assert_eq!(storage.entry_range(name).unwrap(), (4, 10));
        assert_eq!(trim_point(&storage, name), Some(4));
        // Lower (a replay after a restart): nothing changes.
        apply(&applier, 4, &PartitionCommand::trim_log(&record, 2));
        assert_eq!(trim_point(&storage, name), Some(4));
        // Past the end applied: up to the end only.
        apply(&applier, 5, &PartitionCommand::trim_log(&record, 50));
        assert_eq!(trim_point(&storage, name), Some(10));
        assert_eq!(storage.entry_range(name).unwrap().1, 10);
        // A plain create of the log held leaves the point alone.
        apply(&applier, 6, &PartitionCommand::CreateTopic(record.clone()));
        assert_eq!(trim_point(&storage, name), Some(10));
        // The trim of a log deleted before it: nothing, no record.
        let gone = TopicRecord {
            name: "persistent://public/default/gone".to_owned(),
            ..record
        };
        apply(&applier, 7, &PartitionCommand::trim_log(&gone, 3));
        assert_eq!(trim_point(&storage, &gone.name), None);
    }

    /// An `Append` applied from its bytes (read in place, `AppendView`)
    /// leaves the store as the decoded command does, and answers the
    /// same: stored, a replay of it done, other bytes at its ids refused,
    /// an unknown topic refused.
    #[test]
    fn an_append_applied_in_place_equals_the_decoded_one() {
        let name = "persistent://public/default/t";
        let record = replicated_topic(name);
        let batch = |first_id: u64, fill: u8, producer: Option<(&str, u64)>| {
            PartitionCommand::Append(AppendBatch {
                topic: name.to_owned(),
                first_id,
                entries: (0..5u8)
                    .map(|i| {
                        serde_bytes::ByteBuf::from(vec![fill.wrapping_add(i); 40 + i as usize])
                    })
                    .collect(),
                producer: producer.map(|(p, s)| (p.to_owned(), s)),
            })
        };
        let commands = [
            batch(0, 1, Some(("p", 4))),
            batch(5, 10, None),
            batch(0, 1, Some(("p", 4))),
            batch(5, 99, None),
            PartitionCommand::Append(AppendBatch {
                topic: "persistent://public/default/none".to_owned(),
                first_id: 0,
                entries: vec![serde_bytes::ByteBuf::from(vec![1])],
                producer: None,
            }),
        ];
        let in_place: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
        let decoded: Arc<dyn Storage> = Arc::new(MemoryStorage::new());
        let (a, b) = (
            StorageApplier::new(in_place.clone()),
            StorageApplier::new(decoded.clone()),
        );
        apply(&a, 1, &PartitionCommand::CreateTopic(record.clone()));
        apply(&b, 1, &PartitionCommand::CreateTopic(record));
        let mut answers = Vec::new();
        for (k, c) in commands.iter().enumerate() {
            let bytes = encode(c).unwrap();
            assert!(super::AppendView::parse(&bytes).is_some());
            let here: PartitionReply = decode(&a.apply(k as u64 + 2, &bytes).unwrap()).unwrap();
            let there = b.apply_command(k as u64 + 2, c.clone()).unwrap();
            assert_eq!(here, there, "command {k}");
            answers.push(here);
        }
        assert!(matches!(answers[0], PartitionReply::Done));
        assert!(matches!(answers[1], PartitionReply::Done));
        assert!(matches!(answers[2], PartitionReply::Done));
        assert!(matches!(&answers[3], PartitionReply::Refused(w) if w.contains("taken")));
        assert!(matches!(&answers[4], PartitionReply::Refused(w) if w.contains("not found")));
        let read = |s: &Arc<dyn Storage>| {
            (
                s.read(name, 0, 100, usize::MAX).unwrap(),
                s.producer_sequences(name).unwrap(),
            )
        };
        let (entries, sequences) = read(&in_place);
        assert_eq!(entries.len(), 10);
        assert_eq!(entries[7], (7, vec![12u8; 42]));
        assert_eq!((entries, sequences), read(&decoded));
    }

    /// A trim travels as a `CreateTopic`, whose encoding a broker that
    /// predates trims decodes (the field it does not know is skipped), and
    /// a record without a trim point encodes as it did before the field.
    #[test]
    fn a_trim_decodes_as_a_create_without_the_field_and_an_untrimmed_record_is_unchanged() {
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        struct OldRecord {
            name: String,
            created_ms: u64,
            kind: crate::storage::TopicKind,
            replicas: u32,
        }
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        enum OldCommand {
            CreateTopic(OldRecord),
        }
        let record = replicated_topic("persistent://public/default/t");
        let trim = encode(&PartitionCommand::trim_log(&record, 7)).unwrap();
        match decode::<OldCommand>(&trim).unwrap() {
            OldCommand::CreateTopic(r) => assert_eq!(r.name, record.name),
        }
        let old = OldCommand::CreateTopic(OldRecord {
            name: record.name.clone(),
            created_ms: 1,
            kind: crate::storage::TopicKind::Normal,
            replicas: 3,
        });
        let create = PartitionCommand::CreateTopic(record);
        assert_eq!(encode(&create).unwrap(), encode(&old).unwrap());
    }
}
