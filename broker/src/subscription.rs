//! A subscription at run time: one task (an actor) that owns its cursors,
//! consumers, in-flight messages, failure records and tier moves.
//!
//! Everything that changes a subscription arrives as a [`Command`] on one
//! channel, so no state is shared and no lock is held across an await. The
//! actor reads the topic log from its cursor into a small read-ahead buffer,
//! dispatches by subscription type (Exclusive, Failover, Shared, Key_Shared)
//! within each consumer's flow permits and unacked cap, and handles acks and
//! failures:
//!
//! * a failure (nack, ack timeout, consumer lost, `reconsume_later`,
//!   terminate) bumps the message's persisted delivery count and asks the
//!   subscription's [`DeadLetterPolicy`] what to do;
//! * [`Tier::Main`] redelivers in place at once (for nacks and ack timeouts
//!   the client already served the delay), once the new count is durable;
//! * [`Tier::Retry`] and dead-lettering move the message, in one storage
//!   transaction, into the subscription's retry tier (with a due time in the
//!   schedule index) or its dead-letter tier (with its failure history).
//!
//! Order: on Exclusive and Failover subscriptions a failed message is
//! redelivered on its own, after messages already dispatched; the rest of the
//! stream is not rewound. Applications that need strict order should not nack
//! but retry in place. Key_Shared never hands a key to a second consumer
//! while the first still holds unacked messages of that key.

use crate::error::{BrokerError, Result};
use crate::flusher::Flusher;
use crate::metrics::SubscriptionMetrics;
use crate::name::TopicName;
use crate::scheduler::Scheduler;
use crate::storage::{
    AttemptRecord, DeadLetterRecord, FailureRecord, MoveItem, ScheduleKey, Storage, StorageError,
    SubMessage, SubscriptionRecord, TierId, TierMove,
};
use crate::topic::Topic;
use crate::util::{fnv1a, now_ms};
use prost::Message as _;
use ricochet_policy::{
    AttemptOverride, DeadLetterPolicy, Decision, FailureContext, FailureReason, PolicySpec, Tier,
};
use ricochet_proto::{
    Ack, AckType, ActiveChange, CommandResult, ConsumeResponse, ConsumerStats, DeadLetter,
    DueBucket, FailedDelivery, Message, MessageBatch, MessageId, OutboundMessage, ReconsumeLater,
    Redeliver, Subscribed, SubscriptionStatsResponse, SubscriptionType, Terminate,
    consume_response, props, reconsume_later,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

/// Messages buffered ahead of dispatch.
const READ_AHEAD: usize = 1_000;
/// Commands handled before the actor dispatches again, so a burst of acks or
/// nacks does not hold back deliveries.
const COMMANDS_PER_ROUND: usize = 64;
/// Most messages sent to a consumer in one frame.
const MAX_FRAME: usize = 500;
/// Frames stop growing past this many payload bytes (one message always fits:
/// the gRPC frame limit is far above the largest allowed message).
const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// Sends messages in frames bounded by count and bytes.
fn send_frames(tx: &ConsumerTx, msgs: Vec<Message>) {
    let mut frame = Vec::new();
    let mut bytes = 0;
    let flush = |frame: &mut Vec<Message>| {
        let batch = MessageBatch {
            messages: std::mem::take(frame),
        };
        let _ = tx.send(Ok(ConsumeResponse {
            response: Some(consume_response::Response::Messages(batch)),
        }));
    };
    for m in msgs {
        let size = m.payload.len();
        if !frame.is_empty() && (frame.len() >= MAX_FRAME || bytes + size > MAX_FRAME_BYTES) {
            flush(&mut frame);
            bytes = 0;
        }
        bytes += size;
        frame.push(m);
    }
    if !frame.is_empty() {
        flush(&mut frame);
    }
}

/// Where a consumer's frames go.
pub type ConsumerTx = mpsc::UnboundedSender<Result<ConsumeResponse, Status>>;

/// A consumer asking to join.
#[derive(Debug)]
pub struct ConsumerSpec {
    /// Consumer name (unique per subscription is not required).
    pub name: String,
    /// Requested subscription type.
    pub sub_type: SubscriptionType,
    /// The consumer's outbound frames.
    pub tx: ConsumerTx,
    /// The consumer's dead-letter policy, if it sent one.
    pub policy: Option<PolicySpec>,
    /// Whether it receives messages from the retry tier (Pulsar's `enableRetry`).
    pub retry_enabled: bool,
}

/// The subscription's policy and where it came from.
#[derive(Debug, Clone)]
pub struct PolicyInfo {
    /// The spec in force, if any.
    pub spec: Option<PolicySpec>,
    /// `admin`, `client`, `config` or `default`.
    pub source: String,
    /// Retry tier topic.
    pub retry_topic: String,
    /// Dead-letter tier topic.
    pub dead_letter_topic: String,
}

/// A message's state in one subscription (for `GetMessage`).
#[derive(Debug, Clone)]
pub struct MessageState {
    /// `pending`, `in_flight`, `acked`, `scheduled` or `unknown`.
    pub state: String,
    /// Persisted delivery count.
    pub failures: Option<FailureRecord>,
}

/// Requests handled by the subscription actor.
#[derive(Debug)]
pub enum Command {
    /// A consumer joins; replies with its id.
    AddConsumer(ConsumerSpec, oneshot::Sender<Result<(u64, PolicyInfo)>>),
    /// A consumer's stream ended.
    RemoveConsumer(u64),
    /// More permits.
    Flow(u64, u32),
    /// Acknowledgements.
    Ack(u64, Ack),
    /// Redeliver now (nack after the client-held delay, or ack timeout).
    Redeliver(u64, Redeliver),
    /// Move to the retry tier.
    ReconsumeLater(u64, ReconsumeLater),
    /// Move to the dead-letter tier.
    Terminate(u64, Terminate),
    /// A consumer closes cleanly: its messages go back uncounted.
    CloseConsumer(u64),
    /// Messages whose new delivery counts are durable: dispatch them.
    Ready(Vec<(TierId, u64)>),
    /// Stats snapshot, without the schedule part (see [`SubscriptionHandle::stats`]).
    Stats(oneshot::Sender<StatsSnapshot>),
    /// The policy in force.
    GetPolicy(oneshot::Sender<PolicyInfo>),
    /// Replace (or clear) the operator-set policy.
    SetPolicy(Option<PolicySpec>, oneshot::Sender<Result<PolicyInfo>>),
    /// State of one main-topic entry.
    MessageState(u64, oneshot::Sender<MessageState>),
    /// Publish dead letters again on the topic (keeping or resetting their
    /// delivery counts) and remove them from the dead-letter tier.
    Replay(
        Vec<DeadLetter>,
        bool,
        oneshot::Sender<Result<Vec<MessageId>>>,
    ),
    /// Dead letters were purged by an operator (for the DLQ size gauge).
    DeadLettersPurged(u64),
    /// Stop the actor and delete the subscription's state.
    Delete(oneshot::Sender<Result<()>>),
}

/// Handle to a running subscription.
#[derive(Debug, Clone)]
pub struct SubscriptionHandle {
    /// Broker-unique id.
    pub id: u64,
    /// Subscription name.
    pub name: String,
    tx: mpsc::UnboundedSender<Command>,
}

/// What the actor knows for its stats; the schedule part is added from
/// storage outside the actor.
#[derive(Debug)]
pub struct StatsSnapshot {
    stats: SubscriptionStatsResponse,
    /// Messages out with consumers: their schedule entries are not waiting.
    in_flight: HashSet<(TierId, u64)>,
}

impl SubscriptionHandle {
    /// The subscription's stats. The scheduled part scans the schedule index
    /// on a blocking thread, so a stats call never stalls dispatch.
    pub async fn stats(&self, storage: Arc<dyn Storage>) -> Result<SubscriptionStatsResponse> {
        let StatsSnapshot {
            mut stats,
            in_flight,
        } = self.ask(Command::Stats).await?;
        let sub_id = self.id;
        let (scheduled, next_due, by_due) = tokio::task::spawn_blocking(move || {
            schedule_stats(storage.as_ref(), sub_id, &in_flight, now_ms())
        })
        .await
        .map_err(|_| BrokerError::ShuttingDown)??;
        stats.backlog += scheduled;
        stats.scheduled_retries = scheduled;
        stats.next_retry_due_ms = next_due.unwrap_or(0);
        stats.scheduled_by_due = by_due;
        Ok(stats)
    }

    /// Sends a command; fails if the actor is gone.
    pub fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| BrokerError::ShuttingDown)
    }

    /// Sends a command carrying a reply channel and awaits the answer.
    pub async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await.map_err(|_| BrokerError::ShuttingDown)
    }
}

