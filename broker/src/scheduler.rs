//! The retry scheduler: persisted due times, a near-term window in memory.
//!
//! The source of truth is the storage's schedule index, keyed by big-endian
//! due time. This task keeps only entries due before `covered` (about one
//! `window` ahead of now) in a tokio-util [`DelayQueue`], refilling from
//! storage as time advances, so millions of long delays cost disk, not memory.
//! When an entry fires it is handed to its subscription, which keeps the index
//! entry until the message is acked or moved: a crash after firing simply
//! fires it again on restart (at-least-once, never lost). An entry never fires
//! before its wall-clock due time.

use crate::storage::{ScheduleKey, Storage, SubMessage, TierId};
use crate::util::now_ms;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

/// Largest number of index entries loaded per refill step.
const REFILL_BATCH: usize = 50_000;

/// Where fired entries go: one sender per subscription id.
pub type FireSender = mpsc::UnboundedSender<Vec<ScheduleKey>>;

enum Cmd {
    Add(Vec<ScheduleKey>),
    Remove(Vec<ScheduleKey>),
    Register(u64, FireSender),
    Unregister(u64),
}

/// Scheduler counters.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Entries currently held in memory.
    pub in_memory: AtomicU64,
    /// Entries fired so far.
    pub fired: AtomicU64,
    /// Sum of lateness in microseconds (wall clock vs due time) of fired entries.
    pub lateness_us_total: AtomicU64,
}

/// Handle to the scheduler task.
#[derive(Debug, Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Cmd>,
    /// Counters.
    pub stats: Arc<SchedulerStats>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SchedulerCmd")
    }
}

impl Scheduler {
    /// Starts the task. Entries already in storage (overdue ones included)
    /// are loaded by the first refill. The task ends when `stop` is cancelled.
    pub fn start(storage: Arc<dyn Storage>, window: Duration, stop: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(SchedulerStats::default());
        let task = Task {
            storage,
            window,
            queue: DelayQueue::new(),
            keys: HashMap::new(),
            covered: None,
            covered_until_ms: 0,
            subs: HashMap::new(),
            orphans: HashMap::new(),
            stats: stats.clone(),
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = task.run(rx) => {}
                _ = stop.cancelled() => {}
            }
        });
        Self { tx, stats }
    }

    /// Tells the scheduler about entries already persisted in the index.
    pub fn add(&self, keys: Vec<ScheduleKey>) {
        if !keys.is_empty() {
            let _ = self.tx.send(Cmd::Add(keys));
        }
    }

    /// Forgets entries (already removed from the index).
    pub fn remove(&self, keys: Vec<ScheduleKey>) {
        if !keys.is_empty() {
            let _ = self.tx.send(Cmd::Remove(keys));
        }
    }

    /// Routes fired entries of subscription `sub_id` to `tx`.
    pub fn register(&self, sub_id: u64, tx: FireSender) {
        let _ = self.tx.send(Cmd::Register(sub_id, tx));
    }

    /// Stops routing to a subscription.
    pub fn unregister(&self, sub_id: u64) {
        let _ = self.tx.send(Cmd::Unregister(sub_id));
    }
}

struct Task {
    storage: Arc<dyn Storage>,
    window: Duration,
    queue: DelayQueue<ScheduleKey>,
    keys: HashMap<ScheduleKey, delay_queue::Key>,
    /// Every index entry `<= covered` is either in `queue` or has fired.
    covered: Option<ScheduleKey>,
    /// `covered`'s due time once a refill reached the end of its window.
    covered_until_ms: u64,
    subs: HashMap<u64, FireSender>,
    /// Fired entries of subscriptions not registered (yet).
    orphans: HashMap<u64, Vec<ScheduleKey>>,
    stats: Arc<SchedulerStats>,
}

