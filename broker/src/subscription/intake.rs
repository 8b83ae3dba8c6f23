//! Failure intake: turning a consumer's failure reports (redeliver after a
//! nack or an ack timeout, `reconsume_later`, terminate, a lost stream) into
//! [`Failure`]s, checking them against what is in flight, and carrying out
//! what the planner decides: redeliver in place, or move to a tier. A clean
//! close gives messages back with no attempt charged. Consecutive
//! requests of a burst are taken in together ([`Redelivers`], and the
//! `reconsume_later`s of a round): one planning pass and one storage write,
//! each request answered once that write is durable.

use super::SubscriptionActor;
use super::delivery::{Counted, Held};
use super::failure::{self, Failure, Rules, Step};
use super::requests::{ConsumerEvent, ConsumerId, ConsumerRequest, FailedItem, MessageRef};
use crate::error::{BrokerError, Result};
use crate::storage::{FailureRecord, ScheduleKey, TierEntry, TierId};
use ricochet_policy::FailureReason;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// Consecutive redeliver requests (nack frames) of a round, gathered to be
/// taken in together by [`SubscriptionActor::redeliver_frames`].
#[derive(Debug, Default)]
pub(super) struct Redelivers {
    frames: Vec<(ConsumerId, u64, Vec<FailedItem>, Instant)>,
    items: usize,
}

impl Redelivers {
    pub(super) fn push(
        &mut self,
        consumer: ConsumerId,
        request_id: u64,
        items: Vec<FailedItem>,
        queued: Instant,
    ) {
        self.items += items.len();
        self.frames.push((consumer, request_id, items, queued));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Failed messages gathered.
    pub(super) fn items(&self) -> usize {
        self.items
    }
}

impl SubscriptionActor {
    /// Whether a redeliver request naming `items` may be taken in together
    /// with its neighbours: it names its messages (an empty list means
    /// everything in flight, read when it is handled), none counted ahead
    /// or redelivered by the client (their bookkeeping depends on what
    /// earlier requests left in flight), and no outage breaker watches the
    /// subscription (it is handled one request at a time, as before).
    pub(super) fn gathers(&self, items: &[FailedItem]) -> bool {
        !items.is_empty() && !self.has_breaker() && items.iter().all(|i| !i.ahead && !i.local)
    }

    /// Redeliver requests gathered by the round ([`Self::gathers`]), taken
    /// in together: each is checked as it would be alone (one that does not
    /// check out is refused alone), a message a request names that an
    /// earlier one of the group failed already is passed over (it is no
    /// longer in flight, as one request at a time would find it), and all
    /// the failures are planned and written in one [`Self::fail`], so a
    /// burst writes each schedule chunk once instead of once per request.
    /// Each request is answered once that write is durable.
    pub(super) async fn redeliver_frames(&mut self, frames: Redelivers) {
        if frames.is_empty() {
            return;
        }
        let mut failures = Vec::with_capacity(frames.items);
        let mut accepted = Vec::with_capacity(frames.frames.len());
        let mut seen = HashSet::with_capacity(frames.items);
        for (consumer, request_id, items, queued) in frames.frames {
            let since_us = self.since_us(queued);
            match self.redeliver_failures(consumer, items, since_us, &seen) {
                Ok(fs) => {
                    for f in fs {
                        if seen.insert(f.entry) {
                            failures.push(f);
                        }
                    }
                    accepted.push((consumer, request_id));
                }
                Err(e) => self.reply(consumer, request_id, Err(e.into())),
            }
        }
        let (n, started) = (failures.len(), std::time::Instant::now());
        let outcome = if failures.is_empty() {
            Ok(())
        } else {
            self.fail(failures, false).await
        };
        tracing::trace!(
            target: "ricochet::burst",
            n,
            frames = accepted.len(),
            us = started.elapsed().as_micros() as u64,
            "actor: redeliver frames taken in"
        );
        match outcome {
            Ok(()) => self.finish_requests(accepted),
            Err(e) => {
                let e = std::sync::Arc::new(e);
                for (consumer, request_id) in accepted {
                    self.reply(consumer, request_id, Err(e.clone()));
                }
            }
        }
    }

