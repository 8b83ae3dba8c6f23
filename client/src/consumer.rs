//! Consumers: [`ConsumerBuilder`], [`Consumer`] and its cloneable
//! [`Acker`].
//!
//! A consumer is one gRPC stream driven by a background task, which:
//!
//! * grants the broker **flow permits**: `receiver_queue_size` at first,
//!   then, as the application takes messages, a refill each time half the
//!   queue has been consumed (Pulsar's rule);
//! * **groups acks**: individual acks are sent together every
//!   `ack_group_time` (100 ms) or `ack_group_max` (1000) ids, whichever
//!   comes first, and flushed (and confirmed durable) by
//!   [`close`](Consumer::close);
//! * tracks **unacked** messages when an ack timeout is set: a message not
//!   acked within it of the application taking it (`receive`, or the
//!   stream) is sent back with reason `ACK_TIMEOUT`, as in Pulsar, so a
//!   message still waiting in the prefetch queue never times out; the
//!   deadline is rounded up to the tick, so it fires between `ack_timeout`
//!   and `ack_timeout + tick` after it was taken;
//! * tracks **negative acks**: a nacked message is held for the delay the
//!   dead-letter policy gives for its next attempt (or the fixed
//!   `negative_ack_delay`), then all due ids go back in one `Redeliver`
//!   request. The broker counts the attempt, persists it, and redelivers at
//!   once or dead-letters. When the policy routes the attempt to the retry
//!   tier or the DLQ, the client sends it at once instead and the broker
//!   schedules it (the delay is never served twice);
//! * **reconnects** with backoff when the stream breaks, resubscribes with
//!   the same consumer name and settings, and starts clean: messages
//!   received on the old stream but not yet taken by the application are
//!   dropped, and both trackers are cleared, because the broker redelivers
//!   everything that was in flight (its delivery count incremented). An ack
//!   of such an old message is remembered and applied when the broker
//!   redelivers it, so the application does not see it again.
//!
//! # Order
//!
//! On Exclusive and Failover subscriptions a nacked or timed-out message is
//! redelivered on its own, after the messages already dispatched: a nack
//! breaks the order of that message. Applications needing strict order
//! should retry in place rather than nack. Key_Shared keeps a key on one
//! consumer while it holds unacked messages of that key.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use ricochet_policy::{
    DeadLetterPolicy, Decision, FailureContext, FailureReason, PolicySpec, Tier, jitter_seed,
};
use ricochet_proto::{
    Ack, AckType, CloseConsumer, ConsumeRequest, ConsumeResponse, DeadLetterPolicyConfig,
    FailedDelivery, Flow, ReconsumeLater, Redeliver, Subscribe, Subscribed, Terminate,
    consume_request, consume_response, reconsume_later,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::client::{Client, next_frame, sleep_opt};
use crate::error::{Error, Result};
use crate::message::{Message, MessageId, TopicInterner};
use crate::reconnect::{Reconnector, Reopen, open_with_retry};
use crate::tracker::{DelayTracker, far_future};

/// How a subscription shares messages between its consumers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SubscriptionType {
    /// One consumer at a time (the default).
    #[default]
    Exclusive,
    /// Many consumers, one of them active (the lowest name); the others
    /// take over when it leaves.
    Failover,
    /// Many consumers, messages spread round-robin.
    Shared,
    /// Many consumers, messages of one key go to one consumer.
    KeyShared,
}

impl SubscriptionType {
    fn to_proto(self) -> ricochet_proto::SubscriptionType {
        match self {
            SubscriptionType::Exclusive => ricochet_proto::SubscriptionType::Exclusive,
            SubscriptionType::Failover => ricochet_proto::SubscriptionType::Failover,
            SubscriptionType::Shared => ricochet_proto::SubscriptionType::Shared,
            SubscriptionType::KeyShared => ricochet_proto::SubscriptionType::KeyShared,
        }
    }

    /// Whether cumulative acks are allowed (Exclusive and Failover).
    pub fn allows_cumulative_ack(self) -> bool {
        matches!(
            self,
            SubscriptionType::Exclusive | SubscriptionType::Failover
        )
    }
}

/// Where a new subscription starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InitialPosition {
    /// Only messages published after the subscription is created (the default).
    #[default]
    Latest,
    /// Everything still stored.
    Earliest,
}

/// Consumer settings; see the builder methods for each.
#[derive(Clone)]
pub struct ConsumerConfig {
    /// Subscription name (required).
    pub subscription: String,
    /// Subscription type.
    pub subscription_type: SubscriptionType,
    /// Initial position of a new subscription.
    pub initial_position: InitialPosition,
    /// Consumer name; `None` generates a unique one (kept across reconnects,
    /// so a Failover consumer keeps its rank).
    pub consumer_name: Option<String>,
    /// Messages the broker may push ahead of the application (default 1000).
    pub receiver_queue_size: u32,
    /// Redeliver messages not acked within this; `None` (default) disables.
    pub ack_timeout: Option<Duration>,
    /// Granularity of the ack-timeout tracker (default `min(1 s, ack_timeout)`).
    pub ack_timeout_tick: Option<Duration>,
    /// Nack delay when no policy is in force (default 60 s, like Pulsar).
    pub negative_ack_delay: Duration,
    /// The policy consulted for nack delays (not sent to the broker unless
    /// it has a [`spec`](DeadLetterPolicy::spec)).
    pub policy: Option<Arc<dyn DeadLetterPolicy>>,
    /// A policy spec, sent to the broker in `Subscribe` and built locally.
    pub policy_spec: Option<PolicySpec>,
    /// Overrides the retry tier topic (with a policy).
    pub retry_topic: Option<String>,
    /// Overrides the dead-letter topic (with a policy).
    pub dead_letter_topic: Option<String>,
    /// Whether to also receive from the retry tier (broker default).
    pub retry_enabled: Option<bool>,
    /// This consumer reads a dead-letter tier topic on purpose (the broker
    /// refuses subscriptions to `…-DLQ` topics otherwise).
    pub dead_letter_reader: bool,
    /// Ack grouping window (default 100 ms; zero sends every ack at once).
    pub ack_group_time: Duration,
    /// Ack grouping size (default 1000 ids).
    pub ack_group_max: usize,
}

