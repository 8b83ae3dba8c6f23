//! The records the broker persists, as plain Rust values: topics,
//! subscriptions (with their cursors), failure histories, dead letters,
//! schedule entries, and the description of a tier move. How each is encoded
//! is the storage engine's business.

use super::Cursor;
use ricochet_policy::{FailureReason, KeyOrder, PolicySpec};
use ricochet_proto::SubscriptionType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod grants;
pub use grants::*;

/// What a topic is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicKind {
    /// A topic producers publish to.
    Normal,
    /// A subscription's retry tier.
    Retry,
    /// A subscription's dead-letter tier.
    DeadLetter,
}

/// A partitioned topic's persisted metadata: its base name and partition
/// count. Its partitions are ordinary topics with their own records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionedRecord {
    /// Fully qualified base name (`persistent://t/ns/orders`).
    pub name: String,
    /// How many partitions (`-partition-0` ..), never lowered.
    pub partitions: u32,
}

/// A retention policy of a namespace or a topic: how much of a topic's
/// main log is kept whether or not it has subscriptions (dropped whole
/// segments at a time, oldest first). `None` means no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionRecord {
    /// `tenant/namespace` or `persistent://tenant/namespace/topic`.
    pub target: String,
    /// Messages older than this (by publish time) are dropped.
    pub max_age_ms: Option<u64>,
    /// Stored message bytes above this are dropped, oldest first.
    pub max_size_bytes: Option<u64>,
    /// Backlog quota: most message bytes the topic's log may hold.
    #[serde(default)]
    pub backlog_quota_bytes: Option<u64>,
    /// What happens at the backlog quota.
    #[serde(default)]
    pub quota_action: QuotaAction,
}

/// What a topic at its backlog quota does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaAction {
    /// Publishes are refused (RESOURCE_EXHAUSTED) until the log shrinks.
    #[default]
    Refuse,
    /// The oldest segments are dropped, as retention by size does.
    DropOldest,
}

/// A topic's persisted metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicRecord {
    /// Fully qualified name.
    pub name: String,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// What the topic is for.
    pub kind: TopicKind,
    /// Replication factor: above 1, the topic is one partition of a Raft
    /// group (cluster mode), its store written by the group's state machine
    /// only; a broker neither opens it as its own topic nor deletes its copy
    /// as a moved topic. Records written before the field are factor 1.
    #[serde(default = "factor_one")]
    pub replicas: u32,
    /// A replicated topic's trim point: the group dropped its entries
    /// below this id (retention, or every subscription consumed them), and
    /// no replica serves them. 0 (never trimmed, factor 1, records written
    /// before the field) is left out of the encoding, so such a record
    /// reads as it did for a broker that predates it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub trimmed_below: u64,
}

fn factor_one() -> u32 {
    1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Who chose a subscription's dead-letter policy. Precedence, highest
/// first: an operator (admin `SetPolicy`), the subscribing client, the
/// broker's config for the topic, none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    /// Set through the admin API.
    Admin,
    /// Sent by a subscribing consumer.
    Client,
    /// A `[[policies]]` rule of the broker config.
    Config,
    /// No policy.
    Default,
}

impl PolicySource {
    /// `admin`, `client`, `config` or `default` (the admin API's wording).
    pub fn as_str(self) -> &'static str {
        match self {
            PolicySource::Admin => "admin",
            PolicySource::Client => "client",
            PolicySource::Config => "config",
            PolicySource::Default => "default",
        }
    }
}

