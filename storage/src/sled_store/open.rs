//! Opening sled without letting a damaged file take the process down.
//!
//! sled 0.34 panics inside `open` on some damage (flipped bytes in its log
//! that decode as an impossible record: an assertion, an out-of-range
//! slice), on the opening thread or on one of its `sled-io-*` threads.
//! [`guarded`] runs the open under `catch_unwind` and turns a panic into
//! [`StorageError::Corrupt`], which the broker refuses like any other
//! damage (one line naming `ricochet-broker check`). While an open is in
//! progress a panic hook (installed once, chained to the previous one) keeps
//! such panics off stderr and records their message instead; panics on other
//! threads, or outside an open, go to the previous hook as before.

use super::StorageError;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

/// Opens in progress, process-wide (for panics on sled's own threads).
static OPENING: AtomicUsize = AtomicUsize::new(0);
/// The first panic message caught during an open.
static CAUGHT: Mutex<Option<String>> = Mutex::new(None);
static HOOK: Once = Once::new();

thread_local! {
    /// Whether this thread is inside [`guarded`].
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let sled_thread = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("sled-"));
            let ours =
                GUARDED.with(Cell::get) || (sled_thread && OPENING.load(Ordering::Acquire) > 0);
            if !ours {
                return previous(info);
            }
            let what = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let mut caught = crate::util::lock(&CAUGHT);
            if caught.is_none() {
                *caught = Some(format!("{what}{at}"));
            }
        }));
    });
}

/// Runs `open` (sled's open and whatever reads it does on the way); a panic
/// inside it becomes [`StorageError::Corrupt`] naming the panic.
pub(super) fn guarded<T>(
    open: impl FnOnce() -> Result<T, StorageError>,
) -> Result<T, StorageError> {
    install_hook();
    if OPENING.fetch_add(1, Ordering::AcqRel) == 0 {
        // Nothing left over from an earlier open's sled threads.
        crate::util::lock(&CAUGHT).take();
    }
    GUARDED.with(|g| g.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(open));
    GUARDED.with(|g| g.set(false));
    OPENING.fetch_sub(1, Ordering::AcqRel);
    match result {
        Ok(r) => r,
        Err(_) => {
            let what = crate::util::lock(&CAUGHT)
                .take()
                .unwrap_or_else(|| "(no message)".to_owned());
            tracing::debug!(panic = %what, "sled panicked opening the store");
            // One line, as every refusal is.
            let what = what.split_whitespace().collect::<Vec<_>>().join(" ");
            Err(StorageError::Corrupt(format!(
                "sled cannot open the store: it failed on damaged data ({what})"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_becomes_a_corrupt_error_and_the_next_open_runs() {
        let r: Result<(), _> = guarded(|| panic!("impossible record"));
        let e = r.unwrap_err().to_string();
        assert!(e.contains("impossible record"), "{e}");
        assert!(e.contains("sled cannot open the store"), "{e}");
        // A panic on a sled thread during the open is caught by the open's caller.
        let r: Result<(), _> = guarded(|| {
            let t = std::thread::Builder::new()
                .name("sled-io-test".into())
                .spawn(|| panic!("on a sled thread"))
                .unwrap();
            // What sled does when its thread pool's thread dies.
            t.join().expect("thread pool should not crash");
            Ok(())
        });
        let e = r.unwrap_err().to_string();
        assert!(e.contains("on a sled thread"), "{e}");
        assert_eq!(guarded(|| Ok(7)).unwrap(), 7);
    }
}
