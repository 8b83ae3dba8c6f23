//! Producers: [`ProducerBuilder`] and [`Producer`].
//!
//! A producer is one gRPC stream driven by a background task. Messages are
//! numbered with strictly increasing sequence ids in the order
//! [`Producer::send_async`] is called, gathered into batches (by count,
//! bytes and linger time), and pipelined: many batches are in flight at
//! once, and the broker answers each with receipts, in order, once the batch
//! is durable.
//!
//! **Reconnects are transparent.** When the stream breaks the task
//! reconnects with backoff, reopens under the *same producer name*, and
//! resends every message not yet receipted with its *same sequence id*; the
//! broker drops what it had already stored (de-duplication by producer name
//! and sequence id), so a message is stored once. Messages the broker reports
//! as already stored (their sequence id is at or below the
//! `last_sequence_id` it returns on reopen) resolve to an id whose
//! [`MessageId::is_unknown`] is true, as Pulsar answers `-1:-1`. The default
//! producer name is generated and unique per producer, so de-duplication
//! works across reconnects without configuration; give a stable
//! [`name`](ProducerBuilder::name) to de-duplicate across process restarts
//! too (sequence ids then continue from the broker's last one).
//!
//! **A batch the broker could not store is resent the same way** when the
//! cause may pass: its error is [retryable](crate::Error::is_retryable)
//! (UNAVAILABLE: the broker or its Raft group cannot take writes now, the
//! topic is moving; RESOURCE_EXHAUSTED: a full disk or a `refuse` backlog
//! quota; INTERNAL, ABORTED, ...). The producer drops the stream (one WARN
//! naming the cause; [`ProducerStats::reconnects`] counts it), reopens it
//! after a backoff that grows while refusals repeat, and resends that batch
//! and every later one in order; the broker stores nothing sent behind the
//! refused batch on the old stream, so the topic keeps the order of the
//! calls. A message fails only when its
//! [`send_timeout`](ProducerBuilder::send_timeout) passes, with
//! [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) naming the last cause
//! (also its [`source`](std::error::Error::source)). A batch refused for
//! good (invalid or oversize content, a `deliver_at` too far ahead, no
//! permission, a deleted topic, damaged data) fails at once, alone.
//!
//! **Partitioned topics**: a producer on a partitioned
//! topic is one such stream per partition, all under the producer's name,
//! each with its own sequence ids (so de-duplication holds per partition).
//! A message with a key goes to the partition of the key's Murmur3 hash
//! (Pulsar's rule, the same from every client); one without a key goes
//! round-robin, switching partition after each batch's worth of messages.
//! The returned id names the partition. Partitions added later are picked
//! up by a periodic look-up of the count
//! ([`partitions_refresh`](ProducerBuilder::partitions_refresh)).

mod driver;
mod partitioned;
mod queue;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::{MessageId, OutgoingMessage};
use crate::reconnect::open_with_retry;
use queue::{Queue, Reply};

/// Producer settings, as the [`ProducerBuilder`] methods set them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProducerConfig {
    /// Producer name; `None` generates a unique one.
    pub name: Option<String>,
    /// Gather messages into batches (default true). When false every
    /// message is its own `SendBatch`.
    pub batching: bool,
    /// Most messages per batch (default 1000).
    pub batch_max_messages: usize,
    /// Most bytes per batch (default 128 KiB); a larger message goes alone.
    pub batch_max_bytes: usize,
    /// How long the first message of a batch waits for company while
    /// earlier batches are in flight (default 1 ms). On an idle connection a
    /// batch goes as soon as the queued sends are gathered.
    pub batch_linger: Duration,
    /// A message not receipted within this fails with [`ErrorKind::Timeout`](crate::ErrorKind::Timeout)
    /// (and is not resent after a reconnect): until then it is resent after
    /// a broken stream or a retryable refusal. Default 30 s; zero disables
    /// (then a message is resent until the producer closes).
    pub send_timeout: Duration,
    /// On a partitioned topic: how often the partition count is looked up
    /// again, to produce to partitions added later (default 60 s, as
    /// Pulsar's `autoUpdatePartitionsInterval`; zero never).
    pub partitions_refresh: Duration,
    /// Most messages sent and not yet answered by the broker (default 1000,
    /// Pulsar's `maxPendingMessages`), over all partitions.
    pub max_pending_messages: usize,
    /// Most bytes (payload, key and properties) of those messages (default
    /// 64 MiB, Pulsar's `memoryLimit`).
    pub max_pending_bytes: usize,
    /// With the queue full, `send` waits for room (true, the default) or
    /// fails at once with [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull).
    pub block_if_queue_full: bool,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            name: None,
            batching: true,
            batch_max_messages: 1000,
            batch_max_bytes: 128 * 1024,
            batch_linger: Duration::from_millis(1),
            send_timeout: Duration::from_secs(30),
            partitions_refresh: Duration::from_secs(60),
            max_pending_messages: 1000,
            max_pending_bytes: 64 * 1024 * 1024,
            block_if_queue_full: true,
        }
    }
}

