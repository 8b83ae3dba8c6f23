//! Reading a burst before it is due: when the scheduler says schedule
//! entries are coming ([`Fired::Soon`](crate::scheduler::Fired::Soon),
//! [`PREFETCH_LEAD`](crate::scheduler::PREFETCH_LEAD) ahead), their messages
//! (and a retry's failure record) are read and decoded into a bounded
//! buffer, so that when they fire the read-ahead takes them from memory: a
//! thousand nacks due at one instant go out without a thousand storage
//! reads on the way.
//!
//! Nothing here is handed out: a prefetched message goes to the read-ahead
//! only through [`SubscriptionActor::load_due`], for a schedule entry that
//! fired with the same due time, after the same checks as any other (not
//! acked, not in flight). An entry that never fires (it left the schedule)
//! is dropped [`STALE_AFTER_MS`] after its due time, by a wake of the actor
//! of its own ([`SubscriptionActor::sweep_prefetched`]). The buffer holds at
//! most [`PREFETCH_MAX`] messages and [`PREFETCH_MAX_BYTES`] of payload;
//! what does not fit is read when it fires, as before.
//!
//! Reading ahead never holds back what is due: announced entries wait in a
//! queue and are read [`PREFETCH_STEP`] per turn of the actor, only while
//! no fired entry waits to be loaded, and one whose due time has come by
//! then is left to be read when it fires (a burst announced late, as a
//! large `reconsume_later` burst whose moves end near their due times,
//! would otherwise be read ahead while its first messages wait).

use super::EntryMap;
use super::SubscriptionActor;
use crate::storage::{FailureRecord, ScheduleKey, SubMessage, TierEntry, TierId};
use prost::Message as _;
use ricochet_proto::Message;
use std::collections::BTreeSet;

/// Most messages held read ahead of their due times.
pub(super) const PREFETCH_MAX: usize = 16_384;
/// Most payload and key bytes held read ahead of their due times.
pub(super) const PREFETCH_MAX_BYTES: usize = 16 * 1024 * 1024;
/// How long after its due time a prefetched message whose entry did not
/// fire is kept (it was acked, moved or unscheduled meanwhile).
pub(crate) const STALE_AFTER_MS: u64 = 2_000;
/// Most announced entries read ahead per turn of the actor.
pub(crate) const PREFETCH_STEP: usize = 256;

/// A message read before its schedule entry is due.
#[derive(Debug)]
pub(super) struct Early {
    pub due_ms: u64,
    /// Boxed when read, ahead of the due time, so that the fire moves a
    /// pointer into the read-ahead, not the message.
    pub msg: Box<Message>,
    /// A retry-tier message's failure record, read with it.
    pub failure: Option<FailureRecord>,
    pub bytes: usize,
}

/// Messages read ahead of their due times, by entry and by due time.
#[derive(Debug, Default)]
pub(super) struct Prefetched {
    /// Announced entries not read yet (at most [`PREFETCH_MAX`]).
    announced: std::collections::VecDeque<ScheduleKey>,
    by_entry: EntryMap<Early>,
    by_due: BTreeSet<(u64, TierEntry)>,
    bytes: usize,
}

impl Prefetched {
    /// Whether another message fits.
    fn has_room(&self) -> bool {
        self.by_entry.len() < PREFETCH_MAX && self.bytes < PREFETCH_MAX_BYTES
    }

    fn contains(&self, entry: &TierEntry) -> bool {
        self.by_entry.contains_key(entry)
    }

    pub fn insert(&mut self, entry: TierEntry, early: Early) {
        self.remove(&entry);
        self.bytes += early.bytes;
        self.by_due.insert((early.due_ms, entry));
        self.by_entry.insert(entry, early);
    }

    fn remove(&mut self, entry: &TierEntry) -> Option<Early> {
        let early = self.by_entry.remove(entry)?;
        self.by_due.remove(&(early.due_ms, *entry));
        self.bytes -= early.bytes;
        Some(early)
    }

    /// Whether a message is held for `entry`'s schedule entry due at
    /// `due_ms`.
    pub fn holds(&self, entry: &TierEntry, due_ms: u64) -> bool {
        self.by_entry.get(entry).is_some_and(|e| e.due_ms == due_ms)
    }

