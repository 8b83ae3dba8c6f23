//! The allocator of the benches that set a `#[global_allocator]` (the
//! in-process brokers and the clients of `bursts`, `retry_scheduler`,
//! `client_e2e`, ...): mimalloc, the broker binary's default, or jemalloc
//! with this crate's `jemalloc` feature, configured as the binary built with
//! its `jemalloc` feature and `--return-idle-memory on` configures it
//! (`broker/src/allocator.rs`, crate-private there): background purging
//! threads, a 1 s dirty decay, a 0 muzzy decay, and what `_RJEM_MALLOC_CONF`
//! sets left alone. The binary's idle-worker hook (mimalloc's collect,
//! jemalloc's tcache flush) is not installed by either: the benches build
//! their own runtimes.

/// The allocator type, for `#[global_allocator] static GLOBAL: Global = GLOBAL;`.
#[cfg(not(feature = "jemalloc"))]
pub type Global = mimalloc::MiMalloc;
/// The allocator value.
#[cfg(not(feature = "jemalloc"))]
pub const GLOBAL: Global = mimalloc::MiMalloc;

/// The allocator type, for `#[global_allocator] static GLOBAL: Global = GLOBAL;`.
#[cfg(feature = "jemalloc")]
pub type Global = tikv_jemallocator::Jemalloc;
/// The allocator value.
#[cfg(feature = "jemalloc")]
pub const GLOBAL: Global = tikv_jemallocator::Jemalloc;

/// Applies the binary's settings for the allocator (nothing for mimalloc,
/// whose defaults the binary keeps with `--return-idle-memory on`) and
/// names them, for the bench's first line. Call first thing in `main`.
pub fn configure() -> String {
    backend::configure()
}

#[cfg(not(feature = "jemalloc"))]
mod backend {
    pub(super) fn configure() -> String {
        "allocator mimalloc".to_string()
    }
}

#[cfg(feature = "jemalloc")]
mod backend {
    use tikv_jemalloc_ctl::raw;

    /// The variable jemalloc reads its options from (`tikv-jemalloc-sys`
    /// builds it with the `_rjem_` prefix).
    const CONF_ENV: &str = "_RJEM_MALLOC_CONF";

    /// The broker binary's `DIRTY_DECAY_MS_ON` and `MUZZY_DECAY_MS`.
    const DIRTY_DECAY_MS: isize = 1000;
    const MUZZY_DECAY_MS: isize = 0;

    fn environment_sets(option: &str) -> bool {
        std::env::var(CONF_ENV).is_ok_and(|conf| {
            conf.split(',')
                .any(|kv| kv.split(':').next().map(str::trim) == Some(option))
        })
    }

    pub(super) fn configure() -> String {
        if !environment_sets("dirty_decay_ms") {
            set_decay("dirty", DIRTY_DECAY_MS);
        }
        if !environment_sets("muzzy_decay_ms") {
            set_decay("muzzy", MUZZY_DECAY_MS);
        }
        if !environment_sets("background_thread") {
            let _ = tikv_jemalloc_ctl::background_thread::write(true);
        }
        let (background_thread, dirty, muzzy) = settings();
        format!(
            "allocator jemalloc background_thread={background_thread:?} dirty_decay_ms={dirty:?} muzzy_decay_ms={muzzy:?}"
        )
    }

    /// jemalloc's background threads and arena 0's dirty and muzzy decays,
    /// read back.
    pub(super) fn settings() -> (Option<bool>, Option<isize>, Option<isize>) {
        (
            tikv_jemalloc_ctl::background_thread::read().ok(),
            read_decay(b"arena.0.dirty_decay_ms\0"),
            read_decay(b"arena.0.muzzy_decay_ms\0"),
        )
    }

    /// Sets the `kind` decay of the arenas created from now on and of
    /// those that exist.
    #[allow(unsafe_code)]
    fn set_decay(kind: &str, ms: isize) {
        let default = format!("arenas.{kind}_decay_ms\0");
        // SAFETY: the option is an `ssize_t`, written as one; the name is
        // NUL-terminated.
        let _ = unsafe { raw::write(default.as_bytes(), ms) };
        let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(1);
        for i in 0..arenas {
            let name = format!("arena.{i}.{kind}_decay_ms\0");
            // SAFETY: as above; an arena not created yet answers EFAULT and
            // gets the default set above when it is.
            let _ = unsafe { raw::write(name.as_bytes(), ms) };
        }
    }

    #[allow(unsafe_code)]
    fn read_decay(name: &[u8]) -> Option<isize> {
        // SAFETY: reads an `ssize_t` option by a NUL-terminated name.
        unsafe { raw::read::<isize>(name) }.ok()
    }
}

#[cfg(all(test, feature = "jemalloc"))]
mod tests {
    /// `configure` leaves jemalloc as the broker binary's `on` leaves it:
    /// background threads on, dirty decay 1000 ms (jemalloc's own: off and
    /// 10 000 ms), muzzy 0. (Run without `_RJEM_MALLOC_CONF`, which would
    /// win.)
    #[test]
    fn configure_sets_the_binarys_jemalloc_settings() {
        if std::env::var_os("_RJEM_MALLOC_CONF").is_some() {
            println!("skipped: _RJEM_MALLOC_CONF is set");
            return;
        }
        super::configure();
        assert_eq!(
            super::backend::settings(),
            (Some(true), Some(1000), Some(0))
        );
    }
}