/// Producers are made from a [`Client`].
impl Client {
    /// Starts building a producer on `topic` (`orders` means
    /// `persistent://public/default/orders`).
    pub fn producer(&self, topic: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(self.clone(), topic.into())
    }
}

/// Builds a [`Producer`]; see [`Client::producer`].
#[derive(Debug)]
pub struct ProducerBuilder {
    client: Client,
    topic: String,
    config: ProducerConfig,
    /// The queue of a partitioned producer, shared by its partitions.
    queue: Option<Arc<Queue>>,
}

impl ProducerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self {
            client,
            topic,
            config: ProducerConfig::default(),
            queue: None,
        }
    }

    /// Most messages sent and not yet answered (default 1000); see
    /// [`block_if_queue_full`](Self::block_if_queue_full).
    pub fn max_pending_messages(mut self, n: usize) -> Self {
        self.config.max_pending_messages = n.max(1);
        self
    }

    /// Most bytes of messages sent and not yet answered (default 64 MiB).
    pub fn max_pending_bytes(mut self, n: usize) -> Self {
        self.config.max_pending_bytes = n.max(1);
        self
    }

    /// With the queue full, whether [`Producer::send`] and
    /// [`Producer::send_async`] wait for room (true, the default) or fail
    /// at once with [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull).
    pub fn block_if_queue_full(mut self, block: bool) -> Self {
        self.config.block_if_queue_full = block;
        self
    }

    /// A stable producer name: de-duplication then also spans process
    /// restarts. Two live producers must not share a name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = Some(name.into());
        self
    }

    /// Turns batching on or off (on by default).
    pub fn batching(mut self, on: bool) -> Self {
        self.config.batching = on;
        self
    }

    /// Most messages per batch (default 1000).
    pub fn batch_max_messages(mut self, n: usize) -> Self {
        self.config.batch_max_messages = n.max(1);
        self
    }

    /// Most bytes per batch (default 128 KiB).
    pub fn batch_max_bytes(mut self, n: usize) -> Self {
        self.config.batch_max_bytes = n.max(1);
        self
    }

    /// Linger time of a batch (default 1 ms).
    pub fn batch_linger(mut self, d: Duration) -> Self {
        self.config.batch_linger = d;
        self
    }

    /// Send timeout (default 30 s; zero disables).
    pub fn send_timeout(mut self, d: Duration) -> Self {
        self.config.send_timeout = d;
        self
    }

    /// How often a producer on a partitioned topic looks up the partition
    /// count again (default 60 s; zero never).
    pub fn partitions_refresh(mut self, d: Duration) -> Self {
        self.config.partitions_refresh = d;
        self
    }

    /// Every setting of `config` at once, for a partition's producer.
    fn with_config(mut self, config: ProducerConfig) -> Self {
        self.config = config;
        self
    }

    /// Opens the producer. Transient failures (broker unreachable) are
    /// retried with backoff until the client's request timeout; a rejection
    /// (bad topic name, a tier topic, ...) is returned at once.
    ///
    /// The topic's partition count is looked up first: on a partitioned
    /// topic this opens one stream per partition (see the module docs).
    pub async fn create(self) -> Result<Producer> {
        let partitions = crate::partitions::count(&self.client, &self.topic).await?;
        if let Some((base, n)) = partitions {
            let queue = Arc::new(self.new_queue());
            let router =
                partitioned::Router::open(self.client, self.config, base, n, queue).await?;
            return Ok(Producer {
                inner: Inner::Partitioned(router),
                handle: Arc::new(()),
            });
        }
        Ok(Producer {
            inner: Inner::Topic(self.create_topic_producer().await?),
            handle: Arc::new(()),
        })
    }

    fn new_queue(&self) -> Queue {
        Queue::new(
            self.config.max_pending_messages,
            self.config.max_pending_bytes,
            self.config.block_if_queue_full,
        )
    }

    /// Opens the producer on this one topic (a partition, or an ordinary topic).
    async fn create_topic_producer(self) -> Result<TopicProducer> {
        let queue = match &self.queue {
            Some(q) => q.clone(),
            None => Arc::new(self.new_queue()),
        };
        let name = self
            .config
            .name
            .clone()
            .unwrap_or_else(|| format!("producer-{}", crate::unique_suffix()));
        if name.is_empty() {
            return Err(Error::invalid_argument("producer name must not be empty"));
        }
        let ((conn, opened), reconnect) =
            open_with_retry(self.client.config(), "producer open", &self.topic, || {
                driver::open(&self.client, &self.topic, &name)
            })
            .await?;
        Ok(driver::spawn(
            self.client,
            self.config,
            conn,
            &opened,
            reconnect,
            queue,
        ))
    }
}

