//! Consumers: [`ConsumerBuilder`], [`Consumer`] and its cloneable
//! [`Acker`].
//!
//! A consumer is one gRPC stream driven by a background task, which:
//!
//! * grants the broker **flow permits**: `receiver_queue_size` at first,
//!   then, as the application takes messages, a refill each time half the
//!   queue has been consumed (Pulsar's rule), or as soon as the application
//!   waits on an empty queue having taken at least a quarter of it;
//! * **groups acks**: individual acks are sent together every
//!   `ack_group_time` (100 ms) or `ack_group_max` (1000) ids, whichever
//!   comes first, or as soon as the application waits on an empty queue
//!   or awaits an ack's receipt (`ack_flush_on_idle`, on by default: then
//!   holding acks would only delay what the broker or the application
//!   waits for). By default `ack` returns once queued;
//!   [`flush`](Acker::flush) and [`close`](Consumer::close) confirm that
//!   every ack so far is durable (or fail naming how many are not). With
//!   [ack receipts](ConsumerBuilder::ack_receipts) each `ack`,
//!   `ack_cumulative` and `nack` completes only once the broker made it
//!   durable (Pulsar's `isAckReceiptEnabled`);
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
//!   once or dead-letters. A delay of at least `broker_nack_threshold`
//!   (10 s; every delay with ack receipts) is sent at once instead, for the
//!   broker to hold, persisted (NATS's `NakWithDelay`): it costs this client
//!   nothing and survives it. When the policy routes the attempt to the
//!   retry tier or the DLQ, the client sends it at once and the broker
//!   schedules it (the delay is never served twice);
//! * **reconnects** with backoff when the stream breaks, resubscribes with
//!   the same consumer name and settings, and starts clean: messages
//!   received on the old stream but not yet taken by the application are
//!   dropped, and both trackers are cleared, because the broker redelivers
//!   everything that was in flight (its delivery count incremented). A
//!   message of the old stream can no longer be settled
//!   ([`ErrorKind::StaleDelivery`](crate::ErrorKind::StaleDelivery)): an ack never
//!   applies to a message delivered after it was made; settle the
//!   redelivery instead. Acks that were sent and not confirmed when the
//!   stream broke are counted, and the next `flush` or `close` reports them.
//!
//! # Order
//!
//! On Exclusive and Failover subscriptions a nacked or timed-out message is
//! redelivered on its own, after the messages already dispatched: a nack
//! breaks the order of that message. Applications needing strict order
//! should retry in place rather than nack. Key_Shared keeps a key on one
//! consumer while it holds unacked messages of that key.

// The parts, from the application inwards:
// - acker: Acker, the settle API (ack, nack, reconsume_later, terminate, ...)
// - builder: ConsumerBuilder and the Subscribe handshake
// - config: ConsumerConfig, InitialPosition, the Subscribe frame
// - shared: commands, deliveries and state shared by handles and driver
// - driver: the background task (event loop, connected/lost/reconnect/close)
// - acks: ack grouping, what to send when (plain data, unit-tested)
// - redelivery: nack and ack-timeout decisions (plain data, unit-tested)
// - requests: request ids and the answers they wait for
// - ids: topic numbers and compact keys for the trackers
mod acker;
mod acks;
mod builder;
mod commands;
mod config;
mod conn;
mod driver;
mod local;
mod partitioned;
mod redelivery;
mod requests;
mod shared;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

pub use acker::Acker;
pub use builder::ConsumerBuilder;
pub use config::{ConsumerConfig, ConsumerPolicy};
/// How a subscription shares messages between its consumers, and where a
/// new one starts: the protocol's own enums, shared with the broker and CLI.
pub use ricochet_proto::{InitialPosition, SubscriptionType};

use crate::error::{Error, Result};
use crate::message::{Message, MessageId};
use shared::{ACTIVE_NO, ACTIVE_YES, Cmd, Delivery, TakenTracking};