/// What a subscription needs from the rest of the broker.
#[async_trait::async_trait]
pub trait TierTopics: Send + Sync + std::fmt::Debug {
    /// The topic of a retry or dead-letter tier, created on first use.
    async fn tier_topic(&self, name: &str, dead_letter: bool) -> Result<Arc<Topic>>;
    /// Builds a policy from its spec (resolving named, registered policies).
    fn build_policy(&self, spec: &PolicySpec) -> Result<Arc<dyn DeadLetterPolicy>>;
    /// The configured default policy for a topic.
    fn configured_policy(&self, topic: &str) -> Option<PolicySpec>;
}

/// Settings the actor needs.
#[derive(Debug, Clone)]
pub struct SubscriptionSettings {
    /// Dispatch pauses at this many unacked messages per consumer.
    pub max_unacked_per_consumer: usize,
    /// Whether writes must be flushed before they are acknowledged.
    pub sync: bool,
    /// Cancelled when the broker shuts down: consumers leaving then are not
    /// charged an attempt (the broker, not the message, ended the delivery).
    pub shutdown: tokio_util::sync::CancellationToken,
}

struct ConsumerState {
    id: u64,
    name: String,
    tx: ConsumerTx,
    permits: u32,
    unacked: usize,
    /// Whether it receives messages from the retry tier.
    retry: bool,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    consumer: u64,
    bucket: Option<u16>,
    due_ms: Option<u64>,
}

struct Pending {
    msg: Message,
    due_ms: Option<u64>,
}

/// The running state of one subscription.
pub struct SubscriptionActor {
    rec: SubscriptionRecord,
    topic: Arc<Topic>,
    retry_topic_name: String,
    dlq_topic_name: String,
    retry_topic: Option<Arc<Topic>>,
    dlq_topic: Option<Arc<Topic>>,
    storage: Arc<dyn Storage>,
    flusher: Flusher,
    scheduler: Scheduler,
    tiers: Arc<dyn TierTopics>,
    settings: SubscriptionSettings,
    policy: Option<Arc<dyn DeadLetterPolicy>>,
    policy_source: String,
    consumers: Vec<ConsumerState>,
    next_consumer: u64,
    rr: usize,
    read_pos: u64,
    ready: BTreeMap<(TierId, u64), Pending>,
    /// Fired schedule entries not yet loaded into `ready`.
    due: BTreeMap<(TierId, u64), u64>,
    in_flight: HashMap<(TierId, u64), InFlight>,
    /// Failure records of main-tier messages (all) and of loaded retry-tier ones.
    failures: HashMap<(TierId, u64), FailureRecord>,
    /// Key_Shared: which consumer holds unacked messages of a key bucket, and how many.
    buckets: HashMap<u16, (u64, u32)>,
    active: Option<u64>,
    /// Used by `reconsume_later` when the subscription has no policy.
    fallback_retry_policy: Option<Arc<dyn DeadLetterPolicy>>,
    metrics: SubscriptionMetrics,
    /// Messages in the retry tier not yet acked.
    retry_queue: u64,
    /// Messages in the dead-letter tier.
    dlq_size: u64,
    /// Since start: moves into the retry tier, and retry-tier acks.
    retries_scheduled: u64,
    retries_succeeded: u64,
    dirty: bool,
    self_tx: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for SubscriptionActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionActor")
            .field("topic", &self.rec.topic)
            .field("name", &self.rec.name)
            .finish()
    }
}

fn sub_type_of(v: i32) -> SubscriptionType {
    SubscriptionType::try_from(v).unwrap_or(SubscriptionType::Exclusive)
}

fn reason_of(v: i32) -> FailureReason {
    match ricochet_proto::FailureReason::try_from(v) {
        Ok(ricochet_proto::FailureReason::AckTimeout) => FailureReason::AckTimeout,
        Ok(ricochet_proto::FailureReason::ConsumerLost) => FailureReason::ConsumerLost,
        Ok(ricochet_proto::FailureReason::ReconsumeLater) => FailureReason::ReconsumeLater,
        Ok(ricochet_proto::FailureReason::Terminate) => FailureReason::Terminate,
        _ => FailureReason::Nack,
    }
}

fn wire_reason(r: FailureReason) -> i32 {
    (match r {
        FailureReason::Nack => ricochet_proto::FailureReason::Nack,
        FailureReason::AckTimeout => ricochet_proto::FailureReason::AckTimeout,
        FailureReason::ConsumerLost => ricochet_proto::FailureReason::ConsumerLost,
        FailureReason::ReconsumeLater => ricochet_proto::FailureReason::ReconsumeLater,
        FailureReason::Terminate => ricochet_proto::FailureReason::Terminate,
    }) as i32
}

fn bucket_of(key: &str) -> u16 {
    (fnv1a(key.as_bytes()) >> 48) as u16
}

fn result_frame(request_id: u64, code: Code, message: impl Into<String>) -> ConsumeResponse {
    ConsumeResponse {
        response: Some(consume_response::Response::Result(CommandResult {
            request_id,
            code: code as i32,
            message: message.into(),
        })),
    }
}

/// One failure to process, gathered from a command.
struct Failure {
    key: (TierId, u64),
    reason: FailureReason,
    detail: String,
    consumer: String,
    overrides: AttemptOverride,
    extra_props: HashMap<String, String>,
}

/// Policy used for `reconsume_later` when the subscription has none:
/// RocketMQ's defaults (16 retries on the 18-level table, then DLQ).
fn default_retry_policy() -> Option<Arc<dyn DeadLetterPolicy>> {
    PolicySpec::delay_levels_default().build().ok()
}

