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
//!
//! [`PREFETCH_LEAD`] before an entry is due its subscription is told it is
//! coming ([`Fired::Soon`]), so it can read the message ahead and hand it
//! out at the due instant without a storage read; the entry then fires
//! ([`Fired::Due`]) at its due time. On the system clock the last
//! millisecond before a due time is waited out on an OS timer (a blocking
//! thread's sleep) rather than on tokio's 1 ms timer wheel, which fires
//! 1–2 ms after the instant asked for.
//!
//! An entry added with its due time in microseconds ([`Scheduler::add_at`]:
//! a nack held by the broker, whose hold runs from when its frame arrived)
//! fires at that microsecond rather than at its stored millisecond, which is
//! that time rounded up: after a restart it fires at the millisecond, later
//! but never earlier. Only memory knows the microsecond.

use crate::clock::SharedClock;
use crate::storage::{ScheduleKey, Storage, SubMessage, TierId};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

/// A hash map with the Fx hasher (keys that are not attacker-chosen).
type FxMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// Largest number of index entries loaded per refill step.
const REFILL_BATCH: usize = 50_000;

/// How long before its due time a subscription is told an entry is
/// coming ([`Fired::Soon`]): time to read a burst of messages ahead. A
/// retry-tier message costs the actor about 2.5–3.5 µs to read ahead (its
/// stored copy, its failure record, the decode), so 10 000 due at one
/// instant take some 30 ms: at 20 ms of lead (before session 19) some 4 000
/// of them were still unread when they fired and were read during the
/// drain, 1 000 per turn. 50 ms covers the prefetch buffer's bound
/// (16 384 messages) at that rate.
pub const PREFETCH_LEAD: Duration = Duration::from_millis(50);

/// What a subscription hears about its scheduled entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// Due within [`PREFETCH_LEAD`]: the messages may be read ahead, but
    /// not handed out; each comes again as [`Fired::Due`] (unless it left
    /// the schedule meanwhile).
    Soon(Vec<ScheduleKey>),
    /// Due now (never before their wall-clock due times).
    Due(Vec<ScheduleKey>),
}

/// Where fired entries go: one sender per subscription id.
pub type FireSender = mpsc::UnboundedSender<Fired>;

enum Cmd {
    Add(Vec<ScheduleKey>),
    AddAt(Vec<(ScheduleKey, u64)>),
    Remove(Vec<ScheduleKey>),
    Register(u64, FireSender),
    Unregister(u64, FireSender),
    Reload(HashSet<u64>),
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
    /// How far ahead of now the timer is loaded.
    window: Duration,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SchedulerCmd")
    }
}

