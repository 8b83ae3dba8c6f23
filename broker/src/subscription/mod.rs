//! A subscription at run time: one task (an actor) that owns its cursors,
//! consumers, in-flight messages, failure records and tier moves.
//!
//! Everything that changes a subscription arrives as a command on one
//! channel (see [`SubscriptionHandle`]), so no state is shared and no lock is
//! held across an await. The actor reads the topic log from its cursor into
//! a small read-ahead buffer, dispatches by subscription type within each
//! consumer's flow permits and unacked cap, and handles acks and failures:
//!
//! * a failure (nack, ack timeout, consumer lost, `reconsume_later`,
//!   terminate) bumps the message's persisted delivery count and asks the
//!   subscription's policy what to do ([`failure`]);
//! * redelivering in place happens at once (for nacks and ack timeouts the
//!   client already served the delay), once the new count is durable;
//! * a retry or a dead-letter moves the message, in one storage
//!   transaction, into the subscription's retry tier (with a due time in the
//!   schedule index) or its dead-letter tier (with its failure history).
//!
//! Order: on Exclusive and Failover subscriptions a failed message is
//! redelivered on its own, after messages already dispatched; the rest of the
//! stream is not rewound. Key_Shared never hands a key to a second consumer
//! while the first still holds unacked messages of that key. With key order
//! ([`key_order`]) each key's messages stay in order through failures.
//!
//! Map: [`handle`] (the API), [`requests`] (the consumer boundary),
//! [`consumers`], [`dispatch`], [`delivery`], [`acks`], [`intake`] (failure
//! requests), [`failure`] (the planner), [`tiers`] (moves), [`read_ahead`],
//! [`prefetch`] (a burst read before it is due), [`stage`] (and built for its
//! consumer before its instant), [`replay`], [`policy`],
//! [`stats`], [`key_order`], [`breaker`] (the outage breaker).

mod acks;
mod breaker;
mod consumers;
mod delivery;
mod dispatch;
mod failure;
mod handle;
mod holds;
mod intake;
mod key_order;
mod policy;
mod prefetch;
mod read_ahead;
mod replay;
mod requests;
mod retention;
mod stage;
mod stats;
mod tiers;

pub use breaker::BreakerStats;
pub use handle::SubscriptionHandle;
pub(crate) use holds::holds_ahead;
use holds::holds_ahead_ms;
#[cfg(test)]
pub(crate) use prefetch::{PREFETCH_STEP, STALE_AFTER_MS};
pub use requests::{
    ConsumerEvent, ConsumerId, ConsumerRequest, ConsumerSpec, ConsumerTx, FailedItem, MessageRef,
    MessageState, MessageStatus, Outcome, PolicyInfo,
};
#[cfg(test)]
pub(crate) use stage::STAGE_MAX;
pub use stats::{ConsumerStats, DueBucket, SubscriptionStats};
pub use tiers::BrokerLink;

/// How many of the longest-blocked keys a subscription's stats list.
pub const TOP_BLOCKED_KEYS: usize = key_order::TOP_BLOCKED;

