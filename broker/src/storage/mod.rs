//! Storage: the narrow interface dispatch logic uses, and its records.
//!
//! Everything the broker persists goes through [`Storage`]: topic logs (in
//! segments that are dropped whole once consumed), subscription cursors,
//! producer sequence ids for de-duplication, per-message failure records
//! (delivery counts and attempt history), the retry schedule, and dead-letter
//! records. [`sled_store::SledStorage`] is the one implementation; another
//! engine can replace it without touching dispatch logic.
//!
//! Writes are not durable until [`Storage::flush`] returns; the broker's
//! [`crate::flusher::Flusher`] groups concurrent writers onto one flush.

pub mod cursor;
mod error;
pub mod sled_store;

pub use cursor::Cursor;
use error::StorageResult as Result;
pub use error::{StorageError, StorageResult};
use ricochet_proto::Attempt;
use serde::{Deserialize, Serialize};

/// What a topic is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicKind {
    /// A topic producers publish to.
    Normal,
    /// A subscription's retry tier.
    Retry,
    /// A subscription's dead-letter tier.
    DeadLetter,
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
    /// `ricochet.v1.SubscriptionType` value of the last consumer.
    pub sub_type: i32,
    /// Ack state on the main topic.
    pub main: Cursor,
    /// Ack state on the retry tier.
    pub retry: Cursor,
    /// Dead-letter policy set on this subscription, if any.
    pub policy: Option<ricochet_policy::PolicySpec>,
    /// Where `policy` came from: `admin` or `client`.
    pub policy_source: Option<String>,
    /// Overridden retry tier topic, if any.
    pub retry_topic: Option<String>,
    /// Overridden dead-letter tier topic, if any.
    pub dead_letter_topic: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_ms: u64,
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
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(TierId::Main),
            1 => Some(TierId::Retry),
            _ => None,
        }
    }
}

/// Identifies a message within a subscription: its tier and entry id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubMessage {
    /// The subscription's numeric id.
    pub sub_id: u64,
    /// The tier.
    pub tier: TierId,
    /// The entry id in that tier's topic.
    pub entry_id: u64,
}

impl SubMessage {
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
    /// `ricochet.v1.FailureReason` value.
    pub reason: i32,
    /// The nack reason text.
    pub detail: String,
}

impl From<&AttemptRecord> for Attempt {
    fn from(a: &AttemptRecord) -> Self {
        Attempt {
            time_ms: a.time_ms,
            delivery_count: a.delivery_count,
            consumer: a.consumer.clone(),
            reason: a.reason,
            detail: a.detail.clone(),
        }
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
}

/// A schedule entry: `message` becomes deliverable at `due_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// One message moving between tiers, applied atomically with others in a
/// [`TierMove`].
#[derive(Debug, Clone)]
pub struct MoveItem {
    /// The message leaving its tier (acked there).
    pub from: SubMessage,
    /// Where it leaves from, to drop its schedule entry (retry tier only).
    pub from_schedule: Option<ScheduleKey>,
    /// The encoded message appended to the target tier.
    pub payload: Vec<u8>,
    /// The target tier's entry id for it.
    pub target_entry_id: u64,
    /// Its failure record after this move (kept with the target's schedule
    /// entry for a retry move, see [`Storage::failure`]).
    pub failures: FailureRecord,
    /// For a retry move: when it is due.
    pub due_ms: Option<u64>,
    /// For a dead-letter move: the record.
    pub dead_letter: Option<DeadLetterRecord>,
}

/// A batch of moves from one subscription into one target tier, together with
/// the subscription's new cursor state: all or nothing.
#[derive(Debug, Clone)]
pub struct TierMove {
    /// The target tier topic.
    pub target_topic: String,
    /// `Retry` for a retry tier, `None` for the dead-letter tier.
    pub target_tier: Option<TierId>,
    /// The subscription record with the sources marked acked.
    pub subscription: SubscriptionRecord,
    /// The messages.
    pub items: Vec<MoveItem>,
}

/// The persistence interface the broker's dispatch logic is written against.
#[async_trait::async_trait]
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    /// All topics.
    fn list_topics(&self) -> Result<Vec<TopicRecord>>;
    /// Creates or updates a topic's record.
    fn put_topic(&self, record: &TopicRecord) -> Result<()>;
    /// Removes a topic, its entries, producer sequences and subscriptions.
    fn delete_topic(&self, name: &str) -> Result<()>;

    /// Writes entries `first_id..first_id + len` (not durable until flushed),
    /// and records `producer`'s last sequence id with them.
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()>;
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
    /// `(first, next)` entry ids stored for a topic (`first == next` when empty).
    fn entry_range(&self, topic: &str) -> Result<(u64, u64)>;
    /// Drops whole segments that hold only ids `< below`.
    fn trim(&self, topic: &str, below: u64) -> Result<()>;
    /// Removes entries with ids in `ids` from a topic (dead-letter purge).
    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()>;
    /// Last stored sequence id per producer name.
    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>>;

    /// Subscriptions of a topic.
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>>;
    /// Creates or updates a subscription.
    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()>;
    /// Removes a subscription with its failure records and schedule.
    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()>;
    /// A fresh broker-unique id.
    fn next_id(&self) -> Result<u64>;

    /// A message's failure record. A tier move into the retry tier keeps the
    /// record in the message's schedule entry (one stored key fewer per
    /// scheduled retry), so a retry-tier lookup needs its due time;
    /// records written by [`Storage::put_failures`] take precedence.
    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>>;
    /// All failure records of one tier of a subscription.
    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>>;
    /// Writes (or with `None`, deletes) failure records.
    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()>;

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

    /// Bytes on disk.
    fn size_on_disk(&self) -> Result<u64>;
    /// Makes every write so far durable.
    async fn flush(&self) -> Result<()>;
}
