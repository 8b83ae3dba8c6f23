//! Key order (per-key ordered retries): while a message of key K waits for
//! its redelivery (a nack redelivered in place, a hold, a retry-tier
//! retry), later messages of K are held back and other keys flow on; K
//! resumes, its held messages first and in order, once the failed message
//! is acked or dead-lettered. A key blocked past `poison_after` is a poison
//! key: the failed message, then everything held behind it, go to the
//! dead-letter tier through the usual tier move.
//!
//! What it owns:
//! * the blocked keys, in the subscription record (`blocked_keys`: key →
//!   since, failed message), so they are written with the cursors and, for
//!   a tier move, in the move's transaction: a restart holds what was held;
//! * in memory, per key with held messages, the held entry ids (a
//!   `BTreeSet<u64>`, no payload: a released message is read again from
//!   the log); after a restart they are found again as the read-ahead reads
//!   the unacked log from the mark-delete position. A message whose key
//!   is only busy (an earlier one is out, not failed) is held the same way,
//!   up to a bound, so the read-ahead is not filled with messages that
//!   cannot go out and other keys keep flowing;
//! * the rule that a key has one message out at a time: a consumer that
//!   failed K:1 is never also holding K:2, so no later message of a key can
//!   be processed before an earlier one is settled.
//!
//! Messages without a key are not ordered (they flow as without the mode).

use super::SubscriptionActor;
use super::failure::Failure;
use super::read_ahead::READ_AHEAD;
use crate::error::{BrokerError, Result};
use crate::events::{EventKind, FailureEvent};
use crate::storage::{
    AttemptRecord, BlockedKey, FailureRecord, SubscriptionRecord, TierEntry, TierId,
};
use ricochet_policy::{FailureReason, KeyOrder};
use ricochet_proto::SubscriptionType;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

/// Held messages dead-lettered per tier move when a key turns poison.
const POISON_CHUNK: usize = 1_000;

/// Messages waiting behind a busy key (one of its messages out) leave the
/// read-ahead for the key's lane while fewer than this many are held; past
/// it they stay in the read-ahead (and hold it up), so memory stays bounded
/// when one hot key has a long backlog.
const BUSY_HOLD_CAP: usize = 10 * READ_AHEAD;

/// How many of the longest-blocked keys the stats list.
pub(super) const TOP_BLOCKED: usize = 5;

/// A key with messages held back.
#[derive(Debug, Default)]
struct Lane {
    /// Main-topic entry ids held, in order.
    held: BTreeSet<u64>,
    /// The held message loaded back for dispatch, once the key is free.
    lead: Option<TierEntry>,
}

/// The in-memory side of key order.
#[derive(Debug, Default)]
pub(super) struct KeyLanes {
    lanes: HashMap<String, Lane>,
    /// The key of each keyed message in flight.
    in_flight: HashMap<TierEntry, String>,
    /// Keys with a message in flight, and how many.
    busy: HashMap<String, u32>,
    held_total: usize,
    /// After a poison key could not be dead-lettered, not retried before
    /// this (ms since the epoch).
    poison_not_before: u64,
}

impl KeyLanes {
    /// A message of `key` went out.
    pub fn dispatched(&mut self, entry: TierEntry, key: &str) {
        if key.is_empty() {
            return;
        }
        *self.busy.entry(key.to_owned()).or_default() += 1;
        self.in_flight.insert(entry, key.to_owned());
        if let Some(l) = self.lanes.get_mut(key)
            && l.lead == Some(entry)
        {
            l.lead = None;
        }
    }

    /// `entry` left flight (settled, failed or given back).
    pub fn left_flight(&mut self, entry: TierEntry) {
        let Some(key) = self.in_flight.remove(&entry) else {
            return;
        };
        if let Some(n) = self.busy.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.busy.remove(&key);
            }
        }
    }

    /// The key of an in-flight message.
    fn key_of(&self, entry: TierEntry) -> Option<&str> {
        self.in_flight.get(&entry).map(String::as_str)
    }

    fn hold(&mut self, key: String, entry_id: u64) {
        if self.lanes.entry(key).or_default().held.insert(entry_id) {
            self.held_total += 1;
        }
    }

    fn held_of(&self, key: &str) -> usize {
        self.lanes.get(key).map_or(0, |l| l.held.len())
    }

    fn take_held(&mut self, key: &str) -> Vec<u64> {
        let Some(l) = self.lanes.remove(key) else {
            return Vec::new();
        };
        self.held_total -= l.held.len();
        l.held.into_iter().collect()
    }
}