use crate::clock::SharedClock;
use crate::error::Result;
use crate::flusher::Flusher;
use crate::metrics::SubscriptionMetrics;
use crate::scheduler::Scheduler;
use crate::storage::{ScheduleKey, Storage, SubscriptionRecord, TierEntry, TierId};
use crate::topic::Topic;
use consumers::Consumers;
use delivery::Deliveries;
use dispatch::{Dispatcher, Offer};
use handle::Command;
use policy::PolicyState;
use ricochet_proto::Message;
use stats::Counters;
use std::collections::HashMap;
use std::sync::Arc;
use tiers::Tiers;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A map keyed by entry. Keys are ids this broker assigned (a consumer's
/// id is located before it is looked up), so the fast non-keyed hash is
/// safe here; SipHash was a visible share of a 1 000-nack burst.
type EntryMap<V> =
    std::collections::HashMap<crate::storage::TierEntry, V, rustc_hash::FxBuildHasher>;

/// Commands handled before the actor dispatches again, so a burst of acks or
/// nacks does not hold back deliveries.
pub(crate) const COMMANDS_PER_ROUND: usize = 64;
/// Consecutive `reconsume_later`s counted as one command of a round: a
/// burst of them is moved in transactions of up to
/// `COMMANDS_PER_ROUND * RECONSUMES_PER_COMMAND` (group commit).
pub(crate) const RECONSUMES_PER_COMMAND: usize = 16;
/// Most failed messages of consecutive redeliver requests (nack frames)
/// taken in together: one planning pass and one storage write for all of
/// them (group commit), so a burst of frames writes each schedule chunk
/// about once rather than once per frame. The bound of a burst of
/// `reconsume_later`s' move (a move to a tier may carry payload copies);
/// a single larger frame is still taken whole, as before.
pub(crate) const REDELIVERS_PER_WRITE: usize = COMMANDS_PER_ROUND * RECONSUMES_PER_COMMAND;
/// Turns in a row the actor may take fired schedule entries ahead of its
/// command queue (and of a round's acks not yet written): what fired is
/// dispatched before an ack round's write, yet a steady stream of fires
/// cannot hold commands and acks back for more than this many turns.
pub(crate) const FIRED_TURNS_AHEAD: u32 = 4;

/// What every subscription actor shares with the rest of the broker.
#[derive(Debug, Clone)]
pub struct SubscriptionDeps {
    /// Storage.
    pub storage: Arc<dyn Storage>,
    /// Group commit.
    pub flusher: Flusher,
    /// The retry scheduler.
    pub scheduler: Scheduler,
    /// Tier topics and policy building.
    pub link: Arc<dyn BrokerLink>,
    /// Wall-clock time.
    pub clock: SharedClock,
    /// Dispatch pauses at this many unacked messages per consumer.
    pub max_unacked_per_consumer: usize,
    /// The longest delay scheduled (see [`BrokerConfig::max_delay`](crate::BrokerConfig::max_delay)).
    pub max_delay: std::time::Duration,
    /// Cancelled when the broker shuts down: consumers leaving then are not
    /// charged an attempt (the broker, not the message, ended the delivery).
    pub shutdown: CancellationToken,
    /// Where retries and dead letters are counted for the log summary.
    pub failure_log: Arc<crate::failure_log::FailureLog>,
    /// Held while the actor runs (a clean stop waits for every actor).
    pub running: Arc<()>,
}

/// The name of a subscription's retry tier topic.
pub(crate) fn retry_tier_name(rec: &SubscriptionRecord) -> Result<String> {
    Tiers::retry_name_of(rec)
}

/// The running state of one subscription.
pub(crate) struct SubscriptionActor {
    rec: SubscriptionRecord,
    topic: Arc<Topic>,
    tiers: Tiers,
    deps: SubscriptionDeps,
    policy: PolicyState,
    breaker: breaker::BreakerState,
    consumers: Consumers,
    dispatcher: Dispatcher,
    deliveries: Deliveries,
    /// Key order's held messages and keys in flight.
    key_lanes: key_order::KeyLanes,
    /// The next main-topic entry the read-ahead reads.
    read_pos: u64,
    counters: Counters,
    metrics: SubscriptionMetrics,
    /// Retries and dead letters for the periodic log summary.
    failures: Arc<crate::failure_log::FailureTally>,
    /// The record changed since it was last written.
    dirty: bool,
    /// Acks of the current round, written at its end.
    acked_in_round: acks::AckedInRound,
    /// The most commands seen in its queue at once (at a round's start).
    queue_peak: usize,
    /// For messages the actor sends itself once a write is durable; weak, so
    /// the actor stops once every handle is gone.
    self_tx: mpsc::WeakUnboundedSender<Command>,
    /// Where the scheduler sends this actor's fired entries (to unregister
    /// this actor only, not a newer one of the same subscription).
    fire_tx: crate::scheduler::FireSender,
}

impl std::fmt::Debug for SubscriptionActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionActor")
            .field("topic", &self.rec.topic)
            .field("name", &self.rec.name)
            .finish_non_exhaustive()
    }
}