/// A subscription's persisted state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubscriptionRecord {
    /// Broker-unique numeric id, used in compact keys.
    pub id: u64,
    /// Topic name.
    pub topic: String,
    /// Subscription name.
    pub name: String,
    /// The type of its consumers (the last one that joined).
    #[serde(with = "sub_type_code")]
    pub sub_type: SubscriptionType,
    /// Ack state on the main topic.
    pub main: Cursor,
    /// Ack state on the retry tier.
    pub retry: Cursor,
    /// Dead-letter policy set on this subscription, if any.
    pub policy: Option<PolicySpec>,
    /// Who set `policy` (admin or client).
    pub policy_source: Option<PolicySource>,
    /// Overridden retry tier topic, if any.
    pub retry_topic: Option<String>,
    /// Overridden dead-letter tier topic, if any.
    pub dead_letter_topic: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
    /// Per-key ordered retries, when on (set with the policy, by the same
    /// source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_order: Option<KeyOrder>,
    /// Keys held back by key order, each waiting for its failed message.
    /// Stored with the cursors (and in a tier move's transaction), so a
    /// restart holds what was held; the held messages themselves are found
    /// again by reading the unacked log.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blocked_keys: BTreeMap<String, BlockedKey>,
    /// The operator's outage breaker, if any (the config's rule applies
    /// without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<ricochet_policy::BreakerSpec>,
    /// The breaker's state, so an open breaker stays open across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_state: Option<ricochet_policy::BreakerSnapshot>,
}

/// A key held back by key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedKey {
    /// Blocked since, ms since the epoch.
    pub since_ms: u64,
    /// The failed message the key waits for, where it is now.
    pub failed: TierEntry,
    /// Its due time, when it waits in the retry tier (its failure record is
    /// stored with its schedule entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_due_ms: Option<u64>,
}

/// The default retry tier of `subscription` on `topic`: `<topic>-<subscription>-RETRY`
/// (Pulsar's naming; the one place the suffix is spelled).
pub fn default_retry_tier(topic: &str, subscription: &str) -> String {
    format!("{topic}-{subscription}-RETRY")
}

/// The default dead-letter tier of `subscription` on `topic`: `<topic>-<subscription>-DLQ`.
pub fn default_dead_letter_tier(topic: &str, subscription: &str) -> String {
    format!("{topic}-{subscription}-DLQ")
}

impl SubscriptionRecord {
    /// The retry tier this subscription's retries live in: its override,
    /// or the default name.
    pub fn retry_tier(&self) -> String {
        self.retry_topic
            .clone()
            .unwrap_or_else(|| default_retry_tier(&self.topic, &self.name))
    }

    /// A new subscription whose main cursor starts at `start`.
    pub fn new(id: u64, topic: &str, name: &str, sub_type: SubscriptionType, start: u64) -> Self {
        Self {
            id,
            topic: topic.to_owned(),
            name: name.to_owned(),
            sub_type,
            main: Cursor::starting_at(start),
            retry: Cursor::starting_at(0),
            policy: None,
            policy_source: None,
            retry_topic: None,
            dead_letter_topic: None,
            created_ms: 0,
            key_order: None,
            blocked_keys: BTreeMap::new(),
            breaker: None,
            breaker_state: None,
        }
    }

    /// The ack state of one tier.
    pub fn cursor(&self, tier: TierId) -> &Cursor {
        match tier {
            TierId::Main => &self.main,
            TierId::Retry => &self.retry,
        }
    }

    /// The ack state of one tier, to change.
    pub fn cursor_mut(&mut self, tier: TierId) -> &mut Cursor {
        match tier {
            TierId::Main => &mut self.main,
            TierId::Retry => &mut self.retry,
        }
    }

    /// Whether `entry` is acknowledged in its tier.
    pub fn is_acked(&self, entry: TierEntry) -> bool {
        self.cursor(entry.tier).is_acked(entry.entry_id)
    }
}

/// Subscription types are stored as their protocol number (records written
/// before the type was typed hold the same number).
mod sub_type_code {
    use ricochet_proto::SubscriptionType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &SubscriptionType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(*t as i32)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SubscriptionType, D::Error> {
        let v = i32::deserialize(d)?;
        SubscriptionType::try_from(v)
            .map_err(|_| serde::de::Error::custom(format!("unknown subscription type {v}")))
    }
}

/// Which of a subscription's tiers a message sits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TierId {
    /// The subscription's topic.
    Main = 0,
    /// The subscription's retry tier.
    Retry = 1,
}

impl TierId {
    pub(crate) fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(TierId::Main),
            1 => Some(TierId::Retry),
            _ => None,
        }
    }
}

/// One message of a subscription: an entry of its main topic or of its
/// retry tier. Ordered by tier, then entry id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TierEntry {
    /// The tier.
    pub tier: TierId,
    /// The entry id in that tier's topic.
    pub entry_id: u64,
}