#[derive(Debug)]
struct Shared {
    topic: String,
    name: String,
    max_message_size: AtomicU64,
    /// Times the stream was dropped to resend (it broke, or the broker
    /// refused a batch for a reason that may pass).
    reconnects: AtomicU64,
    last_sequence_id: AtomicU64,
    closed: AtomicBool,
    queue: Arc<Queue>,
    /// Why the driver stopped on its own (it could not reconnect).
    fatal: std::sync::OnceLock<Error>,
}

enum Cmd {
    Send(OutgoingMessage, Reply),
    Flush(oneshot::Sender<Result<()>>),
    Close(oneshot::Sender<Result<()>>),
}

/// Sends messages to one topic, or to the partitions of a partitioned
/// topic; see the [module docs](self).
///
/// Cheap to clone: clones share the producer (one stream, one sequence;
/// on a partitioned topic, one of each per partition). The stream is
/// closed by the [`close`](Self::close) of the last clone, or when the
/// last clone is dropped (pending messages are then still sent, best
/// effort); the `close` of a clone while others live only flushes.
///
/// # Example
///
/// [`send`](Self::send) waits for the broker's receipt (in the broker's
/// default `sync` mode: the message is on disk); [`send_async`](Self::send_async)
/// queues the message and returns a [`Receipt`] to await later, so many
/// messages are in flight at once.
///
/// ```
/// # #[tokio::main] async fn main() -> ricochet_client::Result<()> {
/// # let broker = ricochet_testkit::InProcessBroker::start().await;
/// # let client = ricochet_client::Client::connect(broker.url()).await?;
/// use ricochet_client::OutgoingMessage;
///
/// let producer = client
///     .producer("orders")
///     .max_pending_messages(1000) // the queue bound send_async waits on
///     .create()
///     .await?;
/// let first = producer
///     .send(OutgoingMessage::builder("order 1").key("customer-7").property("source", "web"))
///     .await?;
/// assert_eq!(first.entry_id(), 0);
///
/// let mut receipts = Vec::new();
/// for i in 2..=100 {
///     receipts.push(producer.send_async(format!("order {i}")).await?);
/// }
/// for receipt in receipts {
///     receipt.await?; // each message's id, once stored
/// }
/// producer.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Producer {
    inner: Inner,
    /// One per clone: the last one to close closes the stream.
    handle: Arc<()>,
}

#[derive(Debug, Clone)]
enum Inner {
    Topic(TopicProducer),
    Partitioned(Arc<partitioned::Router>),
}