impl SubscriptionActor {
    /// Spawns the actor for a loaded or newly created subscription.
    pub(crate) fn spawn(
        rec: SubscriptionRecord,
        topic: Arc<Topic>,
        deps: SubscriptionDeps,
    ) -> Result<SubscriptionHandle> {
        let storage = deps.storage.clone();
        let tiers = Tiers::for_subscription(&rec)?;
        let counters = Counters {
            retry_queue: tiers.queued_retries(storage.as_ref(), &rec)?,
            dlq_size: storage.count_dead_letters(rec.id)?,
            ..Counters::default()
        };
        // Main-tier failure records of messages not held by a broker-served
        // nack are few (failed, waiting for a redelivery): keep them. Held
        // ones (there can be millions: only their counts and holds are
        // read here) and retry-tier ones are read when their schedule fires.
        let mut deliveries = Deliveries::default();
        let now_ms = deps.clock.now_ms();
        // Holds ending within the window are kept with their counts and
        // times; later ones only as members of the far set (loaded as they
        // come into the window, see `advance_holds`). Storage hands those
        // over as ids only, split where it read them (at most where asked:
        // the window then loads from its cut).
        let horizon = now_ms.saturating_add(holds_ahead_ms(&deps));
        let heads = storage.main_failure_heads_by(rec.id, horizon)?;
        deliveries.held.set_horizon(horizon.min(heads.cut_ms));
        deliveries.held.add_far(heads.far);
        let heads = heads.near;
        // Sized once for all of them: no table regrown (and its memory
        // fresh again) on the way to millions.
        let near = heads
            .iter()
            .filter(|(_, h)| h.hold_until_ms > now_ms && h.hold_until_ms <= horizon)
            .count();
        deliveries.held.reserve(near);
        for (entry_id, head) in heads {
            let m = TierEntry::main(entry_id).of(rec.id);
            if head.hold_until_ms > now_ms {
                deliveries.held.insert(
                    m.entry(),
                    delivery::Held {
                        count: head.count,
                        until_ms: head.hold_until_ms,
                    },
                );
            } else if let Some(f) =
                // A hold that ended keeps its record in its schedule entry.
                storage.failure(m, Some(head.hold_until_ms).filter(|h| *h > 0))?
            {
                deliveries.failures.insert(m.entry(), f);
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (fire_tx, fire_rx) = mpsc::unbounded_channel();
        deps.scheduler.register(rec.id, fire_tx.clone());
        let mut actor = SubscriptionActor {
            read_pos: rec.main.mark_delete,
            metrics: SubscriptionMetrics::new(&rec.topic, &rec.name),
            failures: deps.failure_log.register(&rec.topic, &rec.name),
            policy: PolicyState::default(),
            breaker: Default::default(),
            consumers: Consumers::for_topic(&rec.topic),
            dispatcher: Dispatcher::default(),
            deliveries,
            key_lanes: key_order::KeyLanes::default(),
            counters,
            tiers,
            deps,
            dirty: false,
            acked_in_round: Default::default(),
            queue_peak: 0,
            self_tx: tx.downgrade(),
            fire_tx,
            topic,
            rec,
        };
        actor.resolve_policy()?;
        actor.resolve_breaker();
        let handle = SubscriptionHandle::new(actor.rec.id, actor.rec.name.clone(), tx);
        tokio::spawn(actor.run(rx, fire_rx));
        Ok(handle)
    }

    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Command>,
        mut fired: mpsc::UnboundedReceiver<crate::scheduler::Fired>,
    ) {
        let mut end = self.topic.watch_end();
        self.resume_topic_replays().await;
        // Turns taken by fired entries ahead of the queue since a round ran.
        let mut fired_turns = 0;
        loop {
            // What fired goes first (its entries are due now), ahead of
            // queued commands and of a round's acks left unwritten for it,
            // for a bounded number of turns.
            if fired_turns < FIRED_TURNS_AHEAD
                && let Ok(first) = fired.try_recv()
            {
                fired_turns += 1;
                self.take_fired(Some(first), &mut fired);
                self.after_turn().await;
                continue;
            }
            // Acks deferred for fired entries: written before anything else
            // (their receipts still only after the write).
            self.write_acked();
            // The bound reached: a queued command goes next, whatever fired.
            if std::mem::take(&mut fired_turns) >= FIRED_TURNS_AHEAD
                && let Ok(cmd) = rx.try_recv()
            {
                if self.round(cmd, &mut rx, &fired).await {
                    return;
                }
                self.after_turn().await;
                continue;
            }
            let poison_at = self.key_order_wake();
            let holds_at = self.holds_wake_ms();
            let stale_at = self.read_ahead_stale_at();
            let stage_at = self.stage_wake_ms();
            tokio::select! {
                cmd = rx.recv() => {
                    // `None`: every handle is gone.
                    let Some(cmd) = cmd else { break };
                    if self.round(cmd, &mut rx, &fired).await {
                        return;
                    }
                }
                keys = fired.recv() => {
                    fired_turns += 1;
                    self.take_fired(keys, &mut fired);
                }
                changed = end.changed() => {
                    if changed.is_err() { break; }
                }
                // The breaker's next probe is due: `dispatch` sends it.
                () = breaker::wake_after(self.breaker_wakeup()) => {}
                _ = self.deps.shutdown.cancelled() => {
                    // Consumers are gone with their streams; persist and stop.
                    self.persist();
                    break;
                }
                () = key_order::sleep_until_ms(&self.deps.clock, poison_at) => {}
                () = key_order::sleep_until_ms(&self.deps.clock, holds_at) => self.advance_holds(),
                () = key_order::sleep_until_ms(&self.deps.clock, stale_at) => self.sweep_prefetched(),
                () = key_order::sleep_until_ms(&self.deps.clock, stage_at) => self.stage_due(),
            }
            self.after_turn().await;
        }
        self.deps.scheduler.unregister(self.rec.id, &self.fire_tx);
    }

    /// What follows each turn of the actor: dispatch, read-ahead,
    /// persistence.
    async fn after_turn(&mut self) {
        if self.staged_sent() {
            // Staged messages went out: the stream writes them first.
            tokio::task::yield_now().await;
            self.finish_staged_send();
        }
        self.key_order_tick().await;
        let sent = self.dispatch();
        self.prefetch_step();
        self.watch_blocked();
        self.persist();
        self.deliveries.shrink();
        if sent {
            // The consumer's stream task, woken by the send, waits in
            // this worker's LIFO slot (which no other worker steals)
            // until this task yields: let it write the frame now.
            tokio::task::yield_now().await;
        }
    }

    /// Handles `first` and whatever else is queued, up to a bound; true when
    /// the subscription was deleted. Consecutive `reconsume_later`s are
    /// gathered and moved in one transaction, and consecutive redeliver
    /// requests (nack frames; see [`Self::gathers`]) redelivered by one
    /// write, up to [`REDELIVERS_PER_WRITE`] messages; any other command
    /// first applies what was gathered, so commands still take effect in
    /// arrival order. The round's acks are written at its end, unless
    /// entries fired meanwhile: then `run` dispatches those first and writes
    /// the acks before its next wait or command.
    async fn round(
        &mut self,
        first: Command,
        rx: &mut mpsc::UnboundedReceiver<Command>,
        fired: &mpsc::UnboundedReceiver<crate::scheduler::Fired>,
    ) -> bool {
        // Commands waiting behind this one (for the stats' peak).
        self.queue_peak = self.queue_peak.max(rx.len() + 1);
        let mut next = Some(first);
        let mut reconsumes = Vec::new();
        let mut redelivers = intake::Redelivers::default();
        // The round's requests' stream budgets, given back once it has
        // handled them (gathered ones are applied at its end).
        let mut admitted = Vec::new();
        let mut handled = 0;
        while let Some(mut cmd) = next.take() {
            if let Command::Request(.., units @ Some(_)) = &mut cmd {
                admitted.extend(units.take());
            }
            match cmd {
                Command::Request(
                    consumer,
                    requests::ConsumerRequest::Redeliver { request_id, items },
                    queued,
                    _,
                ) if self.gathers(&items) => {
                    self.reconsume_later(std::mem::take(&mut reconsumes)).await;
                    if redelivers.is_empty() {
                        // As before any other request: the round's acks first.
                        self.write_acked();
                    } else if redelivers.items() + items.len() > REDELIVERS_PER_WRITE {
                        self.redeliver_frames(std::mem::take(&mut redelivers)).await;
                    }
                    redelivers.push(consumer, request_id, items, queued);
                }
                Command::Request(
                    consumer,
                    req @ requests::ConsumerRequest::ReconsumeLater { .. },
                    queued,
                    _,
                ) => {
                    self.redeliver_frames(std::mem::take(&mut redelivers)).await;
                    reconsumes.push((consumer, req, queued));
                    // Group commit: a burst of them counts as one command
                    // per `RECONSUMES_PER_COMMAND`, so up to
                    // `COMMANDS_PER_ROUND` times that go in one move.
                    if !reconsumes.len().is_multiple_of(RECONSUMES_PER_COMMAND) {
                        next = rx.try_recv().ok();
                        if next.is_some() {
                            continue;
                        }
                        break;
                    }
                }
                Command::Delete(force, reply) => {
                    self.redeliver_frames(std::mem::take(&mut redelivers)).await;
                    self.reconsume_later(std::mem::take(&mut reconsumes)).await;
                    self.write_acked();
                    let r = self.delete(force);
                    let deleted = r.is_ok();
                    let _ = reply.send(r);
                    if deleted {
                        return true;
                    }
                }
                other => {
                    self.redeliver_frames(std::mem::take(&mut redelivers)).await;
                    self.reconsume_later(std::mem::take(&mut reconsumes)).await;
                    // Acks are answered before anything else is handled
                    // (a close, another request): only acks and permits
                    // gather behind them.
                    if !matches!(
                        other,
                        Command::Request(
                            _,
                            requests::ConsumerRequest::Ack { .. }
                                | requests::ConsumerRequest::Flow(_),
                            ..
                        )
                    ) {
                        self.write_acked();
                    }
                    self.handle(other).await;
                }
            }
            handled += 1;
            // The bound lets dispatch and persistence run between rounds; a
            // command is only taken off the queue when it will be handled.
            if handled < COMMANDS_PER_ROUND {
                next = rx.try_recv().ok();
            }
        }
        self.redeliver_frames(redelivers).await;
        self.reconsume_later(reconsumes).await;
        if fired.is_empty() {
            self.write_acked();
        }
        drop(admitted);
        false
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::AddConsumer(spec, reply) => {
                let _ = reply.send(self.add_consumer(spec));
            }
            Command::RemoveConsumer(id) => self.consumer_lost(id).await,
            Command::Request(consumer, req, queued, _) => self.request(consumer, req, queued).await,
            Command::Ready(entries) => {
                let entries = entries
                    .into_iter()
                    .filter(|e| {
                        !self.rec.is_acked(*e) && !self.deliveries.in_flight.contains_key(e)
                    })
                    .map(|e| (e, None))
                    .collect();
                self.load_into_ready(entries);
            }
            Command::CountedDurable(entries) => self.counted_durable(entries),
            Command::Stats(reply) => {
                let _ = reply.send(self.stats_snapshot());
            }
            Command::GetPolicy(reply) => {
                let _ = reply.send(self.policy_info());
            }
            Command::SetPolicy(spec, key_order, breaker, reply) => {
                // Stored before the answer, so the flush the admin service
                // waits for covers it (not left to this round's `persist`).
                // All are checked before any changes.
                let checked = match &breaker {
                    Some(b) => b.validate().map_err(Into::into),
                    None => Ok(()),
                };
                let r = checked
                    .and_then(|()| self.check_key_order(key_order.as_ref()))
                    .and_then(|()| self.set_policy(spec, crate::storage::PolicySource::Admin))
                    .and_then(|_| {
                        self.set_key_order(key_order);
                        self.set_breaker_spec(breaker)?;
                        self.deps.storage.put_subscription(&self.rec)?;
                        self.dirty = false;
                        Ok(self.policy_info())
                    });
                let _ = reply.send(r);
            }
            Command::SetBreaker(mode, reply) => {
                let _ = reply.send(self.breaker_force(mode));
            }
            Command::MessageStatus(entry_id, reply) => {
                let _ = reply.send(self.message_status(entry_id));
            }
            Command::Replay(letters, order, reply) => {
                let _ = reply.send(self.replay(letters, order).await);
            }
            Command::DeadLettersPurged(n) => {
                self.counters.dlq_size = self.counters.dlq_size.saturating_sub(n);
                self.dirty = true;
            }
            // Handled by `round`.
            Command::Delete(..) => {}
        }
    }