impl TierEntry {
    /// An entry of the main topic.
    pub fn main(entry_id: u64) -> Self {
        Self {
            tier: TierId::Main,
            entry_id,
        }
    }

    /// An entry of the retry tier.
    pub fn retry(entry_id: u64) -> Self {
        Self {
            tier: TierId::Retry,
            entry_id,
        }
    }

    /// The same entry within subscription `sub_id`, as storage keys it.
    pub fn of(self, sub_id: u64) -> SubMessage {
        SubMessage {
            sub_id,
            tier: self.tier,
            entry_id: self.entry_id,
        }
    }
}

/// Identifies a message within a subscription: its tier and entry id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SubMessage {
    /// The subscription's numeric id.
    pub sub_id: u64,
    /// The tier.
    pub tier: TierId,
    /// The entry id in that tier's topic.
    pub entry_id: u64,
}

impl SubMessage {
    /// The message without its subscription.
    pub fn entry(&self) -> TierEntry {
        TierEntry {
            tier: self.tier,
            entry_id: self.entry_id,
        }
    }

    /// 17-byte big-endian key: sub id, tier, entry id.
    pub fn key(&self) -> [u8; 17] {
        let mut k = [0u8; 17];
        k[..8].copy_from_slice(&self.sub_id.to_be_bytes());
        k[8] = self.tier as u8;
        k[9..].copy_from_slice(&self.entry_id.to_be_bytes());
        k
    }

    /// Inverse of [`SubMessage::key`].
    pub fn from_key(k: &[u8]) -> Option<Self> {
        if k.len() != 17 {
            return None;
        }
        Some(Self {
            sub_id: u64::from_be_bytes(k[..8].try_into().ok()?),
            tier: TierId::from_byte(k[8])?,
            entry_id: u64::from_be_bytes(k[9..].try_into().ok()?),
        })
    }
}

/// The failure history of one message in one subscription.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FailureRecord {
    /// Failed deliveries so far (the delivery count sent with the next delivery).
    pub count: u32,
    /// Time of the first failure, ms since the epoch.
    pub first_failure_ms: u64,
    /// Every failed attempt, oldest first (bounded to the last 64).
    pub attempts: Vec<AttemptRecord>,
    /// Not to be redelivered in place before this time, ms since the epoch
    /// (a nack whose delay the broker serves); 0 when not held.
    #[serde(default)]
    pub hold_until_ms: u64,
    /// Operators' edits made when replaying it from the dead-letter tier
    /// (fix and resend), oldest first (bounded to the last 64).
    #[serde(default)]
    pub edits: Vec<EditRecord>,
}

/// What a subscription's start needs of a failure record: its count and
/// hold ([`SubscriptionStore::failure_heads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureHead {
    /// See [`FailureRecord::count`].
    pub count: u32,
    /// See [`FailureRecord::hold_until_ms`].
    pub hold_until_ms: u64,
}

impl FailureHead {
    /// The head of `record`.
    pub fn of(record: &FailureRecord) -> Self {
        Self {
            count: record.count,
            hold_until_ms: record.hold_until_ms,
        }
    }
}

/// A subscription's main-tier failure heads split at a hold end
/// ([`SubscriptionStore::main_failure_heads_by`]): the heads of records
/// not held or held until `cut_ms` at the latest, by entry id, and only
/// the entry ids of those held longer (a few bits each for runs of ids:
/// millions of held nacks due later cost a start no list of heads).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MainHeads {
    /// Heads of records whose hold ends by `cut_ms` (or that hold nothing).
    pub near: Vec<(u64, FailureHead)>,
    /// Entry ids of records held past `cut_ms`.
    pub far: roaring::RoaringTreemap,
    /// Where the engine split (`u64::MAX`: it did not).
    pub cut_ms: u64,
}

impl MainHeads {
    /// `heads` split at `cut_ms`.
    pub fn split(heads: Vec<(u64, FailureHead)>, cut_ms: u64) -> Self {
        let mut far = roaring::RoaringTreemap::new();
        let near = heads
            .into_iter()
            .filter(|(e, h)| {
                let keep = h.hold_until_ms <= cut_ms;
                if !keep {
                    far.insert(*e);
                }
                keep
            })
            .collect();
        Self { near, far, cut_ms }
    }

