//! Replicated partitions (issue 22, first slice): a partition's state
//! changes as commands of a Raft group (`ricochet-replication`), applied on
//! every replica through [`Storage`], so an applied replica holds the same
//! store a standalone broker has.
//!
//! [`PartitionCommand`] names the changes: a topic created, a producer's
//! batch published (with its sequence ids, de-duplicated when applied), a
//! subscription record written (acks move its cursors; policy changes), failure
//! records written (a nack's new delivery count), schedule entries, a
//! tier move (into the retry or the dead-letter tier, one transaction),
//! the topic's own retention policy, a log's trim point (what its
//! leader's retention or consumed segments dropped, dropped on every
//! replica), and a segment its leader offloaded to the object store
//! (recorded, and its local copies dropped, on every replica).
//! [`StorageApplier`] applies them ([`apply`]); [`ReplicatedPartition`] is
//! one replica of one partition: it proposes commands and answers once the
//! group committed and applied them.
//!
//! In cluster mode a topic created with a factor above 1 is such a group
//! ([`groups`]: placement in etcd, leadership), whose leader writes through
//! [`ReplicatedStorage`]; a standalone or factor-1 topic takes exactly the
//! path it took before. `docs/src/replication.md` says what works and what
//! is missing.

mod append_view;
mod apply;
pub mod coalescing;
pub mod factor;
pub mod gate;
pub mod groups;
pub mod namespaces;
pub mod offload;
#[cfg(test)]
mod offload_tests;
mod peers;
mod pipeline;
#[cfg(test)]
mod pipeline_tests;
mod record;
pub mod seal;
#[cfg(test)]
mod sequence_tests;
mod snapshot;
pub mod status;
mod storage;
pub mod tier;

pub use apply::StorageApplier;
pub use peers::PeerRoles;
pub use storage::ReplicatedStorage;

use crate::storage::{
    DeadLetterRecord, DeadLetterReturn, FailureRecord, LogStorage, ReplayJobRecord,
    RetentionRecord, ScheduleKey, SledStorage, Storage, SubMessage, SubscriptionRecord, TierMove,
    TopicRecord,
};
use crate::{BrokerConfig, BrokerError};
pub use ricochet_replication::{
    Durability, GroupRegistry, NodeSettings, PeerTransport, ReplicaNode, ReplicationError,
    ReplicationService,
};
use ricochet_replication::{decode, encode};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The producer name under which a batch without one is stored: its
/// sequence ids come from the Raft log (`index << 16 | position`), so a
/// batch re-applied after a restart is recognised like a resend.
pub const ANONYMOUS_PRODUCER: &str = "__ricochet_raft";

/// Most messages in one replicated batch (an anonymous batch's positions
/// use the low 16 bits of its sequence ids).
pub const MAX_BATCH: usize = 1 << 16;

