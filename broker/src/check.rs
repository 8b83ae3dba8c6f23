//! `ricochet-broker check --data-dir D`: verifies a stopped store. Reads
//! the manifest (and its checksum), opens the sled database, compares what
//! it holds with what the manifest records, reads every stored value and
//! checks its checksum and decoding, and reports what it found: topics,
//! entries, dead letters, scheduled retries and every problem. It writes
//! nothing of its own (sled's recovery may still rewrite sled's files on
//! open, as a broker start would), and never creates a database where there
//! is none.

use crate::error::{BrokerError, Result};
use crate::storage::manifest::{self, Manifest};
use crate::storage::prelude::*;
use crate::storage::segments::{self, LogSettings, SegmentLog};
use crate::storage::{LogStorage, SledStorage, StorageError};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// What a check found.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// The summary, one line each.
    pub summary: Vec<String>,
    /// Every problem, one line each.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// Whether the store is whole.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.summary {
            writeln!(f, "{line}")?;
        }
        writeln!(f, "problems:          {}", self.problems.len())?;
        for p in &self.problems {
            writeln!(f, "  problem: {p}")?;
        }
        Ok(())
    }
}

/// Checks the stopped store in `dir`.
pub fn check_store(dir: &Path, log_settings: LogSettings) -> Result<CheckReport> {
    if !dir.is_dir() {
        return Err(BrokerError::Config(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let mut report = CheckReport::default();
    let manifest = match std::fs::read(dir.join(manifest::FILE_NAME)) {
        Ok(bytes) => match Manifest::decode(&bytes) {
            Ok(m) => Some(m),
            Err(why) => {
                report
                    .problems
                    .push(format!("the manifest does not verify: {why}"));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(StorageError::Io(e).into()),
    };
    match &manifest {
        Some(m) => report.summary.push(format!(
            "manifest:          store {}, written {}{}",
            m.store_id,
            show_ms(m.written_ms),
            if m.clean {
                " by a clean stop"
            } else {
                " while running (the broker did not stop cleanly)"
            }
        )),
        None => report.summary.push("manifest:          none".to_owned()),
    }
    if !dir.join("db").is_file() {
        report.summary.push("database:          none".to_owned());
        if let Some(m) = &manifest
            && m.recorded_topics() > 0
        {
            report.problems.push(format!(
                "the database (db) is missing, but the manifest records {} topic(s)",
                m.recorded_topics()
            ));
        }
        return Ok(report);
    }
    let store = match SledStorage::open(dir, log_settings.segment_entries, 64 << 20) {
        Ok(s) => Arc::new(s),
        Err(StorageError::Corrupt(why)) => {
            report.problems.push(why);
            return Ok(report);
        }
        Err(e) => return Err(e.into()),
    };
    // The segment-file log, read only: torn tails are listed, not cut.
    let mut log_entries = 0;
    let listed = if dir.join(segments::DIR_NAME).is_dir() {
        match SegmentLog::open(dir, log_settings, false) {
            Ok(log) => {
                log_entries = log.entries();
                report.summary.push(format!(
                    "segment files:     {} topic(s), {} bytes",
                    log.topics().len(),
                    log.size()
                ));
                for torn in &log.torn {
                    report.summary.push(format!(
                        "  torn tail (a write a crash interrupted; cut at the next start): {torn}"
                    ));
                }
                LogStorage::with(store.clone(), log).and_then(|s| s.inventory(true))
            }
            Err(e) => {
                report.problems.push(format!("the segment files: {e}"));
                store.inventory(true)
            }
        }
    } else {
        store.inventory(true)
    };
    let inventory = match listed {
        Ok(inv) => inv,
        Err(e) => {
            report.problems.push(format!("cannot list the store: {e}"));
            return Ok(report);
        }
    };
    if manifest.is_some() || report.problems.is_empty() {
        report
            .problems
            .extend(manifest::verify(manifest.as_ref(), &inventory));
    }
    report.summary.push(format!(
        "database:          store {}",
        inventory.store_id.as_deref().unwrap_or("(no id)")
    ));
    report
        .summary
        .push(format!("topics:            {}", inventory.topics.len()));
    for (name, t) in &inventory.topics {
        let subs: Vec<&str> = t.subscriptions.iter().map(String::as_str).collect();
        report.summary.push(format!(
            "  {name} ({:?}): ids {}..{}, {} segment(s), subscriptions: {}",
            t.kind,
            t.first,
            t.next,
            t.segments.len(),
            if subs.is_empty() {
                "none".to_owned()
            } else {
                subs.join(", ")
            }
        ));
    }
    let verified = store.verify();
    report.summary.push(format!(
        "entries:           {} ({} stored values checked, {log_entries} in segment files, every record checked)",
        verified.entries + log_entries,
        verified.values
    ));
    report.summary.push(format!(
        "dead letters:      {}",
        inventory.dead_letters.unwrap_or(0)
    ));
    report.summary.push(format!(
        "scheduled retries: {}",
        inventory.scheduled.unwrap_or(0)
    ));
    let unlisted = verified.problem_count - verified.problems.len() as u64;
    report.problems.extend(verified.problems);
    if unlisted > 0 {
        report
            .problems
            .push(format!("and {unlisted} more damaged value(s)"));
    }
    Ok(report)
}

fn show_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}
