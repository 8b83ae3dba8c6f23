//! Staging a burst for its due instant: [`STAGE_LEAD_MS`] before
//! messages read ahead of their schedule entries ([`super::prefetch`]) come
//! due, they are taken out of the prefetch buffer and built into what
//! dispatch would hand their consumer (ids and delivery counts set, in
//! dispatch order), so that when the scheduler fires their entries the
//! actor checks them and sends, rather than taking the entries in, loading
//! them into the read-ahead, assigning and building the messages then.
//!
//! Nothing staged goes out before its schedule entry fires: a staged
//! message is sent only for an entry of a [`Fired::Due`] with its due time,
//! and the scheduler never fires early. Staging changes nothing the rest of
//! the actor sees: a staged message stays held or scheduled, its consumer's
//! permits and unacked count untouched until it is sent. At the fire
//! everything dispatch would look at is checked again: the message neither
//! acked (an ack, a purge, a move to a tier) nor in flight, the same
//! consumer still the only one dispatch would hand it to, with the permits
//! and room under the unacked cap for all of them, nothing waiting ahead of
//! them (the read-ahead, fired entries, the log), no key order, no breaker.
//! Fired entries that were not staged but are read ahead for their due
//! time (a piece that fires past the lead the burst was staged with, or
//! entries scheduled after it was staged) are built at the fire and sent
//! with the staged ones, in dispatch order. If any check fails, or the fire
//! holds an entry not read ahead, the fired entries' staged messages go
//! back to the prefetch buffer and the fired entries take the ordinary way
//! (`on_fired`, `load_due`, `dispatch`); the others stay staged, checked
//! again when they fire.
//! Memory only: nothing is written, so a crash loses nothing (the schedule
//! is unchanged).
//!
//! [`Fired::Due`]: crate::scheduler::Fired::Due

use super::EntryMap;
use super::SubscriptionActor;
use super::prefetch::{Early, STALE_AFTER_MS};
use super::requests::{ConsumerEvent, ConsumerId};
use crate::storage::{FailureRecord, ScheduleKey, TierEntry, TierId};
use ricochet_proto::{Message, SubscriptionType};

/// How long before their due time messages read ahead are staged: wide
/// enough for tokio's 1 ms timer and a busy actor, short enough that few
/// acks or permit changes land in between.
pub(super) const STAGE_LEAD_MS: u64 = 5;

/// Most messages staged at once: more due within [`STAGE_LEAD_MS`] take
/// the ordinary way. In the 10 000 `reconsume_later` burst, staging several
/// thousand that then went the ordinary way all the same made rounds
/// slower (session 22), where the 1 000 burst gains. Twice the read-ahead
/// (1 000 messages; `read_ahead.rs` asserts the relation, so this module
/// need not depend on it).
pub(crate) const STAGE_MAX: usize = 2_000;

/// What is kept beside a staged message.
#[derive(Debug)]
struct Meta {
    entry: TierEntry,
    due_ms: u64,
    /// A retry-tier message's failure record, read ahead with it.
    failure: Option<FailureRecord>,
    bytes: usize,
}

/// Staged messages taken out to be sent (or put back), in dispatch order.
#[derive(Debug, Default)]
struct Taken {
    meta: Vec<Meta>,
    msgs: Vec<Message>,
}

impl Taken {
    /// Merges `built` (messages built at the fire) into these, in dispatch
    /// (entry) order.
    fn merge(self, mut built: Vec<(Meta, Message)>) -> Taken {
        built.sort_unstable_by_key(|(m, _)| m.entry);
        let n = self.meta.len() + built.len();
        let mut out = Taken {
            meta: Vec::with_capacity(n),
            msgs: Vec::with_capacity(n),
        };
        let mut a = self.meta.into_iter().zip(self.msgs).peekable();
        let mut b = built.into_iter().peekable();
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some((x, _)), Some((y, _))) if x.entry < y.entry => a.next(),
                (Some(_), None) => a.next(),
                _ => b.next(),
            };
            let Some((m, msg)) = next else {
                return out;
            };
            out.meta.push(m);
            out.msgs.push(msg);
        }
    }
}

