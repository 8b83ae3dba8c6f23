//! Group commit: many writers, one flush.
//!
//! A writer applies its write to storage, then calls [`Flusher::durable`],
//! which resolves once a flush that *started after* the call has finished. One
//! background task runs flushes back to back while anybody waits, so N
//! concurrent producers share one fsync instead of paying N. In interval mode
//! the same task also flushes on a timer and [`Flusher::durable`] is not used
//! for receipts.
//!
//! After a failed flush the flusher turns unhealthy for good (sled refuses
//! further work after an I/O error): every later wait fails. A publish
//! first asks [`Flusher::check_room`], which refuses it while the data
//! directory's disk is nearly full ([`DiskGuard`]), so that a full disk
//! stops publishes before it can fail a flush.

use crate::disk::DiskGuard;
use crate::error::{BrokerError, Result};
use crate::storage::{Storage, StorageError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// Coalesces flush requests onto as few storage flushes as possible.
#[derive(Debug, Clone)]
pub struct Flusher {
    inner: Arc<Inner>,
    /// A replicated partition's storage: [`Flusher::durable`] waits for
    /// its `flush` (every write queued before committed by the group's
    /// majority and applied) instead of a flush of the broker's store.
    through: Option<Arc<dyn Storage>>,
}

#[derive(Debug)]
struct Inner {
    requested: AtomicU64,
    wake: Notify,
    completed: watch::Receiver<u64>,
    healthy: AtomicBool,
    flushes: AtomicU64,
    disk: DiskGuard,
    /// Set when the flush failed because the disk was full.
    failed_full: AtomicBool,
}

impl Flusher {
    /// Starts the flush task. `interval` adds a periodic flush; the task ends
    /// (releasing storage) when `stop` is cancelled. `disk` guards the data
    /// directory's free space.
    pub fn start(
        storage: Arc<dyn Storage>,
        interval: Duration,
        stop: CancellationToken,
        disk: DiskGuard,
    ) -> Self {
        let (done_tx, done_rx) = watch::channel(0u64);
        let inner = Arc::new(Inner {
            requested: AtomicU64::new(0),
            wake: Notify::new(),
            completed: done_rx,
            healthy: AtomicBool::new(true),
            flushes: AtomicU64::new(0),
            disk,
            failed_full: AtomicBool::new(false),
        });
        let task_inner = Arc::downgrade(&inner);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let Some(inner) = task_inner.upgrade() else {
                    break;
                };
                tokio::select! {
                    _ = inner.wake.notified() => {}
                    _ = ticker.tick() => {}
                    _ = stop.cancelled() => break,
                }
                let target = inner.requested.load(Ordering::Acquire);
                let ok = storage.flush().await;
                inner.flushes.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = ok {
                    tracing::error!(error = %e, "storage flush failed; refusing further writes");
                    if e.is_disk_full() {
                        inner.failed_full.store(true, Ordering::Release);
                    }
                    inner.healthy.store(false, Ordering::Release);
                    // Wake every waiter so it sees the failure.
                    let _ = done_tx.send(u64::MAX);
                    break;
                }
                if target > *done_tx.borrow() {
                    let _ = done_tx.send(target);
                }
                if inner.requested.load(Ordering::Acquire) > target {
                    inner.wake.notify_one();
                }
            }
        });
        Self {
            inner,
            through: None,
        }
    }

    /// This flusher for the writers of a replicated partition on its
    /// leader, whose writes go through `storage` (the group's): their
    /// [`Flusher::durable`] waits for `storage`'s commits.
    pub fn through(&self, storage: Arc<dyn Storage>) -> Self {
        Self {
            inner: self.inner.clone(),
            through: Some(storage),
        }
    }

    /// Resolves once every write made before this call is on disk (for a
    /// replicated partition's writers: committed by the group, see
    /// [`Flusher::through`]).
    pub async fn durable(&self) -> Result<()> {
        self.check()?;
        if let Some(storage) = &self.through {
            return Ok(storage.flush().await?);
        }
        let ticket = self.inner.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.inner.wake.notify_one();
        let mut rx = self.inner.completed.clone();
        rx.wait_for(|done| *done >= ticket)
            .await
            .map_err(|_| BrokerError::ShuttingDown)?;
        self.check()
    }

    /// Fails if a flush has failed: RESOURCE_EXHAUSTED naming the disk when
    /// it failed on a full disk.
    pub fn check(&self) -> Result<()> {
        if self.inner.healthy.load(Ordering::Acquire) {
            Ok(())
        } else if self.inner.failed_full.load(Ordering::Acquire) {
            let disk = &self.inner.disk;
            Err(BrokerError::DiskFull(format!(
                "the disk of the data directory {} filled up ({} free now): a flush failed, \
                 so the store refuses writes until the broker is restarted",
                disk.dir().display(),
                crate::disk::show_bytes(disk.free_bytes().unwrap_or(0))
            )))
        } else {
            Err(StorageError::Unhealthy.into())
        }
    }

    /// [`Flusher::check`], then whether a write of about `bytes` leaves
    /// `min_free_space` free on the data directory's disk
    /// ([`DiskGuard::check`]).
    pub fn check_room(&self, bytes: u64) -> Result<()> {
        self.check()?;
        self.inner.disk.check(bytes)
    }

    /// The data directory's free-space guard.
    pub fn disk(&self) -> &DiskGuard {
        &self.inner.disk
    }

    /// Whether every flush so far succeeded.
    pub fn is_healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Acquire)
    }

    /// Number of [`Flusher::durable`] waits asked for so far (not counting
    /// those of a replicated partition's writers).
    pub fn waits(&self) -> u64 {
        self.inner.requested.load(Ordering::Acquire)
    }

    /// Number of storage flushes run so far.
    pub fn flush_count(&self) -> u64 {
        self.inner.flushes.load(Ordering::Relaxed)
    }
}
