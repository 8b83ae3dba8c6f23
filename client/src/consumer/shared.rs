//! What the application's handles ([`Consumer`](super::Consumer),
//! [`Acker`](super::Acker)) and the driver task share: the commands the
//! handles send ([`Cmd`]), the deliveries the driver sends back
//! ([`Delivery`]), and the state both read ([`Shared`]).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64};
use std::time::Duration;

use ricochet_proto::reconsume_later;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::SubscriptionType;
use crate::error::Result;
use crate::message::{Message, MessageId};

pub(super) const ACTIVE_UNKNOWN: u8 = 0;
pub(super) const ACTIVE_YES: u8 = 1;
pub(super) const ACTIVE_NO: u8 = 2;

/// One consumer's identity and the counters its handles and driver both
/// touch.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) topic: String,
    pub(super) subscription: String,
    pub(super) consumer_name: String,
    pub(super) subscription_type: SubscriptionType,
    /// The stream generation; messages of older ones are dropped.
    pub(super) epoch: AtomicU64,
    /// Messages taken by the application since the last permit refill.
    pub(super) consumed: AtomicU32,
    pub(super) refill_threshold: u32,
    /// Whether this consumer is the active one (`ACTIVE_*`).
    pub(super) active: AtomicU8,
    pub(super) closed: AtomicBool,
    /// Whether taking a message starts its ack timeout, and how the driver
    /// hears of it.
    pub(super) track_taken: TakenTracking,
    /// Whether settling waits for the broker's durable confirmation.
    pub(super) receipts: bool,
    /// Whether a nack carries a copy of its message, for a local
    /// redelivery ([`ConsumerConfig::local_redelivery`](super::ConsumerConfig::local_redelivery)).
    pub(super) keeps_copies: bool,
    pub(super) request_timeout: Duration,
    /// What `close` found (or, when the driver stopped on its own, what it
    /// found then), set once before the driver stops: a `close` that finds
    /// the driver gone answers with it.
    pub(super) outcome: OnceLock<Result<()>>,
}

/// How taking a message reaches the driver, which starts its ack timeout
/// from the moment it was taken (Pulsar's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TakenTracking {
    /// No ack timeout: the driver is not told.
    Off,
    /// Each take wakes the driver.
    Wakes,
    /// A take is a quiet command (`commands`), like a plain ack: it waits
    /// unwoken only while an ack group is armed, so at most the ack group
    /// window. The ack timeout is longer than that window, so the take is
    /// registered before its deadline (which runs from the take itself)
    /// could pass.
    Quiet,
}

impl TakenTracking {
    /// The tracking an ack timeout of `ack_timeout` and an ack group window
    /// of `group` need.
    pub(super) fn of(ack_timeout: Option<Duration>, group: Duration) -> Self {
        match ack_timeout {
            None => Self::Off,
            Some(t) if t > group => Self::Quiet,
            Some(_) => Self::Wakes,
        }
    }
}

/// Where the broker's confirmation of one request goes.
pub(super) type Reply = oneshot::Sender<Result<()>>;

/// What the handles ask of the driver. `epoch` is the stream generation
/// the message arrived on (`None`: an id the application kept apart from
/// its message); `reply`, with ack receipts, waits for the broker.
pub(super) enum Cmd {
    Ack {
        id: MessageId,
        epoch: Option<u64>,
        reply: Option<Reply>,
    },
    AckCumulative {
        id: MessageId,
        epoch: Option<u64>,
        reply: Option<Reply>,
    },
    Nack {
        id: MessageId,
        epoch: u64,
        delivery_count: u32,
        detail: Option<String>,
        reply: Option<Reply>,
        /// A copy for a local redelivery (boxed: most commands are small).
        copy: Option<Box<Message>>,
        /// When the application nacked: the delay runs from here.
        at: Instant,
    },
    ReconsumeLater {
        id: MessageId,
        epoch: u64,
        delay: reconsume_later::Delay,
        properties: HashMap<String, String>,
        detail: String,
        /// `None`: queued (the driver counts it until the broker answers).
        reply: Option<Reply>,
        /// When the application asked: the delay runs from here.
        at: Instant,
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
    /// The application waits for a message and its queue is empty: held
    /// acks go now (when `ack_flush_on_idle` is on), as grouping them
    /// longer would only delay what the broker waits for.
    Idle,
    /// Send every held ack now and confirm every ack so far.
    Flush(Reply),
    Close(Reply),
}

/// The messages of one frame (or the error that ended the consumer) for
/// the application, tagged with the stream generation they arrived on.
///
/// A frame's messages go as one item, not one each: the driver makes one
/// channel send per frame and the application's handle takes them from its
/// own buffer (`Consumer::buffered`), still checking each against the
/// current generation and counting each for flow permits as it is taken.
pub(super) struct Delivery {
    pub(super) epoch: u64,
    pub(super) item: Result<Vec<Message>>,
    /// Redelivered by the client itself: they took no flow permit.
    pub(super) local: bool,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("epoch", &self.epoch)
            .field("messages", &self.item.as_ref().map_or(0, Vec::len))
            .finish_non_exhaustive()
    }
}
