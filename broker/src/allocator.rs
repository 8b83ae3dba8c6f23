//! The broker binary's memory allocator and what `--return-idle-memory`
//! does to it: jemalloc by default (the `jemalloc` feature), mimalloc when
//! built with `--no-default-features`, the system allocator with
//! `system-alloc` (which wins over both). Owns
//! the `#[global_allocator]`, the settings applied before the runtime
//! starts, the hook that runs as a runtime worker goes idle, and the
//! settings read back for the start log line. The broker library sets no
//! allocator: a program embedding it chooses its own.

/// `--return-idle-memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum IdleMemory {
    On,
    Eager,
    Off,
}

/// The allocator's settings in force, read back from the allocator, for
/// the start log line (`None`: the allocator has no such setting).
#[derive(Debug, Default)]
pub(crate) struct Settings {
    pub(crate) allocator: &'static str,
    /// mimalloc's purge delay.
    pub(crate) purge_delay_ms: Option<i64>,
    /// jemalloc's background purging threads.
    pub(crate) background_thread: Option<bool>,
    /// jemalloc's decay times of arena 0 (the others get the same).
    pub(crate) dirty_decay_ms: Option<i64>,
    pub(crate) muzzy_decay_ms: Option<i64>,
}

pub(crate) use backend::{allocator_settings, set_allocator_defaults};

/// How often at most one worker collects: rarely enough that a busy
/// worker (which parks thousands of times a second) does not pay for it,
/// often enough that an idle broker, whose workers still wake tens of times
/// a second for its timers, gives what it freed back within seconds.
#[cfg(not(feature = "system-alloc"))]
const RETURN_IDLE_MEMORY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The hook that gives the memory a runtime worker freed back to the system
/// as the worker goes idle (tokio's `on_thread_park`, which runs on the
/// worker itself), at most once per [`RETURN_IDLE_MEMORY_EVERY`]; `None`
/// when off.
///
/// Why, with mimalloc: it keeps freed memory per thread. A block another
/// thread frees goes to its page's list of remote frees, which only the
/// page's own thread takes back, when it next allocates from that page; a
/// page emptied that way stays with its thread. A worker that goes idle
/// after a burst (200 000 retries parked) never allocates again, so the
/// burst's freed memory stayed resident. Purging on every free
/// (`MIMALLOC_PURGE_DELAY=0`) gives it back but cost 20-35 % of 1 KiB
/// publish throughput. `mi_collect(false)` on the worker takes its remote
/// frees back, frees its empty pages to the shared arenas, and purges
/// (`madvise`) what waited there past mimalloc's purge delay (1 s; the next
/// collect a second later purges what this one freed). At 200 000 parked,
/// same binary on and off: 182-232 B instead of 232-257 B per held nack,
/// 227-257 B instead of 338-424 B per `reconsume_later`
/// (docs/src/parked-retries-memory.md, session 11); what is left over the
/// target is mostly in the heaps of sled's I/O threads and tokio's blocking
/// pool, which no hook of ours runs on. `mi_collect` only reaches the
/// calling thread's heap, so no other thread can do this for the workers.
///
/// With jemalloc the arenas are shared and its background threads purge
/// them whoever freed; what stays with a thread is its cache of small
/// blocks (`tcache`), which the hook flushes back to the arenas.
#[cfg(not(feature = "system-alloc"))]
pub(crate) fn return_idle_memory(mode: IdleMemory) -> Option<impl Fn() + Send + Sync + 'static> {
    use std::cell::Cell;
    use std::time::Instant;
    thread_local! {
        /// When this worker last collected.
        static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    if mode == IdleMemory::Off {
        return None;
    }
    Some(|| {
        let now = Instant::now();
        let due = LAST.with(|last| match last.get() {
            Some(t) if now.duration_since(t) < RETURN_IDLE_MEMORY_EVERY => false,
            _ => {
                last.set(Some(now));
                true
            }
        });
        if due {
            backend::collect();
        }
    })
}

/// The system allocator returns what it frees on its own terms.
#[cfg(feature = "system-alloc")]
pub(crate) fn return_idle_memory(_mode: IdleMemory) -> Option<impl Fn() + Send + Sync + 'static> {
    None::<fn()>
}

/// mimalloc (`--no-default-features`).
#[cfg(not(any(feature = "system-alloc", feature = "jemalloc")))]
mod backend {
    use super::{IdleMemory, Settings};

    // sled copies tree nodes on every write; glibc's allocator was a third
    // of the broker's profile, mimalloc makes that churn cheap.
    #[global_allocator]
    static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

    /// mimalloc's `mi_option_purge_delay` (its place in v3's `mi_option_e`;
    /// libmimalloc-sys names it for v2 only). The test
    /// `logs::the_purge_delay_is_mimallocs_by_default_zero_when_eager_and_the_environment_still_sets_it`
    /// checks the index: the value read back follows `MIMALLOC_PURGE_DELAY`.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

