//! What one stream delivered and the application has not settled, and
//! when it goes back to the broker. [`plan_nack`] turns the policy's
//! decision for a nack into "hold it here for a delay", "send it now for
//! the broker to hold for a delay", or "send it now";
//! [`InFlight`] keeps the outstanding ids, the ack-timeout and nack
//! trackers, and gathers the failures due into the `FailedDelivery` list of
//! the next `Redeliver` request.
//!
//! Nothing here sends or sleeps: the driver passes the time in, sleeps
//! until the deadlines it reads, and sends what [`InFlight::take_failures`]
//! returns.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ricochet_policy::{
    DeadLetterPolicy, Decision, FailureContext, FailureReason, Tier, jitter_seed,
};
use ricochet_proto::FailedDelivery;
use tokio::time::Instant;

use super::local::LocalCopies;
use super::shared::Reply;
use crate::ids::{Key, TopicIds};
use crate::message::{Message, MessageId};
use crate::tracker::{DelayTracker, IdBuildHasher};

/// What to do with a nacked message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NackPlan {
    /// Hold it in the client for this long, then send it back (the broker
    /// redelivers it at once, or dead-letters it).
    HoldFor(Duration),
    /// Send it back now, for the broker to hold this long (persisted) and
    /// then redeliver in place.
    BrokerHold(Duration),
    /// Send it back now: the broker schedules it in the retry tier or
    /// dead-letters it (so the delay is not served twice).
    SendNow,
}

impl NackPlan {
    /// Who holds the delay: delays of at least `threshold` (any delay when
    /// `always`) go to the broker, which persists them.
    pub(super) fn holder(self, threshold: Duration, always: bool) -> NackPlan {
        match self {
            NackPlan::HoldFor(d) if always || d >= threshold => NackPlan::BrokerHold(d),
            other => other,
        }
    }
}

/// The plan for a nack of `id` (in `tier`, delivered `delivery_count`
/// times before) with the application's `detail`: the policy's decision
/// for the next attempt, or `fallback` (the fixed nack delay) without one.
pub(super) fn plan_nack(
    policy: Option<&dyn DeadLetterPolicy>,
    fallback: Duration,
    id: &MessageId,
    tier: Tier,
    delivery_count: u32,
    detail: Option<&str>,
) -> NackPlan {
    let Some(policy) = policy else {
        return NackPlan::HoldFor(fallback);
    };
    let attempt = delivery_count.saturating_add(1);
    let seed_key = id.to_string();
    let mut ctx = FailureContext::new(attempt, FailureReason::Nack)
        .with_tier(tier)
        .with_jitter_seed(jitter_seed(seed_key.as_bytes(), attempt));
    if let Some(d) = detail {
        ctx = ctx.with_detail(d);
    }
    match policy.decide(&ctx) {
        Decision::Redeliver {
            after,
            tier: Tier::Main,
        } => NackPlan::HoldFor(after),
        Decision::Redeliver {
            tier: Tier::Retry, ..
        }
        | Decision::DeadLetter { .. } => NackPlan::SendNow,
    }
}

/// One entry of a `Redeliver` request (`hold`: for the broker to serve).
fn failure(
    id: &MessageId,
    reason: ricochet_proto::FailureReason,
    detail: String,
    hold: Duration,
) -> FailedDelivery {
    let mut f = FailedDelivery {
        id: Some(id.to_proto()),
        reason: reason as i32,
        detail,
        ..FailedDelivery::default()
    };
    set_hold(&mut f, hold);
    f
}