impl std::fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("subscription", &self.subscription)
            .field("subscription_type", &self.subscription_type)
            .field("initial_position", &self.initial_position)
            .field("consumer_name", &self.consumer_name)
            .field("receiver_queue_size", &self.receiver_queue_size)
            .field("ack_timeout", &self.ack_timeout)
            .field("ack_timeout_tick", &self.ack_timeout_tick)
            .field("negative_ack_delay", &self.negative_ack_delay)
            .field("policy", &self.policy.as_ref().map(|p| p.name().to_owned()))
            .field("policy_spec", &self.policy_spec)
            .field("retry_enabled", &self.retry_enabled)
            .field("dead_letter_reader", &self.dead_letter_reader)
            .field("ack_group_time", &self.ack_group_time)
            .field("ack_group_max", &self.ack_group_max)
            .finish()
    }
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            subscription: String::new(),
            subscription_type: SubscriptionType::default(),
            initial_position: InitialPosition::default(),
            consumer_name: None,
            receiver_queue_size: 1000,
            ack_timeout: None,
            ack_timeout_tick: None,
            negative_ack_delay: Duration::from_secs(60),
            policy: None,
            policy_spec: None,
            retry_topic: None,
            dead_letter_topic: None,
            retry_enabled: None,
            dead_letter_reader: false,
            ack_group_time: Duration::from_millis(100),
            ack_group_max: 1000,
        }
    }
}

/// Builds a [`Consumer`]; see [`Client::consumer`].
#[derive(Debug)]
pub struct ConsumerBuilder {
    client: Client,
    topic: String,
    config: ConsumerConfig,
}

impl ConsumerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self {
            client,
            topic,
            config: ConsumerConfig::default(),
        }
    }

    /// The subscription name (required).
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.config.subscription = name.into();
        self
    }

    /// The subscription type (default Exclusive).
    pub fn subscription_type(mut self, t: SubscriptionType) -> Self {
        self.config.subscription_type = t;
        self
    }

    /// Where a new subscription starts (default Latest).
    pub fn initial_position(mut self, p: InitialPosition) -> Self {
        self.config.initial_position = p;
        self
    }

    /// The consumer name (default: generated, stable across reconnects).
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.config.consumer_name = Some(name.into());
        self
    }

    /// Messages prefetched ahead of the application (default 1000, at least 1).
    pub fn receiver_queue_size(mut self, n: u32) -> Self {
        self.config.receiver_queue_size = n.max(1);
        self
    }

    /// Redeliver a message not acked within `d` (disabled by default).
    pub fn ack_timeout(mut self, d: Duration) -> Self {
        self.config.ack_timeout = (!d.is_zero()).then_some(d);
        self
    }

    /// Precision of the ack timeout (default `min(1 s, ack_timeout)`).
    pub fn ack_timeout_tick(mut self, d: Duration) -> Self {
        self.config.ack_timeout_tick = Some(d);
        self
    }

    /// Nack delay used when no policy is in force (default 60 s).
    pub fn negative_ack_delay(mut self, d: Duration) -> Self {
        self.config.negative_ack_delay = d;
        self
    }

    /// The policy consulted for nacks. Its [`spec`](DeadLetterPolicy::spec),
    /// if it has one, is also sent to the broker as the subscription's
    /// policy (unless [`policy_spec`](Self::policy_spec) is given too).
    pub fn dead_letter_policy(mut self, policy: Arc<dyn DeadLetterPolicy>) -> Self {
        self.config.policy = Some(policy);
        self
    }

    /// A policy spec: sent to the broker in `Subscribe` (it applies unless
    /// an operator set one) and built locally for nack delays.
    pub fn policy_spec(mut self, spec: PolicySpec) -> Self {
        self.config.policy_spec = Some(spec);
        self
    }

    /// Overrides the retry tier topic `<topic>-<subscription>-RETRY`.
    pub fn retry_topic(mut self, topic: impl Into<String>) -> Self {
        self.config.retry_topic = Some(topic.into());
        self
    }

    /// Overrides the dead-letter topic `<topic>-<subscription>-DLQ`.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.config.dead_letter_topic = Some(topic.into());
        self
    }

    /// Whether to receive from the retry tier too.
    pub fn retry_enabled(mut self, on: bool) -> Self {
        self.config.retry_enabled = Some(on);
        self
    }

    /// Declares this consumer a dead-letter reader: required to subscribe to
    /// a dead-letter tier topic (`<topic>-<subscription>-DLQ`), which the
    /// broker otherwise refuses with [`Error::Rejected`] (PERMISSION_DENIED).
    /// Dead letters can also be listed, replayed and purged with
    /// [`Client::admin`].
    pub fn dead_letter_reader(mut self, on: bool) -> Self {
        self.config.dead_letter_reader = on;
        self
    }

    /// Ack grouping window (default 100 ms; zero disables grouping).
    pub fn ack_group_time(mut self, d: Duration) -> Self {
        self.config.ack_group_time = d;
        self
    }

    /// Ack grouping size (default 1000).
    pub fn ack_group_max(mut self, n: usize) -> Self {
        self.config.ack_group_max = n.max(1);
        self
    }

    /// All settings at once.
    pub fn config(mut self, config: ConsumerConfig) -> Self {
        self.config = config;
        self
    }

    /// Subscribes. Transient failures are retried until the client's request
    /// timeout; a rejection (bad name, type conflict, invalid policy) is
    /// returned at once.
    pub async fn subscribe(self) -> Result<Consumer> {
        let mut cfg = self.config;
        if cfg.subscription.is_empty() {
            return Err(Error::InvalidArgument(
                "a subscription name is required".into(),
            ));
        }
        if let Some(spec) = &cfg.policy_spec {
            spec.validate()?;
        }
        let name = cfg
            .consumer_name
            .clone()
            .unwrap_or_else(|| format!("consumer-{}", crate::unique_suffix()));
        cfg.consumer_name = Some(name);
        if let Some(t) = cfg.ack_timeout {
            let tick = cfg
                .ack_timeout_tick
                .unwrap_or(Duration::from_secs(1))
                .min(t);
            cfg.ack_timeout_tick = Some(tick.max(Duration::from_millis(1)));
        }
        let client = self.client;
        let topic = self.topic;
        let ((conn, subscribed), reconnect) =
            open_with_retry(client.config(), "subscribe", &topic, || {
                subscribe(&client, &topic, &cfg)
            })
            .await?;
        let cfg = Arc::new(cfg);
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            topic: subscribed.topic.clone(),
            subscription: subscribed.subscription.clone(),
            consumer_name: subscribed.consumer_name.clone(),
            subscription_type: cfg.subscription_type,
            epoch: AtomicU64::new(1),
            consumed: AtomicU32::new(0),
            refill_threshold: (cfg.receiver_queue_size / 2).max(1),
            active: AtomicU8::new(ACTIVE_UNKNOWN),
            closed: AtomicBool::new(false),
            track_taken: cfg.ack_timeout.is_some(),
            request_timeout: client.config().request_timeout,
        });
        let mut topics = TopicInterner::default();
        let mut table = TopicTable::default();
        let main = topics.get(&subscribed.topic);
        table.index(&main);
        let unacked = cfg.ack_timeout_tick.map(DelayTracker::new);
        let mut driver = Driver {
            client,
            topic,
            cfg,
            shared: shared.clone(),
            rx: cmd_rx,
            out: out_tx,
            conn: None,
            epoch: 1,
            topics,
            table,
            main_topic: main,
            policy: None,
            outstanding: HashSet::new(),
            unacked,
            nacks: DelayTracker::new(Duration::from_millis(1)),
            nack_details: HashMap::new(),
            acks: Vec::new(),
            loose_acks: Vec::new(),
            ack_deadline: None,
            cumulative: None,
            cumulative_mark: None,
            requests: HashMap::new(),
            next_request: 1,
            stale_acks: StaleAcks::default(),
            redeliver_now: Vec::new(),
            reconnect,
            closing: None,
            close_reply: None,
            close_request: None,
        };
        driver.connected(conn, &subscribed);
        tokio::spawn(driver.run());
        let acker = Acker { tx: cmd_tx, shared };
        Ok(Consumer { rx: out_rx, acker })
    }
}

