//! Converting a group's log from the sled tree earlier brokers kept it in
//! (`log/<group>`: key the index, big-endian; value the CBOR entry, the
//! same bytes a segment record holds) to segment files.
//!
//! Crash-safe by rolling forward: the entries are written to
//! `<group dir>.converting`, fsynced, and the directory renamed to its
//! final name (and its parent fsynced) before the tree is dropped. A node
//! that finds the final directory and the tree died after the rename: it
//! only drops the tree. A `.converting` directory left by a crash before
//! the rename is removed and the conversion starts again.

use super::files::{FileLog, sync_dir};
use crate::RaftDb;
use std::path::Path;

/// A record of converted entries holds about this many bytes.
const BATCH_BYTES: usize = 1 << 20;

/// Converts `group`'s sled log tree, if there is one, into segment files
/// in `dir`; returns how many entries were converted.
pub(super) fn convert(db: &RaftDb, group: &str, dir: &Path) -> crate::Result<u64> {
    let name = format!("log/{group}");
    if !db
        .tree_names()
        .iter()
        .any(|n| n.as_ref() == name.as_bytes())
    {
        return Ok(0);
    }
    if dir.exists() {
        db.drop_tree(&name)?;
        db.flush()?;
        return Ok(0);
    }
    let tree = db.open_tree(&name)?;
    let parent = dir.parent().unwrap_or(dir);
    let Some(file_name) = dir.file_name() else {
        return Err(std::io::Error::other("raft log directory has no name").into());
    };
    let tmp = parent.join(format!("{}.converting", file_name.to_string_lossy()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    let (mut log, _) = FileLog::open(&tmp, None)?;
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut batch_first = 0u64;
    let mut batch_bytes = 0usize;
    let mut converted = 0u64;
    for kv in tree.iter() {
        let (k, v) = kv?;
        let index = u64::from_be_bytes(
            k.as_ref()
                .try_into()
                .map_err(|_| crate::ReplicationError::Codec(format!("raft log key {k:?}")))?,
        );
        let contiguous = batch_first + batch.len() as u64 == index;
        if !batch.is_empty() && (!contiguous || batch_bytes >= BATCH_BYTES) {
            log.append(batch_first, &batch)?;
            batch.clear();
            batch_bytes = 0;
        }
        if batch.is_empty() {
            batch_first = index;
        }
        batch_bytes += v.len();
        batch.push(v.to_vec());
        converted += 1;
    }
    if !batch.is_empty() {
        log.append(batch_first, &batch)?;
    }
    if let Some(f) = log.active_file() {
        f.sync_data()?;
    }
    drop(log);
    sync_dir(&tmp)?;
    std::fs::rename(&tmp, dir)?;
    sync_dir(parent)?;
    db.drop_tree(&name)?;
    db.flush()?;
    tracing::info!(
        group,
        entries = converted,
        "raft log converted from sled to segment files"
    );
    Ok(converted)
}