    /// Heads and far ids in all.
    pub fn len(&self) -> usize {
        self.near.len() + self.far.len() as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.near.is_empty() && self.far.is_empty()
    }
}

/// One operator edit of a dead letter, made when it was replayed: who, when,
/// and what changed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EditRecord {
    /// When, ms since the epoch.
    pub time_ms: u64,
    /// Who: the caller's role, or `anonymous`.
    pub by: String,
    /// Payload size before the edit, bytes.
    pub payload_size_before: u64,
    /// Payload size after the edit, bytes.
    pub payload_size_after: u64,
    /// Property keys set (added or changed).
    pub properties_set: Vec<String>,
    /// Property keys removed.
    pub properties_removed: Vec<String>,
    /// Whether the key changed.
    pub key_changed: bool,
}

/// One failed attempt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AttemptRecord {
    /// When, ms since the epoch.
    pub time_ms: u64,
    /// The delivery count after this failure.
    pub delivery_count: u32,
    /// The consumer that failed it.
    pub consumer: String,
    /// Why the delivery failed.
    #[serde(with = "reason_code")]
    pub reason: FailureReason,
    /// The nack reason text.
    pub detail: String,
}

/// Failure reasons are stored as their protocol number.
pub(crate) mod reason_code {
    use ricochet_policy::FailureReason;
    use ricochet_proto::convert::{failure_reason_from_i32, failure_reason_to_i32};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(r: &FailureReason, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(failure_reason_to_i32(*r))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FailureReason, D::Error> {
        failure_reason_from_i32(i32::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Most attempts kept per failure record.
pub const MAX_ATTEMPTS_KEPT: usize = 64;

impl FailureRecord {
    /// Records one more failure.
    pub fn push(&mut self, attempt: AttemptRecord) {
        if self.first_failure_ms == 0 {
            self.first_failure_ms = attempt.time_ms;
        }
        self.count = attempt.delivery_count;
        if self.attempts.len() == MAX_ATTEMPTS_KEPT {
            self.attempts.remove(0);
        }
        self.attempts.push(attempt);
    }

    /// Records one operator edit.
    pub fn push_edit(&mut self, edit: EditRecord) {
        if self.edits.len() == MAX_ATTEMPTS_KEPT {
            self.edits.remove(0);
        }
        self.edits.push(edit);
    }
}

/// A history of `count` nack failures by consumer `c` (times 1 001, 1 002, …),
/// for tests.
impl MessageEdit {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.payload.is_none()
            && self.set_properties.is_empty()
            && self.unset_properties.is_empty()
            && self.key.is_none()
    }

    /// Applies the edit to a message and says what changed.
    pub fn apply(&self, m: &mut ricochet_proto::Message, time_ms: u64, by: &str) -> EditRecord {
        let before = m.payload.len() as u64;
        if let Some(p) = &self.payload {
            m.payload = p.clone();
        }
        let mut removed = Vec::new();
        for k in &self.unset_properties {
            if m.properties.remove(k).is_some() {
                removed.push(k.clone());
            }
        }
        let mut set = Vec::new();
        for (k, v) in &self.set_properties {
            if m.properties.get(k) != Some(v) {
                set.push(k.clone());
            }
            m.properties.insert(k.clone(), v.clone());
            removed.retain(|r| r != k);
        }
        let key_changed = self.key.as_ref().is_some_and(|k| *k != m.key);
        if let Some(k) = &self.key {
            m.key = k.clone();
        }
        EditRecord {
            time_ms,
            by: by.to_owned(),
            payload_size_before: before,
            payload_size_after: m.payload.len() as u64,
            properties_set: set,
            properties_removed: removed,
            key_changed,
        }
    }
}

#[cfg(any(test, feature = "testing"))]
pub(crate) fn sample_history(count: u32) -> FailureRecord {
    let mut r = FailureRecord::default();
    for n in 1..=count {
        r.push(AttemptRecord {
            time_ms: 1_000 + u64::from(n),
            delivery_count: n,
            consumer: "c".into(),
            reason: FailureReason::Nack,
            detail: format!("failure {n}"),
        });
    }
    r
}

/// A dead-lettered message's record, keyed by (subscription, DLQ entry id).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeadLetterRecord {
    /// Where it came from: (topic, entry id) in the subscription's main topic.
    pub origin_topic: String,
    /// Origin entry id.
    pub origin_entry_id: u64,
    /// Why it was dead-lettered.
    pub reason: String,
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// Its failure history.
    pub failures: FailureRecord,
    /// A republish in progress (see [`ReplayIntent`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Box<ReplayIntent>>,
}

impl DeadLetterRecord {
    /// Why the message died, as its consumer saw it: the detail of the last
    /// failed attempt that gave one (a nack's or `reconsume_later`'s text),
    /// else that attempt's kind (`ack_timeout`, `consumer_lost`, …), else
    /// the policy's verdict ([`DeadLetterRecord::reason`]).
    pub fn cause(&self) -> String {
        let attempts = &self.failures.attempts;
        if let Some(a) = attempts.iter().rev().find(|a| !a.detail.is_empty()) {
            return a.detail.clone();
        }
        match attempts.last() {
            Some(a) => a.reason.as_str().to_owned(),
            None => self.reason.clone(),
        }
    }
}

/// A schedule entry: `message` becomes deliverable at `due_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ScheduleKey {
    /// Due time, ms since the epoch.
    pub due_ms: u64,
    /// The scheduled message.
    pub message: SubMessage,
}

impl ScheduleKey {
    /// 25-byte big-endian key: due time first, so a range scan is a time window.
    pub fn key(&self) -> [u8; 25] {
        let mut k = [0u8; 25];
        k[..8].copy_from_slice(&self.due_ms.to_be_bytes());
        k[8..].copy_from_slice(&self.message.key());
        k
    }

