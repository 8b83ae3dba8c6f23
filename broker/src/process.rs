//! Settings of the process a broker runs in, which `ricochet-broker`
//! applies at start: transparent huge pages off. Public so that a program
//! running the broker in process (the in-process benches) runs it as the
//! binary does, and reads back what the kernel applied.

/// Turns transparent huge pages off for this process
/// (`prctl(PR_SET_THP_DISABLE)`, which every later fault obeys, whatever
/// `madvise` asked for). mimalloc asks for them on its arenas
/// (`MADV_HUGEPAGE`), so the first touch of a fresh 2 MiB region made the
/// kernel zero the whole huge page on the faulting thread:
///
/// - under the `replicated` bench it was 30% of three R3 brokers' samples
///   (`clear_page_erms` under `do_huge_pmd_anonymous_page`), under 1% with
///   them off (`docs/src/replication-history-throughput.md`, session 8);
/// - on a virtual machine that hands freed memory back to its host (virtio
///   balloon free page reporting, as on the project's machine), one such
///   fault measured 4-21 ms, 5.5 ms of it in one `clear_page_erms` on the
///   worker running the subscription that was redelivering a burst: the
///   1 000 burst's slow rounds (`docs/src/parked-retries-bursts-2.md`,
///   session 20).
///
/// A kernel that refuses the call leaves the default, which is only slower.
pub fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// Whether the kernel may give this process transparent huge pages
/// (`THP_enabled` in `/proc/self/status`); `None` where it does not say.
pub fn transparent_huge_pages() -> Option<bool> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim() != "0")
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_process_reads_transparent_huge_pages_off_after_the_call() {
        disable_transparent_huge_pages();
        // A kernel without the line (before 6.0) cannot say.
        if let Some(on) = transparent_huge_pages() {
            assert!(!on, "THP_enabled still 1 after PR_SET_THP_DISABLE");
        }
    }
}