impl SubscriptionActor {
    /// Spawns the actor for a loaded or newly created subscription.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        rec: SubscriptionRecord,
        topic: Arc<Topic>,
        storage: Arc<dyn Storage>,
        flusher: Flusher,
        scheduler: Scheduler,
        tiers: Arc<dyn TierTopics>,
        settings: SubscriptionSettings,
    ) -> Result<SubscriptionHandle> {
        let dlq_size = storage.count_dead_letters(rec.id)?;
        let metrics = SubscriptionMetrics::new(&rec.topic, &rec.name);
        let (tx, rx) = mpsc::unbounded_channel();
        let (fire_tx, fire_rx) = mpsc::unbounded_channel();
        scheduler.register(rec.id, fire_tx);
        let topic_name = TopicName::parse(&rec.topic)?;
        let sub_name = crate::name::SubscriptionName::parse(&rec.name)?;
        let retry_topic_name = rec
            .retry_topic
            .clone()
            .unwrap_or_else(|| topic_name.retry_tier(&sub_name).to_string());
        let dlq_topic_name = rec
            .dead_letter_topic
            .clone()
            .unwrap_or_else(|| topic_name.dead_letter_tier(&sub_name).to_string());
        // Every retry-tier entry the cursor has not acked is still queued
        // there (a message leaving the tier acks its entry), so the queue size
        // comes from the cursor, not from a scan of the schedule.
        let (_, retry_end) = storage.entry_range(&retry_topic_name)?;
        let mark = rec.retry.mark_delete.min(retry_end);
        let retry_queue = (retry_end - mark) - rec.retry.acked_between(mark, retry_end);
        // Main-tier failure records are few (unacked failed messages): keep them all.
        // Retry-tier ones are read when their retry fires.
        let mut failures = HashMap::new();
        for (m, f) in storage.failures_of(rec.id, TierId::Main)? {
            failures.insert((m.tier, m.entry_id), f);
        }
        let mut actor = SubscriptionActor {
            read_pos: rec.main.mark_delete,
            policy: None,
            policy_source: "default".into(),
            retry_topic_name,
            dlq_topic_name,
            retry_topic: None,
            dlq_topic: None,
            storage,
            flusher,
            scheduler,
            tiers,
            settings,
            consumers: Vec::new(),
            next_consumer: 1,
            rr: 0,
            ready: BTreeMap::new(),
            due: BTreeMap::new(),
            in_flight: HashMap::new(),
            failures,
            buckets: HashMap::new(),
            active: None,
            fallback_retry_policy: default_retry_policy(),
            metrics,
            retry_queue,
            dlq_size,
            retries_scheduled: 0,
            retries_succeeded: 0,
            dirty: false,
            self_tx: tx.clone(),
            topic,
            rec,
        };
        actor.resolve_policy()?;
        let handle = SubscriptionHandle {
            id: actor.rec.id,
            name: actor.rec.name.clone(),
            tx,
        };
        tokio::spawn(actor.run(rx, fire_rx));
        Ok(handle)
    }

    fn resolve_policy(&mut self) -> Result<()> {
        let (spec, source) = match (&self.rec.policy, &self.rec.policy_source) {
            (Some(p), src) => (
                Some(p.clone()),
                src.clone().unwrap_or_else(|| "admin".into()),
            ),
            (None, _) => match self.tiers.configured_policy(&self.rec.topic) {
                Some(p) => (Some(p), "config".to_owned()),
                None => (None, "default".to_owned()),
            },
        };
        self.policy = match &spec {
            Some(s) => Some(self.tiers.build_policy(s)?),
            None => None,
        };
        self.policy_source = source;
        Ok(())
    }

    fn policy_info(&self) -> PolicyInfo {
        PolicyInfo {
            spec: self
                .policy
                .as_ref()
                .and_then(|p| p.spec())
                .or_else(|| self.rec.policy.clone()),
            source: self.policy_source.clone(),
            retry_topic: self.retry_topic_name.clone(),
            dead_letter_topic: self.dlq_topic_name.clone(),
        }
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Command>,
        mut fired: mpsc::UnboundedReceiver<Vec<ScheduleKey>>,
    ) {
        let mut end = self.topic.watch_end();
        loop {
            tokio::select! {
                cmd = rx.recv() => {
                    let Some(mut cmd) = cmd else { break };
                    // Handle what else is queued (up to a bound) before dispatching once.
                    let mut handled = 0;
                    // Consecutive `reconsume_later`s are gathered and moved
                    // in one transaction; any other command first applies
                    // them, so commands still take effect in arrival order.
                    let mut reconsumes = Vec::new();
                    loop {
                        match cmd {
                            Command::ReconsumeLater(consumer, req) => {
                                reconsumes.push((consumer, req));
                            }
                            Command::Delete(reply) => {
                                self.reconsume_later(std::mem::take(&mut reconsumes)).await;
                                let r = self.delete();
                                let deleted = r.is_ok();
                                let _ = reply.send(r);
                                if deleted {
                                    return;
                                }
                            }
                            other => {
                                self.reconsume_later(std::mem::take(&mut reconsumes)).await;
                                self.handle(other).await;
                            }
                        }
                        handled += 1;
                        if handled >= COMMANDS_PER_ROUND {
                            break;
                        }
                        match rx.try_recv() {
                            Ok(next) => cmd = next,
                            Err(_) => break,
                        }
                    }
                    self.reconsume_later(reconsumes).await;
                }
                keys = fired.recv() => {
                    if let Some(keys) = keys {
                        let now_us = crate::util::now_us();
                        for k in keys {
                            if k.message.tier == TierId::Retry {
                                self.metrics.retries_fired.increment(1);
                            }
                            let late = now_us.saturating_sub(k.due_ms * 1000) as f64 / 1e6;
                            self.metrics.retry_lateness.record(late);
                            self.due.insert((k.message.tier, k.message.entry_id), k.due_ms);
                        }
                    }
                }
                changed = end.changed() => {
                    if changed.is_err() { break; }
                }
                _ = self.settings.shutdown.cancelled() => {
                    // Consumers are gone with their streams; persist and stop.
                    self.persist();
                    break;
                }
            }
            self.dispatch();
            self.persist();
        }
        self.scheduler.unregister(self.rec.id);
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::AddConsumer(spec, reply) => {
                let r = self.add_consumer(spec);
                let _ = reply.send(r);
            }
            Command::RemoveConsumer(id) => self.remove_consumer(id).await,
            Command::Flow(id, permits) => {
                if let Some(c) = self.consumers.iter_mut().find(|c| c.id == id) {
                    c.permits = c.permits.saturating_add(permits);
                }
            }
            Command::Ack(id, ack) => self.ack(id, ack),
            Command::Redeliver(id, req) => self.redeliver(id, req).await,
            Command::ReconsumeLater(id, req) => self.reconsume_later(vec![(id, req)]).await,
            Command::Terminate(id, req) => self.terminate(id, req).await,
            Command::CloseConsumer(id) => self.close_consumer(id),
            Command::Ready(keys) => {
                for k in keys {
                    if self.is_acked(k) || self.in_flight.contains_key(&k) {
                        continue;
                    }
                    if let Some(p) = self.load(k, None) {
                        self.ready.insert(k, p);
                    }
                }
            }
            Command::Stats(reply) => {
                let _ = reply.send(StatsSnapshot {
                    stats: self.stats(),
                    in_flight: self.in_flight.keys().copied().collect(),
                });
            }
            Command::GetPolicy(reply) => {
                let _ = reply.send(self.policy_info());
            }
            Command::SetPolicy(spec, reply) => {
                let r = self.set_policy(spec, "admin");
                let _ = reply.send(r);
            }
            Command::MessageState(entry, reply) => {
                let _ = reply.send(self.message_state(entry));
            }
            Command::Replay(letters, reset, reply) => {
                let r = self.replay(letters, reset).await;
                let _ = reply.send(r);
            }
            Command::DeadLettersPurged(n) => {
                self.dlq_size = self.dlq_size.saturating_sub(n);
                self.dirty = true;
            }
            Command::Delete(_) => {}
        }
    }

    async fn replay(&mut self, letters: Vec<DeadLetter>, reset: bool) -> Result<Vec<MessageId>> {
        let mut out = Vec::with_capacity(letters.len());
        let mut records = Vec::with_capacity(letters.len());
        let mut dlq_ids = Vec::with_capacity(letters.len());
        for (i, d) in letters.iter().enumerate() {
            let Some(m) = &d.message else { continue };
            dlq_ids.push(m.id.as_ref().map_or(0, |id| id.entry_id));
            let mut properties = m.properties.clone();
            properties.remove(props::DEAD_LETTER_REASON);
            if reset {
                // A fresh start: no reconsume history on the message either.
                // ORIGIN_MESSAGE_ID and REAL_TOPIC stay, as provenance.
                properties.remove(props::RECONSUME_TIMES);
                properties.remove(props::DELAY_TIME);
            }
            out.push(OutboundMessage {
                payload: m.payload.clone(),
                key: m.key.clone(),
                properties,
                event_time_ms: m.event_time_ms,
                deliver_at_ms: 0,
                sequence_id: i as u64,
            });
            records.push(FailureRecord {
                count: m.delivery_count,
                first_failure_ms: d.attempts.first().map_or(0, |a| a.time_ms),
                attempts: d
                    .attempts
                    .iter()
                    .map(|a| AttemptRecord {
                        time_ms: a.time_ms,
                        delivery_count: a.delivery_count,
                        consumer: a.consumer.clone(),
                        reason: a.reason,
                        detail: a.detail.clone(),
                    })
                    .collect(),
            });
        }
        if out.is_empty() {
            return Ok(Vec::new());
        }
        let receipts = self.topic.publish("", out).await?;
        self.dlq_size = self.dlq_size.saturating_sub(dlq_ids.len() as u64);
        let ids: Vec<MessageId> = receipts.into_iter().filter_map(|r| r.message_id).collect();
        if !reset {
            let mut writes = Vec::new();
            for (id, rec) in ids.iter().zip(records) {
                let m = SubMessage {
                    sub_id: self.rec.id,
                    tier: TierId::Main,
                    entry_id: id.entry_id,
                };
                writes.push((m, Some(rec.clone())));
                self.failures.insert((TierId::Main, id.entry_id), rec);
            }
            self.storage.put_failures(&writes)?;
        }
        self.storage.remove_dead_letters(self.rec.id, &dlq_ids)?;
        self.storage
            .remove_entries(&self.dlq_topic_name, &dlq_ids)?;
        if self.settings.sync {
            self.flusher.durable().await?;
        }
        tracing::warn!(sub = %self.rec.name, topic = %self.rec.topic, count = ids.len(), reset, "dead letters replayed");
        Ok(ids)
    }

    fn set_policy(&mut self, spec: Option<PolicySpec>, source: &str) -> Result<PolicyInfo> {
        if let Some(s) = &spec {
            s.validate()?;
            self.tiers.build_policy(s)?;
        }
        let old = (self.rec.policy.clone(), self.rec.policy_source.clone());
        self.rec.policy_source = spec.as_ref().map(|_| source.to_owned());
        self.rec.policy = spec;
        if let Err(e) = self.resolve_policy() {
            (self.rec.policy, self.rec.policy_source) = old;
            return Err(e);
        }
        self.dirty = true;
        Ok(self.policy_info())
    }

    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<(u64, PolicyInfo)> {
        let current = sub_type_of(self.rec.sub_type);
        if !self.consumers.is_empty() {
            if current != spec.sub_type {
                return Err(BrokerError::Conflict(format!(
                    "subscription {} is {} and has consumers; cannot attach a {} consumer",
                    self.rec.name,
                    current.as_str_name(),
                    spec.sub_type.as_str_name()
                )));
            }
            if current == SubscriptionType::Exclusive {
                return Err(BrokerError::Conflict(format!(
                    "subscription {} is Exclusive and already has consumer {:?}",
                    self.rec.name, self.consumers[0].name
                )));
            }
        }
        // A consumer's policy applies unless an operator set one.
        if let Some(p) = spec.policy
            && self.rec.policy_source.as_deref() != Some("admin")
            && self.rec.policy.as_ref() != Some(&p)
        {
            self.set_policy(Some(p), "client")?;
        }
        if self.rec.sub_type != spec.sub_type as i32 {
            self.rec.sub_type = spec.sub_type as i32;
            self.dirty = true;
        }
        let id = self.next_consumer;
        self.next_consumer += 1;
        // The first frame a consumer sees, before any message or active change.
        let info = self.policy_info();
        let subscribed = ConsumeResponse {
            response: Some(consume_response::Response::Subscribed(Subscribed {
                topic: self.rec.topic.clone(),
                subscription: self.rec.name.clone(),
                consumer_name: spec.name.clone(),
                dead_letter_policy: info.spec.as_ref().map(Into::into),
                retry_topic: info.retry_topic.clone(),
                dead_letter_topic: info.dead_letter_topic.clone(),
            })),
        };
        let _ = spec.tx.send(Ok(subscribed));
        self.consumers.push(ConsumerState {
            id,
            name: spec.name,
            tx: spec.tx,
            permits: 0,
            unacked: 0,
            retry: spec.retry_enabled,
        });
        self.update_active(Some(id));
        Ok((id, self.policy_info()))
    }

    /// Picks the active consumer (Failover: lowest name, then earliest) and
    /// tells consumers whose role changed; `joined` is told its role either way.
    fn update_active(&mut self, joined: Option<u64>) {
        if sub_type_of(self.rec.sub_type) != SubscriptionType::Failover {
            self.active = self.consumers.first().map(|c| c.id);
            return;
        }
        let new = self
            .consumers
            .iter()
            .min_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)))
            .map(|c| c.id);
        let old = std::mem::replace(&mut self.active, new);
        for c in &self.consumers {
            let changed = old != new && (Some(c.id) == old || Some(c.id) == new);
            if changed || Some(c.id) == joined {
                let frame = ConsumeResponse {
                    response: Some(consume_response::Response::ActiveChange(ActiveChange {
                        active: Some(c.id) == new,
                    })),
                };
                let _ = c.tx.send(Ok(frame));
            }
        }
    }

    async fn remove_consumer(&mut self, id: u64) {
        let Some(pos) = self.consumers.iter().position(|c| c.id == id) else {
            return;
        };
        let c = self.consumers.remove(pos);
        if self.settings.shutdown.is_cancelled() {
            return;
        }
        let lost: Vec<(TierId, u64)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.consumer == id)
            .map(|(k, _)| *k)
            .collect();
        let failures = lost
            .into_iter()
            .map(|key| Failure {
                key,
                reason: FailureReason::ConsumerLost,
                detail: String::new(),
                consumer: c.name.clone(),
                overrides: AttemptOverride::Policy,
                extra_props: HashMap::new(),
            })
            .collect();
        if let Err(e) = self.fail(failures, None).await {
            tracing::error!(error = %e, sub = %self.rec.name, "cannot record lost consumer's messages");
        }
        self.update_active(None);
    }

    fn consumer_name(&self, id: u64) -> String {
        self.consumers
            .iter()
            .find(|c| c.id == id)
            .map(|c| c.name.clone())
            .unwrap_or_default()
    }

    fn reply(&self, consumer: u64, frame: ConsumeResponse) {
        if let Some(c) = self.consumers.iter().find(|c| c.id == consumer) {
            let _ = c.tx.send(Ok(frame));
        }
    }

    /// `topic:entry` of a message, as carried in `ORIGIN_MESSAGE_ID`.
    fn wire_id(&self, (tier, entry): (TierId, u64)) -> String {
        match tier {
            TierId::Main => format!("{}:{entry}", self.rec.topic),
            TierId::Retry => format!("{}:{entry}", self.retry_topic_name),
        }
    }

    /// Maps a wire id to this subscription's (tier, entry).
    fn locate(&self, id: &MessageId) -> Result<(TierId, u64)> {
        if id.topic == self.rec.topic {
            Ok((TierId::Main, id.entry_id))
        } else if id.topic == self.retry_topic_name {
            Ok((TierId::Retry, id.entry_id))
        } else {
            Err(BrokerError::InvalidArgument(format!(
                "message id {}:{} does not belong to subscription {} on {}",
                id.topic, id.entry_id, self.rec.name, self.rec.topic
            )))
        }
    }

    fn is_acked(&self, (tier, id): (TierId, u64)) -> bool {
        match tier {
            TierId::Main => self.rec.main.is_acked(id),
            TierId::Retry => self.rec.retry.is_acked(id),
        }
    }

    /// Whether a message was ever handed out (so an ack or failure for it
    /// makes sense): in flight, acked, or failed before (it then has a
    /// failure record and may be waiting for redelivery).
    fn was_delivered(&self, key: (TierId, u64)) -> bool {
        self.in_flight.contains_key(&key) || self.is_acked(key) || self.failures.contains_key(&key)
    }

    fn ack(&mut self, consumer: u64, ack: Ack) {
        let mut keys = Vec::with_capacity(ack.ids.len());
        for id in &ack.ids {
            match self.locate(id) {
                Ok(k) if self.was_delivered(k) => keys.push(k),
                Ok(_) => {
                    return self.reply(
                        consumer,
                        result_frame(
                            ack.request_id,
                            Code::InvalidArgument,
                            format!(
                                "cannot ack {}:{}: it was never delivered on this subscription",
                                id.topic, id.entry_id
                            ),
                        ),
                    );
                }
                Err(e) => {
                    return self.reply(
                        consumer,
                        result_frame(ack.request_id, Code::InvalidArgument, e.to_string()),
                    );
                }
            }
        }
        let cumulative = ack.ack_type == AckType::Cumulative as i32;
        if cumulative {
            let t = sub_type_of(self.rec.sub_type);
            if matches!(t, SubscriptionType::Shared | SubscriptionType::KeyShared) {
                return self.reply(
                    consumer,
                    result_frame(
                        ack.request_id,
                        Code::InvalidArgument,
                        format!(
                            "cumulative ack is not allowed on a {} subscription",
                            t.as_str_name()
                        ),
                    ),
                );
            }
            if keys.iter().any(|(t, _)| *t != TierId::Main) {
                return self.reply(
                    consumer,
                    result_frame(
                        ack.request_id,
                        Code::InvalidArgument,
                        "cumulative ack applies to the main topic only",
                    ),
                );
            }
        }
        let mut cleanup = Vec::new();
        let mut unschedule = Vec::new();
        for key in keys {
            if cumulative {
                let through = key.1;
                let done: Vec<(TierId, u64)> = self
                    .in_flight
                    .keys()
                    .filter(|(t, e)| *t == TierId::Main && *e <= through)
                    .copied()
                    .collect();
                self.metrics.acked.increment(done.len() as u64);
                for k in done {
                    self.settle(k, &mut cleanup, &mut unschedule);
                }
                self.rec.main.ack_through(through);
                self.ready
                    .retain(|(t, e), _| !(*t == TierId::Main && *e <= through));
            } else {
                self.settle(key, &mut cleanup, &mut unschedule);
                // Acked while waiting for its redelivery: it will not be sent.
                let msg = SubMessage {
                    sub_id: self.rec.id,
                    tier: key.0,
                    entry_id: key.1,
                };
                let waiting = self
                    .ready
                    .remove(&key)
                    .and_then(|p| p.due_ms)
                    .or(self.due.remove(&key));
                if let Some(due_ms) = waiting {
                    unschedule.push(ScheduleKey {
                        due_ms,
                        message: msg,
                    });
                }
                let newly = match key.0 {
                    TierId::Main => self.rec.main.ack(key.1),
                    TierId::Retry => self.rec.retry.ack(key.1),
                };
                if newly {
                    self.metrics.acked.increment(1);
                    if key.0 == TierId::Retry {
                        self.retry_queue = self.retry_queue.saturating_sub(1);
                        self.retries_succeeded += 1;
                        self.metrics.retry_succeeded.increment(1);
                    }
                }
            }
            self.dirty = true;
        }
        // The cursor is written first; stale failure or schedule records left by a
        // crash in between are recognised as acked and dropped later.
        self.persist();
        let r = self
            .storage
            .put_failures(&cleanup.iter().map(|m| (*m, None)).collect::<Vec<_>>())
            .and_then(|()| {
                self.storage
                    .put_schedule(&unschedule.iter().map(|k| (*k, false)).collect::<Vec<_>>())
            });
        if let Err(e) = r {
            return self.reply(
                consumer,
                result_frame(ack.request_id, Code::Internal, e.to_string()),
            );
        }
        if ack.request_id != 0 {
            self.reply_when_durable(consumer, ack.request_id, Ok(()));
        }
    }

    /// Removes a message from in-flight bookkeeping after it was acked or moved.
    fn settle(
        &mut self,
        key: (TierId, u64),
        cleanup: &mut Vec<SubMessage>,
        unschedule: &mut Vec<ScheduleKey>,
    ) {
        let msg = SubMessage {
            sub_id: self.rec.id,
            tier: key.0,
            entry_id: key.1,
        };
        if let Some(f) = self.in_flight.remove(&key) {
            if let Some(c) = self.consumers.iter_mut().find(|c| c.id == f.consumer) {
                c.unacked = c.unacked.saturating_sub(1);
            }
            if let Some(b) = f.bucket
                && let Some(entry) = self.buckets.get_mut(&b)
            {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.buckets.remove(&b);
                }
            }
            if let Some(due) = f.due_ms {
                unschedule.push(ScheduleKey {
                    due_ms: due,
                    message: msg,
                });
            }
        }
        if self.failures.remove(&key).is_some() || key.0 == TierId::Retry {
            cleanup.push(msg);
        }
    }

    fn reply_when_durable(&self, consumer: u64, request_id: u64, outcome: Result<()>) {
        let tx = self
            .consumers
            .iter()
            .find(|c| c.id == consumer)
            .map(|c| c.tx.clone());
        let flusher = self.flusher.clone();
        let sync = self.settings.sync;
        tokio::spawn(async move {
            let outcome = match outcome {
                Ok(()) if sync => flusher.durable().await,
                other => other,
            };
            let frame = match outcome {
                Ok(()) => result_frame(request_id, Code::Ok, ""),
                Err(e) => result_frame(request_id, crate::service::code_of(&e), e.to_string()),
            };
            if let Some(tx) = tx {
                let _ = tx.send(Ok(frame));
            }
        });
    }

    async fn redeliver(&mut self, consumer: u64, req: Redeliver) {
        let name = self.consumer_name(consumer);
        let failures: Result<Vec<Failure>> = if req.messages.is_empty() {
            Ok(self
                .in_flight
                .iter()
                .filter(|(_, f)| f.consumer == consumer)
                .map(|(k, _)| Failure {
                    key: *k,
                    reason: FailureReason::Nack,
                    detail: String::new(),
                    consumer: name.clone(),
                    overrides: AttemptOverride::Policy,
                    extra_props: HashMap::new(),
                })
                .collect())
        } else {
            let mut out = Vec::with_capacity(req.messages.len());
            let mut bad = None;
            for FailedDelivery { id, reason, detail } in &req.messages {
                let Some(id) = id.as_ref() else {
                    bad = Some(BrokerError::InvalidArgument(
                        "redeliver entry without an id".into(),
                    ));
                    break;
                };
                let key = match self.locate(id) {
                    Ok(k) if self.was_delivered(k) => k,
                    Ok(_) => {
                        bad = Some(BrokerError::InvalidArgument(format!(
                            "cannot redeliver {}:{}: it was never delivered on this subscription",
                            id.topic, id.entry_id
                        )));
                        break;
                    }
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                };
                // Already acked, or already given back (a race the client cannot
                // avoid, e.g. an ack timeout and a nack crossing): nothing to do.
                if self
                    .in_flight
                    .get(&key)
                    .is_none_or(|f| f.consumer != consumer)
                {
                    continue;
                }
                out.push(Failure {
                    key,
                    reason: reason_of(*reason),
                    detail: detail.clone(),
                    consumer: name.clone(),
                    overrides: AttemptOverride::Policy,
                    extra_props: HashMap::new(),
                });
            }
            match bad {
                Some(e) => Err(e),
                None => Ok(out),
            }
        };
        let outcome = match failures {
            Ok(f) => self.fail(f, None).await,
            Err(e) => Err(e),
        };
        self.finish_request(consumer, req.request_id, outcome);
    }

    /// A clean close: the consumer gets nothing more, and its in-flight
    /// messages are dispatched again with their delivery counts unchanged.
    fn close_consumer(&mut self, consumer: u64) {
        let Some(pos) = self.consumers.iter().position(|c| c.id == consumer) else {
            return;
        };
        let mine: Vec<((TierId, u64), InFlight)> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.consumer == consumer)
            .map(|(k, f)| (*k, *f))
            .collect();
        for (key, f) in mine {
            let mut cleanup = Vec::new();
            let mut unschedule = Vec::new();
            self.settle_keep_record(key, &mut cleanup, &mut unschedule);
            match f.due_ms {
                Some(d) => {
                    self.due.insert(key, d);
                }
                None => {
                    if let Some(p) = self.load(key, None) {
                        self.ready.insert(key, p);
                    }
                }
            }
        }
        self.consumers.remove(pos);
        self.update_active(None);
    }

    fn in_flight_key(&self, id: &MessageId) -> Result<(TierId, u64)> {
        let key = self.locate(id)?;
        if self.in_flight.contains_key(&key) {
            Ok(key)
        } else {
            Err(self.not_in_flight(id))
        }
    }

    fn not_in_flight(&self, id: &MessageId) -> BrokerError {
        BrokerError::InvalidArgument(format!(
            "message {}:{} is not in flight on subscription {} (already acked, or never delivered)",
            id.topic, id.entry_id, self.rec.name
        ))
    }

    fn finish_request(&self, consumer: u64, request_id: u64, outcome: Result<()>) {
        match outcome {
            Ok(()) if request_id == 0 => {}
            Ok(()) => self.reply_when_durable(consumer, request_id, Ok(())),
            Err(e) => self.reply(
                consumer,
                result_frame(request_id, crate::service::code_of(&e), e.to_string()),
            ),
        }
    }

    /// `reconsume_later` requests, moved into the retry tier together.
    async fn reconsume_later(&mut self, reqs: Vec<(u64, ReconsumeLater)>) {
        if reqs.is_empty() {
            return;
        }
        let mut failures = Vec::with_capacity(reqs.len());
        let mut accepted = Vec::with_capacity(reqs.len());
        let mut seen = HashSet::with_capacity(reqs.len());
        for (consumer, req) in reqs {
            match self.reconsume_failure(consumer, &req) {
                // The same message twice in one batch: the second finds it
                // gone, as it would have one request at a time.
                Ok(f) if !seen.insert(f.key) => {
                    let e = self.not_in_flight(&req.id.unwrap_or_default());
                    self.finish_request(consumer, req.request_id, Err(e));
                }
                Ok(f) => {
                    failures.push(f);
                    accepted.push((consumer, req.request_id));
                }
                Err(e) => self.finish_request(consumer, req.request_id, Err(e)),
            }
        }
        if failures.is_empty() {
            return;
        }
        match self.fail(failures, Some(Tier::Retry)).await {
            Ok(()) => {
                for (consumer, request_id) in accepted {
                    self.finish_request(consumer, request_id, Ok(()));
                }
            }
            Err(e) => {
                for (consumer, request_id) in accepted {
                    self.reply(
                        consumer,
                        result_frame(request_id, crate::service::code_of(&e), e.to_string()),
                    );
                }
            }
        }
    }

    fn reconsume_failure(&self, consumer: u64, req: &ReconsumeLater) -> Result<Failure> {
        let id = req
            .id
            .as_ref()
            .ok_or_else(|| BrokerError::InvalidArgument("reconsume_later without an id".into()))?;
        let key = self.in_flight_key(id)?;
        let overrides = match req.delay {
            Some(reconsume_later::Delay::DelayMs(ms)) => {
                AttemptOverride::Delay(Duration::from_millis(ms))
            }
            Some(reconsume_later::Delay::DelayLevel(l)) => AttemptOverride::from_rocketmq_level(l),
            None => AttemptOverride::Policy,
        };
        Ok(Failure {
            key,
            reason: FailureReason::ReconsumeLater,
            detail: req.detail.clone(),
            consumer: self.consumer_name(consumer),
            overrides,
            extra_props: req.properties.clone(),
        })
    }

    async fn terminate(&mut self, consumer: u64, req: Terminate) {
        let outcome = async {
            let id = req
                .id
                .as_ref()
                .ok_or_else(|| BrokerError::InvalidArgument("terminate without an id".into()))?;
            let key = self.in_flight_key(id)?;
            let f = Failure {
                key,
                reason: FailureReason::Terminate,
                detail: req.detail.clone(),
                consumer: self.consumer_name(consumer),
                overrides: AttemptOverride::DeadLetter,
                extra_props: HashMap::new(),
            };
            self.fail(vec![f], None).await
        }
        .await;
        self.finish_request(consumer, req.request_id, outcome);
    }

    /// The heart of failure handling: count, decide, then redeliver or move.
    /// `force_tier` makes a redelivery go through the retry tier
    /// (`reconsume_later`) whatever tier the policy prefers.
    async fn fail(&mut self, failures: Vec<Failure>, force_tier: Option<Tier>) -> Result<()> {
        let now = now_ms();
        let mut in_place = Vec::new();
        let mut to_retry = Vec::new();
        let mut to_dlq = Vec::new();
        for f in failures {
            let msg = SubMessage {
                sub_id: self.rec.id,
                tier: f.key.0,
                entry_id: f.key.1,
            };
            let mut rec = match self.failures.get(&f.key) {
                Some(r) => r.clone(),
                None => {
                    let due = self.in_flight.get(&f.key).and_then(|i| i.due_ms);
                    self.storage.failure(msg, due)?.unwrap_or_default()
                }
            };
            let attempt = rec.count + 1;
            self.metrics.redelivery(f.reason.as_str());
            rec.push(AttemptRecord {
                time_ms: now,
                delivery_count: attempt,
                consumer: f.consumer.clone(),
                reason: wire_reason(f.reason),
                detail: f.detail.clone(),
            });
            let policy = match (&self.policy, force_tier) {
                (Some(p), _) => Some(p.clone()),
                (None, Some(_)) => self.fallback_retry_policy.clone(),
                (None, None) => None,
            };
            let tier = if f.key.0 == TierId::Retry {
                Tier::Retry
            } else {
                Tier::Main
            };
            let seed = ricochet_policy::jitter_seed(self.wire_id(f.key).as_bytes(), attempt);
            let first = UNIX_EPOCH + Duration::from_millis(rec.first_failure_ms);
            let decision = match &policy {
                Some(p) => {
                    let mut ctx = FailureContext::new(attempt, f.reason)
                        .with_tier(tier)
                        .with_override(f.overrides)
                        .with_jitter_seed(seed)
                        .with_first_failure(first);
                    if !f.detail.is_empty() {
                        ctx = ctx.with_detail(&f.detail);
                    }
                    p.decide(&ctx)
                }
                None if f.reason == FailureReason::Terminate => Decision::DeadLetter {
                    reason: format!("terminated: {}", f.detail),
                },
                None => Decision::Redeliver {
                    after: Duration::ZERO,
                    tier: Tier::Main,
                },
            };
            tracing::debug!(
                sub = %self.rec.name, message = %self.wire_id(f.key), attempt,
                reason = %f.reason, detail = %f.detail, decision = ?decision,
                "delivery failed"
            );
            match decision {
                Decision::DeadLetter { reason } => to_dlq.push((f, rec, reason)),
                Decision::Redeliver { after, tier } => match force_tier.unwrap_or(tier) {
                    Tier::Retry => to_retry.push((f, rec, after)),
                    Tier::Main => in_place.push((f, rec)),
                },
            }
        }
        if !in_place.is_empty() {
            self.redeliver_in_place(in_place)?;
        }
        if !to_retry.is_empty() {
            self.move_to_retry(to_retry, now).await?;
        }
        if !to_dlq.is_empty() {
            self.move_to_dead_letter(to_dlq, now).await?;
        }
        Ok(())
    }

    /// Persists the new counts, then (once durable) makes the messages
    /// dispatchable again in their current tier.
    fn redeliver_in_place(&mut self, items: Vec<(Failure, FailureRecord)>) -> Result<()> {
        let mut writes = Vec::with_capacity(items.len());
        let mut keys = Vec::with_capacity(items.len());
        for (f, rec) in items {
            let msg = SubMessage {
                sub_id: self.rec.id,
                tier: f.key.0,
                entry_id: f.key.1,
            };
            writes.push((msg, Some(rec.clone())));
            self.failures.insert(f.key, rec);
            let mut sink = Vec::new();
            let mut unschedule = Vec::new();
            // Keep its schedule entry (retry tier) until it is finally acked.
            let due = self.in_flight.get(&f.key).and_then(|i| i.due_ms);
            self.settle_keep_record(f.key, &mut sink, &mut unschedule);
            if let Some(d) = due {
                self.due.insert(f.key, d);
                // Loaded again from `due`, not from `ready`.
                continue;
            }
            keys.push(f.key);
        }
        self.storage.put_failures(&writes)?;
        let tx = self.self_tx.clone();
        let flusher = self.flusher.clone();
        let sync = self.settings.sync;
        tokio::spawn(async move {
            if sync && flusher.durable().await.is_err() {
                return;
            }
            let _ = tx.send(Command::Ready(keys));
        });
        Ok(())
    }

    fn settle_keep_record(
        &mut self,
        key: (TierId, u64),
        cleanup: &mut Vec<SubMessage>,
        unschedule: &mut Vec<ScheduleKey>,
    ) {
        let rec = self.failures.get(&key).cloned();
        self.settle(key, cleanup, unschedule);
        if let Some(r) = rec {
            self.failures.insert(key, r);
        }
    }

    fn source_message(&self, key: (TierId, u64)) -> Result<Message> {
        let topic = match key.0 {
            TierId::Main => &self.rec.topic,
            TierId::Retry => &self.retry_topic_name,
        };
        let bytes = self
            .storage
            .read_one(topic, key.1)?
            .ok_or_else(|| StorageError::Missing(format!("entry {}:{}", topic, key.1)))?;
        Ok(Message::decode(bytes.as_slice()).map_err(StorageError::from)?)
    }

    fn tier_copy(
        &self,
        key: (TierId, u64),
        rec: &FailureRecord,
        extra: &HashMap<String, String>,
    ) -> Result<Message> {
        let mut m = self.source_message(key)?;
        m.properties
            .entry(props::REAL_TOPIC.into())
            .or_insert_with(|| self.rec.topic.clone());
        let origin = self.wire_id(key);
        m.properties
            .entry(props::ORIGIN_MESSAGE_ID.into())
            .or_insert(origin);
        m.properties
            .insert(props::RECONSUME_TIMES.into(), rec.count.to_string());
        for (k, v) in extra {
            m.properties.insert(k.clone(), v.clone());
        }
        Ok(m)
    }

    fn origin_of(&self, m: &Message, key: (TierId, u64)) -> (String, u64) {
        if let Some((t, e)) = m
            .properties
            .get(props::ORIGIN_MESSAGE_ID)
            .and_then(|o| o.rsplit_once(':'))
            && let Ok(e) = e.parse()
        {
            return (t.to_owned(), e);
        }
        (self.rec.topic.clone(), key.1)
    }

    /// The retry (or dead-letter) tier's topic, created on first use.
    async fn tier_topic(&mut self, dead_letter: bool) -> Result<Arc<Topic>> {
        let (slot, name) = if dead_letter {
            (&mut self.dlq_topic, &self.dlq_topic_name)
        } else {
            (&mut self.retry_topic, &self.retry_topic_name)
        };
        if let Some(t) = slot {
            return Ok(t.clone());
        }
        let t = self.tiers.tier_topic(name, dead_letter).await?;
        *slot = Some(t.clone());
        Ok(t)
    }

    /// Marks `key` acked in `sub` (a copy of the record that a move will
    /// write) and returns its storage key and, in the retry tier, its
    /// schedule entry (both removed by the move).
    fn leave(
        &self,
        sub: &mut SubscriptionRecord,
        key: (TierId, u64),
    ) -> (SubMessage, Option<ScheduleKey>) {
        let from = SubMessage {
            sub_id: sub.id,
            tier: key.0,
            entry_id: key.1,
        };
        match key.0 {
            TierId::Main => sub.main.ack(key.1),
            TierId::Retry => sub.retry.ack(key.1),
        };
        let schedule = self
            .in_flight
            .get(&key)
            .and_then(|i| i.due_ms)
            .map(|due_ms| ScheduleKey {
                due_ms,
                message: from,
            });
        (from, schedule)
    }

    async fn move_to_retry(
        &mut self,
        items: Vec<(Failure, FailureRecord, Duration)>,
        now: u64,
    ) -> Result<()> {
        let topic = self.tier_topic(false).await?;
        let first_id = topic.reserve_ids(items.len() as u64)?;
        let mut sub = self.rec.clone();
        let mut move_items = Vec::with_capacity(items.len());
        let mut new_keys = Vec::with_capacity(items.len());
        for (i, (f, rec, after)) in items.iter().enumerate() {
            let due = now + after.as_millis() as u64;
            let mut m = self.tier_copy(f.key, rec, &f.extra_props)?;
            m.properties
                .insert(props::DELAY_TIME.into(), after.as_millis().to_string());
            m.deliver_at_ms = due;
            let target = first_id + i as u64;
            let (from, from_schedule) = self.leave(&mut sub, f.key);
            tracing::info!(
                sub = %self.rec.name,
                message = %format!("{}:{target}", topic.name()),
                origin = %m.properties.get(props::ORIGIN_MESSAGE_ID).map_or("", String::as_str),
                attempt = rec.count,
                delay_ms = after.as_millis() as u64,
                reason = %f.reason,
                detail = %f.detail,
                "retry scheduled"
            );
            new_keys.push(ScheduleKey {
                due_ms: due,
                message: SubMessage {
                    sub_id: sub.id,
                    tier: TierId::Retry,
                    entry_id: target,
                },
            });
            move_items.push(MoveItem {
                from,
                from_schedule,
                payload: m.encode_to_vec(),
                target_entry_id: target,
                failures: rec.clone(),
                due_ms: Some(due),
                dead_letter: None,
            });
        }
        let mv = TierMove {
            target_topic: topic.name().to_string(),
            target_tier: Some(TierId::Retry),
            subscription: sub,
            items: move_items,
        };
        self.storage.move_messages(&mv)?;
        // Bookkeeping for metrics: what entered and left the retry tier.
        let from_retry = items
            .iter()
            .filter(|(f, _, _)| f.key.0 == TierId::Retry)
            .count() as u64;
        self.retry_queue = self.retry_queue.saturating_sub(from_retry) + items.len() as u64;
        self.retries_scheduled += items.len() as u64;
        self.metrics.retries_scheduled.increment(items.len() as u64);
        for (_, _, after) in &items {
            self.metrics.retry_delay.record(after.as_secs_f64());
        }
        self.after_move(
            mv.subscription,
            items.iter().map(|(f, _, _)| f.key).collect(),
        );
        // The timer learns of them once they are durable.
        let scheduler = self.scheduler.clone();
        self.when_durable(topic, first_id + items.len() as u64, move || {
            scheduler.add(new_keys)
        });
        Ok(())
    }

    async fn move_to_dead_letter(
        &mut self,
        items: Vec<(Failure, FailureRecord, String)>,
        now: u64,
    ) -> Result<()> {
        let topic = self.tier_topic(true).await?;
        let first_id = topic.reserve_ids(items.len() as u64)?;
        let mut sub = self.rec.clone();
        let mut move_items = Vec::with_capacity(items.len());
        for (i, (f, rec, reason)) in items.iter().enumerate() {
            let mut m = self.tier_copy(f.key, rec, &f.extra_props)?;
            m.properties
                .insert(props::DEAD_LETTER_REASON.into(), reason.clone());
            m.deliver_at_ms = 0;
            let (origin_topic, origin_entry_id) = self.origin_of(&m, f.key);
            let (from, from_schedule) = self.leave(&mut sub, f.key);
            tracing::warn!(
                sub = %self.rec.name, topic = %self.rec.topic, origin = %format!("{origin_topic}:{origin_entry_id}"),
                attempt = rec.count, reason = %reason, "message dead-lettered"
            );
            move_items.push(MoveItem {
                from,
                from_schedule,
                payload: m.encode_to_vec(),
                target_entry_id: first_id + i as u64,
                failures: rec.clone(),
                due_ms: None,
                dead_letter: Some(DeadLetterRecord {
                    origin_topic,
                    origin_entry_id,
                    reason: reason.clone(),
                    at_ms: now,
                    failures: rec.clone(),
                }),
            });
        }
        let mv = TierMove {
            target_topic: topic.name().to_string(),
            target_tier: None,
            subscription: sub,
            items: move_items,
        };
        self.storage.move_messages(&mv)?;
        let from_retry = items
            .iter()
            .filter(|(f, _, _)| f.key.0 == TierId::Retry)
            .count() as u64;
        self.retry_queue = self.retry_queue.saturating_sub(from_retry);
        self.dlq_size += items.len() as u64;
        for (f, _, _) in &items {
            self.metrics.dead_lettered(f.reason.as_str(), 1);
        }
        self.after_move(
            mv.subscription,
            items.iter().map(|(f, _, _)| f.key).collect(),
        );
        // Readable by dead-letter consumers once durable.
        self.when_durable(topic, first_id + items.len() as u64, || {});
        Ok(())
    }

    /// After a tier move wrote `topic`'s ids below `end`: once they are
    /// durable (at once in `interval` mode), makes them readable and runs
    /// `then`. The actor does not wait for the flush; the request's reply does.
    fn when_durable(&self, topic: Arc<Topic>, end: u64, then: impl FnOnce() + Send + 'static) {
        let flusher = self.flusher.clone();
        let sync = self.settings.sync;
        tokio::spawn(async move {
            if !sync || flusher.durable().await.is_ok() {
                topic.advance_durable_end(end);
                then();
            }
        });
    }

    fn after_move(&mut self, sub: SubscriptionRecord, keys: Vec<(TierId, u64)>) {
        self.rec = sub;
        let mut cleanup = Vec::new();
        let mut unschedule = Vec::new();
        for k in keys {
            self.settle(k, &mut cleanup, &mut unschedule);
            self.ready.remove(&k);
            self.due.remove(&k);
        }
        // The transaction already removed the records and schedule entries.
        self.scheduler.remove(unschedule);
        self.dirty = true;
    }

    /// Reads a message for dispatch; `None` if it is gone or acked.
    fn load(&mut self, key: (TierId, u64), due_ms: Option<u64>) -> Option<Pending> {
        if key.0 == TierId::Retry && !self.failures.contains_key(&key) {
            let msg = SubMessage {
                sub_id: self.rec.id,
                tier: key.0,
                entry_id: key.1,
            };
            match self.storage.failure(msg, due_ms) {
                Ok(Some(r)) => {
                    self.failures.insert(key, r);
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "cannot read a failure record"),
            }
        }
        match self.source_message(key) {
            Ok(msg) => Some(Pending { msg, due_ms }),
            Err(e) => {
                tracing::warn!(error = %e, "dropping a message that cannot be read");
                None
            }
        }
    }

    fn load_due(&mut self) {
        while self.ready.len() < READ_AHEAD {
            let Some((key, due)) = self.due.pop_first() else {
                break;
            };
            if self.is_acked(key) {
                // A crash left the schedule entry of an acked message behind.
                let m = SubMessage {
                    sub_id: self.rec.id,
                    tier: key.0,
                    entry_id: key.1,
                };
                let _ = self.storage.put_schedule(&[(
                    ScheduleKey {
                        due_ms: due,
                        message: m,
                    },
                    false,
                )]);
                continue;
            }
            if self.in_flight.contains_key(&key) {
                continue;
            }
            if let Some(p) = self.load(key, Some(due)) {
                self.ready.insert(key, p);
            }
        }
    }

    fn fill(&mut self) {
        let end = self.topic.durable_end();
        if self.ready.len() >= READ_AHEAD || self.read_pos >= end {
            return;
        }
        let want = READ_AHEAD - self.ready.len();
        let entries = match self
            .storage
            .read(&self.rec.topic, self.read_pos, want, 8 * 1024 * 1024)
        {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, topic = %self.rec.topic, "cannot read topic");
                return;
            }
        };
        let now = now_ms();
        let mut delayed = Vec::new();
        let mut last = None;
        for (id, bytes) in entries {
            if id >= end {
                break;
            }
            last = Some(id);
            let key = (TierId::Main, id);
            if self.rec.main.is_acked(id) || self.in_flight.contains_key(&key) {
                continue;
            }
            let msg = match Message::decode(bytes.as_slice()) {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(error = %e, id, "skipping an undecodable entry");
                    continue;
                }
            };
            if msg.deliver_at_ms > now {
                delayed.push(ScheduleKey {
                    due_ms: msg.deliver_at_ms,
                    message: SubMessage {
                        sub_id: self.rec.id,
                        tier: TierId::Main,
                        entry_id: id,
                    },
                });
                continue;
            }
            self.ready.insert(key, Pending { msg, due_ms: None });
        }
        self.read_pos = match last {
            Some(l) => l + 1,
            // Nothing left below `end` (trimmed or a gap): jump to it.
            None => end,
        };
        if !delayed.is_empty() {
            let writes: Vec<_> = delayed.iter().map(|k| (*k, true)).collect();
            match self.storage.put_schedule(&writes) {
                Ok(()) => self.scheduler.add(delayed),
                Err(e) => tracing::error!(error = %e, "cannot schedule delayed messages"),
            }
        }
    }

    fn can_take(&self, c: &ConsumerState) -> bool {
        c.permits > 0 && c.unacked < self.settings.max_unacked_per_consumer
    }

    fn key_owner(&self, bucket: u16) -> Option<usize> {
        self.consumers
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| {
                fnv1a(
                    &[
                        &bucket.to_be_bytes()[..],
                        c.name.as_bytes(),
                        &c.id.to_be_bytes(),
                    ]
                    .concat(),
                )
            })
            .map(|(i, _)| i)
    }

    fn dispatch(&mut self) {
        if self.consumers.is_empty() {
            return;
        }
        let sub_type = sub_type_of(self.rec.sub_type);
        loop {
            self.load_due();
            self.fill();
            if self.ready.is_empty() || !self.consumers.iter().any(|c| self.can_take(c)) {
                return;
            }
            let mut out: HashMap<usize, Vec<Message>> = HashMap::new();
            let keys: Vec<(TierId, u64)> = self.ready.keys().copied().collect();
            let mut sent = 0usize;
            for key in keys {
                let retry = key.0 == TierId::Retry;
                let takes = |c: &ConsumerState| self.can_take(c) && (c.retry || !retry);
                let (target, bucket) = match sub_type {
                    SubscriptionType::Exclusive | SubscriptionType::Failover => {
                        let Some(i) = self
                            .consumers
                            .iter()
                            .position(|c| Some(c.id) == self.active)
                        else {
                            break;
                        };
                        if !self.can_take(&self.consumers[i]) {
                            break;
                        }
                        if !takes(&self.consumers[i]) {
                            continue;
                        }
                        (i, None)
                    }
                    SubscriptionType::Shared => {
                        let n = self.consumers.len();
                        let Some(i) = (0..n)
                            .map(|k| (self.rr + k) % n)
                            .find(|i| takes(&self.consumers[*i]))
                        else {
                            if retry {
                                continue;
                            }
                            break;
                        };
                        self.rr = (i + 1) % n;
                        (i, None)
                    }
                    SubscriptionType::KeyShared => {
                        let b = bucket_of(&self.ready[&key].msg.key);
                        let owner = match self.buckets.get(&b) {
                            // Keep a key on the consumer still holding its earlier messages.
                            Some((cid, _)) => self.consumers.iter().position(|c| c.id == *cid),
                            None => self.key_owner(b),
                        };
                        match owner {
                            Some(i) if takes(&self.consumers[i]) => (i, Some(b)),
                            _ => continue,
                        }
                    }
                };
                let Some(p) = self.ready.remove(&key) else {
                    continue;
                };
                let c = &mut self.consumers[target];
                c.permits -= 1;
                c.unacked += 1;
                let cid = c.id;
                if let Some(b) = bucket {
                    self.buckets.entry(b).or_insert((cid, 0)).1 += 1;
                }
                self.in_flight.insert(
                    key,
                    InFlight {
                        consumer: cid,
                        bucket,
                        due_ms: p.due_ms,
                    },
                );
                let mut msg = p.msg;
                let topic = match key.0 {
                    TierId::Main => self.rec.topic.clone(),
                    TierId::Retry => self.retry_topic_name.clone(),
                };
                msg.id = Some(MessageId {
                    topic,
                    entry_id: key.1,
                });
                msg.delivery_count = self.failures.get(&key).map_or(0, |r| r.count);
                self.metrics.dispatched.increment(1);
                self.metrics
                    .dispatched_bytes
                    .increment(msg.payload.len() as u64);
                self.metrics
                    .delivery_count
                    .record(f64::from(msg.delivery_count));
                out.entry(target).or_default().push(msg);
                sent += 1;
            }
            for (i, msgs) in out {
                send_frames(&self.consumers[i].tx, msgs);
            }
            if sent == 0 {
                return;
            }
        }
    }

    fn persist(&mut self) {
        self.update_gauges();
        if !self.dirty {
            return;
        }
        self.dirty = false;
        if let Err(e) = self.storage.put_subscription(&self.rec) {
            tracing::error!(error = %e, sub = %self.rec.name, "cannot persist subscription");
            return;
        }
        if let Err(e) = self
            .topic
            .update_mark(self.rec.id, self.rec.main.mark_delete)
        {
            tracing::warn!(error = %e, "retention trim failed");
        }
        if let Some(t) = &self.retry_topic
            && let Err(e) = t.update_mark(self.rec.id, self.rec.retry.mark_delete)
        {
            tracing::warn!(error = %e, "retry tier trim failed");
        }
    }

    fn main_backlog(&self) -> u64 {
        let (_, end) = self.topic.entry_range();
        let start = self.rec.main.mark_delete.min(end);
        (end - start) - self.rec.main.acked_between(start, end)
    }

    fn update_gauges(&self) {
        let m = &self.metrics;
        m.backlog.set(self.main_backlog() as f64);
        m.unacked.set(self.in_flight.len() as f64);
        m.retry_queue.set(self.retry_queue as f64);
        m.dlq_size.set(self.dlq_size as f64);
        if self.retries_scheduled > 0 {
            m.retry_success_ratio
                .set(self.retries_succeeded as f64 / self.retries_scheduled as f64);
        }
    }

    fn stats(&self) -> SubscriptionStatsResponse {
        let backlog_main = self.main_backlog();
        let dead_lettered = self.dlq_size;
        SubscriptionStatsResponse {
            topic: self.rec.topic.clone(),
            subscription: self.rec.name.clone(),
            subscription_type: sub_type_of(self.rec.sub_type).as_str_name().to_owned(),
            // Scheduled messages are added by `SubscriptionHandle::stats`.
            backlog: backlog_main,
            unacked: self.in_flight.len() as u64,
            consumers: self
                .consumers
                .iter()
                .map(|c| ConsumerStats {
                    name: c.name.clone(),
                    unacked: c.unacked as u64,
                    permits: u64::from(c.permits),
                    active: match sub_type_of(self.rec.sub_type) {
                        SubscriptionType::Failover | SubscriptionType::Exclusive => {
                            Some(c.id) == self.active
                        }
                        _ => true,
                    },
                })
                .collect(),
            mark_delete_position: self.rec.main.mark_delete,
            scheduled_retries: 0,
            dead_lettered,
            next_retry_due_ms: 0,
            retry_topic: self.retry_topic_name.clone(),
            dead_letter_topic: self.dlq_topic_name.clone(),
            scheduled_by_due: Vec::new(),
        }
    }

    fn message_state(&self, entry: u64) -> MessageState {
        let key = (TierId::Main, entry);
        let state = if self.in_flight.contains_key(&key) {
            "in_flight"
        } else if self.rec.main.is_acked(entry) {
            "acked"
        } else if self.ready.contains_key(&key)
            || entry >= self.read_pos
            || self.failures.contains_key(&key)
        {
            "pending"
        } else {
            "scheduled"
        };
        let failures = self.failures.get(&key).cloned();
        MessageState {
            state: state.to_owned(),
            failures,
        }
    }

    fn delete(&mut self) -> Result<()> {
        if !self.consumers.is_empty() {
            return Err(BrokerError::Conflict(format!(
                "subscription {} has {} connected consumer(s)",
                self.rec.name,
                self.consumers.len()
            )));
        }
        self.scheduler.unregister(self.rec.id);
        self.topic.remove_mark(self.rec.id);
        Ok(self.storage.delete_subscription(&self.rec)?)
    }
}