/// One state change of a replicated partition, as the Raft log carries it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum PartitionCommand {
    /// Creates a topic (the partition, or one of its tiers) if absent.
    /// With a `trimmed_below` above 0 it is the group's trim of that log
    /// instead ([`PartitionCommand::trim_log`]): every replica drops its
    /// sealed segments below that id and serves nothing below it.
    CreateTopic(TopicRecord),
    /// A producer's batch.
    Publish(PublishBatch),
    /// A subscription's record: acks (its cursors), policy, key order.
    PutSubscription(SubscriptionRecord),
    /// Failure records written (a nack or timeout's new delivery count) or,
    /// with `None`, deleted.
    PutFailures(Vec<(SubMessage, Option<FailureRecord>)>),
    /// Schedule entries added (`true`) or removed.
    PutSchedule(Vec<(ScheduleKey, bool)>),
    /// Messages moved into the retry or dead-letter tier, in one transaction.
    MoveMessages(TierMove),
    /// Entries at ids the leader's topic writer chose (what
    /// [`ReplicatedStorage`]'s `append` proposes).
    Append(AppendBatch),
    /// A subscription deleted, with its failure records, schedule and dead
    /// letters.
    DeleteSubscription(SubscriptionRecord),
    /// Dead-letter records of a subscription removed (a purge, a replay
    /// onto the topic).
    RemoveDeadLetters {
        /// The subscription.
        sub_id: u64,
        /// The dead-letter tier entry ids.
        ids: Vec<u64>,
    },
    /// Entries removed from a log (a purged or replayed dead letter's
    /// entry in the dead-letter tier).
    RemoveEntries {
        /// The topic (a tier).
        topic: String,
        /// Their ids.
        ids: Vec<u64>,
    },
    /// Dead-letter records replaced (a replay's intent written into them).
    PutDeadLetters {
        /// The subscription.
        sub_id: u64,
        /// The records by dead-letter tier entry id.
        records: Vec<(u64, DeadLetterRecord)>,
    },
    /// Dead letters moved back into the retry tier, in one transaction (a
    /// replay into the retry tier).
    ReturnDeadLetters(DeadLetterReturn),
    /// A replay job stored, or its progress.
    PutReplayJob(ReplayJobRecord),
    /// A replay job removed (finished or cancelled).
    RemoveReplayJob(u64),
    /// A topic deleted with its entries, producer sequences and
    /// subscriptions (a subscription's tier, or the replicated topic).
    DeleteTopic(String),
    /// The partition's own retention policy set (every member must run a
    /// broker that knows this command before one is set).
    PutRetention(RetentionRecord),
    /// The partition's own retention policy cleared (its namespace's
    /// applies again).
    DeleteRetention(String),
    /// A sealed segment of the partition's log the leader offloaded to the
    /// object store (uploaded, read back and checked): every replica
    /// records the range with the object's key, size and CRC-32C, and
    /// drops its local segments lying wholly inside the recorded ranges
    /// (`ricochet_storage::tiered` `group`). The object is deleted only by
    /// the group's later trim below it or the topic's delete. A broker that
    /// predates this command cannot decode it and stops applying its group
    /// (see [`StorageApplier`]): upgrade every member before offloading a
    /// replicated topic.
    Offloaded(crate::storage::tiered::SegmentState),
    /// The partition's own offload policy set (an empty one clears it),
    /// which its leader's offload pass follows; every member must run a
    /// broker that knows this command before one is set.
    PutOffloadPolicy {
        /// The partition.
        topic: String,
        /// The policy; empty: none of its own.
        policy: crate::storage::tiered::policy::OffloadPolicy,
    },
    /// The partition's active segment sealed (if it holds entries), as
    /// session 17's leaders proposed it for an idle partition; still
    /// applied from a log they wrote. A leader now proposes
    /// [`PartitionCommand::SealBelow`], which a replay cannot apply twice.
    Seal(String),
    /// The partition's active segment sealed if it holds an entry below
    /// `below` (where the leader's log ended when it decided): its
    /// leader's age roll (`segment_max_age`, busy or idle) and the seal
    /// before an on-demand offload. Every replica seals at the same place
    /// in the log, so its next segment starts at the same id (appends
    /// applied from the group's log roll by id block and size only,
    /// `Storage::append_replicated`); applied again after a restart, when
    /// the store is past it, it seals nothing. A broker that predates this
    /// command stops applying its group, as for
    /// [`PartitionCommand::Offloaded`]: upgrade every member first.
    SealBelow {
        /// The partition.
        topic: String,
        /// Sealed only if the active segment holds an id below this.
        below: u64,
    },
    /// Commands the leader's write queue coalesced into one Raft entry
    /// (one append, one flush, one replication round for all), each the
    /// CBOR of a `PartitionCommand`, applied in order as if each were an
    /// entry of its own at this entry's index; the reply is
    /// [`PartitionReply::Each`]. A `Publish` (whose anonymous sequence ids
    /// derive from the index) or a nested `Sequence` inside is refused.
    /// Proposed only when every member advertises
    /// [`gate::COALESCED`]: a broker that predates it stops applying its
    /// group, as for [`PartitionCommand::Offloaded`].
    Sequence(Vec<serde_bytes::ByteBuf>),
}