const ACTIVE_UNKNOWN: u8 = 0;
const ACTIVE_YES: u8 = 1;
const ACTIVE_NO: u8 = 2;

#[derive(Debug)]
struct Shared {
    topic: String,
    subscription: String,
    consumer_name: String,
    subscription_type: SubscriptionType,
    /// The stream generation; messages of older ones are dropped.
    epoch: AtomicU64,
    /// Messages taken by the application since the last permit refill.
    consumed: AtomicU32,
    refill_threshold: u32,
    active: AtomicU8,
    closed: AtomicBool,
    /// Whether taking a message starts its ack timeout.
    track_taken: bool,
    request_timeout: Duration,
}

enum Cmd {
    Ack {
        id: MessageId,
        epoch: Option<u64>,
    },
    AckCumulative {
        id: MessageId,
        epoch: Option<u64>,
    },
    Nack {
        id: MessageId,
        epoch: u64,
        delivery_count: u32,
        detail: Option<String>,
    },
    ReconsumeLater {
        id: MessageId,
        epoch: u64,
        delay: reconsume_later::Delay,
        properties: HashMap<String, String>,
        detail: String,
        reply: oneshot::Sender<Result<()>>,
    },
    Terminate {
        id: MessageId,
        epoch: u64,
        detail: String,
        reply: oneshot::Sender<Result<()>>,
    },
    /// The application took a message from the queue (ack timeout on).
    Taken {
        id: MessageId,
        epoch: u64,
        at: Instant,
    },
    Flow(u32),
    Close(oneshot::Sender<Result<()>>),
}

struct Delivery {
    epoch: u64,
    item: Result<Message>,
}

/// Receives messages from one subscription; see the [module docs](self).
///
/// Use [`receive`](Self::receive) or the [`Stream`] impl to take messages,
/// and the ack methods (also on the cloneable [`Acker`], for processing in
/// other tasks) to settle them.
#[derive(Debug)]
pub struct Consumer {
    rx: mpsc::UnboundedReceiver<Delivery>,
    acker: Acker,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// The next message. Fails with [`Error::Closed`] once the consumer is
    /// closed, or once with the cause if it could not reconnect.
    pub async fn receive(&mut self) -> Result<Message> {
        loop {
            let Some(d) = self.rx.recv().await else {
                return Err(Error::Closed);
            };
            if let Some(item) = self.acker.accept(d) {
                return item;
            }
        }
    }

    /// A handle for acking from other tasks.
    pub fn acker(&self) -> Acker {
        self.acker.clone()
    }

    /// The topic, fully qualified.
    pub fn topic(&self) -> &str {
        &self.acker.shared.topic
    }

    /// The subscription name.
    pub fn subscription(&self) -> &str {
        &self.acker.shared.subscription
    }

    /// The consumer name.
    pub fn consumer_name(&self) -> &str {
        &self.acker.shared.consumer_name
    }

    /// For Failover subscriptions: whether this consumer is the active one
    /// (`None` until the broker said).
    pub fn is_active(&self) -> Option<bool> {
        match self.acker.shared.active.load(Ordering::Relaxed) {
            ACTIVE_YES => Some(true),
            ACTIVE_NO => Some(false),
            _ => None,
        }
    }

    /// See [`Acker::ack`].
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.acker.ack(msg).await
    }

    /// See [`Acker::ack_id`].
    pub async fn ack_id(&self, id: &MessageId) -> Result<()> {
        self.acker.ack_id(id).await
    }

    /// See [`Acker::ack_cumulative`].
    pub async fn ack_cumulative(&self, msg: &Message) -> Result<()> {
        self.acker.ack_cumulative(msg).await
    }

    /// See [`Acker::nack`].
    pub async fn nack(&self, msg: &Message) -> Result<()> {
        self.acker.nack(msg).await
    }

    /// See [`Acker::nack_with_reason`].
    pub async fn nack_with_reason(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        self.acker.nack_with_reason(msg, reason).await
    }

    /// See [`Acker::reconsume_later`].
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<()> {
        self.acker.reconsume_later(msg, delay).await
    }

    /// See [`Acker::reconsume_later_level`].
    pub async fn reconsume_later_level(&self, msg: &Message, level: i32) -> Result<()> {
        self.acker.reconsume_later_level(msg, level).await
    }

    /// See [`Acker::reconsume_later_with`].
    pub async fn reconsume_later_with(
        &self,
        msg: &Message,
        delay: Duration,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.acker
            .reconsume_later_with(msg, delay, properties)
            .await
    }

    /// See [`Acker::terminate`].
    pub async fn terminate(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        self.acker.terminate(msg, reason).await
    }

    /// See [`Acker::extend_ack_deadline`].
    pub async fn extend_ack_deadline(&self, msg: &Message) -> Result<()> {
        self.acker.extend_ack_deadline(msg).await
    }

    /// Reports nacks still held at once (reason NACK, with their reasons,
    /// rather than after their delay), flushes pending acks and waits until
    /// the broker has made them durable (up to the client's request
    /// timeout), then closes cleanly: messages received but not acked
    /// (taken or still prefetched) go to other consumers, or this
    /// subscription's next one, with their delivery count unchanged. A
    /// consumer that is dropped without `close` is charged an attempt for
    /// each (reason CONSUMER_LOST).
    pub async fn close(&self) -> Result<()> {
        self.acker.shared.closed.store(true, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        if self.acker.tx.send(Cmd::Close(tx)).is_err() {
            return Ok(());
        }
        rx.await.unwrap_or(Ok(()))
    }
}

