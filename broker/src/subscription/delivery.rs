//! Where each of a subscription's messages stands, in memory: ready to be
//! dispatched, fired by the scheduler but not yet loaded, in flight with a
//! consumer, and the failure records of messages that failed before.
//!
//! The persisted truth is the cursors, the failure records and the schedule
//! in storage; this is the working set the actor dispatches from.

use super::requests::{ConsumerId, MessageState};
use crate::storage::{FailureRecord, TierEntry, TierId};
use ricochet_proto::Message;
use std::collections::{BTreeMap, HashMap};

use super::EntryMap;

/// A message ready to be dispatched. Its message is boxed: the read-ahead
/// is a B-tree taken from the front, and a removal there shifts the node's
/// other values, which were some 200 B each unboxed (a burst of 1 000 moved
/// about 2 MB through `memmove` on its way out).
#[derive(Debug)]
pub(super) struct Pending {
    pub msg: Box<Message>,
    /// Its schedule entry's due time, if it came from the schedule.
    pub due_ms: Option<u64>,
}

/// A message out with a consumer.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub consumer: ConsumerId,
    /// Key_Shared: the key bucket it counts against.
    pub bucket: Option<u16>,
    /// Its schedule entry's due time (kept until it is acked or moved).
    pub due_ms: Option<u64>,
}

/// The in-memory working set of one subscription.
#[derive(Debug, Default)]
pub(super) struct Deliveries {
    /// Loaded and ready, in dispatch order (main tier first, then by id).
    pub ready: BTreeMap<TierEntry, Pending>,
    /// Fired schedule entries not yet loaded into `ready`, with due times.
    pub due: BTreeMap<TierEntry, u64>,
    pub in_flight: EntryMap<InFlight>,
    /// Failure records of main-tier messages (all but the held ones) and
    /// of retry-tier ones loaded for dispatch.
    pub failures: EntryMap<FailureRecord>,
    /// Main-tier messages nacked with a delay the broker serves, with their
    /// delivery counts: their failure records stay in storage only (read
    /// when they fail again or are inspected), so a parked nack costs a
    /// small map entry in memory, not a record with its attempt history.
    /// An entry stays until the message is settled or fails again.
    pub held: HeldNacks,
    /// In-flight messages whose client-held nack was counted ahead
    /// (`FailedDelivery.ahead`): the record stored then, and the one
    /// before it (the base if the message fails another way instead).
    pub counted: EntryMap<Counted>,
    /// The last [`Counted::seq`] handed out.
    pub counted_seq: u64,
    /// Messages of schedule entries about to fire, read ahead of their due
    /// times ([`super::prefetch`]).
    pub prefetched: super::prefetch::Prefetched,
    /// Messages read ahead and built for their consumer just before their
    /// due time ([`super::stage`]).
    pub staged: super::stage::Staged,
}

/// A nack counted ahead of its redelivery.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The record before the nack.
    pub before: FailureRecord,
    /// The record with the nack's attempt, stored when it was counted.
    pub after: FailureRecord,
    /// Which counting this is (an entry may be counted again after a
    /// redelivery), so a late flush report marks only its own.
    pub seq: u64,
    /// Whether `after` is known to be durable.
    pub durable: bool,
}

/// What memory keeps of a nack the broker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Its delivery count (failures so far).
    pub count: u32,
    /// When the hold ends, ms since the epoch.
    pub until_ms: u64,
}

impl Deliveries {
    /// Records a message of a schedule entry due at `due_ms` as sent to
    /// `consumer` (a staged one, [`super::stage`]: no key bucket).
    pub fn sent_when_due(&mut self, entry: TierEntry, consumer: ConsumerId, due_ms: u64) {
        let sent = InFlight {
            consumer,
            bucket: None,
            due_ms: Some(due_ms),
        };
        self.in_flight.insert(entry, sent);
    }

    /// Whether a message was ever handed out, so an ack or a failure for it
    /// makes sense: in flight, acked, or failed before (it then has a
    /// failure record and may be waiting for its redelivery).
    pub fn was_delivered(&self, entry: TierEntry, acked: bool) -> bool {
        acked
            || self.in_flight.contains_key(&entry)
            || self.failures.contains_key(&entry)
            || self.held.contains_key(&entry)
    }

    /// The entries `consumer` holds.
    pub fn held(&self, consumer: ConsumerId) -> Vec<(TierEntry, InFlight)> {
        self.in_flight
            .iter()
            .filter(|(_, f)| f.consumer == consumer)
            .map(|(k, f)| (*k, *f))
            .collect()
    }