    /// The message prefetched for `entry`'s schedule entry due at `due_ms`
    /// (one prefetched for another due time is dropped: stale).
    pub fn take(&mut self, entry: TierEntry, due_ms: u64) -> Option<Early> {
        let early = self.remove(&entry)?;
        (early.due_ms == due_ms).then_some(early)
    }

    /// Drops what was due before `before_ms` and never fired.
    pub fn drop_stale(&mut self, before_ms: u64) {
        while let Some(&(due, entry)) = self.by_due.first() {
            if due >= before_ms {
                return;
            }
            self.remove(&entry);
        }
        if self.by_entry.is_empty() && self.by_entry.capacity() > PREFETCH_MAX / 4 {
            self.by_entry = EntryMap::default();
        }
    }

    /// When the earliest held message becomes stale (its entry did not fire
    /// [`STALE_AFTER_MS`] after its due time), if any is held.
    pub fn stale_at(&self) -> Option<u64> {
        self.by_due
            .first()
            .map(|(due, _)| due.saturating_add(STALE_AFTER_MS))
    }

    /// How many messages are held due by `until_ms`, counting up to `cap`.
    pub fn count_due_by(&self, until_ms: u64, cap: usize) -> usize {
        self.by_due
            .iter()
            .take_while(|(due, _)| *due <= until_ms)
            .take(cap)
            .count()
    }

    /// Takes out the messages held due by `until_ms`.
    pub fn take_due_by(&mut self, until_ms: u64) -> Vec<(TierEntry, Early)> {
        let mut out = Vec::new();
        while let Some(&(due, entry)) = self.by_due.first()
            && due <= until_ms
        {
            if let Some(early) = self.remove(&entry) {
                out.push((entry, early));
            }
        }
        out
    }

    /// The earliest due time held, if any.
    pub fn first_due(&self) -> Option<u64> {
        self.by_due.first().map(|(due, _)| *due)
    }

    /// How many messages are held.
    pub fn len(&self) -> usize {
        self.by_entry.len()
    }

    /// Queues announced entries to be read ahead (as many as fit).
    pub fn announce(&mut self, keys: Vec<ScheduleKey>) {
        let room = PREFETCH_MAX.saturating_sub(self.announced.len());
        self.announced.extend(keys.into_iter().take(room));
    }

    /// Whether announced entries wait to be read.
    pub fn has_announced(&self) -> bool {
        !self.announced.is_empty()
    }
}

impl SubscriptionActor {
    /// Schedule entries `keys` are due within the prefetch lead: queued to
    /// be read ahead ([`Self::prefetch_step`]).
    /// What the scheduler sent (`first`, then whatever else it has queued
    /// meanwhile), taken in one turn: fired entries are not left behind
    /// announcements of later ones, each announcement costing the actor a
    /// read-ahead step before it got to the fire.
    pub(super) fn take_fired(
        &mut self,
        first: Option<crate::scheduler::Fired>,
        fired: &mut tokio::sync::mpsc::UnboundedReceiver<crate::scheduler::Fired>,
    ) {
        let mut next = first;
        while let Some(f) = next.take() {
            match f {
                crate::scheduler::Fired::Due(keys) => {
                    let (keys, after) = gather_due(keys, fired);
                    if let Some(keys) = self.fire_staged(keys) {
                        self.on_fired(keys);
                    }
                    next = after;
                }
                crate::scheduler::Fired::Soon(keys) => {
                    self.announced(keys);
                    next = fired.try_recv().ok();
                }
            }
        }
    }

    pub(super) fn announced(&mut self, keys: Vec<ScheduleKey>) {
        tracing::trace!(target: "ricochet::burst", n = keys.len(), "actor: entries coming");
        self.deliveries.prefetched.announce(keys);
    }

