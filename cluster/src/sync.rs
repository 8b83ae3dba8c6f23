//! Poison-free locking and wall-clock time, the two helpers the cluster
//! shares with the broker (whose own copies live in `ricochet-storage`;
//! this crate does not depend on storage for them).

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Reads an `RwLock`, recovering the guard if a panicking thread poisoned
/// it: the cluster's short critical sections leave consistent state.
pub(crate) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes an `RwLock`, recovering from poison as [`read`] does.
pub(crate) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// Wall-clock milliseconds since the Unix epoch (the registration time).
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
