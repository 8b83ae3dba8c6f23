//! The one-time upgrade of a store written before the segment-file log:
//! ordinary topics' entries move from sled's `seg/<topic>/<n>` trees into
//! segment files.
//!
//! Per topic, crash-safe at every step: the entries are copied into a
//! staging directory (`log/<topic>~upgrading/`; `~` never occurs in an encoded name), every file fsynced, the
//! topic's directory renamed into place and the log directory fsynced;
//! only then are the sled trees dropped (the id floor raised first) and
//! sled flushed. A crash before the rename leaves a staging directory,
//! removed at the next start, and the sled trees, copied again; a crash
//! after it finds the topic's directory in place and only drops the trees.

use super::{LogSettings, SegmentLog, dir_name, sync_dir};
use crate::prelude::*;
use crate::{SledStorage, StorageResult as Result, TopicKind};
use std::collections::HashSet;
use std::path::Path;

/// Suffix of a staging directory.
pub const PARTIAL: &str = "~upgrading";

/// Entries read from sled per step.
const CHUNK: usize = 4096;

/// Moves every ordinary topic's entries out of sled's trees into the log
/// under `data_dir`; returns the number of topics moved.
pub async fn run(sled: &SledStorage, data_dir: &Path, settings: LogSettings) -> Result<usize> {
    let ordinary: HashSet<String> = sled
        .list_topics()?
        .into_iter()
        .filter(|t| t.kind == TopicKind::Normal)
        .map(|t| t.name)
        .collect();
    let mut todo: Vec<String> = sled
        .topics_with_trees()
        .into_iter()
        .filter(|t| ordinary.contains(t))
        .collect();
    todo.sort();
    if todo.is_empty() {
        return Ok(0);
    }
    let root = data_dir.join(super::DIR_NAME);
    std::fs::create_dir_all(&root)?;
    let started = std::time::Instant::now();
    let mut entries = 0u64;
    for topic in &todo {
        let dir = root.join(dir_name(topic));
        if !dir.exists() {
            entries += copy(sled, &root, topic, settings)?;
        }
        sled.retire_trees(topic)?;
    }
    sled.flush().await?;
    tracing::info!(
        topics = todo.len(),
        entries,
        took_ms = started.elapsed().as_millis() as u64,
        "storage upgraded: ordinary topics' entries moved from sled trees into segment files (once)"
    );
    Ok(todo.len())
}

/// Copies one topic's entries into its staging directory, then renames it
/// into place, durably; returns the number of entries.
fn copy(sled: &SledStorage, root: &Path, topic: &str, settings: LogSettings) -> Result<u64> {
    let staging = root.join(format!("{}{PARTIAL}", dir_name(topic)));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir_all(&staging)?;
    let log = SegmentLog::open_at(staging.clone(), settings, true)?;
    log.number_by_block(topic)?;
    let block = settings.segment_entries;
    let (mut from, _) = sled.entry_range(topic)?;
    let mut copied = 0u64;
    loop {
        let chunk = sled.read(topic, from, CHUNK, 8 << 20)?;
        let Some((last, _)) = chunk.last() else {
            break;
        };
        from = last + 1;
        // Runs of consecutive ids in one block become one record each.
        let mut run_first = chunk[0].0;
        let mut run: Vec<Vec<u8>> = Vec::new();
        for (id, entry) in chunk {
            // A run ends at a gap and at a block's end: each segment holds
            // the entries of one of sled's trees.
            if id != run_first + run.len() as u64 || (id % block == 0 && !run.is_empty()) {
                log.append(topic, run_first, &run)?;
                run_first = id;
                run.clear();
            }
            run.push(entry);
            copied += 1;
        }
        log.append(topic, run_first, &run)?;
    }
    log.sync()?;
    let dir = root.join(dir_name(topic));
    let built = staging.join(dir_name(topic));
    if built.exists() {
        sync_dir(&built)?;
        std::fs::rename(&built, &dir)?;
    } else {
        // No entry left (every segment trimmed): an empty directory.
        std::fs::create_dir_all(&dir)?;
    }
    sync_dir(root)?;
    std::fs::remove_dir_all(&staging)?;
    tracing::info!(
        topic,
        entries = copied,
        "upgrade: topic's entries copied into segment files"
    );
    Ok(copied)
}
