//! Making sled's writes durable: its flush alone is not.
//!
//! sled 0.34's `flush` writes its log buffers and then calls
//! `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)` on Linux
//! (`pagecache/iobuf.rs`): the pages reach the device, but neither the
//! device's volatile write cache nor the file's metadata (its size, as the
//! log grows) is flushed, so a power cut can still lose what the flush
//! returned for. And a page too large for a quarter of its segment (a
//! value, or a leaf of up to 17 values, over `segment_size / 4`) goes to a
//! file of its own under `<db>/blobs/`, which sled never fsyncs, nor the
//! directory (`pagecache/blob_io.rs`, `write_blob`).
//!
//! [`SledSync::flush`] is the flush to use where a write is acknowledged
//! as durable: it fsyncs every blob file not synced yet and then the
//! directory (sled writes a blob file whole, synchronously, inside the
//! insert that makes it, so by the time the log record pointing at it is
//! durable the blob is too), then runs sled's flush, then `fdatasync`s
//! sled's data file (`<db>/db`). A blob created by a concurrent writer
//! between the blob pass and sled's flush is synced by the next flush,
//! which is the one that acknowledges it; only its pointer may reach the
//! disk first (a power cut in that window leaves an unacknowledged write's
//! page unreadable, which the store's read checks report as damage rather
//! than serve).

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The durable flush of one sled database: its data file, and the blob
/// files already made durable.
#[derive(Debug)]
pub struct SledSync {
    dir: PathBuf,
    synced: Mutex<HashSet<OsString>>,
    /// sled's data file (`<db>/db`), opened read-only: `fdatasync` works
    /// on any descriptor of the file.
    data: Arc<File>,
    /// How many times the data file was synced (tests check that a
    /// durable flush does it).
    data_syncs: AtomicU64,
    /// One flush at a time (see [`SledSync::flush`]).
    flushing: tokio::sync::Mutex<()>,
    /// Nothing else flushes the database (see [`SledSync::sole_flusher`]).
    sole: bool,
}

impl SledSync {
    /// For the sled database open at `db_dir` (its `db` file and its
    /// `blobs/` directory).
    pub fn open(db_dir: &Path) -> io::Result<Self> {
        Ok(Self {
            dir: db_dir.join("blobs"),
            synced: Mutex::new(HashSet::new()),
            data: Arc::new(File::open(db_dir.join("db"))?),
            data_syncs: AtomicU64::new(0),
            flushing: tokio::sync::Mutex::new(()),
            sole: false,
        })
    }

    /// Makes every write to `db` so far durable: new blob files and their
    /// directory, sled's flush, then an `fdatasync` of sled's data file —
    /// skipped, for a [`SledSync::sole_flusher`], when sled's flush wrote
    /// nothing (everything it holds was written by an earlier flush, which
    /// synced it before returning: flushes run one at a time).
    pub async fn flush(&self, db: &sled::Tree) -> sled::Result<()> {
        let _one = self.flushing.lock().await;
        self.sync_new()?;
        let wrote = db.flush_async().await?;
        if wrote > 0 || !self.sole {
            self.sync_data().await?;
        }
        Ok(())
    }

    /// [`SledSync::flush`] for a conversion at open, before the store is
    /// shared (no other flush runs): sled's flush, then always the data
    /// file's sync.
    pub fn flush_blocking(&self, db: &sled::Tree) -> sled::Result<()> {
        self.sync_new()?;
        db.flush()?;
        self.data.sync_data()?;
        self.data_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Declares this the only way the database is flushed (sled's own
    /// flusher off, `flush_every_ms(None)`, and no direct `flush` call
    /// outside tests): then a flush that wrote nothing needs no sync. With
    /// sled's flusher on, it may have written bytes it has not synced yet
    /// when a flush of ours finds nothing left to write.
    pub fn sole_flusher(mut self) -> Self {
        self.sole = true;
        self
    }

    /// `fdatasync` of sled's data file, off the async threads.
    pub async fn sync_data(&self) -> io::Result<()> {
        let data = self.data.clone();
        tokio::task::spawn_blocking(move || data.sync_data())
            .await
            .map_err(io::Error::other)??;
        self.data_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How many times [`SledSync::sync_data`] synced the data file.
    pub fn data_syncs(&self) -> u64 {
        self.data_syncs.load(Ordering::Relaxed)
    }

    /// Fsyncs the blob files not synced before, then the directory when
    /// there were any. Returns how many files it synced. Cheap when there
    /// are none (one directory read). A blob sled removed meanwhile (its
    /// page rewritten) is skipped.
    pub fn sync_new(&self) -> io::Result<usize> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut synced = crate::util::lock(&self.synced);
        let mut present = HashSet::new();
        let mut new = 0;
        for entry in entries {
            let name = entry?.file_name();
            if !synced.contains(&name) {
                match File::open(self.dir.join(&name)) {
                    Ok(f) => f.sync_all()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new += 1;
            }
            present.insert(name);
        }
        if new > 0 {
            File::open(&self.dir)?.sync_all()?;
        }
        // Forget the files sled has removed since.
        *synced = present;
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_over_the_blob_threshold_is_synced_once_and_small_ones_never() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path())
            .flush_every_ms(None)
            .open()
            .unwrap();
        let blobs = SledSync::open(dir.path()).unwrap();
        db.insert(b"small", vec![7u8; 1024]).unwrap();
        assert_eq!(blobs.sync_new().unwrap(), 0, "no blob for 1 KiB");
        // sled's default segment is 512 KiB: a 300 KiB value is a blob.
        db.insert(b"big", vec![9u8; 300 * 1024]).unwrap();
        let on_disk = std::fs::read_dir(dir.path().join("blobs")).unwrap().count();
        assert!(on_disk >= 1, "sled wrote no blob file");
        assert_eq!(blobs.sync_new().unwrap(), on_disk);
        assert_eq!(
            blobs.sync_new().unwrap(),
            0,
            "synced files are not synced again"
        );
        db.flush().unwrap();
    }
}