/// Refuses key order on a Shared subscription.
pub(super) fn check_type(
    sub_type: SubscriptionType,
    key_order: Option<&KeyOrder>,
    name: &str,
) -> Result<()> {
    if key_order.is_some() && sub_type == SubscriptionType::Shared {
        return Err(BrokerError::InvalidArgument(format!(
            "subscription {name}: key order needs a Key_Shared, Failover or Exclusive subscription; a Shared one has no order to keep"
        )));
    }
    Ok(())
}

/// The key waiting for `failed`, if any.
fn key_waiting_for(rec: &SubscriptionRecord, failed: TierEntry) -> Option<String> {
    rec.blocked_keys
        .iter()
        .find(|(_, b)| b.failed == failed)
        .map(|(k, _)| k.clone())
}

fn fmt_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms / 1000 * 1000)).to_string()
}

/// A key released by a tier move, announced once the move is durable.
pub(super) type Released = Vec<(String, u64)>;

/// Key order in the actor.
impl SubscriptionActor {
    fn key_event(&self, kind: EventKind, key: &str, now: u64) -> FailureEvent {
        let mut ev = FailureEvent::new(kind, now, &self.rec.topic, &self.rec.name);
        ev.key = Some(key.to_owned());
        ev
    }

    /// Announces events once everything written so far is durable.
    fn emit_when_durable(&self, events: Vec<FailureEvent>) {
        if events.is_empty() {
            return;
        }
        let flusher = self.deps.flusher.clone();
        let link = self.deps.link.clone();
        tokio::spawn(async move {
            if flusher.durable().await.is_ok() {
                link.emit(events);
            }
        });
    }

    /// The ready entries not to offer this round; held ones are taken out
    /// of the read-ahead (their payloads dropped). `None` without key order.
    /// The flag says whether any was taken out (the read-ahead has room).
    pub(super) fn key_order_skip(&mut self) -> (Option<HashSet<TierEntry>>, bool) {
        if self.rec.key_order.is_none() {
            return (None, false);
        }
        let mut skip = HashSet::new();
        let mut hold = Vec::new();
        let mut offered: HashSet<&str> = HashSet::new();
        let lanes = &self.key_lanes;
        for (entry, p) in &self.deliveries.ready {
            let key = p.msg.key.as_str();
            if key.is_empty() {
                continue;
            }
            let blocked = self.rec.blocked_keys.get(key);
            let lane = lanes.lanes.get(key);
            if blocked.is_some() || lane.is_some() {
                let lead = match blocked {
                    Some(b) => b.failed == *entry,
                    None => lane.is_some_and(|l| l.lead == Some(*entry)),
                };
                if !lead {
                    if entry.tier == TierId::Main {
                        hold.push((*entry, key.to_owned()));
                    } else {
                        skip.insert(*entry);
                    }
                    continue;
                }
            }
            if lanes.busy.contains_key(key) || !offered.insert(key) {
                // Waiting for an earlier message of its key: out of the
                // read-ahead too (while the held set is small), so the
                // read-ahead reads on and other keys flow; it comes back in
                // order when the key is free.
                if entry.tier == TierId::Main && lanes.held_total + hold.len() < BUSY_HOLD_CAP {
                    hold.push((*entry, key.to_owned()));
                } else {
                    skip.insert(*entry);
                }
            }
        }
        let moved = !hold.is_empty();
        for (entry, key) in hold {
            self.deliveries.ready.remove(&entry);
            self.key_lanes.hold(key, entry.entry_id);
        }
        (Some(skip), moved)
    }