/// The timer instant for a wall-clock due time, computed in microseconds: in
/// whole milliseconds the truncated "now" would add up to 1 ms on top of the
/// timer's own 1 ms rounding. `fire` re-checks against the wall clock, so
/// nothing fires early even if the two clocks drift apart.
fn deadline(due_ms: u64) -> Instant {
    let now_us = crate::util::now_us();
    Instant::now() + Duration::from_micros((due_ms * 1000).saturating_sub(now_us))
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut refill = tokio::time::interval(self.window / 4);
        refill.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => break,
                },
                Some(expired) = std::future::poll_fn(|cx| self.queue.poll_expired(cx)), if !self.queue.is_empty() => {
                    let mut fired = vec![expired.into_inner()];
                    // Take everything else that is already due in one go.
                    while let Some(more) = futures::FutureExt::now_or_never(std::future::poll_fn(|cx| self.queue.poll_expired(cx))).flatten() {
                        fired.push(more.into_inner());
                    }
                    self.fire(fired);
                }
                _ = refill.tick() => {
                    // Load the window; a backlog larger than a batch is loaded in steps.
                    while self.refill() {
                        tokio::task::yield_now().await;
                    }
                }
            }
            self.stats
                .in_memory
                .store(self.keys.len() as u64, Ordering::Relaxed);
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Add(keys) => {
                for k in keys {
                    if self.covered.is_some_and(|c| k <= c) {
                        self.insert(k);
                    }
                }
            }
            Cmd::Remove(keys) => {
                for k in keys {
                    if let Some(dk) = self.keys.remove(&k) {
                        self.queue.try_remove(&dk);
                    }
                }
            }
            Cmd::Register(id, tx) => {
                // Entries that fired before the subscription was loaded.
                if let Some(keys) = self.orphans.remove(&id) {
                    let _ = tx.send(keys);
                }
                self.subs.insert(id, tx);
            }
            Cmd::Unregister(id) => {
                self.subs.remove(&id);
                self.orphans.remove(&id);
            }
        }
    }

    fn insert(&mut self, k: ScheduleKey) {
        if !self.keys.contains_key(&k) {
            let dk = self.queue.insert_at(k, deadline(k.due_ms));
            self.keys.insert(k, dk);
        }
    }

    /// Loads the next slice of the window; true when more remains.
    fn refill(&mut self) -> bool {
        let to_ms = now_ms() + self.window.as_millis() as u64;
        if self.covered_until_ms >= to_ms {
            return false;
        }
        match self.storage.scheduled(self.covered, to_ms, REFILL_BATCH) {
            Ok(found) => {
                let more = found.len() >= REFILL_BATCH;
                for k in &found {
                    self.insert(*k);
                }
                if more {
                    self.covered = found.last().copied();
                } else {
                    let end = SubMessage {
                        sub_id: u64::MAX,
                        tier: TierId::Retry,
                        entry_id: u64::MAX,
                    };
                    self.covered = Some(ScheduleKey {
                        due_ms: to_ms - 1,
                        message: end,
                    });
                    self.covered_until_ms = to_ms;
                }
                more
            }
            Err(e) => {
                tracing::error!(error = %e, "retry scheduler cannot read its index");
                false
            }
        }
    }

    fn fire(&mut self, keys: Vec<ScheduleKey>) {
        let now_us = crate::util::now_us();
        let now = now_us / 1000;
        let mut by_sub: HashMap<u64, Vec<ScheduleKey>> = HashMap::new();
        for k in keys {
            self.keys.remove(&k);
            if k.due_ms > now {
                // The monotonic timer ran ahead of the wall clock: never fire early.
                self.insert(k);
                continue;
            }
            self.stats.fired.fetch_add(1, Ordering::Relaxed);
            self.stats
                .lateness_us_total
                .fetch_add(now_us - k.due_ms * 1000, Ordering::Relaxed);
            by_sub.entry(k.message.sub_id).or_default().push(k);
        }
        for (sub, keys) in by_sub {
            match self.subs.get(&sub) {
                Some(tx) => {
                    if tx.send(keys).is_err() {
                        self.subs.remove(&sub);
                    }
                }
                // At start-up the first refill can fire overdue entries before
                // every subscription has registered: hold them until it does.
                None => self.orphans.entry(sub).or_default().extend(keys),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::sled_store::SledStorage;

    fn key(due_ms: u64, sub_id: u64, entry_id: u64) -> ScheduleKey {
        ScheduleKey {
            due_ms,
            message: SubMessage {
                sub_id,
                tier: TierId::Retry,
                entry_id,
            },
        }
    }

    #[tokio::test]
    async fn overdue_entries_wait_for_their_subscription_to_register() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> =
            Arc::new(SledStorage::open(dir.path(), 1024, 1 << 20).unwrap());
        let overdue = key(now_ms() - 1_000, 7, 1);
        storage.put_schedule(&[(overdue, true)]).unwrap();
        let stop = CancellationToken::new();
        let scheduler = Scheduler::start(storage, Duration::from_secs(60), stop.clone());
        // Let the first refill fire it while nobody is registered.
        for _ in 0..100 {
            if scheduler.stats.fired.load(Ordering::Relaxed) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(scheduler.stats.fired.load(Ordering::Relaxed), 1);
        let (tx, mut rx) = mpsc::unbounded_channel();
        scheduler.register(7, tx);
        let got = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![overdue]);
        stop.cancel();
    }

    #[tokio::test]
    async fn entries_fire_in_due_order_and_never_early() {
        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> =
            Arc::new(SledStorage::open(dir.path(), 1024, 1 << 20).unwrap());
        let stop = CancellationToken::new();
        let scheduler = Scheduler::start(storage.clone(), Duration::from_secs(60), stop.clone());
        let (tx, mut rx) = mpsc::unbounded_channel();
        scheduler.register(1, tx);
        let now = now_ms();
        let keys: Vec<_> = (0..20)
            .map(|i| key(now + 50 + (19 - i) * 10, 1, i))
            .collect();
        storage
            .put_schedule(&keys.iter().map(|k| (*k, true)).collect::<Vec<_>>())
            .unwrap();
        // Wait for the first refill to cover the window, then announce them.
        tokio::time::sleep(Duration::from_millis(20)).await;
        scheduler.add(keys.clone());
        let mut fired = Vec::new();
        while fired.len() < 20 {
            let batch = tokio::time::timeout(Duration::from_secs(2), rx.recv())
                .await
                .unwrap()
                .unwrap();
            let at = now_ms();
            for k in batch {
                assert!(at >= k.due_ms, "fired {} ms early", k.due_ms - at);
                fired.push(k);
            }
        }
        let dues: Vec<u64> = fired.iter().map(|k| k.due_ms).collect();
        assert!(dues.windows(2).all(|w| w[0] <= w[1]), "{dues:?}");
        let unique: std::collections::HashSet<_> = fired.iter().collect();
        assert_eq!(unique.len(), 20, "each entry fires once");
        stop.cancel();
    }
}
