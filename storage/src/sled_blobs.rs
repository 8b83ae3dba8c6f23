//! Making sled's blob files durable before the log that points at them.
//!
//! sled 0.34 writes a page too large for a quarter of its segment (a value,
//! or a leaf of up to 17 values, over `segment_size / 4`) to a file of its
//! own under `<db>/blobs/`, and never fsyncs that file nor the directory
//! (`pagecache/blob_io.rs`, `write_blob`): its `flush` makes the log record
//! pointing at the blob durable, not the blob. After a power cut such a
//! write, acknowledged as durable, could come back as a missing or torn
//! file. [`BlobSync::sync_new`] closes that gap: called before sled's flush
//! (sled writes a blob file whole, synchronously, inside the insert that
//! makes it), it fsyncs every blob file it has not synced yet and then the
//! directory, so by the time the flush's log record is durable its blob is
//! too. A blob created by a concurrent writer between the two calls is
//! synced by the next flush, which is the one that acknowledges it; only
//! its pointer may reach the disk first (a power cut in that window leaves
//! an unacknowledged write's page unreadable, which the store's read
//! checks report as damage rather than serve).

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The blob files of one sled database already made durable.
#[derive(Debug)]
pub struct BlobSync {
    dir: PathBuf,
    synced: Mutex<HashSet<OsString>>,
}

impl BlobSync {
    /// For the sled database at `db_dir` (its `blobs/` directory).
    pub fn new(db_dir: &Path) -> Self {
        Self {
            dir: db_dir.join("blobs"),
            synced: Mutex::new(HashSet::new()),
        }
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
        let blobs = BlobSync::new(dir.path());
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