    fn not_in_flight(&self, id: &MessageRef) -> BrokerError {
        BrokerError::InvalidArgument(format!(
            "message {id} is not in flight on subscription {} (already acked, or never delivered)",
            self.rec.name
        ))
    }

    /// The entry `id` names, checked to be in flight with `consumer`: only
    /// the consumer a delivery went to may settle it.
    pub(super) fn held_entry(&self, consumer: ConsumerId, id: &MessageRef) -> Result<TierEntry> {
        let entry = self.locate(id)?;
        match self.deliveries.in_flight.get(&entry) {
            Some(f) if f.consumer == consumer => Ok(entry),
            Some(_) => Err(self.not_yours(id)),
            None => Err(self.not_in_flight(id)),
        }
    }

    fn not_yours(&self, id: &MessageRef) -> BrokerError {
        BrokerError::Conflict(format!(
            "message {id} is in flight with another consumer of subscription {}; only the consumer it was delivered to may settle it",
            self.rec.name
        ))
    }

    /// The consumer's stream ended without a clean close: what it held is
    /// redelivered, an attempt charged for each (reason: consumer lost) —
    /// unless the broker itself is shutting down.
    pub(super) async fn consumer_lost(&mut self, consumer: ConsumerId) {
        let Some(c) = self.consumers.remove(consumer) else {
            return;
        };
        if self.deps.shutdown.is_cancelled() {
            return;
        }
        let failures = self
            .deliveries
            .held(consumer)
            .into_iter()
            .map(|(entry, _)| Failure::new(entry, FailureReason::ConsumerLost, c.name.clone()))
            .collect();
        if let Err(e) = self.fail(failures, false).await {
            tracing::error!(error = %e, sub = %self.rec.name, "cannot record lost consumer's messages");
        }
        self.consumers.elect(self.rec.sub_type, None);
    }

    /// A clean close: the consumer gets nothing more, and its in-flight
    /// messages are dispatched again with their delivery counts unchanged.
    pub(super) fn close_consumer(&mut self, consumer: ConsumerId) {
        if self.consumers.get(consumer).is_none() {
            return;
        }
        let held: Vec<TierEntry> = self
            .deliveries
            .held(consumer)
            .into_iter()
            .map(|(entry, _)| entry)
            .collect();
        for entry in &held {
            self.breaker_released(*entry);
        }
        self.give_back(held);
        self.consumers.remove(consumer);
        self.consumers.elect(self.rec.sub_type, None);
    }

    /// Takes `entries` out of flight and makes them dispatchable again
    /// where they were (ready, or due at their schedule time), with their
    /// delivery counts unchanged.
    pub(super) fn give_back(&mut self, entries: Vec<TierEntry>) {
        let mut back = Vec::new();
        for entry in entries {
            match self.release(entry).flatten() {
                Some(due) => {
                    self.deliveries.due.insert(entry, due);
                }
                None => back.push((entry, None)),
            }
        }
        self.load_into_ready(back);
    }

    /// Redeliver now: after a nack's client-held delay, or an ack timeout.
    pub(super) async fn redeliver(
        &mut self,
        consumer: ConsumerId,
        request_id: u64,
        items: Vec<FailedItem>,
        queued: Instant,
    ) {
        // An empty list asks for everything in flight: not when it held
        // only nacks counted ahead or redelivered by the client.
        let only_notices = !items.is_empty() && items.iter().all(|i| i.ahead || i.local);
        let (local, items): (Vec<_>, Vec<_>) = items.into_iter().partition(|i| i.local);
        self.redelivered_locally(consumer, local);
        let (ahead, items): (Vec<_>, Vec<_>) = items.into_iter().partition(|i| i.ahead);
        // Nacks coming due in the same frame go on whatever the counting did.
        let counted = self.count_ahead(consumer, ahead);
        let outcome = if only_notices {
            counted
        } else {
            let since_us = self.since_us(queued);
            let due = match self.redeliver_failures(consumer, items, since_us, &HashSet::new()) {
                Ok(f) => self.fail(f, false).await,
                Err(e) => Err(e),
            };
            due.and(counted)
        };
        self.finish_request(consumer, request_id, outcome);
    }