    /// The delivery count a message goes out with: its failures so far.
    pub fn delivery_count(&self, entry: TierEntry) -> u32 {
        match self.failures.get(&entry) {
            Some(r) => r.count,
            None => self.held.get(&entry).map_or(0, |h| h.count),
        }
    }

    /// Forgets a message waiting for (re)delivery; its schedule due time if
    /// it was waiting for one.
    pub fn unqueue(&mut self, entry: TierEntry) -> Option<u64> {
        let from_ready = self.ready.remove(&entry).and_then(|p| p.due_ms);
        let from_due = self.due.remove(&entry);
        from_ready.or(from_due)
    }

    /// Where main-topic entry `entry_id` stands at `now_ms`, given its
    /// cursor state and how far the read-ahead has read.
    pub fn state_of(&self, entry_id: u64, acked: bool, read_pos: u64, now_ms: u64) -> MessageState {
        let entry = TierEntry::main(entry_id);
        // A held nack is scheduled until its hold fires (then it is due or ready).
        let fired = self.ready.contains_key(&entry) || self.due.contains_key(&entry);
        let held = ((self.held.get(&entry).is_some_and(|h| h.until_ms > now_ms)
            || self.held.is_far(&entry))
            && !fired)
            || self
                .failures
                .get(&entry)
                .is_some_and(|r| r.hold_until_ms > now_ms);
        if self.in_flight.contains_key(&entry) {
            MessageState::InFlight
        } else if acked {
            MessageState::Acked
        } else if held {
            MessageState::Scheduled
        } else if self.ready.contains_key(&entry)
            || entry_id >= read_pos
            || self.failures.contains_key(&entry)
            || self.held.contains_key(&entry)
        {
            MessageState::Pending
        } else {
            MessageState::Scheduled
        }
    }

    /// Gives memory back once a burst has drained: a map never shrinks by
    /// itself, so one burst of `max_unacked_per_consumer` messages in
    /// flight (or failed) would otherwise keep its table for the life of
    /// the subscription. A map is shrunk when it holds under a quarter of
    /// its capacity, to twice what it holds, so a map that grows and
    /// shrinks by turns is reallocated at most once per halving.
    pub fn shrink(&mut self) {
        shrink_map(&mut self.in_flight);
        shrink_map(&mut self.failures);
        self.held.shrink();
        shrink_map(&mut self.counted);
    }

    /// In-flight main-tier entries up to and including `through`.
    pub fn in_flight_through(&self, through: u64) -> Vec<TierEntry> {
        self.in_flight
            .keys()
            .filter(|e| e.tier == TierId::Main && e.entry_id <= through)
            .copied()
            .collect()
    }
}

/// Main-tier messages under a nack the broker holds: entry id → [`Held`].
///
/// A subscription can hold millions of them (one per parked nack). Only
/// the holds ending by [`HeldNacks::horizon_ms`] (about one retry window
/// ahead) are kept with their counts and times, each in one 16-byte slot of
/// a hash table: the entry id, and the count and hold end packed into one
/// word ([`pack`]); a count or time too large to pack (a count over a
/// million, a time past the year 2527) goes to a second, unpacked table,
/// so nothing is rounded. The rest are only members of a compressed bitmap
/// (`far`, a few bits per entry for runs of nacked ids): their counts and
/// holds stay in storage, and are loaded (see [`HeldNacks::promote`]) when
/// their hold comes into the window or when their schedule entry fires,
/// before they can be dispatched.
#[derive(Debug)]
pub(super) struct HeldNacks {
    packed: HashMap<u64, u64, rustc_hash::FxBuildHasher>,
    wide: HashMap<u64, Held, rustc_hash::FxBuildHasher>,
    /// Held, ending after `horizon_ms`: count and hold in storage only.
    far: roaring::RoaringTreemap,
    /// Every hold ending at or before this is in `packed` or `wide`.
    horizon_ms: u64,
}

impl Default for HeldNacks {
    /// Everything in memory (no horizon) until one is set.
    fn default() -> Self {
        Self {
            packed: HashMap::default(),
            wide: HashMap::default(),
            far: roaring::RoaringTreemap::new(),
            horizon_ms: u64::MAX,
        }
    }
}

/// Bits of a packed slot that hold the hold's end (ms since the epoch).
const UNTIL_BITS: u32 = 44;