    async fn request(
        &mut self,
        consumer: ConsumerId,
        req: ConsumerRequest,
        queued: tokio::time::Instant,
    ) {
        match req {
            ConsumerRequest::Flow(permits) => {
                if let Some(c) = self.consumers.get_mut(consumer) {
                    c.permits = c.permits.saturating_add(permits);
                }
            }
            ConsumerRequest::Ack {
                request_id,
                ids,
                cumulative,
            } => self.ack(consumer, request_id, &ids, cumulative),
            ConsumerRequest::Redeliver { request_id, items } => {
                self.redeliver(consumer, request_id, items, queued).await
            }
            req @ ConsumerRequest::ReconsumeLater { .. } => {
                self.reconsume_later(vec![(consumer, req, queued)]).await
            }
            ConsumerRequest::Terminate {
                request_id,
                id,
                detail,
            } => self.terminate(consumer, request_id, &id, detail).await,
            ConsumerRequest::Close => {
                self.counted_come_due(consumer).await;
                self.close_consumer(consumer);
            }
            ConsumerRequest::CheckAcks { request_id, ids } => {
                let acked = ids
                    .into_iter()
                    .filter(|id| self.locate(id).is_ok_and(|e| self.rec.is_acked(e)))
                    .collect();
                self.consumers.send(
                    consumer,
                    ConsumerEvent::Acked {
                        request_id,
                        ids: acked,
                    },
                );
            }
        }
    }