    /// Inverse of [`ScheduleKey::key`].
    pub fn from_key(k: &[u8]) -> Option<Self> {
        if k.len() != 25 {
            return None;
        }
        Some(Self {
            due_ms: u64::from_be_bytes(k[..8].try_into().ok()?),
            message: SubMessage::from_key(&k[8..])?,
        })
    }
}

/// Where a moved message lands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Arrival {
    /// In the subscription's retry tier, due at `due_ms` (a schedule entry
    /// that also keeps its failure record, see [`super::Storage::failure`]).
    Retry {
        /// When it is redelivered, ms since the epoch.
        due_ms: u64,
    },
    /// In the subscription's dead-letter tier, with this record.
    DeadLetter(DeadLetterRecord),
}

/// One message moving between tiers, applied atomically with others in a
/// [`TierMove`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MoveItem {
    /// The message leaving its tier (acked there).
    pub from: SubMessage,
    /// Its schedule entry, dropped by the move (a scheduled message only).
    pub from_schedule: Option<ScheduleKey>,
    /// The encoded message appended to the target tier.
    pub payload: Vec<u8>,
    /// The target tier's entry id for it.
    pub target_entry_id: u64,
    /// Its failure record after this move.
    pub failures: FailureRecord,
    /// Where it lands.
    pub arrival: Arrival,
    /// Where `payload`'s message was read from (topic, entry id), when a
    /// retry tier may hold a reference to it instead of the copy (no
    /// properties of the retry's own). An engine that cannot keep the
    /// source ignores it and stores the copy ([`super::refs`]).
    pub source: Option<(String, u64)>,
}

/// A batch of moves from one subscription into one tier topic, together
/// with the subscription's new cursor state: all or nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierMove {
    /// The target tier topic.
    pub target_topic: String,
    /// The subscription record with the sources marked acked.
    pub subscription: SubscriptionRecord,
    /// The messages.
    pub items: Vec<MoveItem>,
}

/// Dead letters of one subscription going back into its retry tier, in one
/// transaction: each dead-letter record and its dead-letter tier entry are
/// removed, and a copy is appended to the retry tier with a schedule entry
/// holding its failure record. All or nothing; if any dead letter is no
/// longer there (purged meanwhile) nothing is changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeadLetterReturn {
    /// The subscription's dead-letter tier topic.
    pub dead_letter_topic: String,
    /// The subscription's retry tier topic.
    pub retry_topic: String,
    /// The subscription record, stored with the move.
    pub subscription: SubscriptionRecord,
    /// The dead letters.
    pub items: Vec<ReturnItem>,
}