impl Scheduler {
    /// Starts the task. Entries already in storage (overdue ones included)
    /// are loaded by the first refill. The task ends when `stop` is cancelled.
    pub fn start(
        storage: Arc<dyn Storage>,
        window: Duration,
        clock: SharedClock,
        stop: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(SchedulerStats::default());
        let task = Task {
            storage,
            window,
            queue: DelayQueue::new(),
            keys: FxMap::default(),
            staged: BTreeSet::new(),
            fine: FxMap::default(),
            covered: None,
            covered_until_ms: 0,
            subs: HashMap::new(),
            orphans: HashMap::new(),
            stats: stats.clone(),
            precise: clock.is_system(),
            clock,
            loading_since: Some(std::time::Instant::now()),
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = task.run(rx) => {}
                _ = stop.cancelled() => {}
            }
        });
        Self { tx, stats, window }
    }

    /// How far ahead of now entries are loaded into the timer (the
    /// `retry_window`): a subscription keeps the counts and times of its
    /// held nacks ending within about as far (the window load hook).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Tells the scheduler about entries already persisted in the index.
    pub fn add(&self, keys: Vec<ScheduleKey>) {
        if !keys.is_empty() {
            let _ = self.tx.send(Cmd::Add(keys));
        }
    }

    /// [`Self::add`], each entry due at a microsecond (`(key, due_us)`, at
    /// most `key.due_ms` in µs: the index's millisecond is the microsecond
    /// rounded up): it fires then, not at its millisecond. Once loaded
    /// again from the index (a restart) it fires at its millisecond.
    pub fn add_at(&self, keys: Vec<(ScheduleKey, u64)>) {
        if !keys.is_empty() {
            let _ = self.tx.send(Cmd::AddAt(keys));
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

    /// Stops routing to a subscription, if `tx` is still where its entries
    /// go: an actor that ends after another one of the same subscription
    /// registered (a replicated topic this broker stopped leading and leads
    /// again) leaves the newer one registered.
    pub fn unregister(&self, sub_id: u64, tx: &FireSender) {
        let _ = self.tx.send(Cmd::Unregister(sub_id, tx.clone()));
    }

    /// Forgets what memory holds of subscriptions `sub_ids` (timers, entries
    /// fired while none of them was registered) and loads their window
    /// again from the index: their schedule was written to the store
    /// without this scheduler being told (a replica applied it while another
    /// broker led their topic). Send it before they register.
    pub fn reload(&self, sub_ids: HashSet<u64>) {
        if !sub_ids.is_empty() {
            let _ = self.tx.send(Cmd::Reload(sub_ids));
        }
    }
}

struct Task {
    storage: Arc<dyn Storage>,
    window: Duration,
    /// Entries more than [`PREFETCH_LEAD`] ahead, timed to that lead.
    queue: DelayQueue<ScheduleKey>,
    /// (Fx-hashed, as `fine`: a burst stages and fires thousands of keys
    /// per turn of this task.)
    keys: FxMap<ScheduleKey, delay_queue::Key>,
    /// Entries within [`PREFETCH_LEAD`] of their due times (their
    /// subscriptions were told), by due time in µs, waiting to fire.
    staged: BTreeSet<(u64, ScheduleKey)>,
    /// The due times in µs of entries in `queue` or `staged` added with
    /// one ([`Scheduler::add_at`]); the others are due at their ms.
    fine: FxMap<ScheduleKey, u64>,
    /// Every index entry `<= covered` is either in `queue` or has fired.
    covered: Option<ScheduleKey>,
    /// `covered`'s due time once a refill reached the end of its window.
    covered_until_ms: u64,
    subs: HashMap<u64, FireSender>,
    /// Fired entries of subscriptions not registered (yet).
    orphans: HashMap<u64, Vec<ScheduleKey>>,
    stats: Arc<SchedulerStats>,
    clock: SharedClock,
    /// Whether the last millisecond before a due time is waited on an OS
    /// timer ([`sleep_until_due`]): on the system clock only (a virtual
    /// clock's time moves only through tokio's timers).
    precise: bool,
    /// Set until the first window is loaded (for its log line).
    loading_since: Option<std::time::Instant>,
}

/// The timer instant for a wall-clock due time, computed in microseconds: in
/// whole milliseconds the truncated "now" would add up to 1 ms on top of the
/// timer's own 1 ms rounding. `fire` re-checks against the wall clock, so
/// nothing fires early even if the two clocks drift apart.
fn deadline(due_ms: u64, now_us: u64) -> Instant {
    deadline_us(due_ms.saturating_mul(1000), now_us)
}

/// [`deadline`] for a due time in microseconds.
fn deadline_us(due_us: u64, now_us: u64) -> Instant {
    Instant::now() + Duration::from_micros(due_us.saturating_sub(now_us))
}

/// A wait for a due time ([`sleep_until_due`]), kept across turns.
type DueWait = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// The shortest wait left to an OS timer: below it the blocking thread's
/// wake-up costs about what it saves.
const OS_TIMER_MIN: Duration = Duration::from_micros(50);

/// Sleeps until `at`. `precise`: tokio's timer (1 ms wheel, rounded up)
/// runs to a millisecond before it, then a blocking thread sleeps the rest
/// on the OS timer (tens of µs late, no spinning); otherwise tokio's timer
/// alone (1–2 ms late on a real clock, exact on a paused one).
async fn sleep_until_due(at: Instant, precise: bool) {
    // An instant already past is not handed to the timer wheel, which
    // could hold it to its next tick.
    if !precise {
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
        return;
    }
    if let Some(coarse) = at.checked_sub(Duration::from_millis(1))
        && coarse > Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    let left = at.saturating_duration_since(Instant::now());
    if left >= OS_TIMER_MIN {
        // A detached sleep if this future is dropped: it ends within `left`.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(left)).await;
    }
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        let mut refill = tokio::time::interval(self.window / 4);
        refill.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The wait for the first staged due time, kept across turns of the
        // loop while that time stays first: commands arriving more often
        // than the wait lasts do not start it over (and would starve it).
        let mut timer: Option<(u64, DueWait)> = None;
        loop {
            // What is due goes first, whatever else keeps the loop busy.
            self.fire();
            match (self.staged.first().map(|(due_us, _)| *due_us), &timer) {
                (Some(due), Some((at, _))) if *at == due => {}
                (Some(due), _) => {
                    let at = deadline_us(due, self.clock.now_us());
                    timer = Some((due, Box::pin(sleep_until_due(at, self.precise))));
                }
                (None, _) => timer = None,
            }
            tokio::select! {
                biased;
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Reload(subs)) => self.reload(&subs).await,
                    Some(cmd) => self.command(cmd),
                    None => break,
                },
                () = async { timer.as_mut().expect("armed").1.as_mut().await }, if timer.is_some() => {
                    timer = None;
                    self.fire();
                }
                Some(expired) = std::future::poll_fn(|cx| self.queue.poll_expired(cx)), if !self.queue.is_empty() => {
                    let mut fired = vec![expired.into_inner()];
                    // Take everything else that is already due in one go.
                    // Unconstrained: under tokio's cooperative budget the
                    // queue answers Pending after 128 polls, which split a
                    // burst due at one instant into rounds of 128, each
                    // read and dispatched on its own turn of the actor.
                    while let Some(more) = futures::FutureExt::now_or_never(
                        tokio::task::coop::unconstrained(std::future::poll_fn(|cx| {
                            self.queue.poll_expired(cx)
                        })),
                    )
                    .flatten()
                    {
                        fired.push(more.into_inner());
                    }
                    self.stage(fired);
                }
                _ = refill.tick() => {
                    // Load the window; a backlog larger than a batch is loaded in steps.
                    while self.refill() {
                        tokio::task::yield_now().await;
                    }
                }
            }
            self.stats.in_memory.store(
                (self.keys.len() + self.staged.len()) as u64,
                Ordering::Relaxed,
            );
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
            Cmd::AddAt(keys) => {
                for (k, due_us) in keys {
                    if self.covered.is_some_and(|c| k <= c) {
                        self.insert(k);
                        self.refine(k, due_us);
                    }
                }
            }
            Cmd::Remove(keys) => {
                for k in keys {
                    if let Some(dk) = self.keys.remove(&k) {
                        self.queue.try_remove(&dk);
                        self.fine.remove(&k);
                    } else {
                        self.unstage(&k);
                    }
                }
            }
            Cmd::Register(id, tx) => {
                // Entries that fired before the subscription was loaded.
                if let Some(keys) = self.orphans.remove(&id) {
                    let _ = tx.send(Fired::Due(keys));
                }
                self.subs.insert(id, tx);
            }
            Cmd::Unregister(id, tx) => {
                if self.subs.get(&id).is_some_and(|t| t.same_channel(&tx)) {
                    self.subs.remove(&id);
                    self.orphans.remove(&id);
                }
            }
            Cmd::Reload(subs) => {
                // Handled by `run` (it reads the index in steps).
                let _ = subs;
            }
        }
    }

    /// [`Scheduler::reload`]: drops the timers and orphans of `subs`, then
    /// inserts every index entry of theirs up to `covered` (the refill loads
    /// the later ones as time goes), reading the index in steps.
    async fn reload(&mut self, subs: &HashSet<u64>) {
        for id in subs {
            self.orphans.remove(id);
        }
        let held: Vec<ScheduleKey> = self
            .keys
            .keys()
            .filter(|k| subs.contains(&k.message.sub_id))
            .copied()
            .collect();
        for k in held {
            if let Some(dk) = self.keys.remove(&k) {
                self.queue.try_remove(&dk);
            }
        }
        self.staged
            .retain(|(_, k)| !subs.contains(&k.message.sub_id));
        self.fine.retain(|k, _| !subs.contains(&k.message.sub_id));
        // Before the first refill step nothing is covered: the refill loads
        // them.
        let Some(covered) = self.covered else { return };
        let mut after = None;
        loop {
            let found =
                match self
                    .storage
                    .scheduled(after, covered.due_ms.saturating_add(1), REFILL_BATCH)
                {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::error!(error = %e, "retry scheduler cannot read its index");
                        return;
                    }
                };
            let more = found.len() >= REFILL_BATCH;
            after = found.last().copied();
            for k in found {
                if k <= covered && subs.contains(&k.message.sub_id) {
                    self.insert(k);
                }
            }
            if !more {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Times `k` to [`PREFETCH_LEAD`] before it is due (at once if that
    /// is past: [`Self::stage`] takes it then).
    fn insert(&mut self, k: ScheduleKey) {
        if !self.keys.contains_key(&k) && !self.staged.contains(&(self.due_us(&k), k)) {
            let lead = PREFETCH_LEAD.as_millis() as u64;
            let dk = self.queue.insert_at(
                k,
                deadline(k.due_ms.saturating_sub(lead), self.clock.now_us()),
            );
            self.keys.insert(k, dk);
        }
    }

    /// When `k` is due, in µs.
    fn due_us(&self, k: &ScheduleKey) -> u64 {
        self.fine
            .get(k)
            .copied()
            .unwrap_or_else(|| k.due_ms.saturating_mul(1000))
    }

    /// `k` (in `queue` or `staged`) is due at `due_us`.
    fn refine(&mut self, k: ScheduleKey, due_us: u64) {
        let at = self.due_us(&k);
        if self.staged.remove(&(at, k)) {
            self.staged.insert((due_us, k));
        }
        self.fine.insert(k, due_us);
    }

    /// Takes `k` out of `staged` (if there).
    fn unstage(&mut self, k: &ScheduleKey) {
        let at = self.due_us(k);
        self.staged.remove(&(at, *k));
        self.fine.remove(k);
    }

    /// Loads the next slice of the window; true when more remains.
    fn refill(&mut self) -> bool {
        let to_ms = self.clock.now_ms() + self.window.as_millis() as u64;
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
                    if let Some(since) = self.loading_since.take() {
                        tracing::info!(
                            entries = self.keys.len(),
                            took_ms = since.elapsed().as_millis() as u64,
                            "start: the retry window loaded into the timer"
                        );
                    }
                }
                more
            }
            Err(e) => {
                tracing::error!(error = %e, "retry scheduler cannot read its index");
                false
            }
        }
    }

    /// Entries within [`PREFETCH_LEAD`] of their due times: their
    /// subscriptions are told ([`Fired::Soon`]) and they wait in `staged`
    /// for [`Self::fire`].
    fn stage(&mut self, keys: Vec<ScheduleKey>) {
        let mut by_sub: HashMap<u64, Vec<ScheduleKey>> = HashMap::new();
        for k in keys {
            self.keys.remove(&k);
            if self.staged.insert((self.due_us(&k), k)) {
                by_sub.entry(k.message.sub_id).or_default().push(k);
            }
        }
        for (sub, keys) in by_sub {
            // Not registered (yet): it reads them when they fire.
            if let Some(tx) = self.subs.get(&sub)
                && tx.send(Fired::Soon(keys)).is_err()
            {
                self.subs.remove(&sub);
            }
        }
    }

    /// Hands the staged entries due by the wall clock to their
    /// subscriptions ([`Fired::Due`]); later ones stay staged.
    fn fire(&mut self) {
        let now_us = self.clock.now_us();
        // Per subscription: the first one's due time (µs), the keys.
        let mut by_sub: HashMap<u64, (u64, Vec<ScheduleKey>)> = HashMap::new();
        // Counted once per call, not per entry.
        let (mut fired, mut lateness_us) = (0u64, 0u64);
        // The monotonic timer may run ahead of the wall clock: never fire early.
        while let Some((at, k)) = self.staged.pop_first() {
            if at > now_us {
                self.staged.insert((at, k));
                break;
            }
            self.fine.remove(&k);
            fired += 1;
            lateness_us = lateness_us.saturating_add(now_us.saturating_sub(at));
            by_sub
                .entry(k.message.sub_id)
                .or_insert_with(|| (at, Vec::new()))
                .1
                .push(k);
        }
        if fired > 0 {
            self.stats.fired.fetch_add(fired, Ordering::Relaxed);
            self.stats
                .lateness_us_total
                .fetch_add(lateness_us, Ordering::Relaxed);
        }
        for (sub, (first_at, keys)) in by_sub {
            tracing::trace!(
                target: "ricochet::burst",
                n = keys.len(),
                late_us = now_us.saturating_sub(first_at),
                "scheduler: due entries fired"
            );
            match self.subs.get(&sub) {
                Some(tx) => {
                    if tx.send(Fired::Due(keys)).is_err() {
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
mod tests;