    fn on_fired(&mut self, keys: Vec<ScheduleKey>) {
        tracing::trace!(target: "ricochet::burst", n = keys.len(), "actor: due entries in");
        self.advance_holds();
        let now_us = self.deps.clock.now_us();
        self.deliveries
            .prefetched
            .drop_stale((now_us / 1000).saturating_sub(prefetch::STALE_AFTER_MS));
        for k in keys {
            if k.message.tier == TierId::Retry {
                self.metrics.retries_fired.increment(1);
            }
            if !self.load_far_hold(k) {
                continue;
            }
            let late = now_us.saturating_sub(k.due_ms.saturating_mul(1000)) as f64 / 1e6;
            self.metrics.retry_lateness.record(late);
            self.deliveries.due.insert(k.message.entry(), k.due_ms);
        }
    }

    fn add_consumer(&mut self, spec: ConsumerSpec) -> Result<(ConsumerId, PolicyInfo)> {
        self.consumers
            .admit(&self.rec.name, self.rec.sub_type, spec.sub_type)?;
        key_order::check_type(
            spec.sub_type,
            spec.key_order.as_ref().or(self.rec.key_order.as_ref()),
            &self.rec.name,
        )?;
        if let Some(k) = spec.key_order
            && self.rec.policy_source != Some(crate::storage::PolicySource::Admin)
        {
            self.check_key_order(Some(&k))?;
            self.set_key_order(Some(k));
        }
        // A consumer's policy applies unless an operator set one.
        if let Some(p) = spec.policy
            && self.rec.policy_source != Some(crate::storage::PolicySource::Admin)
            && self.rec.policy.as_ref() != Some(&p)
        {
            self.set_policy(Some(p), crate::storage::PolicySource::Client)?;
        }
        if self.rec.sub_type != spec.sub_type {
            self.rec.sub_type = spec.sub_type;
            self.dirty = true;
        }
        let info = self.policy_info();
        // The first event a consumer sees, before any message or active change.
        let _ = spec.tx.send(ConsumerEvent::Subscribed {
            topic: self.rec.topic.clone(),
            subscription: self.rec.name.clone(),
            consumer_name: spec.name.clone(),
            policy: Box::new(info.clone()),
        });
        let id = self.consumers.add(spec.name, spec.tx, spec.retry_enabled);
        self.consumers.elect(self.rec.sub_type, Some(id));
        Ok((id, info))
    }