/// Sets the hold the broker serves for `f` (zero: none, redeliver now).
pub(super) fn set_hold(f: &mut FailedDelivery, hold: Duration) {
    // Rounded up: the broker never serves less than what is left. A broker
    // that reads `delay_us` serves that; an older one `delay_ms`.
    f.delay_ms = u64::try_from(hold.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    f.delay_us = u64::try_from(hold.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX);
}

/// A failure readied for the next `Redeliver` request.
#[derive(Debug)]
pub(super) struct Ready {
    pub failure: FailedDelivery,
    /// For a hold the broker serves: when it ends, on this client's clock.
    /// The hold in `failure` is what was left when it was readied; the
    /// frame carries what is left when the transport takes it
    /// (`conn::stamped`), so the time the request waits in this client
    /// is not served again by the broker.
    pub due: Option<Instant>,
    /// Who waits for the broker's confirmation (ack receipts).
    pub reply: Option<Reply>,
}

impl Ready {
    fn new(failure: FailedDelivery, due: Option<Instant>, reply: Option<Reply>) -> Self {
        Self {
            failure,
            due,
            reply,
        }
    }
}

/// The ack-timeout tracker: deadlines `timeout` after a message is taken.
#[derive(Debug)]
struct AckTimeouts {
    timeout: Duration,
    tracker: DelayTracker<Key>,
}

/// The messages of one stream between delivery and settlement.
#[derive(Debug)]
pub(super) struct InFlight {
    /// Received on this stream and not yet settled by the application.
    /// FxHash, as the trackers' maps: every delivered message is inserted
    /// and every settled one removed.
    outstanding: HashSet<Key, IdBuildHasher>,
    /// With an ack timeout only.
    ack_timeouts: Option<AckTimeouts>,
    /// Nacks held for their delay.
    nacks: DelayTracker<Key>,
    /// The reasons given with held nacks.
    nack_details: HashMap<Key, String, IdBuildHasher>,
    /// Failures to send in the next `Redeliver` request, with who waits
    /// for the broker's confirmation (ack receipts).
    ready: Vec<Ready>,
    /// The broker counts a held nack when it is made
    /// (`Subscribed.counts_ahead`): each one is announced at once, so that
    /// its redelivery at the due time costs the broker no storage write.
    counts_ahead: bool,
    /// Copies of held nacks counted ahead, redelivered here when due.
    local: LocalCopies,
}

impl InFlight {
    /// Tracks ack timeouts of `ack_timeout` (rounded up to `tick`) when
    /// both are given.
    pub(super) fn new(ack_timeout: Option<Duration>, tick: Option<Duration>) -> Self {
        Self {
            outstanding: HashSet::default(),
            ack_timeouts: ack_timeout.zip(tick).map(|(timeout, tick)| AckTimeouts {
                timeout,
                tracker: DelayTracker::new(tick),
            }),
            // Finer than tokio's 1 ms timer, so the rounding up here adds
            // at most a quarter of a millisecond to the timer's own.
            nacks: DelayTracker::new(Duration::from_micros(250)),
            nack_details: HashMap::default(),
            ready: Vec::new(),
            counts_ahead: false,
            local: LocalCopies::new(0),
        }
    }

    /// Redelivers held nacks the broker counted ahead from a copy kept
    /// here, up to `budget` payload bytes of copies (zero: never).
    pub(super) fn set_local_budget(&mut self, budget: usize) {
        self.local = LocalCopies::new(budget);
    }

    /// Drops every copy kept for local redelivery: the held nacks go back
    /// through the broker (a Failover consumer that stopped being the
    /// active one, whose redeliveries belong to the new one).
    pub(super) fn forget_local_copies(&mut self) {
        self.local.clear();
    }

    /// The broker stored the held nack of `key` durably, for a next
    /// delivery at `delivery_count`: its copy may be redelivered here.
    pub(super) fn counted_ahead(&mut self, key: Key, delivery_count: u32) {
        self.local.confirm(key, delivery_count);
    }

    /// Whether the broker of the current stream counts held nacks ahead.
    pub(super) fn set_counts_ahead(&mut self, on: bool) {
        self.counts_ahead = on;
    }

    /// The stream delivered `key`: outstanding until settled. (A nack still
    /// held for it is dropped; its reason is kept until a later nack of the
    /// key or the stream's end.)
    pub(super) fn delivered(&mut self, key: Key) {
        self.outstanding.insert(key);
        self.nacks.remove(&key);
        self.local.forget(&key);
    }

    /// The application took `key` at `at` (or asked for more time): its
    /// ack timeout runs from then, if it is still outstanding.
    pub(super) fn taken(&mut self, key: Key, at: Instant) {
        if self.outstanding.contains(&key)
            && let Some(t) = &mut self.ack_timeouts
        {
            t.tracker.insert_after(key, t.timeout, at);
        }
    }

    /// `key` is in flight again (the broker refused to move it): outstanding,
    /// its ack timeout running from `now`.
    pub(super) fn track(&mut self, key: Key, now: Instant) {
        self.outstanding.insert(key);
        if let Some(t) = &mut self.ack_timeouts {
            t.tracker.insert_after(key, t.timeout, now);
        }
    }

    /// Stops tracking a message the application settled; whether it was
    /// outstanding on this stream.
    pub(super) fn settle(&mut self, key: &Key) -> bool {
        if let Some(t) = &mut self.ack_timeouts {
            t.tracker.remove(key);
        }
        if self.nacks.remove(key) {
            self.nack_details.remove(key);
        }
        self.local.forget(key);
        self.outstanding.remove(key)
    }

    /// Settles every outstanding main-topic id through entry `through` (a
    /// cumulative ack was sent).
    pub(super) fn settle_through(&mut self, through: u64, is_main: impl Fn(Key) -> bool) {
        let covered: Vec<Key> = self
            .outstanding
            .iter()
            .filter(|k| is_main(**k) && k.1 <= through)
            .copied()
            .collect();
        for k in covered {
            self.settle(&k);
        }
    }

    /// Acts on a nack of `key` (already settled) as `plan` says; `reply`
    /// waits for the broker (a nack held here has none: it is only sent
    /// later). `message`, when given, is kept for a local redelivery of a
    /// nack held here and counted ahead.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nack(
        &mut self,
        key: Key,
        id: &MessageId,
        plan: NackPlan,
        detail: Option<String>,
        now: Instant,
        reply: Option<Reply>,
        message: Option<Message>,
    ) {
        let nack = |hold| {
            failure(
                id,
                ricochet_proto::FailureReason::Nack,
                detail.clone().unwrap_or_default(),
                hold,
            )
        };
        match plan {
            NackPlan::HoldFor(after) => {
                if self.counts_ahead {
                    // Counted by the broker now; redelivered when due.
                    let notice = FailedDelivery {
                        ahead: true,
                        ..nack(Duration::ZERO)
                    };
                    self.ready.push(Ready::new(notice, None, None));
                    if let Some(m) = message {
                        self.local.keep(key, m);
                    }
                }
                self.nacks.insert_after(key, after, now);
                if let Some(d) = detail {
                    self.nack_details.insert(key, d);
                }
                if let Some(r) = reply {
                    let _ = r.send(Ok(()));
                }
            }
            // The delay runs from the nack call (`now`), not from when the
            // driver got to it: the time it waited in the driver's queue
            // is not served again by the broker.
            NackPlan::BrokerHold(hold) => {
                let left = hold.saturating_sub(Instant::now().saturating_duration_since(now));
                self.ready
                    .push(Ready::new(nack(left), Some(now + hold), reply));
            }
            NackPlan::SendNow => self
                .ready
                .push(Ready::new(nack(Duration::ZERO), None, reply)),
        }
    }

    /// Hands every nack held here to the broker with what is left of its
    /// delay (a clean close: the delay is still served, by the broker).
    pub(super) fn hand_over_nacks(
        &mut self,
        now: Instant,
        ids: &TopicIds,
        covered: impl Fn(Key) -> bool,
    ) {
        let held: Vec<(Key, Instant)> = self
            .nacks
            .keys()
            .filter_map(|k| self.nacks.deadline(k).map(|d| (*k, d)))
            .collect();
        self.nacks.clear();
        self.local.clear();
        for (k, deadline) in held {
            let detail = self.nack_details.remove(&k).unwrap_or_default();
            if covered(k) {
                continue;
            }
            if let Some(id) = ids.id(k) {
                let left = deadline.saturating_duration_since(now);
                self.ready.push(Ready::new(
                    failure(&id, ricochet_proto::FailureReason::Nack, detail, left),
                    Some(deadline),
                    None,
                ));
            }
        }
    }

    /// When the next held nack is due.
    pub(super) fn nack_deadline(&self) -> Option<Instant> {
        self.nacks.next_deadline()
    }

    /// When the next ack timeout is due.
    pub(super) fn ack_timeout_deadline(&self) -> Option<Instant> {
        self.ack_timeouts
            .as_ref()
            .and_then(|t| t.tracker.next_deadline())
    }

    /// Readies every held nack due by `now + lead`, with its reason and
    /// what is left of its delay at `now` for the broker to serve, except
    /// ids a cumulative ack `covered`. Returns the messages to redeliver
    /// here (a copy kept and counted ahead, due now): outstanding again,
    /// the broker only told.
    pub(super) fn fire_nacks(
        &mut self,
        now: Instant,
        lead: Duration,
        ids: &TopicIds,
        covered: impl Fn(Key) -> bool,
    ) -> Vec<Message> {
        let mut due = Vec::new();
        self.nacks
            .pop_due_with(now + lead, |k, at| due.push((k, at)));
        let mut here = Vec::new();
        for (k, at) in due {
            let left = at.saturating_duration_since(now);
            let detail = self.nack_details.remove(&k).unwrap_or_default();
            let copy = self.local.take(&k);
            if covered(k) {
                continue;
            }
            if let Some(m) = copy.filter(|_| left.is_zero()) {
                let notice = FailedDelivery {
                    id: Some(m.id().to_proto()),
                    reason: ricochet_proto::FailureReason::Nack as i32,
                    local: true,
                    ..FailedDelivery::default()
                };
                self.ready.push(Ready::new(notice, None, None));
                self.outstanding.insert(k);
                here.push(m);
                continue;
            }
            if let Some(id) = ids.id(k) {
                self.ready.push(Ready::new(
                    failure(&id, ricochet_proto::FailureReason::Nack, detail, left),
                    Some(at),
                    None,
                ));
            }
        }
        here
    }

    /// Readies every outstanding id whose ack timeout is due by `now`,
    /// except ids a cumulative ack `covered`; none of them stays
    /// outstanding.
    pub(super) fn fire_ack_timeouts(
        &mut self,
        now: Instant,
        ids: &TopicIds,
        covered: impl Fn(Key) -> bool,
    ) {
        let Some(t) = &mut self.ack_timeouts else {
            return;
        };
        let mut due = Vec::new();
        t.tracker.pop_due(now, &mut due);
        for k in due {
            if !self.outstanding.remove(&k) || covered(k) {
                continue;
            }
            if let Some(id) = ids.id(k) {
                self.ready.push(Ready::new(
                    failure(
                        &id,
                        ricochet_proto::FailureReason::AckTimeout,
                        String::new(),
                        Duration::ZERO,
                    ),
                    None,
                    None,
                ));
            }
        }
    }

    /// The failures readied since the last call.
    pub(super) fn take_failures(&mut self) -> Vec<Ready> {
        std::mem::take(&mut self.ready)
    }

    /// The stream broke: the broker redelivers everything, forget it all.
    /// Returns who waited for nacks that were not sent.
    pub(super) fn clear(&mut self) -> Vec<Reply> {
        self.outstanding = HashSet::default();
        if let Some(t) = &mut self.ack_timeouts {
            t.tracker.clear();
        }
        self.nacks.clear();
        self.nack_details = HashMap::default();
        self.local.clear();
        self.ready.drain(..).filter_map(|r| r.reply).collect()
    }
}

#[cfg(test)]
#[path = "redelivery_tests.rs"]
mod tests;
