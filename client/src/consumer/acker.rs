//! [`Acker`]: the one API that settles messages (ack, cumulative ack,
//! nack, reconsume later, terminate, extend the ack deadline). Each call
//! becomes a command for the driver task; [`Consumer`](super::Consumer)
//! offers the same methods by dereferencing to its `Acker`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ricochet_proto::reconsume_later;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::shared::{Cmd, Reply, Shared, TakenTracking};
use crate::error::{Error, Result};
use crate::message::{Message, MessageId};

/// Settles messages of one consumer; cheap to clone and `Send`, so
/// processing tasks can ack on their own.
///
/// [`terminate`](Self::terminate) and [`flush`](Self::flush) wait until the
/// broker has made what they did durable. `ack`, `ack_cumulative`, `nack`
/// and [`reconsume_later`](Self::reconsume_later) return once queued, or
/// with [ack receipts](super::ConsumerBuilder::ack_receipts) once durable;
/// `flush` confirms everything queued so far.
///
/// A message that arrived before the consumer reconnected cannot be settled
/// any more ([`ErrorKind::StaleDelivery`](crate::ErrorKind::StaleDelivery)): the broker redelivers it, and only
/// that new delivery can be settled (an ack never applies to a message
/// delivered after it was made).
///
/// A [`Consumer`](super::Consumer) dereferences to its `Acker`, so
/// `consumer.ack(&msg)` works on the consumer itself; take a clone with
/// [`Consumer::acker`](super::Consumer::acker) for other tasks.
#[derive(Debug, Clone)]
pub struct Acker {
    pub(super) tx: super::commands::CmdTx,
    pub(super) shared: Arc<Shared>,
    /// On a partitioned topic: the partitions' ackers, which every call
    /// goes to (by the topic in the message id).
    pub(super) parts: Option<Arc<super::partitioned::Ackers>>,
}