/// Messages staged for one consumer, in dispatch order.
#[derive(Debug, Default)]
pub(super) struct Staged {
    consumer: Option<ConsumerId>,
    /// In dispatch order (by entry): the messages as they will be sent (a
    /// burst that fires whole is sent as this vector, without a copy) and,
    /// beside them, what else is kept of each. A message sent on its own
    /// (its entry fired with a part of the burst) is left empty here.
    meta: Vec<Meta>,
    msgs: Vec<Message>,
    /// Where each entry still staged is in `meta` and `msgs`.
    index: EntryMap<u32>,
    /// The earliest due time staged (ms), when staged.
    first_due_ms: Option<u64>,
    /// No staging before this (ms): an attempt that staged nothing is not
    /// made again at every turn of the actor.
    not_before_ms: u64,
    /// The earliest due time read ahead when more than [`STAGE_MAX`] were
    /// due within the lead: no attempt again (no wake, no count) until the
    /// earliest changes (a piece fired, or another message came first),
    /// since until then the count within the lead can only grow.
    over_bound_first_due: Option<u64>,
    /// Times the messages due within the lead were counted.
    #[cfg(test)]
    pub counts: u64,
    /// Messages sent as staged (not built at the fire).
    #[cfg(test)]
    pub sent_staged: u64,
    /// Sent, their in-flight entries and metrics still to be recorded
    /// (after the actor yielded to the consumer's stream): entry, due time,
    /// delivery count.
    sent: Vec<(TierEntry, u64, u32)>,
    sent_to: Option<ConsumerId>,
    /// When they fired, µs (their lateness).
    sent_at_us: u64,
}

impl Staged {
    pub fn contains(&self, entry: &TierEntry) -> bool {
        self.index.contains_key(entry)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn first_due(&self) -> Option<u64> {
        self.first_due_ms.filter(|_| !self.is_empty())
    }

    /// When to try staging next, given the earliest due time read ahead:
    /// [`STAGE_LEAD_MS`] before it, not before `not_before_ms`; never while
    /// messages are staged, nor while that earliest is the one a burst over
    /// the bound was counted at.
    fn wake_ms(&self, prefetched_first_due: Option<u64>) -> Option<u64> {
        if !self.is_empty() {
            return None;
        }
        let first = prefetched_first_due?;
        if self.over_bound_first_due == Some(first) {
            return None;
        }
        Some(first.saturating_sub(STAGE_LEAD_MS).max(self.not_before_ms))
    }

    /// The due time `entry` is staged for.
    fn due_of(&self, entry: &TierEntry) -> Option<u64> {
        let i = *self.index.get(entry)?;
        Some(self.meta[i as usize].due_ms)
    }

    /// Stages `staged` (nothing is staged).
    fn set(&mut self, mut staged: Vec<(Meta, Message)>) {
        staged.sort_unstable_by_key(|(m, _)| m.entry);
        self.first_due_ms = staged.iter().map(|(m, _)| m.due_ms).min();
        self.index = staged
            .iter()
            .enumerate()
            .map(|(i, (m, _))| (m.entry, i as u32))
            .collect();
        (self.meta, self.msgs) = staged.into_iter().unzip();
    }

    /// Takes the staged messages of `entries` out, in dispatch order.
    fn take(&mut self, entries: impl Iterator<Item = TierEntry>) -> Taken {
        let before = self.index.len();
        let mut at: Vec<u32> = entries.filter_map(|e| self.index.remove(&e)).collect();
        if self.index.is_empty() && before == self.msgs.len() {
            // The whole burst, none sent before: as staged.
            return Taken {
                meta: std::mem::take(&mut self.meta),
                msgs: std::mem::take(&mut self.msgs),
            };
        }
        at.sort_unstable();
        let mut out = Taken {
            meta: Vec::with_capacity(at.len()),
            msgs: Vec::with_capacity(at.len()),
        };
        for i in at {
            let i = i as usize;
            let m = &mut self.meta[i];
            out.meta.push(Meta {
                entry: m.entry,
                due_ms: m.due_ms,
                failure: m.failure.take(),
                bytes: m.bytes,
            });
            out.msgs.push(std::mem::take(&mut self.msgs[i]));
        }
        if self.index.is_empty() {
            self.meta = Vec::new();
            self.msgs = Vec::new();
        }
        out
    }

    /// Takes every staged message out.
    fn take_all(&mut self) -> Taken {
        let left: Vec<TierEntry> = self.index.keys().copied().collect();
        let taken = self.take(left.into_iter());
        self.consumer = None;
        taken
    }
}

impl SubscriptionActor {
    /// When to stage next: [`STAGE_LEAD_MS`] before the earliest message
    /// read ahead is due, unless messages are staged already.
    pub(super) fn stage_wake_ms(&self) -> Option<u64> {
        self.deliveries
            .staged
            .wake_ms(self.deliveries.prefetched.first_due())
    }