impl PartitionCommand {
    /// The group's trim of log `record.name` below id `below` (retention,
    /// or segments every subscription consumed): the log's record with its
    /// trim point raised, as a `CreateTopic`. A member running a broker
    /// that predates trims applies a `CreateTopic` of a topic it holds as
    /// nothing, so a group keeps applying during a rolling upgrade (that
    /// member keeps its segments, as before); a command of a new kind
    /// would stop its group there ([`StorageApplier`]).
    pub fn trim_log(record: &TopicRecord, below: u64) -> Self {
        PartitionCommand::CreateTopic(TopicRecord {
            trimmed_below: below,
            ..record.clone()
        })
    }

    /// Ids a command carries that the broker handed out from its id
    /// counter (`next_id`): every replica raises its own counter past them
    /// when it applies the command, so the member that leads next never
    /// hands one out again (a subscription id, a replay job's id, a replay
    /// intent's sequence id, which the topic's de-duplication compares).
    pub fn issued_ids(&self) -> Vec<u64> {
        match self {
            PartitionCommand::PutSubscription(r) => vec![r.id],
            PartitionCommand::PutReplayJob(j) => vec![j.id],
            PartitionCommand::PutDeadLetters { records, .. } => records
                .iter()
                .filter_map(|(_, r)| r.replay.as_ref().map(|i| i.sequence_id))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Entries appended at ids the leader chose, as `Storage::append` takes
/// them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppendBatch {
    /// The topic (the partition or one of its tiers).
    pub topic: String,
    /// The id of the first entry; the others follow it.
    pub first_id: u64,
    /// The encoded entries.
    pub entries: Vec<serde_bytes::ByteBuf>,
    /// The producer and its last sequence id in the batch, if any.
    pub producer: Option<(String, u64)>,
}

/// Index of [`PartitionCommand::Append`] among the enum's variants (what
/// serde passes with its name; CBOR writes the name).
const APPEND_VARIANT: u32 = 6;

/// [`PartitionCommand::Append`] encoded from borrowed entries: the same
/// bytes as the owned command's encoding, without copying each entry into
/// a [`serde_bytes::ByteBuf`] first (a leader's publish path encodes one
/// per client batch).
pub(crate) struct AppendRef<'a> {
    /// The topic (the partition or one of its tiers).
    pub topic: &'a str,
    /// The id of the first entry.
    pub first_id: u64,
    /// The encoded entries.
    pub entries: &'a [Vec<u8>],
    /// The producer and its last sequence id in the batch, if any.
    pub producer: Option<(&'a str, u64)>,
}

/// [`AppendBatch`]'s fields, borrowed.
#[derive(Serialize)]
#[serde(rename = "AppendBatch")]
struct AppendBatchRef<'a> {
    topic: &'a str,
    first_id: u64,
    entries: EntriesRef<'a>,
    producer: Option<(&'a str, u64)>,
}

/// Entries as a sequence of CBOR byte strings (what `Vec<ByteBuf>` writes).
struct EntriesRef<'a>(&'a [Vec<u8>]);

impl Serialize for EntriesRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|e| serde_bytes::Bytes::new(e)))
    }
}

impl Serialize for AppendRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let batch = AppendBatchRef {
            topic: self.topic,
            first_id: self.first_id,
            entries: EntriesRef(self.entries),
            producer: self.producer,
        };
        s.serialize_newtype_variant("PartitionCommand", APPEND_VARIANT, "Append", &batch)
    }
}

impl AppendRef<'_> {
    /// About how many bytes it takes encoded.
    pub fn size_hint(&self) -> usize {
        append_size_hint(self.entries.iter().map(Vec::len))
    }
}

