//! The producer's background task: batches the handle's messages, sends
//! them, matches the broker's receipts to their callers, expires sends past
//! their timeout, and reopens the stream (resending what is not receipted)
//! when it breaks.
//!
//! A batch the broker could not store for a reason that may pass (the error
//! is [retryable](Error::is_retryable): UNAVAILABLE, RESOURCE_EXHAUSTED, ...)
//! is treated as a broken stream, as Pulsar's producer does: the stream is
//! dropped and reopened after a backoff, and that batch and every later one
//! are resent in order with their sequence ids, until each message's send
//! timeout. The stream is opened with `resend_in_order`, so the broker
//! stores no batch sent behind the refused one. A batch refused for good
//! (invalid, too large, not permitted, a deleted topic) fails alone.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ricochet_proto::{
    ProduceRequest, ProduceResponse, ProducerOpen, ProducerOpened, SendBatch, SendReceipts,
    produce_request, produce_response,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use super::queue::{Queue, Reply};
use super::{Cmd, ProducerConfig, Shared, TopicProducer};
use crate::client::{Client, next_frame, sleep_opt};
use crate::error::{Error, Result};
use crate::message::MessageId;
use crate::reconnect::{ReconnectBackoff, Reconnector, Reopen};

/// Batches assigned a request id and not yet answered, per producer.
const MAX_INFLIGHT_BATCHES: usize = 128;

/// Starts the driver task on a freshly opened stream and returns the
/// application's handle.
pub(super) fn spawn(
    client: Client,
    config: ProducerConfig,
    conn: Conn,
    opened: &ProducerOpened,
    reconnect: Reconnector,
    queue: Arc<Queue>,
) -> TopicProducer {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        topic: opened.topic.clone(),
        name: opened.producer_name.clone(),
        max_message_size: AtomicU64::new(opened.max_message_size),
        reconnects: AtomicU64::new(0),
        last_sequence_id: AtomicU64::new(opened.last_sequence_id.unwrap_or(0)),
        closed: AtomicBool::new(false),
        queue,
        fatal: std::sync::OnceLock::new(),
    });
    let next_seq = opened.last_sequence_id.map_or(0, |l| l.saturating_add(1));
    let refusals = ReconnectBackoff::new(client.config());
    let driver = Driver {
        client,
        config,
        shared: shared.clone(),
        topic_arc: Arc::from(opened.topic.as_str()),
        rx,
        conn: Some(conn),
        reconnect,
        refusals,
        next_seq,
        next_request: 1,
        batch: Vec::new(),
        batch_bytes: 0,
        batch_deadline: None,
        inflight: VecDeque::new(),
        waiters: Vec::new(),
        fatal: None,
        down: None,
        closing: None,
    };
    tokio::spawn(driver.run());
    TopicProducer { tx, shared }
}

pub(super) struct Conn {
    tx: mpsc::UnboundedSender<ProduceRequest>,
    inbound: Streaming<ProduceResponse>,
}

/// Opens a producer stream: `ProducerOpen`, then the broker's `ProducerOpened`.
pub(super) async fn open(
    client: &Client,
    topic: &str,
    name: &str,
) -> Result<(Conn, ProducerOpened)> {
    let timeout = client.config().request_timeout;
    let (tx, rx) = mpsc::unbounded_channel();
    let open = ProduceRequest {
        request: Some(produce_request::Request::Open(ProducerOpen {
            topic: topic.to_owned(),
            producer_name: name.to_owned(),
            resend_in_order: true,
        })),
    };
    tx.send(open).map_err(|_| Error::closed())?;
    // On the topic's owner (the client's own connection when standalone).
    let transport = client.route(topic).await?;
    let handshake = async {
        let mut inbound = Client::broker_on(transport)
            .produce(UnboundedReceiverStream::new(rx))
            .await
            .map_err(Error::from_status)?
            .into_inner();
        match inbound.message().await.map_err(Error::from_status)? {
            Some(ProduceResponse {
                response: Some(produce_response::Response::Opened(o)),
            }) => Ok((inbound, o)),
            Some(ProduceResponse {
                response: Some(produce_response::Response::Error(e)),
            }) => Err(Error::from_frame(e.code, e.message, &e.details)),
            Some(_) => Err(Error::disconnected(
                "the broker answered ProducerOpen with an unexpected frame",
            )),
            None => Err(Error::disconnected(
                "the broker closed the producer stream during the handshake",
            )),
        }
    };
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok((inbound, opened))) => Ok((Conn { tx, inbound }, opened)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::timeout(format!("opening a producer on {topic}"))),
    }
}