/// `held` in one word, `None` when a field does not fit.
fn pack(held: Held) -> Option<u64> {
    (held.until_ms >> UNTIL_BITS == 0 && u64::from(held.count) >> (64 - UNTIL_BITS) == 0)
        .then(|| u64::from(held.count) << UNTIL_BITS | held.until_ms)
}

fn unpack(word: u64) -> Held {
    Held {
        count: (word >> UNTIL_BITS) as u32,
        until_ms: word & ((1 << UNTIL_BITS) - 1),
    }
}

impl HeldNacks {
    /// Records (or replaces) the hold of main-tier message `entry`: with
    /// its count and time if it ends by the horizon, else as a member of
    /// the far set only (its record, stored with the hold, has the rest).
    /// An entry of another tier is never held (a retry-tier message waits
    /// in its schedule) and is ignored.
    pub fn insert(&mut self, entry: TierEntry, held: Held) {
        debug_assert_eq!(entry.tier, TierId::Main, "only main-tier nacks are held");
        if entry.tier != TierId::Main {
            return;
        }
        let id = entry.entry_id;
        if held.until_ms > self.horizon_ms {
            self.packed.remove(&id);
            self.wide.remove(&id);
            self.far.insert(id);
            return;
        }
        self.far.remove(id);
        self.insert_near(id, held);
    }

    fn insert_near(&mut self, id: u64, held: Held) {
        match pack(held) {
            Some(word) => {
                self.wide.remove(&id);
                self.packed.insert(id, word);
            }
            None => {
                self.packed.remove(&id);
                self.wide.insert(id, held);
            }
        }
    }

    /// Adds entries held past the horizon, known by id only (their counts
    /// and holds in storage), as a subscription's start reads them; before
    /// the start inserts the holds it keeps in memory.
    pub fn add_far(&mut self, far: roaring::RoaringTreemap) {
        if self.far.is_empty() {
            self.far = far;
        } else {
            self.far |= far;
        }
    }

    /// Makes room for `n` more holds in memory (of counts and times that
    /// pack, as all but the rarest do), so a start that inserts them one by
    /// one does not regrow the table.
    pub fn reserve(&mut self, n: usize) {
        self.packed.reserve(n);
    }

    /// The hold end up to which holds are kept with their counts and times.
    pub fn horizon_ms(&self) -> u64 {
        self.horizon_ms
    }

    /// Moves the horizon to `to_ms` (never back). The caller loads the
    /// holds ending up to it first ([`Self::promote`]).
    pub fn set_horizon(&mut self, to_ms: u64) {
        if self.horizon_ms == u64::MAX || to_ms > self.horizon_ms {
            self.horizon_ms = to_ms;
        }
    }

    /// Loads the count and hold of far entry `entry_id`, read from its
    /// stored record; false (and nothing changed) if it is not in the far
    /// set (settled meanwhile, or already loaded).
    pub fn promote(&mut self, entry_id: u64, held: Held) -> bool {
        if !self.far.remove(entry_id) {
            return false;
        }
        self.insert_near(entry_id, held);
        true
    }

    /// Whether `entry` is held with its count and time in storage only.
    pub fn is_far(&self, entry: &TierEntry) -> bool {
        entry.tier == TierId::Main && self.far.contains(entry.entry_id)
    }

    /// Whether any hold is kept in the far set.
    pub fn has_far(&self) -> bool {
        !self.far.is_empty()
    }

    /// The hold of `entry`, if it is held and ends by the horizon (a far
    /// one is [`Self::is_far`]).
    pub fn get(&self, entry: &TierEntry) -> Option<Held> {
        if entry.tier != TierId::Main {
            return None;
        }
        let id = entry.entry_id;
        self.packed
            .get(&id)
            .map(|w| unpack(*w))
            .or_else(|| self.wide.get(&id).copied())
    }

    /// Whether `entry` is held (near or far).
    pub fn contains_key(&self, entry: &TierEntry) -> bool {
        self.get(entry).is_some() || self.is_far(entry)
    }

    /// Forgets the hold of `entry`; whether it was held.
    pub fn remove(&mut self, entry: &TierEntry) -> bool {
        if entry.tier != TierId::Main {
            return false;
        }
        let id = entry.entry_id;
        let near = self.packed.remove(&id).is_some() | self.wide.remove(&id).is_some();
        self.far.remove(id) | near
    }