    /// Counts client-held nacks when they are made (`FailedItem::ahead`):
    /// each attempt is planned and stored now, the message stays in flight
    /// with `consumer` (an ack still settles it), and its redelivery when
    /// the client asks for it does no storage write and, once the record is
    /// durable, no flush. A nack the policy would not redeliver in place at
    /// once, or any under an outage breaker, is counted when it comes due,
    /// as without.
    fn count_ahead(&mut self, consumer: ConsumerId, items: Vec<FailedItem>) -> Result<()> {
        if items.is_empty() || self.has_breaker() {
            return Ok(());
        }
        let now = self.deps.clock.now_ms();
        let name = self.consumers.name_of(consumer);
        let mut records = Vec::with_capacity(items.len());
        let mut counted = Vec::with_capacity(items.len());
        for item in items {
            // Not a message of this subscription: nothing to count (its
            // redelivery, if asked for, is refused).
            let Ok(entry) = self.locate(&item.id) else {
                continue;
            };
            let due = match self.deliveries.in_flight.get(&entry) {
                // Settled or given back since: nothing to count.
                Some(f) if f.consumer == consumer => f.due_ms,
                _ => continue,
            };
            if self.deliveries.counted.contains_key(&entry) {
                continue;
            }
            let before = match self.deliveries.failures.get(&entry) {
                Some(r) => r.clone(),
                None => self
                    .deps
                    .storage
                    .failure(entry.of(self.rec.id), due)?
                    .unwrap_or_default(),
            };
            let f = Failure {
                detail: item.detail,
                ..Failure::new(entry, FailureReason::Nack, name.clone())
            };
            let rules = Rules {
                policy: self.policy.policy.as_deref(),
                fallback: self.policy.fallback.as_deref(),
                now_ms: now,
                max_delay: self.deps.max_delay,
            };
            let mut after = before.clone();
            let step = failure::plan(rules, &f, &mut after, &self.wire_id(entry), false);
            if step != Step::InPlace(Duration::ZERO) {
                continue;
            }
            self.deliveries.counted_seq += 1;
            let seq = self.deliveries.counted_seq;
            records.push((entry.of(self.rec.id), Some(after.clone())));
            counted.push((
                entry,
                Counted {
                    before,
                    after,
                    seq,
                    durable: false,
                },
            ));
        }
        if records.is_empty() {
            return Ok(());
        }
        self.deps.storage.put_failures(&records)?;
        let flushed: Vec<(TierEntry, u64)> = counted.iter().map(|(e, c)| (*e, c.seq)).collect();
        self.deliveries.counted.extend(counted);
        let tx = self.self_tx.clone();
        let flusher = self.deps.flusher.clone();
        tokio::spawn(async move {
            if flusher.durable().await.is_ok()
                && let Some(tx) = tx.upgrade()
            {
                let _ = tx.send(super::handle::Command::CountedDurable(flushed));
            }
        });
        Ok(())
    }

    /// The flush after [`count_ahead`](Self::count_ahead) is done: those
    /// records are durable, so each holder may redeliver its nacks itself
    /// when due (a count never goes back, whoever redelivers). Not offered
    /// under an outage breaker or key order: their redeliveries must come
    /// through here.
    pub(super) fn counted_durable(&mut self, entries: Vec<(TierEntry, u64)>) {
        let offer = !self.has_breaker() && self.rec.key_order.is_none();
        let mut notices: HashMap<ConsumerId, Vec<(MessageRef, u32)>> = HashMap::new();
        for (entry, seq) in entries {
            let Some(c) = self.deliveries.counted.get_mut(&entry) else {
                continue;
            };
            if c.seq != seq {
                continue;
            }
            c.durable = true;
            let count = c.after.count;
            if offer && let Some(f) = self.deliveries.in_flight.get(&entry) {
                let consumer = f.consumer;
                notices
                    .entry(consumer)
                    .or_default()
                    .push((self.wire_ref(entry), count));
            }
        }
        for (consumer, counted) in notices {
            self.consumers
                .send(consumer, ConsumerEvent::CountedAhead(counted));
        }
    }

