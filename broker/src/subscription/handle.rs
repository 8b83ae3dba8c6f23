//! [`SubscriptionHandle`]: the typed, async API the rest of the broker uses
//! to talk to a subscription actor. Every call becomes one private
//! [`Command`] on the actor's channel; those that need an answer carry a
//! reply channel. The actor stops once every handle is gone.

use super::breaker::BreakerStats;
use super::requests::{
    ConsumerId, ConsumerRequest, ConsumerSpec, MessageRef, MessageStatus, PolicyInfo,
};
use super::stats::{StatsSnapshot, SubscriptionStats};
use crate::backpressure::Admitted;
use crate::error::{BrokerError, Result};
use crate::storage::{DeadLetterRecord, Storage, TierEntry};
use ricochet_policy::{BreakerMode, BreakerSpec, PolicySpec};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Requests handled by the subscription actor.
#[derive(Debug)]
pub(super) enum Command {
    /// A consumer joins; replies with its id and the policy in force.
    AddConsumer(
        ConsumerSpec,
        oneshot::Sender<Result<(ConsumerId, PolicyInfo)>>,
    ),
    /// A consumer's stream ended.
    RemoveConsumer(ConsumerId),
    /// A consumer's request, with when it was queued for the actor (a
    /// nack's hold and a `reconsume_later`'s delay run from then, not from
    /// when the actor gets to it behind a burst) and the units of its
    /// stream's budget it holds (given back once the actor has handled it).
    Request(
        ConsumerId,
        ConsumerRequest,
        tokio::time::Instant,
        Option<Admitted>,
    ),
    /// Messages whose new delivery counts are durable: dispatch them.
    Ready(Vec<TierEntry>),
    /// Nacks counted ahead (entry, [`Counted::seq`](super::delivery::Counted::seq))
    /// whose records are durable now.
    CountedDurable(Vec<(TierEntry, u64)>),
    /// Stats, without the schedule part (see [`SubscriptionHandle::stats`]).
    Stats(oneshot::Sender<StatsSnapshot>),
    /// The policy in force.
    GetPolicy(oneshot::Sender<PolicyInfo>),
    /// Replace (or clear) the operator-set policy.
    SetPolicy(
        Option<PolicySpec>,
        Option<ricochet_policy::KeyOrder>,
        Option<BreakerSpec>,
        oneshot::Sender<Result<PolicyInfo>>,
    ),
    /// An operator forces the outage breaker open or closed, or hands it
    /// back to its rules.
    SetBreaker(BreakerMode, oneshot::Sender<Result<BreakerStats>>),
    /// State of one main-topic entry.
    MessageStatus(u64, oneshot::Sender<MessageStatus>),
    /// Replay dead letters (by DLQ entry id) as the order says: into the
    /// retry tier or onto the topic, edited or not, keeping or resetting
    /// their delivery counts.
    Replay(
        Vec<(u64, DeadLetterRecord)>,
        crate::storage::ReplayOrder,
        oneshot::Sender<Result<Vec<MessageRef>>>,
    ),
    /// Dead letters were purged by an operator (for the DLQ size gauge).
    DeadLettersPurged(u64),
    /// Stop the actor and delete the subscription's state (`true`: even
    /// with consumers, dead letters or scheduled retries); replies with its
    /// tier topics, for the caller to drop.
    Delete(bool, oneshot::Sender<Result<Vec<String>>>),
}

/// Handle to a running subscription; cheap to clone.
#[derive(Debug, Clone)]
pub struct SubscriptionHandle {
    id: u64,
    name: String,
    tx: mpsc::UnboundedSender<Command>,
}

impl SubscriptionHandle {
    pub(super) fn new(id: u64, name: String, tx: mpsc::UnboundedSender<Command>) -> Self {
        Self { id, name, tx }
    }

