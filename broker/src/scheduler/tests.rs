//! The scheduler's tests: on tokio's paused clock (due order, bursts,
//! the window, reloads, removal), on the system clock (never early), and
//! the microsecond due times of [`Scheduler::add_at`].

use super::*;
use crate::clock::{Clock, TokioClock};
use crate::storage::MemoryStorage;
use crate::storage::prelude::*;

const WINDOW: Duration = Duration::from_secs(60);

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

/// A scheduler over an in-memory store, on tokio's (paused) clock.
fn start() -> (
    Scheduler,
    Arc<MemoryStorage>,
    Arc<TokioClock>,
    CancellationToken,
) {
    let storage = Arc::new(MemoryStorage::new());
    let clock = Arc::new(TokioClock::starting_at_us(1_700_000_000_000_000));
    let stop = CancellationToken::new();
    let s = Scheduler::start(storage.clone(), WINDOW, clock.clone(), stop.clone());
    (s, storage, clock, stop)
}

/// The next entries fired as due, past those announced as coming.
async fn due(rx: &mut mpsc::UnboundedReceiver<Fired>) -> Vec<ScheduleKey> {
    loop {
        match rx.recv().await.expect("registered") {
            Fired::Due(keys) => return keys,
            Fired::Soon(_) => {}
        }
    }
}