    /// Nacks counted ahead that `consumer` redelivered to its application
    /// itself when due: each stays in flight with it, now at its counted
    /// attempt (where the broker's own redelivery would have left it), and
    /// nothing is read, written or sent. One that is no longer counted
    /// ahead for this consumer (acked since, or the consumer's stream was
    /// replaced) is left as it is.
    fn redelivered_locally(&mut self, consumer: ConsumerId, items: Vec<FailedItem>) {
        for item in items {
            let Ok(entry) = self.locate(&item.id) else {
                continue;
            };
            let holds = self
                .deliveries
                .in_flight
                .get(&entry)
                .is_some_and(|f| f.consumer == consumer);
            if !holds {
                continue;
            }
            let Some(c) = self.deliveries.counted.remove(&entry) else {
                continue;
            };
            self.metrics.redelivery(FailureReason::Nack);
            self.metrics.delivery_count.record(f64::from(c.after.count));
            self.deliveries.held.remove(&entry);
            self.deliveries.failures.insert(entry, c.after);
        }
    }

    /// `consumer` closes: its nacks counted ahead and not yet sent back
    /// come due now (the attempt was made), rather than go back uncounted.
    pub(super) async fn counted_come_due(&mut self, consumer: ConsumerId) {
        let name = self.consumers.name_of(consumer);
        let due: Vec<Failure> = self
            .deliveries
            .held(consumer)
            .into_iter()
            .filter(|(e, _)| self.deliveries.counted.contains_key(e))
            .map(|(e, _)| Failure::new(e, FailureReason::Nack, name.clone()))
            .collect();
        if due.is_empty() {
            return;
        }
        if let Err(e) = self.fail(due, false).await {
            tracing::error!(error = %e, sub = %self.rec.name, "cannot redeliver nacks counted ahead");
        }
    }

    /// The failures a redeliver request names, checked; `failed`: messages
    /// failed already by earlier requests taken in together with this one
    /// (passed over, as no longer in flight).
    fn redeliver_failures(
        &self,
        consumer: ConsumerId,
        items: Vec<FailedItem>,
        since_us: u64,
        failed: &HashSet<TierEntry>,
    ) -> Result<Vec<Failure>> {
        let name = self.consumers.name_of(consumer);
        if items.is_empty() {
            return Ok(self
                .deliveries
                .held(consumer)
                .into_iter()
                .map(|(entry, _)| Failure::new(entry, FailureReason::Nack, name.clone()))
                .collect());
        }
        let mut out = Vec::with_capacity(items.len());
        for FailedItem {
            id,
            reason,
            detail,
            hold,
            ..
        } in items
        {
            let entry = self.locate(&id)?;
            if failed.contains(&entry) {
                continue;
            }
            if !self
                .deliveries
                .was_delivered(entry, self.rec.is_acked(entry))
            {
                return Err(BrokerError::InvalidArgument(format!(
                    "cannot redeliver {id}: it was never delivered on this subscription"
                )));
            }
            match self.deliveries.in_flight.get(&entry) {
                Some(f) if f.consumer == consumer => {}
                // Delivered again since, to another consumer: not ours to fail.
                Some(_) => return Err(self.not_yours(&id)),
                // Already acked, or already given back (a race the client
                // cannot avoid, e.g. an ack timeout and a nack crossing).
                None => continue,
            }
            out.push(Failure {
                detail,
                hold,
                since_us: Some(since_us),
                ..Failure::new(entry, reason, name.clone())
            });
        }
        Ok(out)
    }