impl Stream for Consumer {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(d)) => {
                    if let Some(item) = self.acker.accept(d) {
                        return Poll::Ready(Some(item));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Settles messages of one consumer; cheap to clone and `Send`, so
/// processing tasks can ack on their own.
///
/// All methods return once the request is queued, except
/// [`reconsume_later`](Self::reconsume_later) and
/// [`terminate`](Self::terminate), which wait until the broker has moved the
/// message (durably).
#[derive(Debug, Clone)]
pub struct Acker {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
}

impl Acker {
    /// Filters a delivery taken from the queue: drops messages of an old
    /// stream, counts consumption for flow permits.
    fn accept(&self, d: Delivery) -> Option<Result<Message>> {
        match d.item {
            Ok(m) => {
                if d.epoch != self.shared.epoch.load(Ordering::Acquire) {
                    return None;
                }
                self.consumed(1);
                if self.shared.track_taken {
                    // The ack timeout runs from here (Pulsar's rule): a
                    // message waiting in the prefetch queue cannot time out.
                    let _ = self.tx.send(Cmd::Taken {
                        id: m.id.clone(),
                        epoch: d.epoch,
                        at: Instant::now(),
                    });
                }
                Some(Ok(m))
            }
            Err(e) => Some(Err(e)),
        }
    }

    fn consumed(&self, n: u32) {
        let now = self.shared.consumed.fetch_add(n, Ordering::AcqRel) + n;
        if now >= self.shared.refill_threshold {
            let taken = self.shared.consumed.swap(0, Ordering::AcqRel);
            if taken > 0 {
                let _ = self.tx.send(Cmd::Flow(taken));
            }
        }
    }

    fn send(&self, cmd: Cmd) -> Result<()> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.tx.send(cmd).map_err(|_| Error::Closed)
    }

    /// Acknowledges one message (grouped; see the [module docs](self)).
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.send(Cmd::Ack {
            id: msg.id.clone(),
            epoch: Some(msg.epoch),
        })
    }

    /// Acknowledges by id (for ids kept apart from their message).
    pub async fn ack_id(&self, id: &MessageId) -> Result<()> {
        self.send(Cmd::Ack {
            id: id.clone(),
            epoch: None,
        })
    }

    /// Acknowledges this message and every earlier one of the main topic.
    /// Only on Exclusive and Failover subscriptions, and only for
    /// main-topic messages (not retry-tier ones): otherwise
    /// [`Error::InvalidArgument`], and nothing is sent.
    pub async fn ack_cumulative(&self, msg: &Message) -> Result<()> {
        let t = self.shared.subscription_type;
        if !t.allows_cumulative_ack() {
            return Err(Error::InvalidArgument(format!(
                "cumulative ack is not allowed on a {t:?} subscription"
            )));
        }
        if msg.id.topic() != self.shared.topic {
            return Err(Error::InvalidArgument(format!(
                "cumulative ack applies to main-topic messages only; {} is from {}",
                msg.id,
                msg.id.topic()
            )));
        }
        self.send(Cmd::AckCumulative {
            id: msg.id.clone(),
            epoch: Some(msg.epoch),
        })
    }

    /// Tells the consumer the application is still working on `msg`: its ack
    /// timeout starts again from now, and no attempt is counted (NATS's
    /// `InProgress`, RocketMQ's `changeInvisibleTime`). Without an ack
    /// timeout there is no deadline to extend and this does nothing.
    pub async fn extend_ack_deadline(&self, msg: &Message) -> Result<()> {
        if !self.shared.track_taken {
            return Ok(());
        }
        self.send(Cmd::Taken {
            id: msg.id.clone(),
            epoch: msg.epoch,
            at: Instant::now(),
        })
    }

    /// Negatively acknowledges: the message comes back after the delay the
    /// policy gives its next attempt (or the fixed nack delay), or is
    /// dead-lettered once the policy says so.
    pub async fn nack(&self, msg: &Message) -> Result<()> {
        self.nack_inner(msg, None)
    }

    /// [`nack`](Self::nack) with a reason, recorded in the message's failure
    /// history (and its dead letter) and passed to the policy.
    pub async fn nack_with_reason(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        self.nack_inner(msg, Some(reason.into()))
    }

    fn nack_inner(&self, msg: &Message, detail: Option<String>) -> Result<()> {
        self.send(Cmd::Nack {
            id: msg.id.clone(),
            epoch: msg.epoch,
            delivery_count: msg.delivery_count(),
            detail,
        })
    }

