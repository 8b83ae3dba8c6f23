//! The allocator of the benches that set a `#[global_allocator]` (the
//! in-process brokers and the clients of `bursts`, `retry_scheduler`,
//! `client_e2e`, ...): jemalloc, the broker binary's default (this crate's
//! default `jemalloc` feature), or mimalloc with `--no-default-features`;
//! jemalloc configured as the binary with `--return-idle-memory on` configures it
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

/// The broker binary's own tuning code, this very file of the broker crate
/// (its allocator module is the binary's, not the library's).
/// (`eager`'s decay is the binary's only.)
#[cfg(feature = "jemalloc")]
#[path = "../../broker/src/jemalloc_tuning.rs"]
#[allow(dead_code)]
mod jemalloc_tuning;

#[cfg(feature = "jemalloc")]
mod backend {
    use super::jemalloc_tuning as tuning;

    pub(super) fn configure() -> String {
        tuning::apply(tuning::DIRTY_DECAY_MS_ON);
        let (background_thread, dirty, muzzy) = settings();
        format!(
            "allocator jemalloc background_thread={background_thread:?} dirty_decay_ms={dirty:?} muzzy_decay_ms={muzzy:?}"
        )
    }

    /// jemalloc's background threads and arena 0's dirty and muzzy decays,
    /// read back.
    pub(super) fn settings() -> (Option<bool>, Option<isize>, Option<isize>) {
        tuning::settings()
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