    /// `reconsume_later` requests, moved into the retry tier together.
    pub(super) async fn reconsume_later(
        &mut self,
        reqs: Vec<(ConsumerId, ConsumerRequest, Instant)>,
    ) {
        if reqs.is_empty() {
            return;
        }
        let mut failures = Vec::with_capacity(reqs.len());
        let mut accepted = Vec::with_capacity(reqs.len());
        let mut seen = HashSet::with_capacity(reqs.len());
        for (consumer, req, queued) in reqs {
            let since_us = self.since_us(queued);
            let ConsumerRequest::ReconsumeLater {
                request_id,
                id,
                delay,
                properties,
                detail,
                waited,
            } = req
            else {
                continue;
            };
            // A level must be one of the policy's (the fallback's without one).
            let policy = self
                .policy
                .policy
                .as_deref()
                .or(self.policy.fallback.as_deref());
            let delay = match policy.map_or(Ok(delay), |p| delay.checked_for(p)) {
                Ok(d) => d,
                Err(e) => {
                    let e = BrokerError::InvalidArgument(e.to_string());
                    self.reply(consumer, request_id, Err(e.into()));
                    continue;
                }
            };
            match self.held_entry(consumer, &id) {
                // The same message twice in one batch: the second finds it
                // gone, as it would have one request at a time.
                Ok(entry) if !seen.insert(entry) => {
                    self.reply(consumer, request_id, Err(self.not_in_flight(&id).into()));
                }
                Ok(entry) => {
                    failures.push(Failure {
                        detail,
                        overrides: delay,
                        extra_props: properties,
                        since_us: Some(since_us),
                        waited,
                        ..Failure::new(
                            entry,
                            FailureReason::ReconsumeLater,
                            self.consumers.name_of(consumer),
                        )
                    });
                    accepted.push((consumer, request_id));
                }
                Err(e) => self.reply(consumer, request_id, Err(e.into())),
            }
        }
        if failures.is_empty() {
            return;
        }
        let (n, started) = (failures.len(), std::time::Instant::now());
        let moved = self.fail(failures, true).await;
        tracing::trace!(
            target: "ricochet::burst",
            n,
            us = started.elapsed().as_micros() as u64,
            "actor: reconsume_later moves taken in"
        );
        match moved {
            Ok(()) => self.finish_requests(accepted),
            Err(e) => {
                let e = std::sync::Arc::new(e);
                for (consumer, request_id) in accepted {
                    self.reply(consumer, request_id, Err(e.clone()));
                }
            }
        }
    }

    /// Straight to the dead-letter tier.
    pub(super) async fn terminate(
        &mut self,
        consumer: ConsumerId,
        request_id: u64,
        id: &MessageRef,
        detail: String,
    ) {
        let outcome = match self.held_entry(consumer, id) {
            Ok(entry) => {
                let f = Failure {
                    detail,
                    overrides: ricochet_policy::AttemptOverride::DeadLetter,
                    ..Failure::new(
                        entry,
                        FailureReason::Terminate,
                        self.consumers.name_of(consumer),
                    )
                };
                self.fail(vec![f], false).await
            }
            Err(e) => Err(e),
        };
        self.finish_request(consumer, request_id, outcome);
    }

