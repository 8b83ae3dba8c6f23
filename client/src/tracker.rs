//! The timer structure behind the consumer's two trackers: the *unacked*
//! tracker (ack timeout) and the *negative-ack* tracker (the policy's nack
//! delay).
//!
//! [`DelayTracker`] is a bucketed timer wheel: deadlines are rounded **up**
//! to a resolution (0.25 ms for nacks, the ack-timeout tick for unacked
//! messages) and each bucket holds the keys due at that instant, in a
//! `BTreeMap` ordered by time. A side `HashMap` holds each live key's bucket,
//! so removal (an ack) is O(1) and lazy: the key is dropped from the map and
//! its stale bucket slot is skipped when the bucket fires. Everything due is
//! popped at once ([`DelayTracker::pop_due`]), which is how the consumer
//! groups due ids into one `Redeliver` request.
//!
//! Guarantees: a key is never returned before its deadline (rounding is
//! upwards) and is returned at most once per insert. Unlike Pulsar's old
//! tracker, nothing scans all keys on a tick: the consumer sleeps until
//! [`DelayTracker::next_deadline`] and pops only due buckets.
//!
//! Memory: one map entry (the key plus a `u64` tick) and one bucket slot
//! (the key) per outstanding id, plus a `BTreeMap` node per distinct due
//! tick; [`DelayTracker::memory_estimate`] computes it from capacities. With
//! the consumer's 16-byte keys that is 74 bytes per id at 1 000 000
//! outstanding ids (84 by RSS; measured by the `client_e2e` bench), about
//! what tokio-util's `DelayQueue` plus a key map would take.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// The hasher of the tracker's maps: FxHash (`rustc-hash`). Message ids are
/// small integers the broker assigns, so SipHash's flooding resistance buys
/// nothing here and costs a third of an insert.
pub type IdBuildHasher = rustc_hash::FxBuildHasher;

/// A timer wheel of keys with deadlines, rounded up to a resolution.
#[derive(Debug)]
pub struct DelayTracker<K> {
    base: Instant,
    resolution_ns: u64,
    buckets: BTreeMap<u64, Vec<K>>,
    due: HashMap<K, u64, IdBuildHasher>,
}

impl<K: Hash + Eq + Clone> DelayTracker<K> {
    /// An empty tracker whose deadlines are rounded up to `resolution`
    /// (at least 0.1 ms).
    pub fn new(resolution: Duration) -> Self {
        let resolution_ns = u64::try_from(resolution.as_nanos())
            .unwrap_or(u64::MAX)
            .max(100_000);
        Self {
            base: Instant::now(),
            resolution_ns,
            buckets: BTreeMap::new(),
            due: HashMap::default(),
        }
    }

    /// The rounding applied to deadlines.
    pub fn resolution(&self) -> Duration {
        Duration::from_nanos(self.resolution_ns)
    }

    fn tick_of(&self, deadline: Instant) -> u64 {
        let ns = u64::try_from(deadline.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX);
        ns.div_ceil(self.resolution_ns)
    }

    fn instant_of(&self, tick: u64) -> Instant {
        let ns = tick.saturating_mul(self.resolution_ns);
        self.base
            .checked_add(Duration::from_nanos(ns))
            .unwrap_or_else(far_future)
    }

    /// Tracks `key` until `deadline` (replacing its previous deadline, if
    /// any). Returns true if the key was not tracked before.
    pub fn insert(&mut self, key: K, deadline: Instant) -> bool {
        let tick = self.tick_of(deadline);
        match self.due.insert(key.clone(), tick) {
            Some(old) if old == tick => false,
            old => {
                self.buckets.entry(tick).or_default().push(key);
                old.is_none()
            }
        }
    }

    /// Tracks `key` for `delay` from `now`.
    pub fn insert_after(&mut self, key: K, delay: Duration, now: Instant) -> bool {
        let deadline = now.checked_add(delay).unwrap_or_else(far_future);
        self.insert(key, deadline)
    }

    /// Stops tracking `key`. Returns whether it was tracked.
    pub fn remove(&mut self, key: &K) -> bool {
        self.due.remove(key).is_some()
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &K) -> bool {
        self.due.contains_key(key)
    }

    /// When `key` fires, if tracked (its deadline rounded up).
    pub fn deadline(&self, key: &K) -> Option<Instant> {
        self.due.get(key).map(|t| self.instant_of(*t))
    }

    /// Number of tracked keys.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// Forgets everything (and returns the memory).
    pub fn clear(&mut self) {
        self.buckets = BTreeMap::new();
        self.due = HashMap::default();
    }