    /// Broker-unique id (the key of its records in storage).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Subscription name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn send(&self, cmd: Command) -> Result<()> {
        self.tx.send(cmd).map_err(|_| BrokerError::ShuttingDown)
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await.map_err(|_| BrokerError::ShuttingDown)
    }

    /// Adds a consumer; the actor sends it `Subscribed` first.
    pub async fn add_consumer(&self, spec: ConsumerSpec) -> Result<(ConsumerId, PolicyInfo)> {
        self.ask(|r| Command::AddConsumer(spec, r)).await?
    }

    /// Queues a consumer's request (answered on its stream, if at all).
    pub fn request(&self, consumer: ConsumerId, request: ConsumerRequest) -> Result<()> {
        self.send(Command::Request(
            consumer,
            request,
            tokio::time::Instant::now(),
            None,
        ))
    }

    /// [`Self::request`], for a request whose frame reached the broker at
    /// `received`: a nack's hold and a `reconsume_later`'s delay run from
    /// then, not from when the actor gets to it. `admitted` (its stream's
    /// budget) is dropped once the actor has handled the request.
    pub(crate) fn request_at(
        &self,
        consumer: ConsumerId,
        request: ConsumerRequest,
        received: tokio::time::Instant,
        admitted: Admitted,
    ) -> Result<()> {
        self.send(Command::Request(
            consumer,
            request,
            received,
            Some(admitted),
        ))
    }

    /// The consumer's stream ended: what it held is redelivered, an attempt
    /// charged (unless it closed cleanly first).
    pub fn remove_consumer(&self, consumer: ConsumerId) -> Result<()> {
        self.send(Command::RemoveConsumer(consumer))
    }

    /// The subscription's stats. The scheduled part scans the schedule index
    /// on a blocking thread, so a stats call never stalls dispatch.
    pub async fn stats(&self, storage: Arc<dyn Storage>) -> Result<SubscriptionStats> {
        let snapshot = self.ask(Command::Stats).await?;
        snapshot.complete(storage, self.id).await
    }

    /// The policy in force.
    pub async fn policy(&self) -> Result<PolicyInfo> {
        self.ask(Command::GetPolicy).await
    }

    /// Sets (or with `None` clears) the operator's policy, with key order
    /// (`None`: off; see [`ricochet_policy::KeyOrder`]) and the outage
    /// breaker (`None`: no breaker of the operator's).
    pub async fn set_policy(
        &self,
        spec: Option<PolicySpec>,
        key_order: Option<ricochet_policy::KeyOrder>,
        breaker: Option<BreakerSpec>,
    ) -> Result<PolicyInfo> {
        self.ask(|r| Command::SetPolicy(spec, key_order, breaker, r))
            .await?
    }

    /// Forces the outage breaker open or closed, or back to auto; stored
    /// (not yet flushed) when it answers. FAILED_PRECONDITION without a
    /// breaker.
    pub async fn set_breaker(&self, mode: BreakerMode) -> Result<BreakerStats> {
        self.ask(|r| Command::SetBreaker(mode, r)).await?
    }

    /// Where main-topic entry `entry_id` stands in this subscription.
    pub async fn message_status(&self, entry_id: u64) -> Result<MessageStatus> {
        self.ask(|r| Command::MessageStatus(entry_id, r)).await
    }

    /// Replays dead letters as `order` says; returns their new ids.
    pub async fn replay(
        &self,
        letters: Vec<(u64, DeadLetterRecord)>,
        order: crate::storage::ReplayOrder,
    ) -> Result<Vec<MessageRef>> {
        self.ask(|r| Command::Replay(letters, order, r)).await?
    }

    /// Tells the actor that `n` dead letters were purged.
    pub fn dead_letters_purged(&self, n: u64) -> Result<()> {
        self.send(Command::DeadLettersPurged(n))
    }

    /// Deletes the subscription's state and stops it; returns its retry and
    /// dead-letter tier topics (the caller drops them). Without `force` a
    /// subscription with consumers, dead letters or scheduled retries is
    /// refused; with it, consumers are disconnected and the rest dropped.
    pub async fn delete(&self, force: bool) -> Result<Vec<String>> {
        self.ask(|r| Command::Delete(force, r)).await?
    }
}