    /// The purge delay of `--return-idle-memory eager` unless
    /// `MIMALLOC_PURGE_DELAY` says otherwise: 0, mimalloc gives a page back to
    /// the system (`madvise`) as soon as it is freed to its arenas, instead of
    /// 1 s later at the next collect. After a burst (200 000 retries parked)
    /// the freed memory of threads no hook of ours runs on (sled's I/O
    /// threads, tokio's blocking pool) stayed resident with the 1 s delay:
    /// 205-220 B per parked held nack and 266-274 B per `reconsume_later`,
    /// against 135-148 and 191-195 B with 0, same binary. The cost, why it is
    /// not the default: an `madvise` per freed page and the faults when it is
    /// used again; parking (consume + nack) measured 0.77x, `reconsume_later`
    /// 0.80x (medians of 8 rounds), and 1 KiB publish 0.66-0.78x
    /// (docs/src/parked-retries-memory-2.md, session 19).
    const PURGE_DELAY_MS: std::os::raw::c_long = 0;

    /// Sets the allocator's defaults for `mode`, before the runtime starts:
    /// with `eager`, [`PURGE_DELAY_MS`]; otherwise mimalloc's own. A purge
    /// delay given in the environment (`MIMALLOC_PURGE_DELAY`, read by
    /// mimalloc itself) is kept either way: `mi_option_set_default` leaves an
    /// option the environment set.
    #[allow(unsafe_code)]
    pub(crate) fn set_allocator_defaults(mode: IdleMemory) {
        if mode == IdleMemory::Eager {
            // SAFETY: sets one option's value; mimalloc reads it on each free
            // to an arena and takes no pointer from us.
            unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
        }
    }

    /// The allocator's settings, for the start log line.
    #[allow(unsafe_code)]
    pub(crate) fn allocator_settings() -> Settings {
        // SAFETY: reads one option's value.
        let delay = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        Settings {
            allocator: "mimalloc",
            purge_delay_ms: Some(delay as i64),
            ..Settings::default()
        }
    }

    /// mimalloc's `mi_collect(false)` on the calling thread's heap. (`true`
    /// would also purge at once what is still within its delay and free the
    /// pages mimalloc keeps for reuse; on the workers' park it measured no
    /// better, session 11.)
    #[allow(unsafe_code)]
    pub(super) fn collect() {
        // SAFETY: `mi_collect` takes no pointer and has no precondition: it
        // works on the calling thread's own heap, and on the shared arenas
        // under mimalloc's own synchronisation; mimalloc is this program's
        // allocator.
        unsafe { libmimalloc_sys::mi_collect(false) }
    }
}

/// jemalloc (the `jemalloc` feature).
#[cfg(all(feature = "jemalloc", not(feature = "system-alloc")))]
mod backend {
    use super::{IdleMemory, Settings};
    use crate::jemalloc_tuning::{self as tuning, DIRTY_DECAY_MS_EAGER, DIRTY_DECAY_MS_ON};

    #[global_allocator]
    static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    /// Sets the allocator's defaults for `mode`, before the runtime starts:
    /// with `on`, background purging threads and a dirty decay of
    /// [`DIRTY_DECAY_MS_ON`]; with `eager`, of [`DIRTY_DECAY_MS_EAGER`];
    /// with `off`, jemalloc's own. What `_RJEM_MALLOC_CONF` sets is kept.
    pub(crate) fn set_allocator_defaults(mode: IdleMemory) {
        match mode {
            IdleMemory::Off => {}
            IdleMemory::On => tuning::apply(DIRTY_DECAY_MS_ON),
            IdleMemory::Eager => tuning::apply(DIRTY_DECAY_MS_EAGER),
        }
    }

    /// The allocator's settings, for the start log line.
    pub(crate) fn allocator_settings() -> Settings {
        let (background_thread, dirty, muzzy) = tuning::settings();
        Settings {
            allocator: "jemalloc",
            background_thread,
            dirty_decay_ms: dirty.map(|v| v as i64),
            muzzy_decay_ms: muzzy.map(|v| v as i64),
            ..Settings::default()
        }
    }

    /// Flushes the calling thread's cache of small blocks back to the
    /// arenas (`thread.tcache.flush`), where the background threads purge
    /// the pages that emptied.
    #[allow(unsafe_code)]
    pub(super) fn collect() {
        // SAFETY: a command without arguments (no old or new value); it
        // works on the calling thread's own cache under jemalloc's own
        // synchronisation; jemalloc is this program's allocator.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                c"thread.tcache.flush".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        }
    }
}

/// The system allocator (`system-alloc`, for heap profilers that intercept
/// malloc).
#[cfg(feature = "system-alloc")]
mod backend {
    use super::{IdleMemory, Settings};

    pub(crate) fn set_allocator_defaults(_mode: IdleMemory) {}

    pub(crate) fn allocator_settings() -> Settings {
        Settings {
            allocator: "system",
            ..Settings::default()
        }
    }
}