    /// Every tracked key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.due.keys()
    }

    /// When the earliest bucket fires (it may hold only removed keys, in
    /// which case popping it returns nothing). `None` when empty.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.due.is_empty() {
            return None;
        }
        self.buckets
            .first_key_value()
            .map(|(t, _)| self.instant_of(*t))
    }

    /// Moves every key whose (rounded) deadline is at or before `now` into
    /// `out`, in deadline order. Returns how many were added.
    pub fn pop_due(&mut self, now: Instant, out: &mut Vec<K>) -> usize {
        let before = out.len();
        self.pop_due_with(now, |k, _| out.push(k));
        out.len() - before
    }

    /// Hands every key whose (rounded) deadline is at or before `now` to
    /// `f` with that deadline, in deadline order, and stops tracking it.
    pub fn pop_due_with(&mut self, now: Instant, mut f: impl FnMut(K, Instant)) {
        let elapsed =
            u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX);
        let last_due = elapsed / self.resolution_ns;
        while let Some((&tick, _)) = self.buckets.first_key_value() {
            if tick > last_due {
                break;
            }
            let Some((tick, keys)) = self.buckets.pop_first() else {
                break;
            };
            let at = self.instant_of(tick);
            for k in keys {
                if self.due.get(&k) == Some(&tick) {
                    self.due.remove(&k);
                    f(k, at);
                }
            }
        }
        if self.due.is_empty() && !self.buckets.is_empty() {
            // Only stale slots are left.
            self.buckets.clear();
        }
        if self.due.capacity() > 4096 && self.due.len() * 4 < self.due.capacity() {
            self.due.shrink_to(self.due.len() * 2);
        }
    }

    /// Approximate heap bytes held, from capacities: the key map (key,
    /// tick and one control byte per slot), the bucket vectors and one
    /// B-tree slot per bucket.
    pub fn memory_estimate(&self) -> usize {
        let map = self.due.capacity() * (std::mem::size_of::<(K, u64)>() + 1);
        let slots: usize = self
            .buckets
            .values()
            .map(|v| v.capacity() * std::mem::size_of::<K>())
            .sum();
        let tree = self.buckets.len() * (std::mem::size_of::<(u64, Vec<K>)>() + 8);
        map + slots + tree
    }
}

pub(crate) fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn never_early_and_grouped() {
        let mut t = DelayTracker::new(Duration::from_millis(1));
        let now = Instant::now();
        t.insert_after(1u64, Duration::from_millis(10), now);
        t.insert_after(2, Duration::from_millis(10), now);
        t.insert_after(3, Duration::from_millis(25), now);
        let mut out = Vec::new();
        assert_eq!(t.pop_due(now + Duration::from_millis(9), &mut out), 0);
        assert_eq!(t.next_deadline(), Some(now + Duration::from_millis(10)));
        assert_eq!(t.pop_due(now + Duration::from_millis(10), &mut out), 2);
        out.sort_unstable();
        assert_eq!(out, vec![1, 2]);
        assert_eq!(t.len(), 1);
        out.clear();
        assert_eq!(t.pop_due(now + Duration::from_secs(1), &mut out), 1);
        assert_eq!(out, vec![3]);
        assert!(t.is_empty());
        assert_eq!(t.next_deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn remove_and_reinsert() {
        let mut t = DelayTracker::new(Duration::from_millis(1));
        let now = Instant::now();
        assert!(t.insert_after("a", Duration::from_millis(5), now));
        assert!(!t.insert_after("a", Duration::from_millis(50), now));
        assert!(t.insert_after("b", Duration::from_millis(5), now));
        assert!(t.remove(&"b"));
        assert!(!t.remove(&"b"));
        let mut out = Vec::new();
        // "a" moved to 50 ms; its stale 5 ms slot and "b" are skipped.
        assert_eq!(t.pop_due(now + Duration::from_millis(10), &mut out), 0);
        assert_eq!(t.pop_due(now + Duration::from_millis(50), &mut out), 1);
        assert_eq!(out, vec!["a"]);
        // Inserting the same key twice at the same deadline fires it once.
        t.insert_after("c", Duration::from_millis(5), now);
        t.insert_after("c", Duration::from_millis(5), now);
        out.clear();
        assert_eq!(t.pop_due(now + Duration::from_secs(1), &mut out), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn coarse_resolution_rounds_up() {
        let mut t = DelayTracker::new(Duration::from_millis(100));
        let now = t.base;
        t.insert(7u32, now + Duration::from_millis(101));
        assert_eq!(t.deadline(&7), Some(now + Duration::from_millis(200)));
        let mut out = Vec::new();
        assert_eq!(t.pop_due(now + Duration::from_millis(199), &mut out), 0);
        assert_eq!(t.pop_due(now + Duration::from_millis(200), &mut out), 1);
    }

    /// 100 000 outstanding ids with spread deadlines: every live id fires
    /// exactly once, none early, removed ids never, in deadline order.
    #[tokio::test(start_paused = true)]
    async fn hundred_thousand_outstanding() {
        const N: u64 = 100_000;
        let mut t = DelayTracker::new(Duration::from_millis(1));
        let now = Instant::now();
        for i in 0..N {
            // 0..=999 ms, interleaved.
            t.insert_after((1u32, i), Duration::from_millis((i * 7919) % 1000), now);
        }
        assert_eq!(t.len(), N as usize);
        for i in (0..N).step_by(2) {
            assert!(t.remove(&(1, i)));
        }
        assert_eq!(t.len(), (N / 2) as usize);
        let per_id = t.memory_estimate() / N as usize;
        assert!(per_id < 128, "{per_id} bytes per id");
        let mut fired = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut step = now;
        while let Some(d) = t.next_deadline() {
            assert!(d >= step);
            step = d;
            let mut out = Vec::new();
            t.pop_due(step, &mut out);
            for k in &out {
                let due = now + Duration::from_millis((k.1 * 7919) % 1000);
                assert!(step >= due, "fired early");
                assert!(step - due < Duration::from_millis(1), "fired late");
                assert!(seen.insert(*k), "fired twice");
            }
            fired.extend(out);
        }
        assert_eq!(fired.len(), (N / 2) as usize);
        assert!(fired.iter().all(|k| k.1 % 2 == 1));
        assert!(t.is_empty());
    }
}
