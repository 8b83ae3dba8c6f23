//! Free space on the data directory's filesystem. [`DiskGuard`] refuses
//! publishes with RESOURCE_EXHAUSTED (naming the directory and the space
//! left) while the filesystem has less than `min_free_space` free, and lets
//! them through again by itself once space returns. The point is that sled
//! never meets a full disk: after a failed write sled refuses all further
//! work until it is reopened, and a write it could not finish is not one
//! the broker has acknowledged, but the store would then need a restart.
//! The free space is the `ricochet_storage_free_bytes` gauge, the refusing
//! state `ricochet_storage_disk_full`; a WARN line says when refusals start
//! and an INFO line when they end.
//!
//! Free space is read with `statvfs` at most every [`PROBE_EVERY`] while
//! there is room; in between, bytes let through are subtracted from the
//! last reading, and a write that would cross the limit reads it afresh.

use crate::error::{BrokerError, Result};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longest time a free-space reading is trusted while there is room.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Free space beyond `min_free_space` a refusing guard waits for before it
/// lets writes through again.
const RESUME_MARGIN: u64 = 1 << 20;

/// Watches the free space of the data directory's filesystem.
#[derive(Debug)]
pub struct DiskGuard {
    dir: PathBuf,
    min_free: u64,
    probe: Mutex<Probe>,
    full: AtomicBool,
}

#[derive(Debug, Default)]
struct Probe {
    at: Option<Instant>,
    /// Bytes free at the last reading.
    free: u64,
    /// Bytes let through since.
    since: u64,
}

impl DiskGuard {
    /// Guards `dir`, refusing publishes below `min_free` bytes free (0:
    /// never refuses).
    pub fn new(dir: PathBuf, min_free: u64) -> Self {
        Self {
            dir,
            min_free,
            probe: Mutex::new(Probe::default()),
            full: AtomicBool::new(false),
        }
    }

    /// Bytes free for an unprivileged writer on the data directory's
    /// filesystem, read now.
    pub fn free_bytes(&self) -> std::io::Result<u64> {
        let s = rustix::fs::statvfs(&self.dir)?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// The data directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Whether publishes are being refused.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// Lets a write of about `bytes` through, or refuses it with
    /// [`BrokerError::DiskFull`] when it would leave less than
    /// `min_free_space` free.
    pub fn check(&self, bytes: u64) -> Result<()> {
        if self.min_free == 0 {
            return Ok(());
        }
        // Once refusing, a write goes through only with a margin to spare,
        // so refusals do not flicker with each small write that still fits.
        let need = if self.is_full() {
            self.min_free.saturating_add(bytes.max(RESUME_MARGIN))
        } else {
            self.min_free.saturating_add(bytes)
        };
        let mut p = crate::util::lock(&self.probe);
        let stale = p.at.is_none_or(|t| t.elapsed() >= PROBE_EVERY);
        if stale || p.free.saturating_sub(p.since) < need {
            match self.free_bytes() {
                Ok(free) => {
                    *p = Probe {
                        at: Some(Instant::now()),
                        free,
                        since: 0,
                    };
                }
                // A filesystem that cannot say lets the write go to the
                // engine, which reports a real failure itself.
                Err(e) => {
                    tracing::debug!(error = %e, dir = %self.dir.display(), "cannot read free space");
                    return Ok(());
                }
            }
        }
        let left = p.free.saturating_sub(p.since);
        if left < need {
            drop(p);
            self.set_full(true, left);
            return Err(BrokerError::DiskFull(self.refusal(left)));
        }
        p.since = p.since.saturating_add(bytes);
        drop(p);
        self.set_full(false, left);
        Ok(())
    }

    /// The refusal's message, with `left` bytes free.
    pub fn refusal(&self, left: u64) -> String {
        format!(
            "the disk of the data directory {} is full: {} free, below min_free_space ({}); \
             publishes are refused until space is freed",
            self.dir.display(),
            show_bytes(left),
            show_bytes(self.min_free)
        )
    }

    fn set_full(&self, full: bool, left: u64) {
        if self.full.swap(full, Ordering::AcqRel) == full {
            return;
        }
        metrics::gauge!("ricochet_storage_disk_full").set(if full { 1.0 } else { 0.0 });
        metrics::gauge!("ricochet_storage_free_bytes").set(left as f64);
        if full {
            tracing::warn!(
                data_dir = %self.dir.display(),
                free_bytes = left,
                min_free_space = self.min_free,
                "disk full: {}",
                self.refusal(left)
            );
        } else {
            tracing::info!(
                data_dir = %self.dir.display(),
                free_bytes = left,
                "disk space is back: publishes are accepted again"
            );
        }
    }

    /// Updates the free-space gauges (the broker's health task, twice a second).
    pub fn record(&self) {
        if let Ok(free) = self.free_bytes() {
            metrics::gauge!("ricochet_storage_free_bytes").set(free as f64);
        }
        metrics::gauge!("ricochet_storage_disk_full").set(if self.is_full() { 1.0 } else { 0.0 });
    }
}

/// `bytes` for a person: B, KiB, MiB or GiB with one decimal.
pub fn show_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_the_limit_a_write_is_refused_naming_the_directory_and_the_space_left() {
        let dir = tempfile::tempdir().unwrap();
        let free = DiskGuard::new(dir.path().into(), 1).free_bytes().unwrap();
        assert!(free > 0);
        // A limit above what is free refuses; the message says where and how much.
        let g = DiskGuard::new(dir.path().into(), free + (1 << 40));
        let e = g.check(10).unwrap_err();
        assert!(matches!(e, BrokerError::DiskFull(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(msg.contains("free, below min_free_space"), "{msg}");
        assert!(g.is_full());
        // A limit far below lets writes through, and 0 turns the guard off.
        let g = DiskGuard::new(dir.path().into(), 1);
        g.check(10).unwrap();
        assert!(!g.is_full());
        DiskGuard::new(dir.path().into(), 0)
            .check(u64::MAX)
            .unwrap();
    }

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(show_bytes(512), "512 B");
        assert_eq!(show_bytes(3 * 1024 * 1024 + 512 * 1024), "3.5 MiB");
        assert_eq!(show_bytes(64 << 20), "64.0 MiB");
    }
}