struct PendingMsg {
    seq: u64,
    msg: ricochet_proto::OutboundMessage,
    reply: Option<Reply>,
    deadline: Option<Instant>,
}

struct Batch {
    request_id: u64,
    msgs: Vec<PendingMsg>,
    /// Why the batch is being resent (the broker's refusal, or the stream's
    /// break), named by the timeout error of its messages.
    cause: Option<Error>,
    /// The broker refused the batch since it was last sent: it is not
    /// stored, so sequence ids the broker reports stored on reopen mean a
    /// later batch was stored before it (a broker that ignores
    /// `resend_in_order`).
    refused: bool,
}

enum Event {
    Response(Result<Option<ProduceResponse>, tonic::Status>),
    Cmd(Option<Cmd>),
    Linger,
    Reconnect,
    Expire,
    CloseDeadline,
}

struct Driver {
    client: Client,
    config: ProducerConfig,
    shared: Arc<Shared>,
    topic_arc: Arc<str>,
    rx: mpsc::UnboundedReceiver<Cmd>,
    conn: Option<Conn>,
    reconnect: Reconnector,
    /// The delay before reopening after a refused batch: it grows while
    /// refusals follow one another (the reopen itself succeeds, so the
    /// reconnector's backoff would start over each time) and starts over on
    /// a receipt.
    refusals: ReconnectBackoff,
    next_seq: u64,
    next_request: u64,
    batch: Vec<PendingMsg>,
    batch_bytes: usize,
    batch_deadline: Option<Instant>,
    inflight: VecDeque<Batch>,
    /// `flush` and `close` callers waiting for every seq up to theirs.
    waiters: Vec<(u64, oneshot::Sender<Result<()>>)>,
    fatal: Option<Error>,
    /// While disconnected: the last reconnect attempt's error when it was
    /// [`ErrorKind::OwnerDown`](crate::ErrorKind::OwnerDown) (the topic's broker is down).
    down: Option<Error>,
    /// Set by `close`: the deadline, and whether the command channel is done.
    closing: Option<Instant>,
}

impl Driver {
    async fn run(mut self) {
        let mut rx_open = true;
        loop {
            if self.closing.is_some() || !rx_open {
                self.flush_batch();
                if self.all_done() {
                    break;
                }
            }
            let accepting = rx_open && self.inflight.len() < MAX_INFLIGHT_BATCHES;
            let linger = if self.batch.is_empty() || self.inflight.len() >= MAX_INFLIGHT_BATCHES {
                None
            } else {
                self.batch_deadline
            };
            let expire = self.next_expiry();
            let reconnect = if self.conn.is_none() && self.fatal.is_none() {
                self.reconnect.due()
            } else {
                None
            };
            let close_at = self.closing;
            let event = tokio::select! {
                biased;
                r = next_frame(self.conn.as_mut().map(|c| &mut c.inbound)) => Event::Response(r),
                c = self.rx.recv(), if accepting => Event::Cmd(c),
                _ = sleep_opt(linger) => Event::Linger,
                _ = sleep_opt(reconnect) => Event::Reconnect,
                _ = sleep_opt(expire) => Event::Expire,
                _ = sleep_opt(close_at) => Event::CloseDeadline,
            };
            match event {
                Event::Response(Ok(Some(resp))) => self.on_response(resp),
                Event::Response(Ok(None)) => self.lost(
                    Error::disconnected("the broker ended the producer stream"),
                    Instant::now(),
                ),
                Event::Response(Err(status)) => {
                    let e = self.client.stream_broke(status);
                    self.lost(e, Instant::now());
                }
                Event::Cmd(Some(cmd)) => {
                    self.on_cmd(cmd);
                    // Take whatever else is queued before deciding to send.
                    while self.inflight.len() < MAX_INFLIGHT_BATCHES {
                        match self.rx.try_recv() {
                            Ok(cmd) => self.on_cmd(cmd),
                            Err(_) => break,
                        }
                    }
                    // Nothing more is queued: with batching off, or when no
                    // batch is in flight (the connection is idle), send now
                    // rather than wait out the linger. A sender bounded by a
                    // window of receipts would otherwise pay the linger on
                    // every round trip; under load, batches still fill while
                    // earlier ones are in flight.
                    if !self.config.batching || self.inflight.is_empty() {
                        self.flush_batch();
                    }
                }
                Event::Cmd(None) => {
                    // Every handle is gone: send what is queued, then stop.
                    rx_open = false;
                    if self.closing.is_none() {
                        self.closing = Some(Instant::now() + self.client.config().request_timeout);
                    }
                }
                Event::Linger => self.flush_batch(),
                Event::Reconnect => self.reconnect().await,
                Event::Expire => self.expire(Instant::now()),
                Event::CloseDeadline => {
                    let left: usize = self.inflight.iter().map(|b| b.msgs.len()).sum::<usize>()
                        + self.batch.len();
                    self.fail_all(&Error::closed());
                    for (_, w) in self.waiters.drain(..) {
                        let _ = w.send(Err(Error::timeout(format!(
                            "closing: {left} message(s) not receipted in time"
                        ))));
                    }
                    break;
                }
            }
            self.check_waiters();
        }
        self.shared.closed.store(true, Ordering::Release);
        self.fail_all(&Error::closed());
        for (_, w) in self.waiters.drain(..) {
            let _ = w.send(self.fatal.clone().map_or(Ok(()), Err));
        }
        // Dropping the connection ends the request stream: the broker sees a
        // clean close.
    }

    fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Send(msg, reply) => {
                if let Some(e) = &self.fatal {
                    let _ = reply.send(Err(e.clone()));
                    return;
                }
                if self.closing.is_some() {
                    let _ = reply.send(Err(Error::closed()));
                    return;
                }
                let size = msg.size();
                let max_messages = self.max_batch_messages();
                if !self.batch.is_empty()
                    && (self.batch.len() >= max_messages
                        || self.batch_bytes + size > self.config.batch_max_bytes)
                {
                    self.flush_batch();
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                let now = Instant::now();
                let deadline =
                    (!self.config.send_timeout.is_zero()).then(|| now + self.config.send_timeout);
                if self.batch.is_empty() {
                    self.batch_deadline = Some(now + self.config.batch_linger);
                }
                self.batch.push(PendingMsg {
                    seq,
                    msg: msg.into_proto(seq),
                    reply: Some(reply),
                    deadline,
                });
                self.batch_bytes += size;
                if self.batch.len() >= max_messages
                    || self.batch_bytes >= self.config.batch_max_bytes
                {
                    self.flush_batch();
                }
            }
            Cmd::Flush(reply) => {
                self.flush_batch();
                self.waiters.push((self.next_seq.saturating_sub(1), reply));
            }
            Cmd::Close(reply) => {
                if self.closing.is_none() {
                    self.closing = Some(Instant::now() + self.client.config().request_timeout);
                }
                self.flush_batch();
                self.waiters.push((self.next_seq.saturating_sub(1), reply));
            }
        }
    }

    /// Most messages one batch takes: with batching off, one (each send is
    /// its own `SendBatch`, also when several sends were queued at once).
    fn max_batch_messages(&self) -> usize {
        if self.config.batching {
            self.config.batch_max_messages.max(1)
        } else {
            1
        }
    }

    /// Assigns the open batch a request id and sends it (or keeps it for the
    /// next connection).
    fn flush_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let msgs = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        self.batch_deadline = None;
        let batch = Batch {
            request_id: self.next_request,
            msgs,
            cause: None,
            refused: false,
        };
        self.next_request += 1;
        if let Some(conn) = &self.conn
            && conn.tx.send(send_frame(&batch)).is_err()
        {
            // The stream is gone; the response side will report it.
            tracing::debug!("producer stream closed while sending");
        }
        self.inflight.push_back(batch);
    }

    fn on_response(&mut self, resp: ProduceResponse) {
        match resp.response {
            Some(produce_response::Response::Receipts(r)) => self.on_receipts(r),
            Some(produce_response::Response::Error(e)) => {
                let err = Error::from_frame(e.code, e.message, &e.details);
                if err.is_retryable() {
                    let Some(batch) = self
                        .inflight
                        .iter_mut()
                        .find(|b| b.request_id == e.request_id)
                    else {
                        tracing::warn!(
                            request_id = e.request_id,
                            "send error for an unknown batch"
                        );
                        return;
                    };
                    // Kept, with every later batch, for the next stream.
                    batch.refused = true;
                    // Whether the next open asks where the topic is again.
                    let _ = self.client.stream_failed(&err);
                    let at = Instant::now() + self.refusals.next_delay();
                    self.lost(err, at);
                    return;
                }
                let Some(batch) = self.take_batch(e.request_id) else {
                    tracing::warn!(request_id = e.request_id, "send error for an unknown batch");
                    return;
                };
                for m in batch.msgs {
                    if let Some(r) = m.reply {
                        let _ = r.send(Err(err.clone()));
                    }
                }
            }
            Some(produce_response::Response::Opened(_)) | None => {
                tracing::debug!("ignoring an unexpected producer frame");
            }
        }
    }

    fn take_batch(&mut self, request_id: u64) -> Option<Batch> {
        if self
            .inflight
            .front()
            .is_some_and(|b| b.request_id == request_id)
        {
            return self.inflight.pop_front();
        }
        let pos = self
            .inflight
            .iter()
            .position(|b| b.request_id == request_id)?;
        self.inflight.remove(pos)
    }

    fn on_receipts(&mut self, r: SendReceipts) {
        // The broker stores again: a later refusal reopens soon.
        self.refusals.reset();
        let Some(batch) = self.take_batch(r.request_id) else {
            tracing::warn!(request_id = r.request_id, "receipts for an unknown batch");
            return;
        };
        let mut receipts = r.receipts.into_iter().peekable();
        for m in batch.msgs {
            // Receipts come in batch order; skip any the broker added.
            while receipts.peek().is_some_and(|x| x.sequence_id < m.seq) {
                receipts.next();
            }
            let outcome = match receipts.peek() {
                Some(x) if x.sequence_id == m.seq => {
                    let x = receipts.next();
                    match x.and_then(|x| x.message_id) {
                        Some(id) if id.topic == *self.topic_arc => {
                            Ok(MessageId::new(self.topic_arc.clone(), id.entry_id))
                        }
                        Some(id) => Ok(MessageId::new(id.topic, id.entry_id)),
                        None => Ok(MessageId::new(
                            self.topic_arc.clone(),
                            MessageId::UNKNOWN_ENTRY,
                        )),
                    }
                }
                _ => Err(Error::disconnected(format!(
                    "the broker sent no receipt for sequence id {}",
                    m.seq
                ))),
            };
            if let Some(reply) = m.reply {
                let _ = reply.send(outcome);
            }
        }
    }

    /// Drops the stream for `cause` (it broke, or the broker refused a
    /// batch for a reason that may pass) and schedules the reopen at `at`.
    fn lost(&mut self, cause: Error, at: Instant) {
        if self.conn.take().is_none() {
            return;
        }
        self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
        let pending: usize = self.inflight.iter().map(|b| b.msgs.len()).sum();
        tracing::warn!(topic = %self.shared.topic, producer = %self.shared.name, cause = %cause, pending, "producer stream lost; reconnecting to resend");
        for b in &mut self.inflight {
            b.cause = Some(cause.clone());
        }
        self.reconnect.lost(at);
    }

    async fn reconnect(&mut self) {
        let open = open(&self.client, &self.shared.topic, &self.shared.name);
        match self
            .reconnect
            .attempt(open, Error::is_retryable, "producer")
            .await
        {
            Reopen::Open((conn, opened)) => {
                self.shared
                    .max_message_size
                    .store(opened.max_message_size, Ordering::Relaxed);
                let last = opened.last_sequence_id;
                self.shared
                    .last_sequence_id
                    .store(last.unwrap_or(0), Ordering::Relaxed);
                if let Some(l) = last {
                    self.next_seq = self.next_seq.max(l.saturating_add(1));
                }
                // Stored before the break (receipt lost): resolve without resending.
                let stored = |seq: u64| last.is_some_and(|l| seq <= l);
                let mut resent = 0usize;
                for batch in &mut self.inflight {
                    let refused = std::mem::take(&mut batch.refused);
                    let cause = batch.cause.clone();
                    batch.msgs.retain_mut(|m| {
                        if m.reply.is_none() {
                            return false;
                        }
                        if stored(m.seq) {
                            let outcome = match (&cause, refused) {
                                // Refused, yet below the broker's last: a
                                // later batch was stored first. Resent, it
                                // would be dropped as a duplicate.
                                (Some(e), true) => Err(e.clone()),
                                _ => Ok(MessageId::new(
                                    self.topic_arc.clone(),
                                    MessageId::UNKNOWN_ENTRY,
                                )),
                            };
                            if let Some(r) = m.reply.take() {
                                let _ = r.send(outcome);
                            }
                            return false;
                        }
                        true
                    });
                }
                self.inflight.retain(|b| !b.msgs.is_empty());
                for batch in &self.inflight {
                    resent += batch.msgs.len();
                    let _ = conn.tx.send(send_frame(batch));
                }
                tracing::info!(topic = %self.shared.topic, producer = %self.shared.name, resent, "producer reconnected");
                self.conn = Some(conn);
                self.down = None;
            }
            // Kept for the sends that expire meanwhile: a topic whose
            // broker is down fails them with that, not a bare timeout.
            Reopen::Later(e) => self.down = e.owner_down().is_some().then_some(e),
            Reopen::Failed(e) => {
                tracing::error!(error = %e, topic = %self.shared.topic, "producer cannot reconnect; failing its messages");
                self.fail_all(&e);
                let _ = self.shared.fatal.set(e.clone());
                self.fatal = Some(e);
                self.shared.closed.store(true, Ordering::Release);
            }
        }
    }

    /// The earliest send-timeout deadline of a message still waiting.
    fn next_expiry(&self) -> Option<Instant> {
        if self.config.send_timeout.is_zero() {
            return None;
        }
        self.inflight
            .iter()
            .flat_map(|b| b.msgs.iter())
            .chain(self.batch.iter())
            .find(|m| m.reply.is_some())
            .and_then(|m| m.deadline)
    }

    fn expire(&mut self, now: Instant) {
        let timeout = self.config.send_timeout;
        // Disconnected because the topic's broker is down: say so.
        let down = self.conn.is_none().then_some(self.down.as_ref()).flatten();
        let fail = |m: &mut PendingMsg, cause: Option<&Error>| {
            if m.deadline.is_some_and(|d| d <= now)
                && let Some(r) = m.reply.take()
            {
                let _ = r.send(Err(match (down, cause) {
                    (Some(e), _) => e.clone(),
                    (None, Some(cause)) => Error::timeout_after(
                        format!(
                            "no receipt within the send timeout of {timeout:?}; last resent after: {cause}"
                        ),
                        cause,
                    ),
                    (None, None) => {
                        Error::timeout(format!("no receipt within the send timeout of {timeout:?}"))
                    }
                }));
            }
        };
        for b in &mut self.inflight {
            let cause = b.cause.as_ref();
            b.msgs.iter_mut().for_each(|m| fail(m, cause));
        }
        self.batch.iter_mut().for_each(|m| fail(m, None));
        self.batch.retain(|m| m.reply.is_some());
        if self.conn.is_none() {
            // Nothing will answer them on this connection: forget them now.
            for b in &mut self.inflight {
                b.msgs.retain(|m| m.reply.is_some());
            }
            self.inflight.retain(|b| !b.msgs.is_empty());
        }
    }

    fn fail_all(&mut self, e: &Error) {
        for m in self
            .inflight
            .drain(..)
            .flat_map(|b| b.msgs)
            .chain(self.batch.drain(..))
        {
            if let Some(r) = m.reply {
                let _ = r.send(Err(e.clone()));
            }
        }
    }

    /// Whether every message up to `seq` is answered.
    fn done_through(&self, seq: u64) -> bool {
        let first_pending = self
            .inflight
            .iter()
            .flat_map(|b| b.msgs.first())
            .chain(self.batch.first())
            .map(|m| m.seq)
            .next();
        first_pending.is_none_or(|s| s > seq)
    }

    fn all_done(&self) -> bool {
        self.inflight.is_empty() && self.batch.is_empty()
    }

    fn check_waiters(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut self.waiters);
        for (seq, w) in waiters {
            if self.done_through(seq) || self.fatal.is_some() {
                let _ = w.send(match &self.fatal {
                    Some(e) => Err(e.clone()),
                    None => Ok(()),
                });
            } else {
                self.waiters.push((seq, w));
            }
        }
    }
}

fn send_frame(batch: &Batch) -> ProduceRequest {
    ProduceRequest {
        request: Some(produce_request::Request::Send(SendBatch {
            request_id: batch.request_id,
            messages: batch.msgs.iter().map(|m| m.msg.clone()).collect(),
        })),
    }
}