impl Acker {
    /// The acker that settles messages of `id`'s topic: this one, or on a
    /// partitioned topic the acker of the partition it came from.
    fn target(&self, id: &MessageId) -> Result<Cow<'_, Acker>> {
        match &self.parts {
            // Borrowed: a clone per call (two reference counts and the
            // channel's sender count up and down, on lines the driver's
            // thread shares) was a measurable part of acking a burst.
            None => Ok(Cow::Borrowed(self)),
            Some(parts) => parts.for_topic(id.topic()).map(Cow::Owned),
        }
    }

    fn send(&self, cmd: Cmd) -> Result<()> {
        self.queue(cmd, false)
    }

    /// Queues `cmd`; a `quiet` one wakes the driver only when it has no ack
    /// flush armed or the group's room is used up (`commands`).
    pub(super) fn queue(&self, cmd: Cmd, quiet: bool) -> Result<()> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(Error::closed());
        }
        let queued = if quiet {
            self.tx.send_quiet(cmd)
        } else {
            self.tx.send(cmd)
        };
        queued.map_err(|_| Error::closed())
    }

    /// Fails for a message of an earlier stream.
    fn current(&self, msg: &Message) -> Result<()> {
        if msg.epoch == self.shared.epoch.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::stale_delivery(msg.id.to_string()))
        }
    }

    /// Sends a settle command; with ack receipts, waits for the broker.
    async fn settle(&self, make: impl FnOnce(Option<Reply>) -> Cmd) -> Result<()> {
        self.settle_as(make, false).await
    }

    /// [`Self::settle`] for a plain ack: without receipts it is queued
    /// quietly (`commands`).
    async fn settle_ack(&self, make: impl FnOnce(Option<Reply>) -> Cmd) -> Result<()> {
        self.settle_as(make, true).await
    }

    async fn settle_as(&self, make: impl FnOnce(Option<Reply>) -> Cmd, quiet: bool) -> Result<()> {
        if self.shared.receipts {
            self.request(|reply| make(Some(reply))).await
        } else {
            self.queue(make(None), quiet)
        }
    }

    /// Acknowledges one message (grouped; see the [module docs](super)).
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        let this = self.target(&msg.id)?;
        let this = &this;
        this.current(msg)?;
        this.settle_ack(|reply| Cmd::Ack {
            id: msg.id.clone(),
            epoch: Some(msg.epoch),
            reply,
        })
        .await
    }

    /// Acknowledges by id (for ids kept apart from their message; the
    /// broker refuses it unless the message is in flight with this consumer).
    pub async fn ack_id(&self, id: &MessageId) -> Result<()> {
        let this = self.target(id)?;
        let this = &this;
        this.settle_ack(|reply| Cmd::Ack {
            id: id.clone(),
            epoch: None,
            reply,
        })
        .await
    }

    /// Sends every held ack now and waits until the broker has made every
    /// ack and queued `reconsume_later` of this consumer so far durable.
    /// Fails with [`ErrorKind::Unconfirmed`](crate::ErrorKind::Unconfirmed) naming how many were lost (with a
    /// broken stream, or refused: the broker redelivers those messages) or
    /// unconfirmed.
    pub async fn flush(&self) -> Result<()> {
        if let Some(parts) = &self.parts {
            let mut first = None;
            for a in parts.all() {
                if let Err(e) = a.request(Cmd::Flush).await {
                    first.get_or_insert(e);
                }
            }
            return first.map_or(Ok(()), Err);
        }
        self.request(Cmd::Flush).await
    }

    /// Acknowledges this message and every earlier one of the main topic.
    /// Only on Exclusive and Failover subscriptions, and only for
    /// main-topic messages (not retry-tier ones): otherwise
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), and nothing is sent.
    pub async fn ack_cumulative(&self, msg: &Message) -> Result<()> {
        let this = self.target(&msg.id)?;
        let this = &this;
        let t = this.shared.subscription_type;
        if !t.allows_cumulative_ack() {
            return Err(Error::invalid_argument(format!(
                "cumulative ack is not allowed on a {t:?} subscription"
            )));
        }
        if msg.id.topic() != this.shared.topic {
            return Err(Error::invalid_argument(format!(
                "cumulative ack applies to main-topic messages only; {} is from {}",
                msg.id,
                msg.id.topic()
            )));
        }
        this.current(msg)?;
        this.settle(|reply| Cmd::AckCumulative {
            id: msg.id.clone(),
            epoch: Some(msg.epoch),
            reply,
        })
        .await
    }

    /// Tells the consumer the application is still working on `msg`: its ack
    /// timeout starts again from now, and no attempt is counted (NATS's
    /// `InProgress`, RocketMQ's `changeInvisibleTime`). Without an ack
    /// timeout there is no deadline to extend and this does nothing.
    pub async fn extend_ack_deadline(&self, msg: &Message) -> Result<()> {
        let this = self.target(&msg.id)?;
        let this = &this;
        if this.shared.track_taken == TakenTracking::Off {
            return Ok(());
        }
        this.send(Cmd::Taken {
            id: msg.id.clone(),
            epoch: msg.epoch,
            at: Instant::now(),
        })
    }

    /// Negatively acknowledges: the message comes back after the delay the
    /// policy gives its next attempt (or the fixed nack delay), or is
    /// dead-lettered once the policy says so. Short delays are held here;
    /// delays of at least the
    /// [broker nack threshold](super::ConsumerBuilder::broker_nack_threshold)
    /// (and every nack with ack receipts) are held by the broker.
    pub async fn nack(&self, msg: &Message) -> Result<()> {
        self.nack_inner(msg, None).await
    }

    /// [`nack`](Self::nack) with a reason, recorded in the message's failure
    /// history (and its dead letter) and passed to the policy.
    pub async fn nack_with_reason(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        self.nack_inner(msg, Some(reason.into())).await
    }

    async fn nack_inner(&self, msg: &Message, detail: Option<String>) -> Result<()> {
        let this = self.target(&msg.id)?;
        let this = &this;
        this.current(msg)?;
        this.settle(|reply| Cmd::Nack {
            id: msg.id.clone(),
            epoch: msg.epoch,
            delivery_count: msg.delivery_count(),
            detail,
            reply,
            copy: this.shared.keeps_copies.then(|| Box::new(msg.clone())),
            at: Instant::now(),
        })
        .await
    }

    async fn request(&self, make: impl FnOnce(oneshot::Sender<Result<()>>) -> Cmd) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        match tokio::time::timeout(self.shared.request_timeout, rx).await {
            Ok(r) => r.unwrap_or(Err(Error::closed())),
            Err(_) => Err(Error::timeout("waiting for the broker to confirm")),
        }
    }

    /// Sends the message to the subscription's retry tier, to be delivered
    /// again after `delay` (by the broker, whether or not a consumer is
    /// connected then). Like an ack, returns once queued, or with
    /// [ack receipts](super::ConsumerBuilder::ack_receipts) once the move
    /// is durable; [`flush`](Self::flush) confirms every queued move (a
    /// move the broker refused is reported there and the message stays in
    /// flight, to be redelivered).
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<()> {
        self.reconsume(
            msg,
            reconsume_later::Delay::DelayMs(duration_ms(delay)),
            HashMap::new(),
        )
        .await
    }

    /// RocketMQ's `delayLevelWhenNextConsume`: `-1` dead-letters now, `0`
    /// lets the policy decide, `k > 0` uses delay level `k` (one of the
    /// subscription's policy's levels, which the broker checks). Any other
    /// level is [`Error::InvalidArgument`] and nothing is sent.
    pub async fn reconsume_later_level(&self, msg: &Message, level: i32) -> Result<()> {
        ricochet_policy::AttemptOverride::from_rocketmq_level(level)
            .map_err(|e| Error::invalid_argument(e.to_string()))?;
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
        let at = tokio::time::Instant::now();
        let this = self.target(&msg.id)?;
        this.current(msg)?;
        this.settle(|reply| Cmd::ReconsumeLater {
            id: msg.id.clone(),
            epoch: msg.epoch,
            delay,
            properties,
            detail: String::new(),
            reply,
            at,
        })
        .await
    }

    /// Gives up on the message: straight to the dead-letter tier with
    /// `reason`. Returns once the move is durable.
    pub async fn terminate(&self, msg: &Message, reason: impl Into<String>) -> Result<()> {
        let this = self.target(&msg.id)?;
        let this = &this;
        let detail = reason.into();
        this.request(|reply| Cmd::Terminate {
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