/// Receives messages from one subscription; see the [module docs](self).
///
/// Use [`receive`](Self::receive) or the [`Stream`] impl to take messages.
/// Settle them with the consumer's own methods ([`ack`](Self::ack),
/// [`nack`](Self::nack), [`reconsume_later`](Self::reconsume_later),
/// [`terminate`](Self::terminate), ...). For processing in other tasks,
/// take a cloneable [`acker`](Self::acker): it has the same methods.
///
/// After [`close`](Self::close), `receive` and every settle method fail with
/// [`ErrorKind::Closed`](crate::ErrorKind::Closed).
///
/// # Example
///
/// A failed message comes back after the subscription's policy's delay,
/// its delivery count (stored by the broker) one higher; past the policy's
/// limit it goes to the subscription's dead-letter tier.
///
/// ```
/// # #[tokio::main] async fn main() -> ricochet_client::Result<()> {
/// # let broker = ricochet_testkit::InProcessBroker::start().await;
/// # let client = ricochet_client::Client::connect(broker.url()).await?;
/// use ricochet_client::{InitialPosition, PolicySpec};
///
/// client.producer("orders").create().await?.send("order 1").await?;
///
/// let mut consumer = client
///     .consumer("orders")
///     .subscription("billing")
///     .initial_position(InitialPosition::Earliest)
///     // Redeliver 100 ms after a nack, at most 3 times, then dead-letter.
///     .policy("backoff:fixed=100ms,max=3".parse::<PolicySpec>()?)
///     .subscribe()
///     .await?;
/// let msg = consumer.receive().await?;
/// assert_eq!(msg.delivery_count(), 0);
/// consumer.nack_with_reason(&msg, "database busy").await?;
///
/// let again = consumer.receive().await?;
/// assert_eq!((again.payload_str(), again.delivery_count()), (Some("order 1"), 1));
/// consumer.ack(&again).await?;
/// consumer.close().await?; // Ok once every ack is durable
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Consumer {
    rx: mpsc::UnboundedReceiver<Delivery>,
    /// The rest of the frame taken last from `rx`, not yet handed out.
    buffered: Buffered,
    acker: Acker,
    /// On a partitioned topic, the partitions' merged deliveries (`rx` is
    /// then unused).
    merged: Option<partitioned::Merged>,
    /// The driver(s) were told the application waits on an empty queue,
    /// and no message was taken since.
    idle_told: bool,
}

/// The messages of the frame a [`Consumer`] took last from its driver,
/// with the stream generation and kind they came with.
#[derive(Debug)]
struct Buffered {
    messages: std::vec::IntoIter<Message>,
    epoch: u64,
    local: bool,
}

impl Default for Buffered {
    fn default() -> Self {
        Self {
            messages: Vec::new().into_iter(),
            epoch: 0,
            local: false,
        }
    }
}

impl Consumer {
    fn new(rx: mpsc::UnboundedReceiver<Delivery>, acker: Acker) -> Self {
        Self {
            rx,
            buffered: Buffered::default(),
            acker,
            merged: None,
            idle_told: false,
        }
    }

    fn partitioned(merged: partitioned::Merged, acker: Acker) -> Self {
        Self {
            rx: mpsc::unbounded_channel().1,
            buffered: Buffered::default(),
            acker,
            merged: Some(merged),
            idle_told: false,
        }
    }