/// One dead letter of a [`DeadLetterReturn`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReturnItem {
    /// Its dead-letter tier entry id (and dead-letter record key).
    pub dead_letter_id: u64,
    /// The encoded message appended to the retry tier.
    pub payload: Vec<u8>,
    /// Its retry tier entry id.
    pub target_entry_id: u64,
    /// When it is delivered again, ms since the epoch.
    pub due_ms: u64,
    /// Its failure record from now on.
    pub failures: FailureRecord,
}

/// A republish of a dead letter onto its topic that has been decided but
/// not finished: written into the dead-letter record before the publish, so
/// a broker that crashes between publishing and removing the dead letter
/// publishes it again under the same producer sequence id, which the
/// topic's de-duplication drops if the first publish was stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplayIntent {
    /// The sequence id of the replay producer (see [`replay_producer`]).
    pub sequence_id: u64,
    /// The message to publish, encoded (edits applied).
    pub message: Vec<u8>,
    /// The failure record the published message starts with (`None`: a
    /// fresh start).
    pub failures: Option<FailureRecord>,
}

/// The producer name a subscription's republishing replays use on its topic.
pub fn replay_producer(subscription: &str) -> String {
    format!("__ricochet_replay/{subscription}")
}

/// Changes made to a dead letter when it is replayed (fix and resend).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageEdit {
    /// A new payload.
    pub payload: Option<Vec<u8>>,
    /// Properties added or replaced.
    pub set_properties: std::collections::BTreeMap<String, String>,
    /// Property keys removed (before `set_properties` apply).
    pub unset_properties: Vec<String>,
    /// A new key.
    pub key: Option<String>,
}

/// Where a replay sends dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayTarget {
    /// The subscription's retry tier, due at this time (ms since epoch; 0
    /// or a past time means now).
    RetryTier {
        /// Due time.
        due_ms: u64,
    },
    /// Published again on the topic, for every subscription.
    Topic,
}

/// A replay as an operator ordered it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayOrder {
    /// Where the dead letters go.
    pub target: ReplayTarget,
    /// Start their delivery count from 0 again.
    pub reset_count: bool,
    /// Changes to make first (fix and resend).
    pub edit: Option<MessageEdit>,
    /// Who asked: a role, or `anonymous`.
    pub by: String,
}

/// A rate-limited replay in progress, kept durably so that it resumes
/// after a broker restart: the dead letters it was asked to replay (those
/// matching when it was asked) and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayJobRecord {
    /// Broker-unique id.
    pub id: u64,
    /// The subscription's topic.
    pub topic: String,
    /// The subscription.
    pub subscription: String,
    /// The dead-letter entry ids to replay, ascending (stored once, apart
    /// from the rest; empty when read without them).
    pub dead_letter_ids: Vec<u64>,
    /// How many ids there are.
    pub total: u64,
    /// How many of `dead_letter_ids` are done (replayed, or gone).
    pub cursor: usize,
    /// Dead letters replayed so far (those gone meanwhile not counted).
    pub replayed: u64,
    /// Messages per second.
    pub rate_per_second: u32,
    /// What to do with each.
    pub order: ReplayOrder,
    /// When it was asked, ms since the epoch.
    pub created_ms: u64,
}

/// Everything a subscription keeps apart from its record — failure records,
/// schedule entries (with the failure records retries carry in them) and
/// dead-letter records — as moved whole with its topic to another broker
/// (`crate::transfer`). Keys are relative to the subscription, whose numeric
/// id differs from broker to broker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubscriptionState {
    /// Failure records stored under their own keys.
    pub failures: Vec<(TierEntry, FailureRecord)>,
    /// Schedule entries: due time, message, and the failure record the
    /// entry itself holds (a retry-tier entry), if any.
    pub schedule: Vec<(u64, TierEntry, Option<FailureRecord>)>,
    /// Dead-letter records by dead-letter tier entry id.
    pub dead_letters: Vec<(u64, DeadLetterRecord)>,
}