/// Scheduled (not yet acked, not in flight) retry-tier and delayed
/// messages of this subscription: count, earliest due time, and counts by
/// due-time bucket. Scans the schedule index: O(all scheduled messages), an
/// admin call run off the actor.
fn schedule_stats(
    storage: &dyn Storage,
    sub_id: u64,
    in_flight: &HashSet<(TierId, u64)>,
    now: u64,
) -> Result<(u64, Option<u64>, Vec<DueBucket>)> {
    const BUCKETS: [(&str, u64); 5] = [
        ("overdue", 0),
        ("1m", 60_000),
        ("10m", 600_000),
        ("1h", 3_600_000),
        ("2h", 7_200_000),
    ];
    let mut buckets: Vec<DueBucket> = BUCKETS
        .iter()
        .map(|(label, ahead)| DueBucket {
            label: (*label).to_owned(),
            until_ms: now + ahead,
            count: 0,
        })
        .chain(std::iter::once(DueBucket {
            label: "later".into(),
            until_ms: 0,
            count: 0,
        }))
        .collect();
    let mut count = 0;
    let mut next = None;
    let mut after = None;
    loop {
        let batch = storage.scheduled(after, u64::MAX, 10_000)?;
        for k in &batch {
            if k.message.sub_id == sub_id
                && !in_flight.contains(&(k.message.tier, k.message.entry_id))
            {
                count += 1;
                next = Some(next.map_or(k.due_ms, |n: u64| n.min(k.due_ms)));
                let i = buckets
                    .iter()
                    .position(|b| b.until_ms == 0 || k.due_ms < b.until_ms)
                    .unwrap_or(buckets.len() - 1);
                buckets[i].count += 1;
            }
        }
        if batch.len() < 10_000 {
            break;
        }
        after = batch.last().copied();
    }
    Ok((count, next, buckets))
}
