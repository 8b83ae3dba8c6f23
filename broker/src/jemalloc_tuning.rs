//! jemalloc's tuning as the broker binary applies it (`allocator.rs`, the
//! `jemalloc` feature): the decays, the background purging threads, what
//! `_RJEM_MALLOC_CONF` sets left alone, and the settings read back. It
//! depends on `tikv-jemalloc-ctl` only, so that the benches' allocator
//! (`benches/src/allocator.rs`) includes this same file and configures
//! their in-process brokers exactly as the binary is configured.

use tikv_jemalloc_ctl::raw;

/// The variable jemalloc reads its options from (`tikv-jemalloc-sys`
/// builds it with the `_rjem_` prefix): an option it names is left as it
/// says.
pub(crate) const CONF_ENV: &str = "_RJEM_MALLOC_CONF";

/// The dirty decay of `--return-idle-memory on`: a page freed to an arena
/// is given back to the system (`madvise(MADV_DONTNEED)`) by a background
/// thread over about this long, whichever thread freed it (jemalloc's own
/// default: 10 s, and no background thread).
pub(crate) const DIRTY_DECAY_MS_ON: isize = 1000;

/// The dirty decay of `eager`: every page goes back as it is freed.
pub(crate) const DIRTY_DECAY_MS_EAGER: isize = 0;

/// The muzzy decay (pages given back lazily, `MADV_FREE`): 0, jemalloc's
/// own default on Linux, so dirty pages are purged outright.
pub(crate) const MUZZY_DECAY_MS: isize = 0;

/// Whether `_RJEM_MALLOC_CONF` sets `option`.
fn environment_sets(option: &str) -> bool {
    std::env::var(CONF_ENV).is_ok_and(|conf| {
        conf.split(',')
            .any(|kv| kv.split(':').next().map(str::trim) == Some(option))
    })
}

/// Sets a dirty decay of `dirty_ms`, a muzzy decay of [`MUZZY_DECAY_MS`]
/// and background purging threads, each unless `_RJEM_MALLOC_CONF` sets it.
pub(crate) fn apply(dirty_ms: isize) {
    if !environment_sets("dirty_decay_ms") {
        set_decay("dirty", dirty_ms);
    }
    if !environment_sets("muzzy_decay_ms") {
        set_decay("muzzy", MUZZY_DECAY_MS);
    }
    if !environment_sets("background_thread") {
        // A failure (a platform without them) leaves purging to the
        // threads that allocate, which is only slower to give back.
        let _ = tikv_jemalloc_ctl::background_thread::write(true);
    }
}

/// Sets the `kind` (`dirty` or `muzzy`) decay of the arenas created from
/// now on and of those that exist (arena 0 at least: jemalloc creates the
/// others as threads first allocate).
#[allow(unsafe_code)]
fn set_decay(kind: &str, ms: isize) {
    let default = format!("arenas.{kind}_decay_ms\0");
    // SAFETY: the option is an `ssize_t`, written as one; the name is
    // NUL-terminated.
    let _ = unsafe { raw::write(default.as_bytes(), ms) };
    let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(1);
    for i in 0..arenas {
        let name = format!("arena.{i}.{kind}_decay_ms\0");
        // SAFETY: as above. An arena not created yet answers EFAULT and
        // gets the default set above when it is.
        let _ = unsafe { raw::write(name.as_bytes(), ms) };
    }
}

/// Background threads, and arena 0's dirty and muzzy decays, read back.
#[allow(unsafe_code)]
pub(crate) fn settings() -> (Option<bool>, Option<isize>, Option<isize>) {
    // SAFETY: reads `ssize_t` options by NUL-terminated names.
    let decay = |name: &[u8]| unsafe { raw::read::<isize>(name) }.ok();
    (
        tikv_jemalloc_ctl::background_thread::read().ok(),
        decay(b"arena.0.dirty_decay_ms\0"),
        decay(b"arena.0.muzzy_decay_ms\0"),
    )
}