    /// Every held entry, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = TierEntry> + '_ {
        self.packed
            .keys()
            .chain(self.wide.keys())
            .copied()
            .chain(self.far.iter())
            .map(TierEntry::main)
    }

    /// How many are held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.packed.len() + self.wide.len() + self.far.len() as usize
    }

    /// Shrinks the in-memory tables (see [`Deliveries::shrink`]).
    fn shrink(&mut self) {
        shrink_map(&mut self.packed);
        shrink_map(&mut self.wide);
    }
}

/// Capacity under which a map is left alone (its table is small).
const SHRINK_ABOVE: usize = 1_024;

fn shrink_map<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > SHRINK_ABOVE && map.len() < map.capacity() / 4 {
        map.shrink_to((map.len() * 2).max(SHRINK_ABOVE / 2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Deliveries {
        fn state_of_at(&self, entry_id: u64, acked: bool, read_pos: u64) -> MessageState {
            self.state_of(entry_id, acked, read_pos, 0)
        }
    }

    #[test]
    fn drained_maps_give_their_memory_back() {
        let mut d = Deliveries::default();
        let flight = InFlight {
            consumer: 1,
            bucket: None,
            due_ms: None,
        };
        for i in 0..50_000 {
            d.in_flight.insert(TierEntry::main(i), flight);
            d.failures
                .insert(TierEntry::retry(i), FailureRecord::default());
        }
        d.shrink();
        assert!(d.in_flight.capacity() >= 50_000, "a full map is kept");
        for i in 0..49_990 {
            d.in_flight.remove(&TierEntry::main(i));
            d.failures.remove(&TierEntry::retry(i));
        }
        d.shrink();
        assert!(
            d.in_flight.capacity() <= SHRINK_ABOVE,
            "{}",
            d.in_flight.capacity()
        );
        assert!(
            d.failures.capacity() <= SHRINK_ABOVE,
            "{}",
            d.failures.capacity()
        );
        // What is left is kept.
        assert_eq!(d.in_flight.len(), 10);
        assert!(d.in_flight.contains_key(&TierEntry::main(49_995)));
        assert_eq!(d.failures.len(), 10);
    }

    #[test]
    fn held_nacks_keep_counts_and_times_exactly_packed_or_not() {
        let mut h = HeldNacks::default();
        let now = 1_764_000_000_000; // Late 2025, in ms.
        let cases = [
            (
                1,
                Held {
                    count: 1,
                    until_ms: now,
                },
            ),
            (
                2,
                Held {
                    count: (1 << 20) - 1,
                    until_ms: (1 << UNTIL_BITS) - 1,
                },
            ),
            // Too large to pack: kept whole in the second table.
            (
                3,
                Held {
                    count: 1 << 20,
                    until_ms: now,
                },
            ),
            (
                4,
                Held {
                    count: u32::MAX,
                    until_ms: u64::MAX,
                },
            ),
            (
                5,
                Held {
                    count: 0,
                    until_ms: 1 << UNTIL_BITS,
                },
            ),
        ];
        for (id, held) in cases {
            h.insert(TierEntry::main(id), held);
        }
        assert_eq!(h.len(), 5);
        assert_eq!((h.packed.len(), h.wide.len()), (2, 3));
        for (id, held) in cases {
            assert_eq!(h.get(&TierEntry::main(id)), Some(held), "{id}");
        }
        // Replaced across the two tables, never in both.
        h.insert(
            TierEntry::main(3),
            Held {
                count: 2,
                until_ms: now,
            },
        );
        h.insert(
            TierEntry::main(1),
            Held {
                count: u32::MAX,
                until_ms: now,
            },
        );
        assert_eq!(h.len(), 5);
        assert_eq!(
            h.get(&TierEntry::main(3)),
            Some(Held {
                count: 2,
                until_ms: now
            })
        );
        assert_eq!(h.get(&TierEntry::main(1)).map(|x| x.count), Some(u32::MAX));
        // Another tier is never held.
        assert_eq!(h.get(&TierEntry::retry(2)), None);
        assert!(!h.remove(&TierEntry::retry(2)));
        let mut keys: Vec<u64> = h.keys().map(|e| e.entry_id).collect();
        keys.sort_unstable();
        assert_eq!(keys, [1, 2, 3, 4, 5]);
        assert!(h.remove(&TierEntry::main(4)));
        assert!(!h.contains_key(&TierEntry::main(4)));
        assert_eq!(h.len(), 4);
    }

    #[test]
    fn holds_beyond_the_horizon_are_only_members_until_loaded() {
        let mut h = HeldNacks::default();
        let held = |count, until_ms| Held { count, until_ms };
        h.set_horizon(1_000);
        h.insert(TierEntry::main(1), held(1, 900));
        h.insert(TierEntry::main(2), held(3, 5_000));
        h.insert(TierEntry::main(3), held(1, 1_000));
        // Inside: count and time in memory; beyond: held, nothing else.
        assert_eq!(h.get(&TierEntry::main(1)), Some(held(1, 900)));
        assert_eq!(h.get(&TierEntry::main(3)), Some(held(1, 1_000)));
        assert_eq!(h.get(&TierEntry::main(2)), None);
        assert!(h.contains_key(&TierEntry::main(2)) && h.is_far(&TierEntry::main(2)));
        assert!(!h.is_far(&TierEntry::main(1)) && h.has_far());
        assert_eq!((h.packed.len(), h.far.len()), (2, 1));
        // Every held entry is listed, near or far.
        let mut keys: Vec<u64> = h.keys().map(|e| e.entry_id).collect();
        keys.sort_unstable();
        assert_eq!(keys, [1, 2, 3]);
        // The horizon never goes back.
        h.set_horizon(6_000);
        h.set_horizon(10);
        assert_eq!(h.horizon_ms(), 6_000);
        // Loaded from its stored record once it comes into the window.
        assert!(h.promote(2, held(3, 5_000)));
        assert!(!h.promote(2, held(9, 9)), "loaded once");
        assert!(!h.promote(7, held(1, 1)), "never held");
        assert_eq!(h.get(&TierEntry::main(2)), Some(held(3, 5_000)));
        assert!(!h.has_far());
        // A re-hold beyond the horizon drops the old count and time, and a
        // removal forgets it wherever it is.
        h.insert(TierEntry::main(1), held(2, 7_000));
        assert_eq!(h.get(&TierEntry::main(1)), None);
        assert!(h.is_far(&TierEntry::main(1)));
        assert!(h.remove(&TierEntry::main(1)));
        assert!(!h.contains_key(&TierEntry::main(1)));
        assert!(!h.remove(&TierEntry::main(1)));
        assert_eq!(h.len(), 2);
        // Without a horizon (the default) everything is kept in memory.
        let mut all = HeldNacks::default();
        all.insert(TierEntry::main(1), held(1, u64::MAX));
        assert_eq!(all.get(&TierEntry::main(1)), Some(held(1, u64::MAX)));
    }

    #[test]
    fn states_of_main_topic_messages() {
        let mut d = Deliveries::default();
        d.in_flight.insert(
            TierEntry::main(1),
            InFlight {
                consumer: 1,
                bucket: None,
                due_ms: None,
            },
        );
        d.ready.insert(
            TierEntry::main(2),
            Pending {
                msg: Box::default(),
                due_ms: None,
            },
        );
        d.failures
            .insert(TierEntry::main(3), FailureRecord::default());
        let read_pos = 10;
        assert_eq!(d.state_of_at(1, false, read_pos), MessageState::InFlight);
        assert_eq!(d.state_of_at(2, false, read_pos), MessageState::Pending);
        assert_eq!(
            d.state_of_at(3, false, read_pos),
            MessageState::Pending,
            "awaiting redelivery"
        );
        assert_eq!(d.state_of_at(4, true, read_pos), MessageState::Acked);
        assert_eq!(
            d.state_of_at(5, false, read_pos),
            MessageState::Scheduled,
            "read past, not ready: delayed"
        );
        assert_eq!(
            d.state_of_at(12, false, read_pos),
            MessageState::Pending,
            "not read yet"
        );
    }

    #[test]
    fn unqueue_reports_a_schedule_entry_from_either_queue() {
        let mut d = Deliveries::default();
        d.ready.insert(
            TierEntry::retry(1),
            Pending {
                msg: Box::default(),
                due_ms: Some(50),
            },
        );
        d.due.insert(TierEntry::retry(2), 60);
        d.ready.insert(
            TierEntry::main(3),
            Pending {
                msg: Box::default(),
                due_ms: None,
            },
        );
        assert_eq!(d.unqueue(TierEntry::retry(1)), Some(50));
        assert_eq!(d.unqueue(TierEntry::retry(2)), Some(60));
        assert_eq!(d.unqueue(TierEntry::main(3)), None);
        assert!(d.ready.is_empty() && d.due.is_empty());
    }
}