    /// The topic and entry id a consumer knows `entry` by.
    fn wire_ref(&self, entry: TierEntry) -> MessageRef {
        MessageRef {
            topic: self.tiers.topic_of(&self.rec, entry.tier).to_owned(),
            entry_id: entry.entry_id,
        }
    }

    /// `topic:entry` of a message, as carried in `ORIGIN_MESSAGE_ID`.
    fn wire_id(&self, entry: TierEntry) -> String {
        format!(
            "{}:{}",
            self.tiers.topic_of(&self.rec, entry.tier),
            entry.entry_id
        )
    }

    /// Hands what is ready to consumers with room; true when it sent any.
    fn dispatch(&mut self) -> bool {
        if self.consumers.is_empty() {
            return false;
        }
        let max_unacked = self.deps.max_unacked_per_consumer;
        let mut sent = false;
        loop {
            self.load_due();
            self.fill();
            // An open breaker sends nothing, or one probe.
            let budget = self.breaker_budget();
            if self.deliveries.ready.is_empty()
                || budget == Some(0)
                || !self.consumers.iter().any(|c| c.can_take(max_unacked))
            {
                return sent;
            }
            let (skip, held) = self.key_order_skip();
            let active = self.consumers.active();
            let offers = self
                .deliveries
                .ready
                .iter()
                .filter(|(e, _)| skip.as_ref().is_none_or(|s| !s.contains(*e)))
                .take(budget.unwrap_or(usize::MAX))
                .map(|(entry, p)| Offer {
                    entry: *entry,
                    key: &p.msg.key,
                });
            let assigned = self.dispatcher.assign(
                self.rec.sub_type,
                self.consumers.as_mut_slice(),
                active,
                max_unacked,
                offers,
            );
            if assigned.is_empty() {
                if held {
                    // Held messages left the read-ahead: read on.
                    continue;
                }
                return sent;
            }
            if budget.is_some() {
                self.breaker_probe_sent(assigned[0].entry);
            }
            // Each consumer's share sized up front: a burst's thousands of
            // messages (some 200 B each) are not moved again as a vector
            // doubles.
            let mut shares: HashMap<ConsumerId, usize> = HashMap::new();
            for a in &assigned {
                *shares.entry(a.consumer).or_default() += 1;
            }
            let mut out: HashMap<ConsumerId, Vec<Message>> = shares
                .into_iter()
                .map(|(c, n)| (c, Vec::with_capacity(n)))
                .collect();
            let (mut dispatched, mut bytes) = (0u64, 0u64);
            for a in assigned {
                let Some(p) = self.deliveries.ready.remove(&a.entry) else {
                    continue;
                };
                self.deliveries.in_flight.insert(
                    a.entry,
                    delivery::InFlight {
                        consumer: a.consumer,
                        bucket: a.bucket,
                        due_ms: p.due_ms,
                    },
                );
                if self.rec.key_order.is_some() {
                    self.key_lanes.dispatched(a.entry, &p.msg.key);
                }
                let mut msg = *p.msg;
                let id = self.wire_ref(a.entry);
                msg.id = Some(ricochet_proto::MessageId {
                    topic: id.topic,
                    entry_id: id.entry_id,
                });
                msg.delivery_count = self.deliveries.delivery_count(a.entry);
                dispatched += 1;
                bytes += msg.payload.len() as u64;
                self.metrics
                    .delivery_count
                    .record(f64::from(msg.delivery_count));
                out.entry(a.consumer).or_default().push(msg);
            }
            self.metrics.dispatched.increment(dispatched);
            self.metrics.dispatched_bytes.increment(bytes);
            for (consumer, msgs) in out {
                tracing::trace!(target: "ricochet::burst", n = msgs.len(), "actor: messages handed to a consumer's stream");
                self.consumers.send(consumer, ConsumerEvent::Messages(msgs));
                sent = true;
            }
        }
    }