impl Producer {
    /// The topic, fully qualified (a partitioned topic's base name).
    pub fn topic(&self) -> &str {
        match &self.inner {
            Inner::Topic(p) => p.topic(),
            Inner::Partitioned(r) => r.topic(),
        }
    }

    /// The producer name (generated unless set); on a partitioned topic,
    /// every partition's stream has it.
    pub fn name(&self) -> &str {
        match &self.inner {
            Inner::Topic(p) => p.name(),
            Inner::Partitioned(r) => r.name(),
        }
    }

    /// The partition count when the topic is partitioned (it may grow).
    pub fn partitions(&self) -> Option<u32> {
        match &self.inner {
            Inner::Topic(_) => None,
            Inner::Partitioned(r) => Some(r.len() as u32),
        }
    }

    /// The highest sequence id the broker had stored for this producer
    /// name when the stream was last (re)opened (0 when none); on a
    /// partitioned topic the highest over the partitions.
    pub fn last_sequence_id(&self) -> u64 {
        match &self.inner {
            Inner::Topic(p) => p.last_sequence_id(),
            Inner::Partitioned(r) => r.last_sequence_id(),
        }
    }

    /// Sends a message and waits for its receipt (the broker has stored it,
    /// durably in the broker's sync mode). On a partitioned topic the id
    /// names the partition the message went to. Waits for room first when
    /// the producer's queue is full (see [`send_async`](Self::send_async)).
    pub async fn send(&self, msg: impl Into<OutgoingMessage>) -> Result<MessageId> {
        self.send_async(msg).await?.await
    }

    /// Queues a message and returns its [`Receipt`], a future of the
    /// receipt, without waiting for it: call it many times to pipeline.
    /// Sequence ids (and so the order on the topic, or on a partition)
    /// follow the order of the calls. The receipts need not be awaited for
    /// the messages to be sent.
    ///
    /// The queue is bounded ([`max_pending_messages`](ProducerBuilder::max_pending_messages),
    /// [`max_pending_bytes`](ProducerBuilder::max_pending_bytes)): messages
    /// sent and not yet answered by the broker hold room in it. When it is
    /// full this waits for room (the default), or fails at once with
    /// [`ErrorKind::QueueFull`](crate::ErrorKind::QueueFull) when the
    /// producer was built with
    /// [`block_if_queue_full(false)`](ProducerBuilder::block_if_queue_full).
    /// A closed producer, or a message over the broker's size limit, fails
    /// here too, and nothing is sent.
    pub async fn send_async(&self, msg: impl Into<OutgoingMessage>) -> Result<Receipt> {
        let msg = msg.into();
        match &self.inner {
            Inner::Topic(p) => p.send_async(msg).await,
            Inner::Partitioned(r) => r.route(&msg).send_async(msg).await,
        }
    }

    /// How many messages (and their bytes) are sent and not yet answered by
    /// the broker, over all partitions: the producer's queue;
    /// and how many times a stream was dropped to resend.
    pub fn stats(&self) -> ProducerStats {
        let (q, reconnects) = match &self.inner {
            Inner::Topic(p) => (&*p.shared.queue, p.reconnects()),
            Inner::Partitioned(r) => (r.queue(), r.all().iter().map(|p| p.reconnects()).sum()),
        };
        ProducerStats {
            pending_messages: q.pending_messages(),
            pending_bytes: q.pending_bytes(),
            reconnects,
        }
    }

    /// Sends the current batch now and waits until every message queued
    /// before this call is receipted (or failed).
    pub async fn flush(&self) -> Result<()> {
        Producer::flush_inner(&self.inner).await
    }

    async fn flush_inner(inner: &Inner) -> Result<()> {
        match inner {
            Inner::Topic(p) => p.flush().await,
            Inner::Partitioned(r) => {
                for p in r.all() {
                    p.flush().await?;
                }
                Ok(())
            }
        }
    }