    /// Blocks the keys of messages about to wait for their redelivery, and
    /// stores the record before the failures are (so a failure never
    /// survives a crash without its key's block).
    pub(super) fn block_keys(&mut self, failed: &[TierEntry], now: u64) -> Result<()> {
        if self.rec.key_order.is_none() {
            return Ok(());
        }
        let mut events = Vec::new();
        let mut changed = false;
        for &entry in failed {
            let Some(key) = self.key_lanes.key_of(entry).map(str::to_owned) else {
                continue;
            };
            match self.rec.blocked_keys.get_mut(&key) {
                Some(b) => {
                    changed |= b.failed != entry;
                    b.failed = entry;
                }
                None => {
                    self.rec.blocked_keys.insert(
                        key.clone(),
                        BlockedKey {
                            since_ms: now,
                            failed: entry,
                            failed_due_ms: None,
                        },
                    );
                    changed = true;
                    let mut ev = self.key_event(EventKind::KeyBlocked, &key, now);
                    ev.message_id = Some(self.wire_id(entry));
                    tracing::info!(topic = %self.rec.topic, sub = %self.rec.name, %key, failed = %self.wire_id(entry), "key blocked");
                    events.push(ev);
                }
            }
        }
        if changed {
            self.deps.storage.put_subscription(&self.rec)?;
            self.dirty = true;
        }
        self.emit_when_durable(events);
        Ok(())
    }

    /// A tier move about to be stored in `sub`: a key waiting for a moved
    /// message now waits for its copy in the retry tier (`to` with its due
    /// time), or is released if it was dead-lettered (`to` `None`). Returns
    /// the keys released, for [`keys_released`](Self::keys_released).
    pub(super) fn key_order_moves(
        &self,
        sub: &mut SubscriptionRecord,
        moves: &[(TierEntry, Option<(TierEntry, u64)>)],
    ) -> Released {
        let mut released = Vec::new();
        if sub.blocked_keys.is_empty() {
            return released;
        }
        for (from, to) in moves {
            let Some(key) = key_waiting_for(sub, *from) else {
                continue;
            };
            match to {
                Some((to, due)) => {
                    if let Some(b) = sub.blocked_keys.get_mut(&key) {
                        b.failed = *to;
                        b.failed_due_ms = Some(*due);
                    }
                }
                None => {
                    if let Some(b) = sub.blocked_keys.remove(&key) {
                        released.push((key, b.since_ms));
                    }
                }
            }
        }
        released
    }

    /// Announces keys released (their failed message acked or
    /// dead-lettered); their held messages are dispatched from the next
    /// round on, in order.
    pub(super) fn keys_released(&mut self, released: Released, why: &str) {
        if released.is_empty() {
            return;
        }
        let now = self.deps.clock.now_ms();
        let mut events = Vec::with_capacity(released.len());
        for (key, since) in released {
            let blocked = now.saturating_sub(since);
            tracing::info!(topic = %self.rec.topic, sub = %self.rec.name, %key, blocked_ms = blocked, held = self.key_lanes.held_of(&key), why, "key released");
            let mut ev = self.key_event(EventKind::KeyReleased, &key, now);
            ev.blocked_ms = Some(blocked);
            ev.cause = Some(why.to_owned());
            events.push(ev);
        }
        self.emit_when_durable(events);
    }

    /// `entry` is done with (acked; a move updated or released its key
    /// before): the key waiting for it is released (stored with the cursor
    /// that acks it).
    pub(super) fn key_order_settled(&mut self, entry: TierEntry) {
        if self.rec.blocked_keys.is_empty() {
            return;
        }
        let Some(key) = self.key_lanes.key_of(entry).map(str::to_owned) else {
            return;
        };
        if self.rec.blocked_keys.get(&key).map(|b| b.failed) == Some(entry) {
            let b = self.rec.blocked_keys.remove(&key);
            self.dirty = true;
            self.keys_released(b.map(|b| (key, b.since_ms)).into_iter().collect(), "acked");
        }
    }

    /// When the next key turns poison, if one can.
    pub(super) fn key_order_wake(&self) -> Option<u64> {
        let limit = self.rec.key_order.as_ref()?.poison_after?;
        let oldest = self.rec.blocked_keys.values().map(|b| b.since_ms).min()?;
        Some(
            oldest
                .saturating_add(super::intake::millis(limit))
                .max(self.key_lanes.poison_not_before),
        )
    }