    /// The next message. Fails with [`ErrorKind::Closed`](crate::ErrorKind::Closed) once the consumer is
    /// closed, or once with the cause if it could not reconnect.
    pub async fn receive(&mut self) -> Result<Message> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx))
            .await
            .unwrap_or(Err(Error::closed()))
    }

    /// The application waits on an empty queue: tells the driver(s) once
    /// per wait, so held acks go now (`ack_flush_on_idle`).
    fn idle(&mut self) {
        if self.idle_told {
            return;
        }
        self.idle_told = true;
        match &self.acker.parts {
            None => {
                self.grant_taken();
                let _ = self.acker.tx.send(Cmd::Idle);
            }
            Some(parts) => {
                for a in parts.all() {
                    let _ = a.tx.send(Cmd::Idle);
                }
            }
        }
    }

    /// Filters a message as the application takes it: drops messages of
    /// an old stream, counts consumption for flow permits.
    fn accept(&self, m: Message, epoch: u64, local: bool) -> Option<Message> {
        if epoch != self.acker.shared.epoch.load(Ordering::Acquire) {
            return None;
        }
        if !local {
            self.consumed(1);
        }
        let tracking = self.acker.shared.track_taken;
        if tracking != TakenTracking::Off {
            // The ack timeout runs from here (Pulsar's rule): a
            // message waiting in the prefetch queue cannot time out.
            let taken = Cmd::Taken {
                id: m.id.clone(),
                epoch,
                at: Instant::now(),
            };
            let _ = self.acker.queue(taken, tracking == TakenTracking::Quiet);
        }
        Some(m)
    }

    /// The next message of this (unpartitioned) consumer: from the frame
    /// taken last, else from the driver's queue.
    fn poll_own(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message>>> {
        loop {
            if let Some(m) = self.buffered.messages.next() {
                let (epoch, local) = (self.buffered.epoch, self.buffered.local);
                match self.accept(m, epoch, local) {
                    Some(m) => return Poll::Ready(Some(Ok(m))),
                    None => continue,
                }
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(d)) => match d.item {
                    Ok(messages) => {
                        self.buffered = Buffered {
                            messages: messages.into_iter(),
                            epoch: d.epoch,
                            local: d.local,
                        };
                    }
                    Err(e) => return Poll::Ready(Some(Err(e))),
                },
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The application drained its queue: the permits of what it took
    /// since the last refill go now if they are at least half a refill (a
    /// quarter of the queue), not once half the queue is taken. The broker
    /// may then fill the whole queue again, which is all a permit means
    /// (Pulsar's rule counts the same permits, it only sends them later):
    /// a burst that comes after a lull is not cut at the permits left from
    /// before it. The half-refill floor keeps a trickle (one message per
    /// wait) from sending a `Flow` per message.
    fn grant_taken(&self) {
        let shared = &self.acker.shared;
        if shared.consumed.load(Ordering::Acquire) >= shared.refill_threshold.div_ceil(2) {
            let taken = shared.consumed.swap(0, Ordering::AcqRel);
            if taken > 0 {
                let _ = self.acker.tx.send(Cmd::Flow(taken));
            }
        }
    }

    fn consumed(&self, n: u32) {
        let now = self.acker.shared.consumed.fetch_add(n, Ordering::AcqRel) + n;
        if now >= self.acker.shared.refill_threshold {
            let taken = self.acker.shared.consumed.swap(0, Ordering::AcqRel);
            if taken > 0 {
                let _ = self.acker.tx.send(Cmd::Flow(taken));
            }
        }
    }

    /// A handle for acking from other tasks.
    pub fn acker(&self) -> Acker {
        self.acker.clone()
    }

    /// Acknowledges one message: [`Acker::ack`].
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.acker.ack(msg).await
    }

    /// Acknowledges one message by id: [`Acker::ack_id`].
    pub async fn ack_id(&self, id: &MessageId) -> Result<()> {
        self.acker.ack_id(id).await
    }

    /// Acknowledges `msg` and everything before it: [`Acker::ack_cumulative`].
    pub async fn ack_cumulative(&self, msg: &Message) -> Result<()> {
        self.acker.ack_cumulative(msg).await
    }

    /// Sends pending acks and waits until they are durable: [`Acker::flush`].
    pub async fn flush(&self) -> Result<()> {
        self.acker.flush().await
    }

    /// Restarts `msg`'s ack timeout: [`Acker::extend_ack_deadline`].
    pub async fn extend_ack_deadline(&self, msg: &Message) -> Result<()> {
        self.acker.extend_ack_deadline(msg).await
    }

    /// A negative ack, redelivered after the policy's delay: [`Acker::nack`].
    pub async fn nack(&self, msg: &Message) -> Result<()> {
        self.acker.nack(msg).await
    }

    /// A negative ack with a reason: [`Acker::nack_with_reason`].
    pub async fn nack_with_reason(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        self.acker.nack_with_reason(msg, reason).await
    }

    /// Retries `msg` through the retry tier after `delay`:
    /// [`Acker::reconsume_later`].
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<()> {
        self.acker.reconsume_later(msg, delay).await
    }

    /// Retries `msg` at a delay level: [`Acker::reconsume_later_level`].
    pub async fn reconsume_later_level(&self, msg: &Message, level: i32) -> Result<()> {
        self.acker.reconsume_later_level(msg, level).await
    }

    /// Retries `msg` with added properties: [`Acker::reconsume_later_with`].
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

    /// Dead-letters `msg` at once: [`Acker::terminate`].
    pub async fn terminate(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        self.acker.terminate(msg, reason).await
    }

    /// The topic, fully qualified (a partitioned topic's base name; each
    /// message's id names its partition).
    pub fn topic(&self) -> &str {
        &self.acker.shared.topic
    }

    /// The partition count when the topic is partitioned (it grows as
    /// partitions are added and subscribed).
    pub fn partitions(&self) -> Option<u32> {
        self.acker.parts.as_ref().map(|p| p.all().len() as u32)
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
    ///
    /// On a partitioned topic: whether it is active on any partition
    /// (Failover spreads partitions over the consumers).
    pub fn is_active(&self) -> Option<bool> {
        if let Some(parts) = &self.acker.parts {
            let states: Vec<u8> = parts
                .all()
                .iter()
                .map(|a| a.shared.active.load(Ordering::Relaxed))
                .collect();
            return if states.contains(&ACTIVE_YES) {
                Some(true)
            } else if !states.is_empty() && states.iter().all(|s| *s == ACTIVE_NO) {
                Some(false)
            } else {
                None
            };
        }
        match self.acker.shared.active.load(Ordering::Relaxed) {
            ACTIVE_YES => Some(true),
            ACTIVE_NO => Some(false),
            _ => None,
        }
    }

    /// Hands nacks still held here to the broker (reason NACK, with their
    /// reasons and what is left of their delays), sends pending acks and
    /// waits until the broker has made every ack of this consumer durable
    /// (up to the client's request timeout), then closes cleanly: messages
    /// received but not acked (taken or still prefetched) go to other
    /// consumers, or this subscription's next one, with their delivery
    /// count unchanged. A consumer that is dropped without `close` is
    /// charged an attempt for each (reason CONSUMER_LOST).
    ///
    /// `Ok` means every ack was confirmed durable. Otherwise
    /// [`ErrorKind::Unconfirmed`](crate::ErrorKind::Unconfirmed) names how many
    /// were not (lost with a broken stream, or unanswered in time): the
    /// broker redelivers those messages. A `close` made while another is
    /// under way, or after it, returns what that one found; after the
    /// consumer stopped on its own (it could not resubscribe), what was
    /// unconfirmed then.
    ///
    /// On a partitioned topic every partition's stream is closed so; the
    /// first error is returned.
    pub async fn close(&self) -> Result<()> {
        let Some(parts) = &self.acker.parts else {
            return self.acker.close_partition().await;
        };
        self.acker.shared.closed.store(true, Ordering::Release);
        let mut first = None;
        for a in parts.all() {
            if let Err(e) = a.close_partition().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Acker {
    /// [`Consumer::close`] of one topic's stream.
    pub(super) async fn close_partition(&self) -> Result<()> {
        self.shared.closed.store(true, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Close(tx)).is_ok()
            && let Ok(r) = rx.await
        {
            return r;
        }
        // The driver has stopped (closed before, or it could not
        // resubscribe): what it found then. Without it (the driver task
        // died) nothing is known to be confirmed, so never `Ok`.
        self.shared
            .outcome
            .get()
            .cloned()
            .unwrap_or(Err(Error::closed()))
    }
}

impl Stream for Consumer {
    type Item = Result<Message>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let polled = match &mut this.merged {
            Some(m) => m.poll_next(cx),
            None => this.poll_own(cx),
        };
        match polled {
            Poll::Pending => this.idle(),
            Poll::Ready(_) => this.idle_told = false,
        }
        polled
    }
}

#[cfg(test)]
#[path = "handoff_tests.rs"]
mod handoff_tests;