/// Index of [`PartitionCommand::Sequence`] among the enum's variants.
const SEQUENCE_VARIANT: u32 = 21;

/// [`PartitionCommand::Sequence`] encoded from borrowed commands (each a
/// `PartitionCommand`'s CBOR): the owned command's bytes, with each
/// command copied once, straight into the entry's buffer.
pub(crate) struct SequenceRef<'a>(pub &'a [Vec<u8>]);

impl Serialize for SequenceRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_variant(
            "PartitionCommand",
            SEQUENCE_VARIANT,
            "Sequence",
            &EntriesRef(self.0),
        )
    }
}

impl SequenceRef<'_> {
    /// About how many bytes it takes encoded.
    pub fn size_hint(&self) -> usize {
        append_size_hint(self.0.iter().map(Vec::len))
    }
}

/// About how many bytes an `Append` of entries of these lengths takes
/// encoded (a size hint for the encoding's buffer).
pub(crate) fn append_size_hint(lens: impl Iterator<Item = usize>) -> usize {
    lens.map(|n| n + 9).sum::<usize>() + 256
}

/// A producer's batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublishBatch {
    /// The topic (partition).
    pub topic: String,
    /// The producer's name; empty for none (see [`ANONYMOUS_PRODUCER`]).
    pub producer: String,
    /// The publish time the leader gave the batch, ms since the epoch (so
    /// every replica stores the same bytes).
    pub publish_time_ms: u64,
    /// The messages.
    pub messages: Vec<PublishMessage>,
}

/// One message of a [`PublishBatch`] (the fields of `OutboundMessage`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PublishMessage {
    /// The payload.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// Routing and user key; empty for none.
    pub key: String,
    /// User properties.
    pub properties: HashMap<String, String>,
    /// Event time, ms since the epoch; 0 for none.
    pub event_time_ms: u64,
    /// Not deliverable before, ms since the epoch; 0 for now.
    pub deliver_at_ms: u64,
    /// The producer's sequence id (ignored for an anonymous batch).
    pub sequence_id: u64,
}

/// What applying a command answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PartitionReply {
    /// A batch's receipts, in the batch's order.
    Published(Vec<PublishReceipt>),
    /// The change was made.
    Done,
    /// Nothing was changed, for this reason.
    Refused(String),
    /// A [`PartitionCommand::Sequence`]'s replies, one per command in its
    /// order, each the CBOR of a `PartitionReply`.
    Each(Vec<serde_bytes::ByteBuf>),
}

/// One message's receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishReceipt {
    /// The sequence id it was stored under.
    pub sequence_id: u64,
    /// Its entry id; `None` for a duplicate (already stored).
    pub entry_id: Option<u64>,
}

/// Opens the store a replica applies to, as a standalone broker opens its
/// own (`SledStorage` and the segment-file log in `config.data_dir`).
pub async fn open_store(config: &BrokerConfig) -> Result<Arc<dyn Storage>, BrokerError> {
    std::fs::create_dir_all(&config.data_dir)?;
    let sled = Arc::new(SledStorage::open(
        &config.data_dir,
        config.segment_entries,
        config.cache_capacity,
    )?);
    sled.upgrade_held()?;
    let log = LogStorage::open(sled, &config.data_dir, config.log_settings(), None).await?;
    Ok(Arc::new(log))
}