    /// Once per round: keys whose failed message was acked another way
    /// (a cumulative ack) are released, poison keys dead-lettered, and each
    /// free key with held messages gets its next one loaded for dispatch.
    pub(super) async fn key_order_tick(&mut self) {
        if self.rec.blocked_keys.is_empty() && self.key_lanes.lanes.is_empty() {
            return;
        }
        let now = self.deps.clock.now_ms();
        let stale: Vec<String> = self
            .rec
            .blocked_keys
            .iter()
            .filter(|(_, b)| self.rec.is_acked(b.failed) || self.rec.key_order.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        if !stale.is_empty() {
            let released = stale
                .into_iter()
                .filter_map(|k| self.rec.blocked_keys.remove(&k).map(|b| (k, b.since_ms)))
                .collect();
            self.dirty = true;
            self.keys_released(released, "acked");
        }
        if let Some(limit) = self.rec.key_order.and_then(|k| k.poison_after)
            && now >= self.key_lanes.poison_not_before
        {
            let limit_ms = super::intake::millis(limit);
            let poison: Vec<String> = self
                .rec
                .blocked_keys
                .iter()
                .filter(|(_, b)| now.saturating_sub(b.since_ms) >= limit_ms)
                .map(|(k, _)| k.clone())
                .collect();
            for key in poison {
                if let Err(e) = self.poison(&key, now).await {
                    tracing::error!(error = %e, sub = %self.rec.name, %key, "cannot dead-letter a poison key; trying again in a second");
                    self.key_lanes.poison_not_before = now.saturating_add(1_000);
                    break;
                }
            }
        }
        self.load_leads();
    }

    /// Loads the next held message of each free key (one at a time: the
    /// key has one message out at a time anyway). Without key order (it was
    /// turned off) every held message goes back, as room allows.
    fn load_leads(&mut self) {
        let ordered = self.rec.key_order.is_some();
        let mut load = Vec::new();
        let mut room = READ_AHEAD.saturating_sub(self.deliveries.ready.len());
        let (rec, ready, in_flight) = (
            &self.rec,
            &self.deliveries.ready,
            &self.deliveries.in_flight,
        );
        let lanes = &mut self.key_lanes;
        lanes.lanes.retain(|key, lane| {
            if rec.blocked_keys.contains_key(key) {
                return true;
            }
            if ordered {
                // A lead that is neither ready nor out (it could not be
                // read) is given up.
                if let Some(l) = lane.lead {
                    if ready.contains_key(&l) || in_flight.contains_key(&l) {
                        return true;
                    }
                    lane.lead = None;
                }
                if lanes.busy.contains_key(key) {
                    return true;
                }
                while let Some(id) = lane.held.pop_first() {
                    lanes.held_total -= 1;
                    // Acked meanwhile (a cumulative ack): skipped.
                    if !rec.main.is_acked(id) {
                        lane.lead = Some(TierEntry::main(id));
                        load.push((TierEntry::main(id), None));
                        return true;
                    }
                }
                return false;
            }
            while room > 0
                && let Some(id) = lane.held.pop_first()
            {
                lanes.held_total -= 1;
                room -= 1;
                load.push((TierEntry::main(id), None));
            }
            !lane.held.is_empty()
        });
        load.retain(|(e, _)| !self.rec.is_acked(*e));
        if !load.is_empty() {
            self.load_into_ready(load);
        }
    }

    /// Dead-letters a poison key: its failed message, then what is held
    /// behind it, each with the reason.
    async fn poison(&mut self, key: &str, now: u64) -> Result<()> {
        let Some(b) = self.rec.blocked_keys.get(key).copied() else {
            return Ok(());
        };
        let blocked_for = fmt_ms(now.saturating_sub(b.since_ms));
        let failed_id = self.wire_id(b.failed);
        let held = self.key_lanes.take_held(key);
        tracing::warn!(topic = %self.rec.topic, sub = %self.rec.name, %key, failed = %failed_id, held = held.len(), %blocked_for, "poison key: dead-lettering it and its held messages");
        // The failed message first: its move releases the key.
        let mut first = Vec::new();
        if !self.rec.is_acked(b.failed) {
            let record = match self.deliveries.failures.get(&b.failed) {
                Some(r) => r.clone(),
                None => {
                    let due = self
                        .deliveries
                        .in_flight
                        .get(&b.failed)
                        .and_then(|i| i.due_ms)
                        .or(b.failed_due_ms);
                    self.deps
                        .storage
                        .failure(b.failed.of(self.rec.id), due)?
                        .unwrap_or_default()
                }
            };
            let reason = format!("poison key {key:?}: blocked for {blocked_for}");
            first.push((self.poison_failure(b.failed, &reason, now), record, reason));
        }
        let reason = format!("key {key:?} blocked by {failed_id} for {blocked_for} (poison key)");
        let mut items = first;
        let held: Vec<TierEntry> = held
            .into_iter()
            .map(TierEntry::main)
            .filter(|e| !self.rec.is_acked(*e))
            .collect();
        for e in held {
            let f = self.poison_failure(e, &reason, now);
            let mut record = FailureRecord::default();
            record.push(AttemptRecord {
                time_ms: now,
                delivery_count: 0,
                consumer: f.consumer.clone(),
                reason: f.reason,
                detail: f.detail.clone(),
            });
            items.push((f, record, reason.clone()));
        }
        let mut ev = self.key_event(EventKind::KeyPoisoned, key, now);
        ev.message_id = Some(failed_id);
        ev.blocked_ms = Some(now.saturating_sub(b.since_ms));
        ev.verdict = Some(reason);
        while !items.is_empty() {
            let rest = items.split_off(items.len().min(POISON_CHUNK));
            self.move_to_dead_letter(std::mem::replace(&mut items, rest), now)
                .await?;
        }
        self.emit_when_durable(vec![ev]);
        // Whatever happened to the failed message, the key is free now.
        if self.rec.blocked_keys.remove(key).is_some() {
            self.dirty = true;
        }
        Ok(())
    }

    fn poison_failure(&self, entry: TierEntry, reason: &str, _now: u64) -> Failure {
        // `Terminate`: the broker, not a consumer, declares them unprocessable.
        Failure {
            detail: reason.to_owned(),
            overrides: ricochet_policy::AttemptOverride::DeadLetter,
            ..Failure::new(entry, FailureReason::Terminate, "broker (key order)".into())
        }
    }

    /// Checks a key order setting: its limits, and the subscription's type.
    pub(super) fn check_key_order(&self, key_order: Option<&KeyOrder>) -> Result<()> {
        if let Some(k) = key_order {
            k.validate()
                .map_err(|e| BrokerError::InvalidArgument(e.to_string()))?;
        }
        check_type(self.rec.sub_type, key_order, &self.rec.name)
    }

    /// Sets key order (checked by [`check_key_order`](Self::check_key_order)).
    /// Turned off, blocked keys are released and held messages go back.
    pub(super) fn set_key_order(&mut self, key_order: Option<KeyOrder>) {
        if self.rec.key_order != key_order {
            self.rec.key_order = key_order;
            self.dirty = true;
        }
    }

    /// Messages held behind blocked keys (not those only waiting for a
    /// busy key), for the stats and the gauge.
    pub(super) fn held_behind_blocked(&self) -> usize {
        if self.key_lanes.lanes.len() <= self.rec.blocked_keys.len() {
            self.key_lanes
                .lanes
                .iter()
                .filter(|(k, _)| self.rec.blocked_keys.contains_key(*k))
                .map(|(_, l)| l.held.len())
                .sum()
        } else {
            self.rec
                .blocked_keys
                .keys()
                .map(|k| self.key_lanes.held_of(k))
                .sum()
        }
    }

    /// Key order's part of the stats.
    pub(super) fn key_order_stats(&self) -> Option<super::stats::KeyOrderStats> {
        self.rec.key_order?;
        let now = self.deps.clock.now_ms();
        let mut keys: Vec<_> = self.rec.blocked_keys.iter().collect();
        keys.sort_by_key(|(_, b)| b.since_ms);
        Some(super::stats::KeyOrderStats {
            blocked_keys: keys.len() as u64,
            oldest_blocked_ms: keys
                .first()
                .map_or(0, |(_, b)| now.saturating_sub(b.since_ms)),
            held_messages: self.held_behind_blocked() as u64,
            top: keys
                .into_iter()
                .take(TOP_BLOCKED)
                .map(|(k, b)| super::stats::BlockedKeyStats {
                    key: k.clone(),
                    blocked_since_ms: b.since_ms,
                    failed_id: self.wire_id(b.failed),
                    held: self.key_lanes.held_of(k) as u64,
                })
                .collect(),
        })
    }
}

/// Sleeps until wall time `at_ms` on `clock` (forever with `None`), in tokio
/// time, so a paused test clock drives it too.
pub(super) async fn sleep_until_ms(clock: &crate::clock::SharedClock, at_ms: Option<u64>) {
    match at_ms {
        Some(at) => {
            let wait = at.saturating_sub(clock.now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        None => std::future::pending().await,
    }
}