    /// Drops the prefetched messages whose entries did not fire
    /// [`STALE_AFTER_MS`] after their due times (acked, moved or
    /// unscheduled meanwhile): woken by [`Prefetched::stale_at`], so an idle
    /// subscription does not keep them until its next burst.
    pub(super) fn sweep_prefetched(&mut self) {
        let now = self.deps.clock.now_ms();
        self.unstage_stale(now);
        self.deliveries
            .prefetched
            .drop_stale(now.saturating_sub(STALE_AFTER_MS).saturating_add(1));
    }

    /// Reads up to [`PREFETCH_STEP`] announced entries ahead, unless fired
    /// entries wait to be loaded; asks for another turn while more wait.
    pub(super) fn prefetch_step(&mut self) {
        if !self.deliveries.prefetched.has_announced() || !self.deliveries.due.is_empty() {
            return;
        }
        let n = self
            .deliveries
            .prefetched
            .announced
            .len()
            .min(PREFETCH_STEP);
        let keys: Vec<ScheduleKey> = self.deliveries.prefetched.announced.drain(..n).collect();
        self.prefetch(keys);
        if self.deliveries.prefetched.has_announced()
            && let Some(tx) = self.self_tx.upgrade()
        {
            let _ = tx.send(super::handle::Command::Ready(Vec::new()));
        }
    }

    /// Reads the messages of schedule entries `keys`, due within the
    /// prefetch lead, into the prefetch buffer (as many as fit); one that
    /// cannot be read is left to be read when it fires, and so is one due
    /// already or waiting elsewhere (fired, ready, in flight, acked).
    fn prefetch(&mut self, keys: Vec<ScheduleKey>) {
        let now = self.deps.clock.now_ms();
        self.deliveries
            .prefetched
            .drop_stale(now.saturating_sub(STALE_AFTER_MS));
        let mut want: Vec<(TierEntry, u64)> = Vec::new();
        for k in keys {
            let entry = k.message.entry();
            if k.due_ms <= now
                || self.rec.is_acked(entry)
                || self.deliveries.in_flight.contains_key(&entry)
                || self.deliveries.ready.contains_key(&entry)
                || self.deliveries.due.contains_key(&entry)
                || self.deliveries.prefetched.contains(&entry)
                || self.deliveries.staged.contains(&entry)
            {
                continue;
            }
            // A held nack known only in the far set gets its count now,
            // not when it fires.
            if !self.load_far_hold(k) {
                continue;
            }
            want.push((entry, k.due_ms));
        }
        for tier in [TierId::Main, TierId::Retry] {
            let batch: Vec<(TierEntry, u64)> = want
                .iter()
                .filter(|(e, _)| e.tier == tier)
                .copied()
                .collect();
            if batch.is_empty() || !self.deliveries.prefetched.has_room() {
                continue;
            }
            let room = PREFETCH_MAX - self.deliveries.prefetched.len();
            let batch = &batch[..batch.len().min(room)];
            let topic = self.tiers.topic_of(&self.rec, tier).to_owned();
            let ids: Vec<u64> = batch.iter().map(|(e, _)| e.entry_id).collect();
            let Ok(read) = self.deps.storage.read_many(&topic, &ids) else {
                continue;
            };
            tracing::trace!(target: "ricochet::burst", n = ids.len(), "actor: read ahead");
            // A retry's failure record, read together with the others of
            // the batch (they share the schedule's stored chunks); one that
            // cannot be read is read again when it fires.
            let mut failures: Vec<Option<Option<FailureRecord>>> = vec![None; batch.len()];
            if tier == TierId::Retry {
                let (at, asked): (Vec<usize>, Vec<(SubMessage, Option<u64>)>) = batch
                    .iter()
                    .enumerate()
                    .filter(|(_, (e, _))| !self.deliveries.failures.contains_key(e))
                    .map(|(i, &(e, due_ms))| (i, (e.of(self.rec.id), Some(due_ms))))
                    .unzip();
                if !asked.is_empty()
                    && let Ok(records) = self.deps.storage.failures_many(&asked)
                {
                    for (i, r) in at.into_iter().zip(records) {
                        failures[i] = Some(r);
                    }
                }
            }
            for ((&(entry, due_ms), bytes), failure) in batch.iter().zip(read).zip(failures) {
                if !self.deliveries.prefetched.has_room() {
                    break;
                }
                let Some(msg) =
                    bytes.and_then(|b| Message::decode(b.as_slice()).ok().map(Box::new))
                else {
                    continue;
                };
                let failure =
                    if tier == TierId::Retry && !self.deliveries.failures.contains_key(&entry) {
                        match failure {
                            Some(r) => r,
                            // Not read: read again when it fires.
                            None => continue,
                        }
                    } else {
                        None
                    };
                let bytes = msg.payload.len() + msg.key.len();
                self.deliveries.prefetched.insert(
                    entry,
                    Early {
                        due_ms,
                        msg,
                        failure,
                        bytes,
                    },
                );
            }
        }
    }
}