/// The partition (topic) a Raft group's name names: the group name is the
/// topic, or `<topic>@<incarnation>` (see `groups::GroupRecord::raft_group`).
pub fn partition_of(group: &str) -> &str {
    match group.rsplit_once('@') {
        Some((topic, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => topic,
        _ => group,
    }
}

/// One replica of one partition: its Raft node and the store it applies to.
#[derive(Debug)]
pub struct ReplicatedPartition {
    node: ReplicaNode,
    storage: Arc<dyn Storage>,
}

impl ReplicatedPartition {
    /// Starts node `id` of the group `topic` on `storage`, with its Raft log
    /// in `raft_dir` (and its snapshots in `raft_dir/raft-snapshots` unless
    /// `settings` names a place), and routes the group's RPCs through
    /// `registry`.
    pub async fn start(
        id: u64,
        topic: &str,
        raft_dir: &Path,
        settings: &NodeSettings,
        storage: Arc<dyn Storage>,
        registry: &GroupRegistry,
    ) -> Result<Self, ReplicationError> {
        let db = ricochet_replication::open_db(raft_dir, settings)?;
        let mut settings = settings.clone();
        if settings.snapshot_dir.is_none() {
            settings.snapshot_dir = Some(raft_dir.join("raft-snapshots"));
        }
        Self::start_on(id, topic, &db, &settings, storage, registry).await
    }

    /// [`ReplicatedPartition::start`] on a Raft database the broker opened
    /// once for all its groups.
    pub async fn start_on(
        id: u64,
        topic: &str,
        db: &ricochet_replication::RaftDb,
        settings: &NodeSettings,
        storage: Arc<dyn Storage>,
        registry: &GroupRegistry,
    ) -> Result<Self, ReplicationError> {
        let applier = Arc::new(StorageApplier::for_partition(
            storage.clone(),
            partition_of(topic),
        ));
        let node = ReplicaNode::start(id, topic, db, settings, applier, registry).await?;
        Ok(Self { node, storage })
    }

    /// Proposes `command`; its reply once committed by a majority and
    /// applied here (the leader only).
    pub async fn propose(
        &self,
        command: &PartitionCommand,
    ) -> Result<PartitionReply, ReplicationError> {
        let reply = self.node.write(encode(command)?).await?;
        decode(&reply)
    }

    /// Publishes a batch: its receipts once a majority stored it. A
    /// refused batch (unknown topic, too large) is
    /// [`ReplicationError::Refused`].
    pub async fn publish(
        &self,
        batch: PublishBatch,
    ) -> Result<Vec<PublishReceipt>, ReplicationError> {
        match self.propose(&PartitionCommand::Publish(batch)).await? {
            PartitionReply::Published(r) => Ok(r),
            PartitionReply::Refused(why) => Err(ReplicationError::Refused(why)),
            PartitionReply::Done | PartitionReply::Each(_) => Err(ReplicationError::Refused(
                "a publish answered without receipts".to_owned(),
            )),
        }
    }

    /// The Raft node.
    pub fn node(&self) -> &ReplicaNode {
        &self.node
    }

    /// The store this replica applies to.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The borrowed encoding is the owned command's, byte for byte, and
    /// decodes as it (with and without a producer, with no entry).
    #[test]
    fn an_append_encoded_from_borrowed_entries_is_the_owned_commands_bytes() {
        let entries: Vec<Vec<u8>> = vec![vec![1, 2, 3], vec![0; 300], (0..=255).collect()];
        for (entries, producer) in [
            (&entries[..], Some(("p-1", 42))),
            (&entries[..1], None),
            (&entries[..0], None),
        ] {
            let owned = PartitionCommand::Append(AppendBatch {
                topic: "t".into(),
                first_id: 7,
                entries: entries
                    .iter()
                    .map(|e| serde_bytes::ByteBuf::from(e.clone()))
                    .collect(),
                producer: producer.map(|(p, s): (&str, u64)| (p.to_owned(), s)),
            });
            let borrowed = AppendRef {
                topic: "t",
                first_id: 7,
                entries,
                producer,
            };
            let bytes = encode(&borrowed).unwrap();
            assert_eq!(bytes, encode(&owned).unwrap());
            match decode::<PartitionCommand>(&bytes).unwrap() {
                PartitionCommand::Append(b) => {
                    assert_eq!(b.first_id, 7);
                    assert_eq!(b.entries.len(), entries.len());
                    assert!(b.entries.iter().zip(entries).all(|(a, b)| a[..] == b[..]));
                }
                other => panic!("decoded as {other:?}"),
            }
        }
    }
}