    /// When the prefetch buffer or the staged messages next hold a message
    /// whose entry did not fire [`STALE_AFTER_MS`] after its due time.
    pub(super) fn read_ahead_stale_at(&self) -> Option<u64> {
        let staged = self
            .deliveries
            .staged
            .first_due()
            .map(|d| d.saturating_add(STALE_AFTER_MS));
        match (self.deliveries.prefetched.stale_at(), staged) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The consumer dispatch would hand every message due now to, if it is
    /// one (and so the order and the consumer are dispatch's), with nothing
    /// waiting ahead of them.
    fn staging_target(&self) -> Option<ConsumerId> {
        if self.rec.key_order.is_some()
            || self.breaker_budget().is_some()
            || !self.deliveries.ready.is_empty()
            || !self.deliveries.due.is_empty()
            || self.read_pos < self.topic.durable_end()
        {
            return None;
        }
        match self.rec.sub_type {
            SubscriptionType::Exclusive | SubscriptionType::Failover => self.consumers.active(),
            SubscriptionType::Shared if self.consumers.len() == 1 => {
                self.consumers.iter().next().map(|c| c.id)
            }
            _ => None,
        }
    }

    /// Whether `consumer` may take `n` more messages, `retry` of them from
    /// the retry tier.
    fn has_room(&self, consumer: ConsumerId, n: usize, retry: bool) -> bool {
        self.consumers.get(consumer).is_some_and(|c| {
            c.permits as usize >= n
                && c.unacked + n <= self.deps.max_unacked_per_consumer
                && (c.retry || !retry)
        })
    }

    /// Stages the messages read ahead that are due within
    /// [`STAGE_LEAD_MS`], if their consumer has room for all of them.
    pub(super) fn stage_due(&mut self) {
        let now = self.deps.clock.now_ms();
        self.deliveries.staged.not_before_ms = now.saturating_add(1);
        if !self.deliveries.staged.is_empty() {
            return;
        }
        let Some(consumer) = self.staging_target() else {
            return;
        };
        let until = now.saturating_add(STAGE_LEAD_MS);
        #[cfg(test)]
        {
            self.deliveries.staged.counts += 1;
        }
        let n = self
            .deliveries
            .prefetched
            .count_due_by(until, STAGE_MAX + 1);
        if n > STAGE_MAX {
            self.deliveries.staged.over_bound_first_due = self.deliveries.prefetched.first_due();
            tracing::trace!(target: "ricochet::burst", n, "actor: over the staging bound");
            return;
        }
        if n == 0 || !self.has_room(consumer, n, false) {
            return;
        }
        let taken = self.deliveries.prefetched.take_due_by(until);
        let retry = taken.iter().any(|(e, _)| e.tier == TierId::Retry);
        if retry && !self.has_room(consumer, n, true) {
            for (entry, early) in taken {
                self.deliveries.prefetched.insert(entry, early);
            }
            return;
        }
        let mut staged = Vec::with_capacity(taken.len());
        for (entry, early) in taken {
            if self.rec.is_acked(entry) || self.deliveries.in_flight.contains_key(&entry) {
                // Left to the fire's ordinary way, which drops it.
                self.deliveries.prefetched.insert(entry, early);
                continue;
            }
            staged.push(self.build(entry, early));
        }
        if !staged.is_empty() {
            self.deliveries.staged.set(staged);
            self.deliveries.staged.consumer = Some(consumer);
            tracing::trace!(target: "ricochet::burst", n = self.deliveries.staged.len(), "actor: staged for the due instant");
        }
    }

    /// What dispatch would hand a consumer for `entry`, read ahead as
    /// `early` (its delivery count is set when it is sent).
    fn build(&self, entry: TierEntry, early: Early) -> (Meta, Message) {
        let mut msg = *early.msg;
        let id = self.wire_ref(entry);
        msg.id = Some(ricochet_proto::MessageId {
            topic: id.topic,
            entry_id: id.entry_id,
        });
        let meta = Meta {
            entry,
            due_ms: early.due_ms,
            failure: early.failure,
            bytes: early.bytes,
        };
        (meta, msg)
    }

    /// Puts the staged messages back into the prefetch buffer.
    pub(super) fn unstage(&mut self) {
        let taken = self.deliveries.staged.take_all();
        self.put_back(taken);
    }

    /// Puts the staged messages of `keys` back into the prefetch buffer
    /// (the others stay staged, checked again when they fire).
    fn unstage_keys(&mut self, keys: &[ScheduleKey]) {
        let taken = self
            .deliveries
            .staged
            .take(keys.iter().map(|k| k.message.entry()));
        self.put_back(taken);
        if self.deliveries.staged.is_empty() {
            self.deliveries.staged.consumer = None;
        }
    }

    fn put_back(&mut self, taken: Taken) {
        for (m, msg) in taken.meta.into_iter().zip(taken.msgs) {
            self.deliveries.prefetched.insert(
                m.entry,
                Early {
                    due_ms: m.due_ms,
                    msg: Box::new(msg),
                    failure: m.failure,
                    bytes: m.bytes,
                },
            );
        }
    }

    /// Unstages what is staged once its first entry is stale (it did not
    /// fire: acked, moved or unscheduled meanwhile); the prefetch buffer's
    /// sweep then drops it.
    pub(super) fn unstage_stale(&mut self, now_ms: u64) {
        if self
            .deliveries
            .staged
            .first_due()
            .is_some_and(|d| d.saturating_add(STALE_AFTER_MS) <= now_ms)
        {
            self.unstage();
        }
    }

    /// Sends the staged messages of fired entries `keys`, if every one of
    /// them is staged and still goes out as dispatch would send it now;
    /// otherwise unstages those of `keys` and hands `keys` back for the
    /// ordinary way.
    pub(super) fn fire_staged(&mut self, keys: Vec<ScheduleKey>) -> Option<Vec<ScheduleKey>> {
        self.finish_staged_send();
        let staged = &self.deliveries.staged;
        let Some(consumer) = staged.consumer else {
            return Some(keys);
        };
        // Fired entries not staged but read ahead for this due time (the
        // piece reaches past the lead the burst was staged with, or they
        // came after it was staged) are built now and sent with the others.
        let mut unstaged = Vec::new();
        let mut not_read = 0;
        for k in &keys {
            let e = k.message.entry();
            if staged.due_of(&e) == Some(k.due_ms) {
                continue;
            }
            if self.deliveries.prefetched.holds(&e, k.due_ms) {
                unstaged.push(*k);
            } else {
                not_read += 1;
            }
        }
        let staged_n = keys.len() - unstaged.len() - not_read;
        let retry = keys.iter().any(|k| k.message.tier == TierId::Retry);
        let declined = if not_read > 0 {
            Some("not all read ahead")
        } else if self.staging_target() != Some(consumer) {
            Some("target")
        } else if !self.has_room(consumer, keys.len(), retry) {
            Some("room")
        } else if keys.iter().any(|k| {
            let e = k.message.entry();
            self.rec.is_acked(e) || self.deliveries.in_flight.contains_key(&e)
        }) {
            Some("acked or in flight")
        } else {
            None
        };
        if let Some(why) = declined {
            tracing::trace!(
                target: "ricochet::burst",
                why,
                fired = keys.len(),
                staged_of_them = staged_n,
                still_staged = staged.len(),
                "actor: staged messages not sent, the ordinary way"
            );
            self.unstage_keys(&keys);
            return Some(keys);
        }
        tracing::trace!(target: "ricochet::burst", n = keys.len(), staged = staged_n, "actor: due entries in");
        let now_us = self.deps.clock.now_us();
        let mut taken = self
            .deliveries
            .staged
            .take(keys.iter().map(|k| k.message.entry()));
        if !unstaged.is_empty() {
            let mut built = Vec::with_capacity(unstaged.len());
            for k in unstaged {
                let entry = k.message.entry();
                if let Some(early) = self.deliveries.prefetched.take(entry, k.due_ms) {
                    built.push(self.build(entry, early));
                }
            }
            taken = taken.merge(built);
        }
        #[cfg(test)]
        {
            self.deliveries.staged.sent_staged += staged_n as u64;
        }
        let Taken { mut meta, mut msgs } = taken;
        let mut sent = Vec::with_capacity(msgs.len());
        for (m, msg) in meta.iter_mut().zip(msgs.iter_mut()) {
            if let Some(f) = m.failure.take() {
                self.deliveries.failures.entry(m.entry).or_insert(f);
            }
            msg.delivery_count = self.deliveries.delivery_count(m.entry);
            sent.push((m.entry, m.due_ms, msg.delivery_count));
        }
        if let Some(c) = self.consumers.get_mut(consumer) {
            c.permits -= msgs.len() as u32;
            c.unacked += msgs.len();
        }
        let bytes: usize = msgs.iter().map(|m| m.payload.len()).sum();
        self.metrics.dispatched.increment(msgs.len() as u64);
        self.metrics.dispatched_bytes.increment(bytes as u64);
        tracing::trace!(target: "ricochet::burst", n = msgs.len(), "actor: messages handed to a consumer's stream");
        self.consumers.send(consumer, ConsumerEvent::Messages(msgs));
        if self.deliveries.staged.is_empty() {
            self.deliveries.staged.consumer = None;
        }
        if self.rec.sub_type == SubscriptionType::Shared {
            self.dispatcher.sent_to_only_consumer();
        }
        self.deliveries.staged.sent = sent;
        self.deliveries.staged.sent_to = Some(consumer);
        self.deliveries.staged.sent_at_us = now_us;
        None
    }

    /// Whether staged messages were sent and their bookkeeping waits
    /// ([`Self::finish_staged_send`]).
    pub(super) fn staged_sent(&self) -> bool {
        self.deliveries.staged.sent_to.is_some()
    }

    /// Records the staged messages just sent as in flight, with the metrics
    /// a fire and a dispatch record; run once the consumer's stream had its
    /// turn, before the actor handles anything else.
    pub(super) fn finish_staged_send(&mut self) {
        let Some(consumer) = self.deliveries.staged.sent_to.take() else {
            return;
        };
        let now_us = self.deliveries.staged.sent_at_us;
        for (entry, due_ms, count) in std::mem::take(&mut self.deliveries.staged.sent) {
            if entry.tier == TierId::Retry {
                self.metrics.retries_fired.increment(1);
            }
            let late = now_us.saturating_sub(due_ms.saturating_mul(1000)) as f64 / 1e6;
            self.metrics.retry_lateness.record(late);
            self.metrics.delivery_count.record(f64::from(count));
            self.deliveries.sent_when_due(entry, consumer, due_ms);
        }
        self.advance_holds();
        self.deliveries
            .prefetched
            .drop_stale((now_us / 1000).saturating_sub(STALE_AFTER_MS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(ids: &[u64]) -> Staged {
        let mut s = Staged::default();
        let staged = ids
            .iter()
            .map(|&id| {
                let meta = Meta {
                    entry: TierEntry::main(id),
                    due_ms: 100 + id,
                    failure: None,
                    bytes: 0,
                };
                let msg = Message {
                    payload: format!("m{id}").into_bytes(),
                    ..Message::default()
                };
                (meta, msg)
            })
            .collect();
        s.set(staged);
        s
    }

    fn ids(taken: &Taken) -> Vec<u64> {
        let ids: Vec<u64> = taken.meta.iter().map(|m| m.entry.entry_id).collect();
        let payloads: Vec<String> = ids.iter().map(|id| format!("m{id}")).collect();
        let got: Vec<String> = taken
            .msgs
            .iter()
            .map(|m| String::from_utf8(m.payload.clone()).unwrap())
            .collect();
        assert_eq!(got, payloads, "each message beside its entry");
        ids
    }

    #[test]
    fn the_wake_skips_a_burst_over_the_bound_until_its_earliest_due_time_changes() {
        let mut s = Staged {
            not_before_ms: 97,
            ..Staged::default()
        };
        assert_eq!(s.wake_ms(None), None);
        assert_eq!(s.wake_ms(Some(100)), Some(97), "not before");
        assert_eq!(s.wake_ms(Some(110)), Some(105), "the lead");
        s.over_bound_first_due = Some(110);
        assert_eq!(s.wake_ms(Some(110)), None, "counted over the bound");
        assert_eq!(s.wake_ms(Some(111)), Some(106), "a piece fired");
        assert_eq!(s.wake_ms(Some(104)), Some(99), "another came first");
        let s = staged(&[1]);
        assert_eq!(s.wake_ms(Some(100)), None, "staged already");
    }

    #[test]
    fn staged_messages_are_taken_in_dispatch_order_whatever_order_they_fire_in() {
        let mut s = staged(&[4, 0, 3, 1, 2]);
        assert_eq!(s.first_due(), Some(100));
        let fired = [3, 1].map(TierEntry::main);
        assert_eq!(ids(&s.take(fired.into_iter())), vec![1, 3]);
        assert_eq!(s.len(), 3);
        assert!(!s.contains(&TierEntry::main(1)));
        assert_eq!(s.due_of(&TierEntry::main(1)), None);
        assert_eq!(s.due_of(&TierEntry::main(4)), Some(104));
        // Not staged: nothing taken for it.
        let fired = [2, 9, 0, 4].map(TierEntry::main);
        assert_eq!(ids(&s.take(fired.into_iter())), vec![0, 2, 4]);
        assert!(s.is_empty());
        assert_eq!(s.first_due(), None);
        // Fired whole: as staged.
        let mut s = staged(&[7, 5, 6]);
        let fired = [6, 7, 5].map(TierEntry::main);
        assert_eq!(ids(&s.take(fired.into_iter())), vec![5, 6, 7]);
        assert!(s.is_empty());
    }
}
