//! Small helpers the storage engines share with the broker: poison-free
//! locking, wall-clock milliseconds, and the test failpoints
//! (`RICOCHET_FAILPOINT`) that crash tests arm to abort at an exact step.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks a mutex, recovering the guard if a panicking thread poisoned it: the
/// broker's short critical sections leave consistent state behind, and
/// refusing service for ever after one panic would be worse.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads an `RwLock`, recovering from poison as [`lock`] does.
pub fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes an `RwLock`, recovering from poison as [`lock`] does.
pub fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// Wall-clock milliseconds since the Unix epoch (for registration times
/// only; the broker's own timing uses its clock).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The failpoint named by `RICOCHET_FAILPOINT`, read once.
fn armed_failpoint() -> Option<&'static str> {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var("RICOCHET_FAILPOINT").ok())
        .as_deref()
}

/// Whether `RICOCHET_FAILPOINT` names `name` (a step that must prepare its
/// crash, e.g. flush what is written so far, before [`failpoint`]).
pub fn failpoint_armed(name: &str) -> bool {
    armed_failpoint() == Some(name)
}

/// Aborts the process when `RICOCHET_FAILPOINT` equals `name`: a test's way
/// to crash the broker at an exact step (as a SIGKILL would, without
/// flushing). Unset (always, outside tests), it does nothing.
pub fn failpoint(name: &str) {
    if failpoint_armed(name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}
