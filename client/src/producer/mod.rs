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

mod driver;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::message::{MessageId, OutgoingMessage};
use crate::reconnect::open_with_retry;

/// Producer settings.
#[derive(Debug, Clone)]
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
    /// A message not receipted within this fails with [`Error::Timeout`]
    /// (and is not resent after a reconnect). Default 30 s; zero disables.
    pub send_timeout: Duration,
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
        }
    }
}

/// Builds a [`Producer`]; see [`Client::producer`].
#[derive(Debug)]
pub struct ProducerBuilder {
    client: Client,
    topic: String,
    config: ProducerConfig,
}

impl ProducerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self {
            client,
            topic,
            config: ProducerConfig::default(),
        }
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

    /// All settings at once.
    pub fn config(mut self, config: ProducerConfig) -> Self {
        self.config = config;
        self
    }

    /// Opens the producer. Transient failures (broker unreachable) are
    /// retried with backoff until the client's request timeout; a rejection
    /// (bad topic name, a tier topic, ...) is returned at once.
    pub async fn create(self) -> Result<Producer> {
        let name = self
            .config
            .name
            .clone()
            .unwrap_or_else(|| format!("producer-{}", crate::unique_suffix()));
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "producer name must not be empty".into(),
            ));
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
        ))
    }
}

#[derive(Debug)]
struct Shared {
    topic: String,
    name: String,
    max_message_size: AtomicU64,
    last_sequence_id: AtomicU64,
    closed: AtomicBool,
}

enum Cmd {
    Send(OutgoingMessage, oneshot::Sender<Result<MessageId>>),
    Flush(oneshot::Sender<Result<()>>),
    Close(oneshot::Sender<Result<()>>),
}

/// Sends messages to one topic; see the [module docs](self).
///
/// Cheap to clone: clones share the producer (one stream, one sequence).
/// The producer is closed by [`close`](Self::close) or when the last clone
/// is dropped (pending messages are then still sent, best effort).
#[derive(Debug, Clone)]
pub struct Producer {
    tx: mpsc::UnboundedSender<Cmd>,
    shared: Arc<Shared>,
}

impl Producer {
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

    /// Sends a message and waits for its receipt (the broker has stored it,
    /// durably in the broker's sync mode).
    pub async fn send(&self, msg: impl Into<OutgoingMessage>) -> Result<MessageId> {
        self.send_async(msg).await
    }

    /// Queues a message and returns a future of its receipt, without
    /// waiting: call it many times to pipeline. Sequence ids (and so the
    /// order on the topic) follow the order of the calls, not of awaiting
    /// the futures. The futures need not be awaited for the messages to be
    /// sent. Nothing bounds how many are queued: keep a window of futures
    /// (or call [`flush`](Self::flush)) to bound memory.
    pub fn send_async(
        &self,
        msg: impl Into<OutgoingMessage>,
    ) -> impl Future<Output = Result<MessageId>> + Send + 'static {
        let msg = msg.into();
        let (tx, rx) = oneshot::channel();
        let max = self.shared.max_message_size.load(Ordering::Relaxed);
        let early = if self.shared.closed.load(Ordering::Acquire) {
            Some(Error::Closed)
        } else if max > 0 && msg.counted_size() as u64 > max {
            Some(Error::InvalidArgument(format!(
                "message of {} bytes (payload, key and properties) exceeds the broker's limit of {max} bytes",
                msg.counted_size()
            )))
        } else if self.tx.send(Cmd::Send(msg, tx)).is_err() {
            Some(Error::Closed)
        } else {
            None
        };
        async move {
            if let Some(e) = early {
                return Err(e);
            }
            rx.await.unwrap_or(Err(Error::Closed))
        }
    }

    /// Sends the current batch now and waits until every message queued
    /// before this call is receipted (or failed).
    pub async fn flush(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::Flush(tx)).map_err(|_| Error::Closed)?;
        rx.await.unwrap_or(Err(Error::Closed))
    }

    /// Flushes, waits for the outstanding receipts (up to the client's
    /// request timeout), then closes the stream. Later sends fail with
    /// [`Error::Closed`]; so do messages still unreceipted at the deadline.
    pub async fn close(&self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Close(tx)).is_err() {
            return Ok(());
        }
        rx.await.unwrap_or(Ok(()))
    }
}