fn persist(storage: &MemoryStorage, keys: &[ScheduleKey]) {
    storage
        .put_schedule(&keys.iter().map(|k| (*k, true)).collect::<Vec<_>>())
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn overdue_entries_wait_for_their_subscription_to_register() {
    let (scheduler, storage, clock, stop) = start();
    let overdue = key(clock.now_ms() - 1_000, 7, 1);
    persist(&storage, &[overdue]);
    // Let the first refill fire it while nobody is registered.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(scheduler.stats.fired.load(Ordering::Relaxed), 1);
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(7, tx);
    assert_eq!(due(&mut rx).await, vec![overdue]);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn entries_fire_in_due_order_at_their_due_time_never_early() {
    let (scheduler, storage, clock, stop) = start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(1, tx);
    let now = clock.now_ms();
    let keys: Vec<_> = (0..20)
        .map(|i| key(now + 50 + (19 - i) * 10, 1, i))
        .collect();
    persist(&storage, &keys);
    // Announced after the first refill covered the window.
    tokio::time::sleep(Duration::from_millis(1)).await;
    scheduler.add(keys.clone());
    let mut fired = Vec::new();
    while fired.len() < 20 {
        let batch = due(&mut rx).await;
        let at = clock.now_us();
        for k in batch {
            assert!(
                at >= k.due_ms * 1000,
                "fired {} us early",
                k.due_ms * 1000 - at
            );
            assert!(
                at - k.due_ms * 1000 <= 1_000,
                "fired {} us late",
                at - k.due_ms * 1000
            );
            fired.push(k);
        }
    }
    let dues: Vec<u64> = fired.iter().map(|k| k.due_ms).collect();
    assert!(dues.windows(2).all(|w| w[0] <= w[1]), "{dues:?}");
    let unique: std::collections::HashSet<_> = fired.iter().collect();
    assert_eq!(unique.len(), 20, "each entry fires once");
    stop.cancel();
}

/// A burst due at one instant reaches its subscription as one batch,
/// however large (tokio's cooperative budget once cut it into rounds
/// of 128, each a turn of the actor: a read and a dispatch each).
#[tokio::test(start_paused = true)]
async fn a_burst_due_at_one_instant_fires_as_one_batch() {
    let (scheduler, storage, clock, stop) = start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(1, tx);
    let due_ms = clock.now_ms() + 100;
    let keys: Vec<_> = (0..1000).map(|i| key(due_ms, 1, i)).collect();
    persist(&storage, &keys);
    tokio::time::sleep(Duration::from_millis(1)).await;
    scheduler.add(keys);
    let batch = due(&mut rx).await;
    assert_eq!(batch.len(), 1000, "one batch, not rounds");
    stop.cancel();
}

/// Only the next `WINDOW` of the schedule is held in memory; an entry
/// hours away is loaded when its window comes, and fires on time.
#[tokio::test(start_paused = true)]
async fn far_entries_stay_in_storage_until_their_window() {
    let (scheduler, storage, clock, stop) = start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(3, tx);
    let now = clock.now_ms();
    let near = key(now + 5_000, 3, 1);
    let hours: Vec<_> = (0..1_000)
        .map(|i| key(now + 2 * 3_600_000 + i, 3, 100 + i))
        .collect();
    persist(&storage, &[near]);
    persist(&storage, &hours);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        scheduler.stats.in_memory.load(Ordering::Relaxed),
        1,
        "only the near entry"
    );
    assert_eq!(due(&mut rx).await, vec![near]);
    assert_eq!(
        clock.now_ms(),
        near.due_ms,
        "fired at its due time on the virtual clock"
    );
    let mut got = 0;
    while got < hours.len() {
        let batch = due(&mut rx).await;
        for k in &batch {
            assert!(clock.now_ms() >= k.due_ms);
        }
        got += batch.len();
    }
    assert!(clock.now_ms() >= now + 2 * 3_600_000 + 999);
    stop.cancel();
}

/// Entries written to the index behind the scheduler's back (a replica
/// applying a group's schedule while another broker leads) once its
/// window covered their due times are loaded by `reload` and fire on
/// time; what fired meanwhile for nobody and left the index is dropped.
#[tokio::test(start_paused = true)]
async fn reload_loads_entries_written_behind_it_and_drops_stale_orphans() {
    let (scheduler, storage, clock, stop) = start();
    let now = clock.now_ms();
    let stale = key(now - 1_000, 9, 1);
    persist(&storage, &[stale]);
    // The first refill fires it while nobody is registered; then it
    // leaves the index (acked where the topic was led).
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(scheduler.stats.fired.load(Ordering::Relaxed), 1);
    storage.put_schedule(&[(stale, false)]).unwrap();
    let behind = key(clock.now_ms() + 500, 9, 2);
    let other = key(clock.now_ms() + 400, 10, 3);
    persist(&storage, &[behind, other]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    scheduler.reload([9].into_iter().collect());
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(9, tx);
    let fired = tokio::time::timeout(WINDOW * 2, due(&mut rx)).await;
    assert_eq!(
        fired.expect("the reloaded entry fires"),
        vec![behind],
        "not the stale one"
    );
    assert_eq!(clock.now_ms(), behind.due_ms, "at its due time");
    // Only the subscriptions named are reloaded.
    assert_eq!(scheduler.stats.fired.load(Ordering::Relaxed), 2);
    stop.cancel();
}

/// An actor ending after a newer one of its subscription registered
/// does not take the newer one's entries away.
#[tokio::test(start_paused = true)]
async fn an_older_actor_unregistering_leaves_the_newer_one() {
    let (scheduler, storage, clock, stop) = start();
    let (old_tx, _old_rx) = mpsc::unbounded_channel();
    scheduler.register(5, old_tx.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(5, tx);
    scheduler.unregister(5, &old_tx);
    let k = key(clock.now_ms() + 100, 5, 1);
    persist(&storage, &[k]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    scheduler.add(vec![k]);
    let fired = tokio::time::timeout(WINDOW, due(&mut rx)).await;
    assert_eq!(fired.expect("the newer actor gets it"), vec![k]);
    stop.cancel();
}

/// On the system clock (the last millisecond waited on an OS timer):
/// each entry is announced once and fires at or after its due time by
/// the wall clock, never before.
#[tokio::test]
async fn on_the_system_clock_entries_fire_never_before_their_due_time() {
    use crate::clock::SystemClock;
    let storage = Arc::new(MemoryStorage::new());
    let clock: SharedClock = Arc::new(SystemClock);
    let stop = CancellationToken::new();
    let scheduler = Scheduler::start(storage.clone(), WINDOW, clock.clone(), stop.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(2, tx);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let now = clock.now_ms();
    let keys: Vec<_> = (0..30).map(|i| key(now + 50 + i, 2, i)).collect();
    persist(&storage, &keys);
    scheduler.add(keys.clone());
    let (mut soon, mut fired) = (0, 0);
    while fired < keys.len() {
        match rx.recv().await.unwrap() {
            Fired::Soon(k) => soon += k.len(),
            Fired::Due(k) => {
                let at = clock.now_us();
                for k in &k {
                    assert!(
                        at >= k.due_ms * 1000,
                        "fired {} us early",
                        k.due_ms * 1000 - at
                    );
                }
                fired += k.len();
            }
        }
    }
    assert_eq!(soon, keys.len(), "each announced once");
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn removed_entries_do_not_fire() {
    let (scheduler, storage, clock, stop) = start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(4, tx);
    let now = clock.now_ms();
    let (gone, kept) = (key(now + 100, 4, 1), key(now + 200, 4, 2));
    persist(&storage, &[gone, kept]);
    tokio::time::sleep(Duration::from_millis(1)).await;
    storage.put_schedule(&[(gone, false)]).unwrap();
    scheduler.remove(vec![gone]);
    assert_eq!(due(&mut rx).await, vec![kept]);
    stop.cancel();
}

/// A scheduler task driven by hand (no loop: the test calls `command`,
/// `stage` and `fire`), its window covering everything, on `clock`.
fn task_on(clock: Arc<TokioClock>) -> Task {
    Task {
        storage: Arc::new(MemoryStorage::new()),
        window: WINDOW,
        queue: DelayQueue::new(),
        keys: Default::default(),
        staged: BTreeSet::new(),
        fine: Default::default(),
        covered: Some(key(u64::MAX, u64::MAX, u64::MAX)),
        covered_until_ms: u64::MAX,
        subs: HashMap::new(),
        orphans: HashMap::new(),
        stats: Arc::new(SchedulerStats::default()),
        precise: false,
        clock,
        loading_since: None,
    }
}

/// Moves the paused clock to `at_us` exactly.
async fn advance_to(clock: &TokioClock, at_us: u64) {
    tokio::time::advance(Duration::from_micros(at_us - clock.now_us())).await;
}

/// What `fire` handed out now (as due), if anything.
fn fired_now(task: &mut Task, rx: &mut mpsc::UnboundedReceiver<Fired>) -> Vec<ScheduleKey> {
    task.fire();
    let mut out = Vec::new();
    while let Ok(f) = rx.try_recv() {
        if let Fired::Due(keys) = f {
            out.extend(keys);
        }
    }
    out
}

/// An entry added with its due µs (`add_at`) fires at that µs, not at its
/// stored millisecond (the µs rounded up), and never a µs before; one added
/// with its millisecond only fires at the millisecond. So does one whose µs
/// comes after it was loaded (by the refill) at its millisecond.
#[tokio::test(start_paused = true)]
async fn an_entry_added_at_a_microsecond_fires_then_not_at_its_millisecond() {
    let clock = Arc::new(TokioClock::starting_at_us(1_700_000_000_000_000));
    let mut task = task_on(clock.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    task.command(Cmd::Register(1, tx));
    let due_ms = clock.now_ms() + 100;
    let (fine, coarse, later) = (key(due_ms, 1, 1), key(due_ms, 1, 2), key(due_ms, 1, 3));
    let (fine_us, later_us) = (due_ms * 1000 - 900, due_ms * 1000 - 400);
    task.command(Cmd::AddAt(vec![(fine, fine_us)]));
    task.command(Cmd::Add(vec![coarse, later]));
    // The prefetch lead is reached: all three staged (announced).
    task.stage(vec![fine, coarse, later]);
    // `later`'s µs is learnt only now (it was loaded at its ms).
    task.command(Cmd::AddAt(vec![(later, later_us)]));
    advance_to(&clock, fine_us - 1).await;
    assert!(fired_now(&mut task, &mut rx).is_empty(), "1 µs early");
    advance_to(&clock, fine_us).await;
    assert_eq!(fired_now(&mut task, &mut rx), vec![fine]);
    advance_to(&clock, later_us - 1).await;
    assert!(fired_now(&mut task, &mut rx).is_empty(), "1 µs early");
    advance_to(&clock, later_us).await;
    assert_eq!(fired_now(&mut task, &mut rx), vec![later]);
    advance_to(&clock, due_ms * 1000 - 1).await;
    assert!(fired_now(&mut task, &mut rx).is_empty(), "1 µs early");
    advance_to(&clock, due_ms * 1000).await;
    assert_eq!(fired_now(&mut task, &mut rx), vec![coarse]);
    assert!(task.fine.is_empty(), "nothing left of the fired µs");
}

/// Removing an entry added with its µs takes it out whether it is still
/// timed or already staged: it does not fire.
#[tokio::test(start_paused = true)]
async fn entries_added_at_a_microsecond_can_be_removed() {
    let clock = Arc::new(TokioClock::starting_at_us(1_700_000_000_000_000));
    let mut task = task_on(clock.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    task.command(Cmd::Register(1, tx));
    let due_ms = clock.now_ms() + 100;
    let (staged, timed) = (key(due_ms, 1, 1), key(due_ms + 50, 1, 2));
    task.command(Cmd::AddAt(vec![
        (staged, due_ms * 1000 - 500),
        (timed, (due_ms + 50) * 1000 - 500),
    ]));
    task.stage(vec![staged]);
    task.command(Cmd::Remove(vec![staged, timed]));
    assert!(task.staged.is_empty() && task.keys.is_empty() && task.fine.is_empty());
    advance_to(&clock, (due_ms + 60) * 1000).await;
    assert!(fired_now(&mut task, &mut rx).is_empty());
}

/// A burst is announced early enough to be read ahead whole: 10 000
/// retry-tier messages cost the actor some 30 ms to read (about 3 µs
/// each), and at a 20 ms lead some 4 000 of them were still unread when
/// they fired (session 19's trace), so they were read during the drain.
#[tokio::test(start_paused = true)]
async fn a_burst_is_announced_in_time_to_be_read_ahead_whole() {
    let (scheduler, storage, clock, stop) = start();
    let (tx, mut rx) = mpsc::unbounded_channel();
    scheduler.register(1, tx);
    let due_ms = clock.now_ms() + 200;
    let keys: Vec<_> = (0..10_000).map(|i| key(due_ms, 1, i)).collect();
    persist(&storage, &keys);
    tokio::time::sleep(Duration::from_millis(1)).await;
    scheduler.add(keys);
    let Some(Fired::Soon(coming)) = rx.recv().await else {
        panic!("the burst is announced before it fires");
    };
    let lead_ms = due_ms - clock.now_ms();
    assert!(
        lead_ms >= 45,
        "announced {lead_ms} ms ahead: too late to read 10 000 retries (~30 ms)"
    );
    assert_eq!(coming.len(), 10_000);
    assert_eq!(due(&mut rx).await.len(), 10_000);
    assert!(clock.now_ms() >= due_ms, "never early");
    stop.cancel();
}