    fn persist(&mut self) {
        self.update_gauges();
        if !self.dirty {
            return;
        }
        self.dirty = false;
        // Made durable by `flusher.durable()`, which every confirmation
        // that depends on it awaits.
        if let Err(e) = self.deps.storage.put_subscription_queued(&self.rec) {
            tracing::error!(error = %e, sub = %self.rec.name, "cannot persist subscription");
            return;
        }
        if let Err(e) = self
            .topic
            .update_mark(self.rec.id, self.rec.main.mark_delete)
        {
            tracing::warn!(error = %e, "retention trim failed");
        }
        if let Some(t) = &self.tiers.retry
            && let Err(e) = t.update_mark(self.rec.id, self.rec.retry.mark_delete)
        {
            tracing::warn!(error = %e, "retry tier trim failed");
        }
    }

    fn message_status(&self, entry_id: u64) -> MessageStatus {
        let entry = TierEntry::main(entry_id);
        MessageStatus {
            state: self.deliveries.state_of(
                entry_id,
                self.rec.main.is_acked(entry_id),
                self.read_pos,
                self.deps.clock.now_ms(),
            ),
            failures: match self.deliveries.failures.get(&entry) {
                // A nack counted ahead: the record stored then.
                _ if self.deliveries.counted.contains_key(&entry) => {
                    self.deliveries.counted.get(&entry).map(|c| c.after.clone())
                }
                Some(r) => Some(r.clone()),
                // A held nack's record is in storage only.
                None if self.deliveries.held.contains_key(&entry) => self
                    .deps
                    .storage
                    .failure(
                        entry.of(self.rec.id),
                        self.deliveries
                            .held
                            .get(&entry)
                            .map(|h| h.until_ms)
                            .or_else(|| self.far_hold_until(entry)),
                    )
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "cannot read a failure record");
                        None
                    }),
                None => None,
            },
        }
    }

    /// Deletes the subscription's state; returns its tier topics.
    fn delete(&mut self, force: bool) -> Result<Vec<String>> {
        let held = [
            (self.consumers.len() as u64, "connected consumer(s)"),
            (self.counters.dlq_size, "dead letter(s)"),
            (self.counters.retry_queue, "scheduled retr(ies)"),
        ];
        if !force && let Some((n, what)) = held.iter().find(|(n, _)| *n > 0) {
            return Err(crate::error::BrokerError::Conflict(format!(
                "subscription {} has {n} {what}; use force to delete it with everything it holds",
                self.rec.name
            )));
        }
        for c in self.consumers.iter() {
            let _ = c.tx.send(ConsumerEvent::End(
                crate::error::BrokerError::SubscriptionNotFound {
                    topic: self.rec.topic.clone(),
                    subscription: format!("{} (deleted by an operator)", self.rec.name),
                },
            ));
        }
        self.deps.scheduler.unregister(self.rec.id, &self.fire_tx);
        self.topic.remove_mark(self.rec.id);
        self.deps.storage.delete_subscription(&self.rec)?;
        self.metrics.clear();
        tracing::info!(topic = %self.rec.topic, sub = %self.rec.name, force, "subscription deleted");
        Ok(vec![
            self.tiers.retry_name.clone(),
            self.tiers.dead_letter_name.clone(),
        ])
    }
}