    /// Counts each failure, asks the planner, then redelivers or moves.
    /// `reconsume` sends redeliveries through the retry tier.
    /// Failures the outage breaker spares (it is open) go back unchanged.
    pub(super) async fn fail(&mut self, failures: Vec<Failure>, reconsume: bool) -> Result<()> {
        let (failures, spared) = self.breaker_screen(failures);
        self.give_back_spared(spared);
        let now = self.deps.clock.now_ms();
        let stored = self.stored_records(&failures)?;
        let mut in_place = Vec::new();
        let mut to_retry = Vec::new();
        let mut to_dlq = Vec::new();
        for f in failures {
            let counted = self.deliveries.counted.remove(&f.entry);
            let counted = match counted {
                Some(c) if f.reason == FailureReason::Nack => {
                    // A nack counted ahead comes due: stored already.
                    self.metrics.redelivery(f.reason);
                    let hold = f.hold.min(self.deps.max_delay);
                    in_place.push((f, c.after, hold, Some(c.durable)));
                    continue;
                }
                other => other,
            };
            // Failed another way since its nack was counted (the client
            // cancelled the nack): counted from the record before it.
            let base = match counted {
                Some(c) => Some(c.before),
                None => self.deliveries.failures.get(&f.entry).cloned(),
            };
            let mut record = match base {
                Some(r) => r,
                // Read before the loop (a first failure has none).
                None => match stored.get(&f.entry) {
                    Some(r) => r.clone().unwrap_or_default(),
                    None => {
                        let due = self
                            .deliveries
                            .in_flight
                            .get(&f.entry)
                            .and_then(|i| i.due_ms);
                        self.deps
                            .storage
                            .failure(f.entry.of(self.rec.id), due)?
                            .unwrap_or_default()
                    }
                },
            };
            self.metrics.redelivery(f.reason);
            let rules = Rules {
                policy: self.policy.policy.as_deref(),
                fallback: self.policy.fallback.as_deref(),
                now_ms: now,
                max_delay: self.deps.max_delay,
            };
            let origin = self.wire_id(f.entry);
            let step = failure::plan(rules, &f, &mut record, &origin, reconsume);
            tracing::debug!(
                sub = %self.rec.name, message = %origin, attempt = record.count,
                reason = %f.reason, detail = %f.detail, step = ?step,
                "delivery failed"
            );
            match step {
                Step::InPlace(hold) => in_place.push((f, record, hold, None)),
                Step::Retry(after) => to_retry.push((f, record, after)),
                Step::DeadLetter(reason) => to_dlq.push((f, record, reason)),
            }
        }
        let waiting: Vec<TierEntry> = in_place
            .iter()
            .map(|(f, ..)| f.entry)
            .chain(to_retry.iter().map(|(f, _, _)| f.entry))
            .collect();
        self.block_keys(&waiting, now)?;
        if !in_place.is_empty() {
            self.redeliver_in_place(in_place, now)?;
        }
        if !to_retry.is_empty() {
            self.move_to_retry(to_retry, now).await?;
        }
        if !to_dlq.is_empty() {
            self.move_to_dead_letter(to_dlq, now).await?;
        }
        Ok(())
    }

    /// The stored failure records of the `failures` not known to the actor
    /// (not counted ahead, no record in memory), read together: a burst of
    /// `reconsume_later`s or nacks is one batched read, not one each.
    fn stored_records(
        &self,
        failures: &[Failure],
    ) -> Result<HashMap<TierEntry, Option<FailureRecord>>> {
        let mut entries = Vec::new();
        let mut keys = Vec::new();
        for f in failures {
            let known = self.deliveries.counted.contains_key(&f.entry)
                || self.deliveries.failures.contains_key(&f.entry);
            if known {
                continue;
            }
            let due = self
                .deliveries
                .in_flight
                .get(&f.entry)
                .and_then(|i| i.due_ms);
            entries.push(f.entry);
            keys.push((f.entry.of(self.rec.id), due));
        }
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let records = self.deps.storage.failures_many(&keys)?;
        Ok(entries.into_iter().zip(records).collect())
    }