    /// Closes this handle. The last clone to close flushes, waits for the
    /// outstanding receipts (up to the client's request timeout), then
    /// closes the stream (every partition's); messages still unreceipted at
    /// the deadline fail with [`ErrorKind::Closed`](crate::ErrorKind::Closed).
    /// While other clones live, this only [flushes](Self::flush): the
    /// stream stays open for them.
    ///
    /// `Ok` means every message sent before the call was answered by the
    /// broker (each receipt says whether it was stored). An error names
    /// what is not: messages unreceipted at the deadline
    /// ([`ErrorKind::Timeout`](crate::ErrorKind::Timeout)), or the reason the
    /// producer had stopped on its own (it could not reconnect: the error
    /// it failed with, or [`ErrorKind::Closed`](crate::ErrorKind::Closed)).
    pub async fn close(self) -> Result<()> {
        let Producer { inner, handle } = self;
        if Arc::try_unwrap(handle).is_err() {
            return Producer::flush_inner(&inner).await;
        }
        match &inner {
            Inner::Topic(p) => p.close().await,
            Inner::Partitioned(r) => r.close().await,
        }
    }
}

/// The producer's queue, as [`Producer::stats`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ProducerStats {
    /// Messages sent and not yet answered by the broker.
    pub pending_messages: u64,
    /// Their bytes (payload, key and properties).
    pub pending_bytes: u64,
    /// Times a stream (any partition's) was dropped and reopened to resend:
    /// it broke, or the broker refused a batch for a reason that may pass
    /// (each also logs one WARN naming the cause).
    pub reconnects: u64,
}

/// The receipt of a message queued by [`Producer::send_async`], to come:
/// a future of the message's id once the broker stored it (or the error).
#[derive(Debug)]
pub struct Receipt {
    rx: oneshot::Receiver<Result<MessageId>>,
}

impl Future for Receipt {
    type Output = Result<MessageId>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(Error::closed())))
    }
}

/// The producer of one topic (or one partition): one stream, one sequence.
#[derive(Debug, Clone)]
pub(crate) struct TopicProducer {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
}

impl TopicProducer {
    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// The topic, fully qualified.
    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// The producer name (generated unless set).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The highest sequence id the broker had stored for this producer
    /// name when the stream was last (re)opened (0 when none).
    pub fn last_sequence_id(&self) -> u64 {
        self.shared.last_sequence_id.load(Ordering::Relaxed)
    }

    /// Times the stream was dropped to resend.
    pub fn reconnects(&self) -> u64 {
        self.shared.reconnects.load(Ordering::Relaxed)
    }

    /// See [`Producer::send_async`].
    pub async fn send_async(&self, msg: OutgoingMessage) -> Result<Receipt> {
        let max = self.shared.max_message_size.load(Ordering::Relaxed);
        if self.is_closed() {
            return Err(Error::closed());
        }
        if max > 0 && msg.counted_size() as u64 > max {
            return Err(Error::invalid_argument(format!(
                "message of {} bytes (payload, key and properties) exceeds the broker's limit of {max} bytes",
                msg.counted_size()
            )));
        }
        let room = self.shared.queue.room(msg.counted_size()).await?;
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Send(msg, Reply::new(tx, room)))
            .map_err(|_| Error::closed())?;
        Ok(Receipt { rx })
    }

    /// Sends the current batch now and waits until every message queued
    /// before this call is receipted (or failed).
    pub async fn flush(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Flush(tx)).map_err(|_| self.stopped())?;
        rx.await.unwrap_or_else(|_| Err(self.stopped()))
    }

    /// Why the driver is gone: the error it stopped with, or
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed).
    fn stopped(&self) -> Error {
        self.shared.fatal.get().cloned().unwrap_or_else(|| {
            Error::new(crate::ErrorKind::Closed, "the producer's task has stopped")
        })
    }

    /// Flushes, waits for the outstanding receipts (up to the client's
    /// request timeout), then closes the stream. Later sends fail with
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed); so do messages still unreceipted at the deadline.
    /// Fails when the driver was already gone (it stopped on its own).
    pub async fn close(&self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Close(tx)).map_err(|_| self.stopped())?;
        rx.await.unwrap_or_else(|_| Err(self.stopped()))
    }
}