/// Answers to consumer requests.
impl SubscriptionActor {
    /// Answers request `request_id` now: an error always (so a client that
    /// asked for no reply still logs it), success only when it asked.
    fn reply(&self, consumer: ConsumerId, request_id: u64, outcome: Outcome) {
        if request_id != 0 || outcome.is_err() {
            self.consumers.send(
                consumer,
                ConsumerEvent::Done {
                    request_id,
                    outcome,
                },
            );
        }
    }

    /// Answers a successful request once everything it (and every earlier
    /// request of the stream) wrote is durable, in either durability mode:
    /// a confirmation is a promise. Errors go at once.
    fn finish_request(&self, consumer: ConsumerId, request_id: u64, outcome: Result<()>) {
        if outcome.is_err() || request_id == 0 {
            return self.reply(consumer, request_id, outcome.map_err(Arc::new));
        }
        let Some(tx) = self.consumers.get(consumer).map(|c| c.tx.clone()) else {
            return;
        };
        let flusher = self.deps.flusher.clone();
        tokio::spawn(async move {
            let outcome = flusher.durable().await;
            let _ = tx.send(ConsumerEvent::Done {
                request_id,
                outcome: outcome.map_err(Arc::new),
            });
        });
    }

    /// Maps a consumer's id to this subscription's tier and entry.
    fn locate(&self, id: &MessageRef) -> Result<TierEntry> {
        self.tiers.locate(&self.rec, id).ok_or_else(|| {
            crate::error::BrokerError::InvalidArgument(format!(
                "message id {id} does not belong to subscription {} on {}",
                self.rec.name, self.rec.topic
            ))
        })
    }
}