/// `keys` and the entries of every `Due` queued right behind them (pieces
/// of a burst fired meanwhile, all due now): taken as one, so that a burst
/// staged whole goes out in one send, not one per piece; what came next,
/// if anything did.
fn gather_due(
    mut keys: Vec<ScheduleKey>,
    fired: &mut tokio::sync::mpsc::UnboundedReceiver<crate::scheduler::Fired>,
) -> (Vec<ScheduleKey>, Option<crate::scheduler::Fired>) {
    loop {
        match fired.try_recv() {
            Ok(crate::scheduler::Fired::Due(more)) => keys.extend(more),
            Ok(other) => return (keys, Some(other)),
            Err(_) => return (keys, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Fired;

    fn key(id: u64) -> ScheduleKey {
        ScheduleKey {
            due_ms: 100,
            message: TierEntry::main(id).of(1),
        }
    }

    fn ids(keys: &[ScheduleKey]) -> Vec<u64> {
        keys.iter().map(|k| k.message.entry().entry_id).collect()
    }

    #[test]
    fn pieces_fired_back_to_back_are_taken_as_one() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for f in [
            Fired::Due(vec![key(2), key(3)]),
            Fired::Due(vec![key(4)]),
            Fired::Soon(vec![key(9)]),
            Fired::Due(vec![key(5)]),
        ] {
            tx.send(f).unwrap();
        }
        let (keys, after) = gather_due(vec![key(1)], &mut rx);
        assert_eq!(ids(&keys), vec![1, 2, 3, 4]);
        assert!(matches!(after, Some(Fired::Soon(k)) if ids(&k) == vec![9]));
        // The later piece waits behind the announcement.
        let (keys, after) = gather_due(Vec::new(), &mut rx);
        assert_eq!(ids(&keys), vec![5]);
        assert!(after.is_none());
    }

    fn early(due_ms: u64, bytes: usize) -> Early {
        Early {
            due_ms,
            msg: Box::default(),
            failure: None,
            bytes,
        }
    }

    #[test]
    fn a_message_is_taken_only_for_the_due_time_it_was_read_for() {
        let mut p = Prefetched::default();
        p.insert(TierEntry::main(1), early(100, 10));
        assert!(
            p.take(TierEntry::main(1), 101).is_none(),
            "another due time"
        );
        assert_eq!(p.len(), 0, "the stale one is dropped");
        p.insert(TierEntry::main(1), early(100, 10));
        assert_eq!(p.take(TierEntry::main(1), 100).unwrap().due_ms, 100);
        assert!(p.take(TierEntry::main(1), 100).is_none(), "taken once");
    }

    #[test]
    fn stale_messages_are_dropped_and_the_byte_count_follows() {
        let mut p = Prefetched::default();
        p.insert(TierEntry::main(1), early(100, 10));
        p.insert(TierEntry::retry(2), early(200, 20));
        assert_eq!(p.bytes, 30);
        p.drop_stale(150);
        assert_eq!((p.len(), p.bytes), (1, 20));
        assert!(p.contains(&TierEntry::retry(2)));
        p.drop_stale(201);
        assert_eq!((p.len(), p.bytes), (0, 0));
    }

    #[test]
    fn the_buffer_is_bounded_by_bytes() {
        let mut p = Prefetched::default();
        p.insert(TierEntry::main(1), early(100, PREFETCH_MAX_BYTES - 1));
        assert!(p.has_room());
        p.insert(TierEntry::main(2), early(100, 1));
        assert!(!p.has_room());
    }
}