    /// Persists the new counts, then (once durable, in either mode) makes the messages
    /// dispatchable again in their current tier: at once, or when their
    /// hold ends (a schedule entry, so the hold survives a restart).
    /// `Some(durable)` marks a record stored ahead (a nack counted when it
    /// was made): not written again, and dispatchable at once when durable.
    fn redeliver_in_place(
        &mut self,
        items: Vec<(Failure, FailureRecord, Duration, Option<bool>)>,
        now: u64,
    ) -> Result<()> {
        let mut records = Vec::with_capacity(items.len());
        // Held: each record with its schedule entry, in one write.
        let mut held_records = Vec::new();
        let mut ready = Vec::with_capacity(items.len());
        let mut held = Vec::new();
        let mut unheld = Vec::new();
        let mut at_once = Vec::new();
        // A hold ends at its microsecond (the scheduler fires it then);
        // stored, it ends at that microsecond rounded up to a whole
        // millisecond, so it never ends before the consumer's (or its
        // client's) due time, after a restart neither.
        let from = self.deps.clock.now_us().max(now.saturating_mul(1000));
        for (f, mut rec, hold, stored) in items {
            let msg = f.entry.of(self.rec.id);
            // From when the request reached the broker, if it says.
            let from = f.since_us.unwrap_or(from);
            let hold_until_us = (!hold.is_zero()).then(|| from.saturating_add(micros_up(hold)));
            let hold_until = hold_until_us.map(|us| us.div_ceil(1000));
            rec.hold_until_ms = hold_until.unwrap_or(0);
            let mut parked = None;
            if hold_until.is_some() {
                // Parked: the record stays in storage until the hold ends.
                self.deliveries.failures.remove(&f.entry);
                if f.entry.tier == TierId::Main {
                    self.deliveries.held.insert(
                        f.entry,
                        Held {
                            count: rec.count,
                            until_ms: rec.hold_until_ms,
                        },
                    );
                }
                parked = Some(rec);
            } else {
                if stored.is_none() {
                    records.push((msg, Some(rec.clone())));
                }
                self.deliveries.held.remove(&f.entry);
                self.deliveries.failures.insert(f.entry, rec);
            }
            let scheduled = self.release(f.entry).flatten();
            match (hold_until, scheduled) {
                // A scheduled message keeps its schedule entry until it is
                // finally acked, and is loaded again from `due`.
                (None, Some(due)) => {
                    self.deliveries.due.insert(f.entry, due);
                }
                // Stored ahead and durable: no flush to wait for.
                (None, None) if stored == Some(true) => at_once.push((f.entry, None)),
                (None, None) => ready.push(f.entry),
                (Some(until), old) => {
                    if let Some(due_ms) = old {
                        unheld.push(ScheduleKey {
                            due_ms,
                            message: msg,
                        });
                    }
                    let key = ScheduleKey {
                        due_ms: until,
                        message: msg,
                    };
                    if let Some(rec) = parked.take() {
                        held_records.push((key, rec));
                    }
                    held.push((key, hold_until_us.unwrap_or(until.saturating_mul(1000))));
                }
            }
        }
        if !records.is_empty() {
            self.deps.storage.put_failures(&records)?;
        }
        if !held_records.is_empty() || !unheld.is_empty() {
            self.deps.storage.put_held(&held_records, &unheld)?;
        }
        self.deps.scheduler.remove(unheld);
        if !at_once.is_empty() {
            self.load_into_ready(at_once);
        }
        if ready.is_empty() && held.is_empty() {
            return Ok(());
        }
        let tx = self.self_tx.clone();
        let flusher = self.deps.flusher.clone();
        let scheduler = self.deps.scheduler.clone();
        tokio::spawn(async move {
            // In both durability modes: a delivery count never goes back,
            // so it is durable before the message goes out again.
            if flusher.durable().await.is_err() {
                return;
            }
            scheduler.add_at(held);
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(super::handle::Command::Ready(ready));
            }
        });
        Ok(())
    }
}

impl SubscriptionActor {
    /// The broker clock's time (µs) when a request was queued for this
    /// actor (`queued`): a nack's hold and a `reconsume_later`'s delay run
    /// from then, so a request that waited behind a burst in the actor's
    /// queue is not due later by that wait. Never later than now.
    pub(super) fn since_us(&self, queued: Instant) -> u64 {
        let waited = u64::try_from(queued.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.deps.clock.now_us().saturating_sub(waited)
    }
}

/// `d` in whole microseconds, rounded up (a hold never ends early).
fn micros_up(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// How long a retry waits, for logs and metrics.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