    async fn request(&self, make: impl FnOnce(oneshot::Sender<Result<()>>) -> Cmd) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        match tokio::time::timeout(self.shared.request_timeout, rx).await {
            Ok(r) => r.unwrap_or(Err(Error::Closed)),
            Err(_) => Err(Error::Timeout("waiting for the broker to confirm".into())),
        }
    }

    /// Sends the message to the subscription's retry tier, to be delivered
    /// again after `delay` (by the broker, whether or not a consumer is
    /// connected then). Returns once the move is durable.
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<()> {
        self.reconsume(
            msg,
            reconsume_later::Delay::DelayMs(duration_ms(delay)),
            HashMap::new(),
        )
        .await
    }

    /// RocketMQ's `delayLevelWhenNextConsume`: `-1` dead-letters now, `0`
    /// lets the policy decide, `k > 0` uses delay level `k`.
    pub async fn reconsume_later_level(&self, msg: &Message, level: i32) -> Result<()> {
        self.reconsume(
            msg,
            reconsume_later::Delay::DelayLevel(level),
            HashMap::new(),
        )
        .await
    }

    /// [`reconsume_later`](Self::reconsume_later), adding `properties` to
    /// the retried message.
    pub async fn reconsume_later_with(
        &self,
        msg: &Message,
        delay: Duration,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.reconsume(
            msg,
            reconsume_later::Delay::DelayMs(duration_ms(delay)),
            properties,
        )
        .await
    }

    async fn reconsume(
        &self,
        msg: &Message,
        delay: reconsume_later::Delay,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.request(|reply| Cmd::ReconsumeLater {
            id: msg.id.clone(),
            epoch: msg.epoch,
            delay,
            properties,
            detail: String::new(),
            reply,
        })
        .await
    }

    /// Gives up on the message: straight to the dead-letter tier with
    /// `reason`. Returns once the move is durable.
    pub async fn terminate(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        let detail = reason.into();
        self.request(|reply| Cmd::Terminate {
            id: msg.id.clone(),
            epoch: msg.epoch,
            detail,
            reply,
        })
        .await
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A compact id: (index of the topic in the consumer's table, entry id).
type Key = (u32, u64);

/// The topics a consumer sees ids from (its main topic, its retry tier).
#[derive(Debug, Default)]
struct TopicTable {
    names: Vec<Arc<str>>,
}

impl TopicTable {
    /// The index of `topic`, added if new; `None` past a small bound.
    fn index(&mut self, topic: &Arc<str>) -> Option<u32> {
        if let Some(i) = self
            .names
            .iter()
            .position(|t| Arc::ptr_eq(t, topic) || **t == **topic)
        {
            return u32::try_from(i).ok();
        }
        if self.names.len() >= 64 {
            return None;
        }
        self.names.push(topic.clone());
        u32::try_from(self.names.len() - 1).ok()
    }

    fn key(&mut self, id: &MessageId) -> Option<Key> {
        self.index(id.topic_arc()).map(|t| (t, id.entry_id()))
    }

    fn id(&self, key: Key) -> Option<MessageId> {
        let t = self.names.get(key.0 as usize)?;
        Some(MessageId::new(t.clone(), key.1))
    }
}

/// Ids acked after the stream they came on broke, applied when the broker
/// redelivers them. Bounded (oldest forgotten first).
#[derive(Debug, Default)]
struct StaleAcks {
    set: HashSet<Key>,
    order: VecDeque<Key>,
}

impl StaleAcks {
    const CAP: usize = 100_000;

    fn insert(&mut self, k: Key) {
        if self.set.insert(k) {
            self.order.push_back(k);
            while self.order.len() > Self::CAP {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn take(&mut self, k: &Key) -> bool {
        // The order queue keeps the key until it ages out; harmless.
        self.set.remove(k)
    }
}

struct Conn {
    tx: mpsc::UnboundedSender<ConsumeRequest>,
    inbound: Streaming<ConsumeResponse>,
}

impl Conn {
    fn send(&self, r: consume_request::Request) {
        // A failure means the stream is gone; the response side reports it.
        let _ = self.tx.send(ConsumeRequest { request: Some(r) });
    }
}

fn policy_config(cfg: &ConsumerConfig) -> Option<DeadLetterPolicyConfig> {
    let spec = cfg
        .policy_spec
        .clone()
        .or_else(|| cfg.policy.as_ref().and_then(|p| p.spec()))?;
    let mut wire = DeadLetterPolicyConfig::from(&spec);
    wire.retry_topic = cfg.retry_topic.clone().unwrap_or_default();
    wire.dead_letter_topic = cfg.dead_letter_topic.clone().unwrap_or_default();
    Some(wire)
}

/// Opens a consumer stream: `Subscribe`, then the broker's `Subscribed`.
async fn subscribe(
    client: &Client,
    topic: &str,
    cfg: &ConsumerConfig,
) -> Result<(Conn, Subscribed)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let sub = Subscribe {
        topic: topic.to_owned(),
        subscription: cfg.subscription.clone(),
        subscription_type: cfg.subscription_type.to_proto() as i32,
        initial_position: match cfg.initial_position {
            InitialPosition::Latest => ricochet_proto::InitialPosition::Latest,
            InitialPosition::Earliest => ricochet_proto::InitialPosition::Earliest,
        } as i32,
        consumer_name: cfg.consumer_name.clone().unwrap_or_default(),
        dead_letter_policy: policy_config(cfg),
        retry_enabled: cfg.retry_enabled,
        dead_letter_reader: cfg.dead_letter_reader,
    };
    tx.send(ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(sub)),
    })
    .map_err(|_| Error::Closed)?;
    let handshake = async {
        let mut inbound = client
            .broker()
            .consume(UnboundedReceiverStream::new(rx))
            .await?
            .into_inner();
        loop {
            match inbound.message().await? {
                Some(ConsumeResponse {
                    response: Some(consume_response::Response::Subscribed(s)),
                }) => {
                    return Ok((inbound, s));
                }
                Some(ConsumeResponse {
                    response: Some(consume_response::Response::Result(r)),
                }) if r.code != 0 => {
                    return Err(Error::from_code(r.code, r.message));
                }
                // Nothing else may come first; skip rather than fail.
                Some(_) => continue,
                None => {
                    return Err(Error::Connection(
                        "the broker closed the consumer stream during the handshake".into(),
                    ));
                }
            }
        }
    };
    match tokio::time::timeout(client.config().request_timeout, handshake).await {
        Ok(Ok((inbound, s))) => Ok((Conn { tx, inbound }, s)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Timeout(format!("subscribing to {topic}"))),
    }
}

enum Event {
    Response(Result<Option<ConsumeResponse>, tonic::Status>),
    Cmd(Option<Cmd>),
    AckFlush,
    NackDue,
    AckTimeout,
    Reconnect,
    CloseDeadline,
}

struct PendingRequest {
    reply: oneshot::Sender<Result<()>>,
    key: Option<Key>,
    epoch: u64,
}

struct Driver {
    client: Client,
    topic: String,
    cfg: Arc<ConsumerConfig>,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    out: mpsc::UnboundedSender<Delivery>,
    conn: Option<Conn>,
    epoch: u64,
    topics: TopicInterner,
    table: TopicTable,
    main_topic: Arc<str>,
    policy: Option<Arc<dyn DeadLetterPolicy>>,
    /// Received on this stream and not yet settled by the application.
    outstanding: HashSet<Key>,
    unacked: Option<DelayTracker<Key>>,
    nacks: DelayTracker<Key>,
    nack_details: HashMap<Key, String>,
    /// Grouped acks of outstanding messages.
    acks: Vec<ricochet_proto::MessageId>,
    /// Acks of ids this stream did not deliver (sent in their own frame so
    /// that a rejection cannot take the others with it).
    loose_acks: Vec<ricochet_proto::MessageId>,
    ack_deadline: Option<Instant>,
    cumulative: Option<MessageId>,
    cumulative_mark: Option<u64>,
    requests: HashMap<u64, PendingRequest>,
    next_request: u64,
    stale_acks: StaleAcks,
    redeliver_now: Vec<FailedDelivery>,
    reconnect: Reconnector,
    closing: Option<Instant>,
    close_reply: Option<oneshot::Sender<Result<()>>>,
    close_request: Option<u64>,
}

impl Driver {
    async fn run(mut self) {
        let mut rx_open = true;
        loop {
            let nack_due = self.nacks.next_deadline();
            let ack_timeout_due = self.unacked.as_ref().and_then(DelayTracker::next_deadline);
            let reconnect = if self.conn.is_none() {
                self.reconnect.due()
            } else {
                None
            };
            let event = tokio::select! {
                biased;
                r = next_frame(self.conn.as_mut().map(|c| &mut c.inbound)) => Event::Response(r),
                c = self.rx.recv(), if rx_open => Event::Cmd(c),
                _ = sleep_opt(self.ack_deadline) => Event::AckFlush,
                _ = sleep_opt(nack_due) => Event::NackDue,
                _ = sleep_opt(ack_timeout_due) => Event::AckTimeout,
                _ = sleep_opt(reconnect) => Event::Reconnect,
                _ = sleep_opt(self.closing) => Event::CloseDeadline,
            };
            match event {
                Event::Response(Ok(Some(r))) => self.on_response(r),
                Event::Response(Ok(None)) => {
                    self.lost("the broker ended the consumer stream".into())
                }
                Event::Response(Err(s)) => self.lost(Error::from(s).to_string()),
                Event::Cmd(Some(cmd)) => {
                    self.on_cmd(cmd);
                    for _ in 0..1024 {
                        match self.rx.try_recv() {
                            Ok(cmd) => self.on_cmd(cmd),
                            Err(_) => break,
                        }
                    }
                }
                Event::Cmd(None) => {
                    // Every handle is gone: flush acks and stop.
                    rx_open = false;
                    self.start_close(None);
                }
                Event::AckFlush => self.flush_acks(0),
                Event::NackDue => self.fire_nacks(Instant::now()),
                Event::AckTimeout => self.fire_ack_timeouts(),
                Event::Reconnect => self.reconnect().await,
                Event::CloseDeadline => {
                    self.finish_close(Err(Error::Timeout(
                        "waiting for the broker to confirm the final acks".into(),
                    )));
                }
            }
            self.send_redeliveries();
            if self.closing.is_some() && self.close_reply.is_none() && self.close_request.is_none()
            {
                break;
            }
            if self.out.is_closed() && self.closing.is_none() {
                // The Consumer was dropped (only ackers remain): close.
                self.start_close(None);
            }
        }
        self.shared.closed.store(true, Ordering::Release);
        for (_, r) in self.requests.drain() {
            let _ = r.reply.send(Err(Error::Closed));
        }
    }

    /// A fresh stream is up: reset per-stream state, grant permits.
    fn connected(&mut self, conn: Conn, s: &Subscribed) {
        self.policy = self.effective_policy(s);
        if !s.retry_topic.is_empty() {
            let retry = self.topics.get(&s.retry_topic);
            self.table.index(&retry);
        }
        self.shared.consumed.store(0, Ordering::Release);
        conn.send(consume_request::Request::Flow(Flow {
            permits: self.cfg.receiver_queue_size,
        }));
        self.conn = Some(conn);
        self.reconnect.connected();
    }

    /// The policy used for nack delays: the application's own object, else
    /// the one the broker says is in force (when it can be built here), else
    /// the application's spec.
    fn effective_policy(&self, s: &Subscribed) -> Option<Arc<dyn DeadLetterPolicy>> {
        if let Some(p) = &self.cfg.policy {
            return Some(p.clone());
        }
        if let Some(p) = s
            .dead_letter_policy
            .as_ref()
            .and_then(|c| PolicySpec::try_from(c).ok())
            .and_then(|spec| spec.build().ok())
        {
            return Some(p);
        }
        self.cfg.policy_spec.as_ref().and_then(|s| s.build().ok())
    }

    fn on_response(&mut self, r: ConsumeResponse) {
        match r.response {
            Some(consume_response::Response::Messages(batch)) => {
                let mut auto_acked = 0u32;
                for m in batch.messages {
                    let Some(msg) = Message::from_proto(m, self.epoch, &mut self.topics) else {
                        tracing::warn!("dropping a message without an id");
                        continue;
                    };
                    let Some(key) = self.table.key(&msg.id) else {
                        tracing::warn!(id = %msg.id, "dropping a message from an unexpected topic");
                        continue;
                    };
                    if self.stale_acks.take(&key) {
                        // Acked by the application before the reconnect.
                        self.acks.push(msg.id.to_proto());
                        auto_acked += 1;
                        continue;
                    }
                    self.outstanding.insert(key);
                    self.nacks.remove(&key);
                    if self
                        .out
                        .send(Delivery {
                            epoch: self.epoch,
                            item: Ok(msg),
                        })
                        .is_err()
                    {
                        break;
                    }
                }
                if auto_acked > 0 {
                    self.schedule_ack_flush();
                    // Those never reach the application: return their permits.
                    if let Some(c) = &self.conn {
                        c.send(consume_request::Request::Flow(Flow {
                            permits: auto_acked,
                        }));
                    }
                }
            }
            Some(consume_response::Response::Result(r)) => {
                self.on_result(r.request_id, r.code, r.message)
            }
            Some(consume_response::Response::ActiveChange(a)) => {
                self.shared.active.store(
                    if a.active { ACTIVE_YES } else { ACTIVE_NO },
                    Ordering::Relaxed,
                );
            }
            Some(consume_response::Response::Subscribed(_)) | None => {
                tracing::debug!("ignoring an unexpected consumer frame");
            }
        }
    }

    fn on_result(&mut self, request_id: u64, code: i32, message: String) {
        if request_id == 0 {
            if code != 0 {
                tracing::warn!(code, %message, sub = %self.shared.subscription, "the broker rejected a consumer request");
            }
            return;
        }
        if self.close_request == Some(request_id) {
            self.close_request = None;
            let r = if code == 0 {
                Ok(())
            } else {
                Err(Error::from_code(code, message))
            };
            self.finish_close(r);
            return;
        }
        let Some(req) = self.requests.remove(&request_id) else {
            return;
        };
        if code == 0 {
            let _ = req.reply.send(Ok(()));
        } else {
            // Still in flight on the broker: track it again.
            if let Some(k) = req.key.filter(|_| req.epoch == self.epoch) {
                self.track(k, Instant::now());
            }
            let _ = req.reply.send(Err(Error::from_code(code, message)));
        }
    }

    fn track(&mut self, key: Key, now: Instant) {
        self.outstanding.insert(key);
        if let (Some(t), Some(timeout)) = (&mut self.unacked, self.cfg.ack_timeout) {
            t.insert_after(key, timeout, now);
        }
    }

    /// Stops tracking a message the application settled; whether it was
    /// outstanding on this stream.
    fn settle(&mut self, key: &Key) -> bool {
        if let Some(t) = &mut self.unacked {
            t.remove(key);
        }
        if self.nacks.remove(key) {
            self.nack_details.remove(key);
        }
        self.outstanding.remove(key)
    }

    fn is_stale(&self, epoch: Option<u64>) -> bool {
        epoch.is_some_and(|e| e != self.epoch)
    }

    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Ack { id, epoch } => {
                let Some(key) = self.table.key(&id) else {
                    self.loose_acks.push(id.to_proto());
                    self.schedule_ack_flush();
                    return;
                };
                if self.is_stale(epoch) {
                    self.stale_acks.insert(key);
                    return;
                }
                if self.settle(&key) {
                    self.acks.push(id.to_proto());
                } else {
                    self.loose_acks.push(id.to_proto());
                }
                self.schedule_ack_flush();
            }
            Cmd::AckCumulative { id, epoch } => {
                if self.is_stale(epoch) {
                    return;
                }
                if self
                    .cumulative
                    .as_ref()
                    .is_none_or(|c| c.entry_id() < id.entry_id())
                {
                    self.cumulative_mark = Some(id.entry_id());
                    self.cumulative = Some(id);
                }
                self.schedule_ack_flush();
            }
            Cmd::Nack {
                id,
                epoch,
                delivery_count,
                detail,
            } => {
                let Some(key) = self.table.key(&id) else {
                    return;
                };
                if self.is_stale(Some(epoch)) || !self.settle(&key) {
                    // Already settled, or from a broken stream (the broker
                    // redelivers those anyway).
                    return;
                }
                self.nack(key, &id, delivery_count, detail);
            }
            Cmd::ReconsumeLater {
                id,
                epoch,
                delay,
                properties,
                detail,
                reply,
            } => {
                let key = self.table.key(&id);
                let request = consume_request::Request::ReconsumeLater(ReconsumeLater {
                    request_id: 0,
                    id: Some(id.to_proto()),
                    delay: Some(delay),
                    properties,
                    detail,
                });
                self.command(key, epoch, request, reply);
            }
            Cmd::Terminate {
                id,
                epoch,
                detail,
                reply,
            } => {
                let key = self.table.key(&id);
                let request = consume_request::Request::Terminate(Terminate {
                    request_id: 0,
                    id: Some(id.to_proto()),
                    detail,
                });
                self.command(key, epoch, request, reply);
            }
            Cmd::Taken { id, epoch, at } => {
                if epoch != self.epoch {
                    return;
                }
                let Some(key) = self.table.key(&id) else {
                    return;
                };
                if self.outstanding.contains(&key)
                    && let (Some(t), Some(timeout)) = (&mut self.unacked, self.cfg.ack_timeout)
                {
                    t.insert_after(key, timeout, at);
                }
            }
            Cmd::Flow(n) => {
                if let Some(c) = &self.conn {
                    c.send(consume_request::Request::Flow(Flow { permits: n }));
                }
            }
            Cmd::Close(reply) => self.start_close(Some(reply)),
        }
    }

    fn nack(&mut self, key: Key, id: &MessageId, delivery_count: u32, detail: Option<String>) {
        let now = Instant::now();
        let delay = match &self.policy {
            Some(policy) => {
                let attempt = delivery_count.saturating_add(1);
                let tier = if id.topic() == &*self.main_topic {
                    Tier::Main
                } else {
                    Tier::Retry
                };
                let seed_key = id.to_string();
                let mut ctx = FailureContext::new(attempt, FailureReason::Nack)
                    .with_tier(tier)
                    .with_jitter_seed(jitter_seed(seed_key.as_bytes(), attempt));
                if let Some(d) = &detail {
                    ctx = ctx.with_detail(d);
                }
                match policy.decide(&ctx) {
                    Decision::Redeliver {
                        after,
                        tier: Tier::Main,
                    } => Some(after),
                    // The broker schedules the retry tier or dead-letters:
                    // tell it now, so the delay is not served twice.
                    Decision::Redeliver {
                        tier: Tier::Retry, ..
                    }
                    | Decision::DeadLetter { .. } => None,
                }
            }
            None => Some(self.cfg.negative_ack_delay),
        };
        match delay {
            Some(after) => {
                self.nacks.insert_after(key, after, now);
                if let Some(d) = detail {
                    self.nack_details.insert(key, d);
                }
            }
            None => self.redeliver_now.push(FailedDelivery {
                id: Some(id.to_proto()),
                reason: ricochet_proto::FailureReason::Nack as i32,
                detail: detail.unwrap_or_default(),
            }),
        }
    }

    fn command(
        &mut self,
        key: Option<Key>,
        epoch: u64,
        mut request: consume_request::Request,
        reply: oneshot::Sender<Result<()>>,
    ) {
        if epoch != self.epoch {
            let _ = reply.send(Err(Error::Connection(
                "the consumer reconnected since this message was received; the broker redelivers it".into(),
            )));
            return;
        }
        let Some(conn) = &self.conn else {
            let _ = reply.send(Err(Error::Connection(
                "the consumer is reconnecting".into(),
            )));
            return;
        };
        let rid = self.next_request;
        self.next_request += 1;
        match &mut request {
            consume_request::Request::ReconsumeLater(r) => r.request_id = rid,
            consume_request::Request::Terminate(t) => t.request_id = rid,
            _ => {}
        }
        conn.send(request);
        if let Some(k) = &key {
            if let Some(t) = &mut self.unacked {
                t.remove(k);
            }
            if self.nacks.remove(k) {
                self.nack_details.remove(k);
            }
            self.outstanding.remove(k);
        }
        self.requests
            .insert(rid, PendingRequest { reply, key, epoch });
    }

    fn schedule_ack_flush(&mut self) {
        if self.cfg.ack_group_time.is_zero()
            || self.acks.len() + self.loose_acks.len() >= self.cfg.ack_group_max
        {
            self.flush_acks(0);
        } else if self.ack_deadline.is_none() {
            self.ack_deadline = Some(Instant::now() + self.cfg.ack_group_time);
        }
    }

    /// Sends grouped acks; the last frame carries `request_id`.
    fn flush_acks(&mut self, request_id: u64) {
        self.ack_deadline = None;
        if self.conn.is_none() {
            return;
        }
        let individual = std::mem::take(&mut self.acks);
        let loose = std::mem::take(&mut self.loose_acks);
        let cumulative = self.cumulative.take();
        let mut frames = Vec::new();
        if !loose.is_empty() {
            frames.push(Ack {
                request_id: 0,
                ack_type: AckType::Individual as i32,
                ids: loose,
            });
        }
        if let Some(c) = cumulative {
            // Drop what the cumulative ack covers from the trackers.
            if let Some(main) = self.table.index(&self.main_topic) {
                let through = c.entry_id();
                let covered: Vec<Key> = self
                    .outstanding
                    .iter()
                    .filter(|k| k.0 == main && k.1 <= through)
                    .copied()
                    .collect();
                for k in covered {
                    self.settle(&k);
                }
            }
            frames.push(Ack {
                request_id: 0,
                ack_type: AckType::Cumulative as i32,
                ids: vec![c.to_proto()],
            });
        }
        if !individual.is_empty() || request_id != 0 {
            frames.push(Ack {
                request_id: 0,
                ack_type: AckType::Individual as i32,
                ids: individual,
            });
        }
        if let Some(last) = frames.last_mut() {
            last.request_id = request_id;
        }
        let Some(conn) = &self.conn else { return };
        for f in frames {
            conn.send(consume_request::Request::Ack(f));
        }
    }

    /// Queues for redelivery every held nack due by `until`, with its reason.
    fn fire_nacks(&mut self, until: Instant) {
        let mut due = Vec::new();
        self.nacks.pop_due(until, &mut due);
        for k in due {
            let detail = self.nack_details.remove(&k).unwrap_or_default();
            if self.covered_by_cumulative(k) {
                continue;
            }
            if let Some(id) = self.table.id(k) {
                self.redeliver_now.push(FailedDelivery {
                    id: Some(id.to_proto()),
                    reason: ricochet_proto::FailureReason::Nack as i32,
                    detail,
                });
            }
        }
    }

    fn fire_ack_timeouts(&mut self) {
        let Some(t) = &mut self.unacked else { return };
        let mut due = Vec::new();
        t.pop_due(Instant::now(), &mut due);
        for k in due {
            if !self.outstanding.remove(&k) || self.covered_by_cumulative(k) {
                continue;
            }
            if let Some(id) = self.table.id(k) {
                self.redeliver_now.push(FailedDelivery {
                    id: Some(id.to_proto()),
                    reason: ricochet_proto::FailureReason::AckTimeout as i32,
                    detail: String::new(),
                });
            }
        }
    }

    fn covered_by_cumulative(&self, k: Key) -> bool {
        k.0 == 0 && self.cumulative_mark.is_some_and(|m| k.1 <= m)
    }

    /// Sends the failures gathered this turn in one `Redeliver` request.
    fn send_redeliveries(&mut self) {
        if self.redeliver_now.is_empty() {
            return;
        }
        let messages = std::mem::take(&mut self.redeliver_now);
        if let Some(c) = &self.conn {
            c.send(consume_request::Request::Redeliver(Redeliver {
                request_id: 0,
                messages,
            }));
        }
    }

    fn lost(&mut self, why: String) {
        if self.conn.take().is_none() {
            return;
        }
        if self.closing.is_some() {
            self.close_request = None;
            let pending = !self.acks.is_empty() || self.cumulative.is_some();
            self.finish_close(if pending {
                Err(Error::Connection(format!(
                    "the stream broke before the final acks were confirmed: {why}"
                )))
            } else {
                Ok(())
            });
            return;
        }
        tracing::warn!(topic = %self.shared.topic, sub = %self.shared.subscription, reason = %why, "consumer stream lost; reconnecting");
        // A new generation: the broker redelivers what was in flight.
        self.epoch += 1;
        self.shared.epoch.store(self.epoch, Ordering::Release);
        for a in self.acks.drain(..).chain(self.loose_acks.drain(..)) {
            let id = MessageId::from_proto(&a, &mut self.topics);
            if let Some(k) = self.table.key(&id) {
                self.stale_acks.insert(k);
            }
        }
        self.ack_deadline = None;
        self.cumulative = None;
        self.cumulative_mark = None;
        self.outstanding = HashSet::new();
        if let Some(t) = &mut self.unacked {
            t.clear();
        }
        self.nacks.clear();
        self.nack_details = HashMap::new();
        self.redeliver_now.clear();
        for (_, r) in self.requests.drain() {
            let _ = r.reply.send(Err(Error::Connection(format!(
                "the stream broke before the broker confirmed; the message is redelivered if the request was lost: {why}"
            ))));
        }
        self.reconnect.lost(Instant::now());
    }

    async fn reconnect(&mut self) {
        let open = subscribe(&self.client, &self.topic, &self.cfg);
        // The broker may still hold the old stream's Exclusive slot.
        let retry =
            |e: &Error| e.is_retryable() || e.code() == Some(tonic::Code::FailedPrecondition);
        match self.reconnect.attempt(open, retry, "consumer").await {
            Reopen::Open((conn, s)) => {
                tracing::info!(topic = %self.shared.topic, sub = %self.shared.subscription, "consumer reconnected");
                self.connected(conn, &s);
            }
            Reopen::Later => {}
            Reopen::Failed(e) => {
                tracing::error!(error = %e, topic = %self.shared.topic, "consumer cannot resubscribe; closing");
                let _ = self.out.send(Delivery {
                    epoch: self.epoch,
                    item: Err(e),
                });
                self.closing = Some(Instant::now());
            }
        }
    }

    fn start_close(&mut self, reply: Option<oneshot::Sender<Result<()>>>) {
        if self.closing.is_some() {
            if let Some(r) = reply {
                // A second close: answer when the first finishes is not
                // tracked; answer now.
                let _ = r.send(Ok(()));
            }
            return;
        }
        self.shared.closed.store(true, Ordering::Release);
        self.closing = Some(Instant::now() + self.shared.request_timeout);
        if self.conn.is_none() {
            let lost = self.acks.len() + self.loose_acks.len();
            let r = if lost == 0 {
                Ok(())
            } else {
                Err(Error::Connection(format!(
                    "closed while disconnected; {lost} ack(s) not delivered"
                )))
            };
            if let Some(reply) = reply {
                let _ = reply.send(r);
            }
            return;
        }
        // Held nacks are real failures: report them now, with their reasons,
        // rather than let the broker see them as lost with the consumer.
        self.fire_nacks(far_future());
        self.send_redeliveries();
        let rid = self.next_request;
        self.next_request += 1;
        self.flush_acks(rid);
        // A clean close: what this consumer still holds (taken or only
        // prefetched) goes to other consumers without an attempt charged.
        if let Some(c) = &self.conn {
            c.send(consume_request::Request::Close(CloseConsumer {}));
        }
        self.close_request = Some(rid);
        self.close_reply = reply;
    }

    fn finish_close(&mut self, r: Result<()>) {
        self.close_request = None;
        if let Some(reply) = self.close_reply.take() {
            let _ = reply.send(r);
        }
        // Leaving the loop drops the stream; make sure it happens now.
        self.closing = Some(Instant::now());
    }
}
