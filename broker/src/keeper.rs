//! [`ManifestKeeper`]: the broker's side of the manifest
//! ([`crate::storage::manifest`]). At start it compares the manifest with
//! what the store holds and refuses a store that lacks something the
//! manifest records (unless told to accept the loss); while running it
//! reserves entry ids durably ahead of use, records snapshots of what is
//! durable, and forgets deleted topics and subscriptions before they are
//! deleted; at a clean stop it writes exact facts and counts.
//!
//! Writes are grouped like flushes: whoever needs the manifest on disk
//! waits for a write that started after its change, and one write covers
//! every change made before it. A manifest write is a small file written,
//! fsynced, renamed and its directory fsynced.
//!
//! What the manifest promises:
//! * `reserved` per topic is exact: no id at or above it was ever handed
//!   out, and no id below it is handed out again (so a crash leaves gaps,
//!   never reuse);
//! * a topic's recorded `next`, segments and subscriptions are lower bounds,
//!   as of the last snapshot (every few seconds while writes happen, and at
//!   a clean stop);
//! * dead-letter and schedule counts, per subscription, are exact at a
//!   clean stop and absent while running (retries fire and dead letters
//!   are purged between snapshots), so they are checked only after a clean
//!   stop. They are checked before serving in the default mode too
//!   (`verify_on_start = "background"`: a scan of the keys of both trees
//!   before serving; `"before"` takes them from its pass). Only `"off"`, the
//!   fast mode, neither counts them at a clean stop nor compares them.

use crate::clock::SharedClock;
use crate::error::{BrokerError, Result};
use crate::flusher::Flusher;
use crate::storage::manifest::{self, Manifest, TopicFacts};
use crate::storage::{Inventory, Storage, StorageError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Problems listed in a refusal line (the rest are counted).
const LISTED: usize = 3;

#[derive(Debug)]
struct State {
    manifest: Manifest,
    /// Bumped by every change to `manifest`.
    version: u64,
}

/// Keeps the manifest of one store.
#[derive(Debug)]
pub struct ManifestKeeper {
    storage: Arc<dyn Storage>,
    clock: SharedClock,
    state: std::sync::Mutex<State>,
    /// The version last written; held while writing.
    written: tokio::sync::Mutex<u64>,
    /// Held by a snapshot and by deletions, so a snapshot never records a
    /// topic or subscription being deleted; holds the change count the last
    /// snapshot saw.
    snapshots: tokio::sync::Mutex<u64>,
    changes: AtomicU64,
    closed: AtomicBool,
}

/// A deletion in progress: holds off snapshots until dropped, after the
/// store has deleted what the manifest no longer names.
#[derive(Debug)]
pub struct Forgetting<'a> {
    keeper: &'a ManifestKeeper,
    _guard: tokio::sync::MutexGuard<'a, u64>,
}

impl Forgetting<'_> {
    /// Removes a topic (its reservation included) from the manifest, on disk.
    pub async fn topic(&self, name: &str) -> Result<()> {
        let v = self.keeper.change(|m| {
            m.topics.remove(name);
        });
        self.keeper.persist(v).await
    }

    /// Removes a subscription from the manifest, on disk.
    pub async fn subscription(&self, topic: &str, name: &str) -> Result<()> {
        let v = self.keeper.change(|m| {
            if let Some(r) = m.topics.get_mut(topic).and_then(|t| t.recorded.as_mut()) {
                r.subscriptions.remove(name);
            }
        });
        self.keeper.persist(v).await
    }
}

impl ManifestKeeper {
    /// Checks `storage` against its manifest and takes it over: a fresh
    /// store gets an identity, and the manifest is rewritten at once (as
    /// "not clean", with what the store holds now). Fails with
    /// [`BrokerError::DataLoss`] when the store lacks what the manifest
    /// records, unless `accept_loss` (then each loss is logged and the
    /// store's current state becomes the record). The dead-letter and
    /// schedule counts a clean stop recorded are compared only with
    /// `count` (they take a scan of both trees: free after the verify pass
    /// run before serving, which counted them).
    pub async fn open(
        storage: Arc<dyn Storage>,
        accept_loss: bool,
        count: bool,
        clock: SharedClock,
    ) -> Result<Self> {
        let (found, unreadable) = match storage.load_manifest() {
            Ok(m) => (m, None),
            Err(StorageError::Corrupt(why)) => (None, Some(why)),
            Err(e) => return Err(e.into()),
        };
        let started = std::time::Instant::now();
        let counted = count && found.as_ref().is_some_and(|m| m.clean);
        let inventory = storage.inventory(counted)?;
        tracing::info!(
            counted,
            topics = inventory.topics.len(),
            scheduled = inventory.scheduled,
            dead_letters = inventory.dead_letters,
            took_ms = started.elapsed().as_millis() as u64,
            "start: inventory taken for the manifest check"
        );
        // A store from before checksums has data, no store id and no
        // manifest; with a manifest, a missing id means a lost database (the
        // segment-file log's data is no sign of an old store).
        let legacy = found.is_none()
            && unreadable.is_none()
            && inventory.store_id.is_none()
            && inventory.has_data;
        let mut problems = Vec::new();
        if let Some(why) = &unreadable {
            problems.push(format!("the manifest does not verify: {why}"));
        }
        if unreadable.is_none() || legacy {
            problems.extend(manifest::verify(found.as_ref(), &inventory));
        }
        if !problems.is_empty() {
            if legacy || !accept_loss {
                return Err(BrokerError::DataLoss(refusal(&problems, legacy)));
            }
            for p in &problems {
                tracing::warn!(problem = %p, "accepting data loss (--accept-data-loss)");
            }
        }
        let store_id = match (&inventory.store_id, &found) {
            (Some(id), _) => id.clone(),
            (None, Some(m)) => m.store_id.clone(),
            (None, None) => format!("{:032x}", rand::random::<u128>()),
        };
        if inventory.store_id.is_none() {
            storage.set_store_id(&store_id)?;
            storage.flush().await?;
            tracing::info!(store = %store_id, "new store");
        }
        let manifest = fresh_manifest(store_id, found, &inventory);
        let keeper = Self {
            storage,
            clock,
            state: std::sync::Mutex::new(State {
                manifest,
                version: 1,
            }),
            written: tokio::sync::Mutex::new(0),
            snapshots: tokio::sync::Mutex::new(0),
            changes: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        };
        keeper.persist(1).await?;
        Ok(keeper)
    }

    /// The store's identity.
    pub fn store_id(&self) -> String {
        crate::util::lock(&self.state).manifest.store_id.clone()
    }

    /// Ids below this may have been handed out for `topic`.
    pub fn reserved(&self, topic: &str) -> u64 {
        crate::util::lock(&self.state)
            .manifest
            .topics
            .get(topic)
            .map_or(0, |t| t.reserved)
    }

    /// Makes "`topic`'s ids stay below `ceiling`" durable (if not already)
    /// and returns the ceiling now on disk (at least `ceiling`).
    pub async fn reserve(&self, topic: &str, ceiling: u64) -> Result<u64> {
        if self.closed.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        let mut granted = 0;
        let v = self.change(|m| {
            let t = m.topics.entry(topic.to_owned()).or_default();
            t.reserved = t.reserved.max(ceiling);
            granted = t.reserved;
        });
        self.persist(v).await?;
        Ok(granted)
    }

    /// Notes that something a snapshot records may have changed.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Records what the store holds once it is durable: takes an inventory,
    /// waits for a flush that started after it, then writes it. Does
    /// nothing when nothing changed since the last snapshot.
    pub async fn snapshot(&self, flusher: &Flusher) -> Result<()> {
        let mut seen = self.snapshots.lock().await;
        let changes = self.changes.load(Ordering::Acquire);
        if changes == *seen {
            return Ok(());
        }
        let inventory = self.storage.inventory(false)?;
        flusher.durable().await?;
        let v = self.change(|m| {
            for (name, t) in &inventory.topics {
                m.topics.entry(name.clone()).or_default().recorded = Some(t.recorded());
            }
        });
        self.persist(v).await?;
        *seen = changes;
        Ok(())
    }

    /// Holds off snapshots while something is deleted: forget it in the
    /// manifest first, then delete it from the store, then drop this.
    pub async fn forgetting(&self) -> Forgetting<'_> {
        Forgetting {
            keeper: self,
            _guard: self.snapshots.lock().await,
        }
    }

    /// Refuses further reservations (the broker is stopping).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Writes the manifest of a clean stop: `handed_out` gives each open
    /// topic's next id (nothing at or above it was handed out, so the
    /// reservation comes down to it), `inventory` (counted, after the last
    /// flush) what the store holds.
    pub async fn stop_clean(
        &self,
        handed_out: &[(String, u64)],
        inventory: &Inventory,
    ) -> Result<()> {
        self.close();
        let v = self.change(|m| {
            for (name, next) in handed_out {
                let t = m.topics.entry(name.clone()).or_default();
                let stored = inventory.topics.get(name).map_or(0, |i| i.next);
                t.reserved = (*next).max(stored);
            }
            for (name, t) in &inventory.topics {
                let facts = m.topics.entry(name.clone()).or_default();
                facts.reserved = facts.reserved.max(t.next);
                facts.recorded = Some(t.recorded());
            }
            m.dead_letters = inventory.dead_letters;
            m.scheduled = inventory.scheduled;
            m.clean = true;
        });
        self.persist(v).await
    }

    /// Applies `f` to the manifest in memory; returns the version that
    /// includes it.
    fn change(&self, f: impl FnOnce(&mut Manifest)) -> u64 {
        let mut s = crate::util::lock(&self.state);
        f(&mut s.manifest);
        s.version += 1;
        s.version
    }

    /// Returns once a manifest including version `v` is on disk.
    async fn persist(&self, v: u64) -> Result<()> {
        let mut written = self.written.lock().await;
        if *written >= v {
            return Ok(());
        }
        let (mut manifest, version) = {
            let s = crate::util::lock(&self.state);
            (s.manifest.clone(), s.version)
        };
        manifest.written_ms = self.clock.now_ms();
        self.storage.save_manifest(&manifest).await?;
        *written = version;
        Ok(())
    }
}

/// The manifest a run starts with: what the store holds now (checked, or
/// accepted), and every reservation the previous manifest made. It records
/// no counts: they hold only at a clean stop.
fn fresh_manifest(store_id: String, previous: Option<Manifest>, inventory: &Inventory) -> Manifest {
    let mut m = Manifest {
        store_id,
        ..Manifest::default()
    };
    for (name, facts) in previous.map(|p| p.topics).unwrap_or_default() {
        m.topics.insert(
            name,
            TopicFacts {
                reserved: facts.reserved,
                recorded: None,
            },
        );
    }
    for (name, t) in &inventory.topics {
        let facts = m.topics.entry(name.clone()).or_default();
        facts.reserved = facts.reserved.max(t.next);
        let mut recorded = t.recorded();
        recorded.counts.clear();
        facts.recorded = Some(recorded);
    }
    m
}

/// One line: what is wrong and what the operator can do.
fn refusal(problems: &[String], legacy: bool) -> String {
    let mut line = problems
        .iter()
        .take(LISTED)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > LISTED {
        line.push_str(&format!("; and {} more", problems.len() - LISTED));
    }
    if !legacy {
        line.push_str(
            " (`ricochet-broker check` lists everything; --accept-data-loss starts with what is left)",
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::storage::prelude::*;
    use crate::storage::{MemoryStorage, TopicKind, TopicRecord};

    async fn open(s: &Arc<MemoryStorage>, accept: bool) -> Result<ManifestKeeper> {
        ManifestKeeper::open(s.clone(), accept, true, Arc::new(SystemClock)).await
    }

    fn topic(s: &MemoryStorage, name: &str, entries: usize) {
        s.put_topic(&TopicRecord {
            name: name.into(),
            created_ms: 0,
            kind: TopicKind::Normal,
            replicas: 1,
            trimmed_below: 0,
        })
        .unwrap();
        let e: Vec<Vec<u8>> = (0..entries).map(|i| vec![i as u8]).collect();
        s.append(name, 0, &e, None).unwrap();
    }

    #[tokio::test]
    async fn a_fresh_store_gets_an_identity_and_a_manifest() {
        let s = Arc::new(MemoryStorage::new());
        let k = open(&s, false).await.unwrap();
        let m = s.load_manifest().unwrap().unwrap();
        assert_eq!(m.store_id.len(), 32);
        assert_eq!(s.inventory(false).unwrap().store_id, Some(m.store_id));
        assert!(!m.clean);
        assert_eq!(k.reserved("t"), 0);
    }

    #[tokio::test]
    async fn reservations_are_on_disk_before_they_are_granted() {
        let s = Arc::new(MemoryStorage::new());
        let k = open(&s, false).await.unwrap();
        assert_eq!(k.reserve("t", 100).await.unwrap(), 100);
        assert_eq!(
            s.load_manifest().unwrap().unwrap().topics["t"].reserved,
            100
        );
        // Never lowered by a smaller request.
        assert_eq!(k.reserve("t", 50).await.unwrap(), 100);
        k.close();
        assert!(matches!(
            k.reserve("t", 200).await,
            Err(BrokerError::ShuttingDown)
        ));
    }

    #[tokio::test]
    async fn a_store_that_lost_entries_is_refused_unless_the_loss_is_accepted() {
        let s = Arc::new(MemoryStorage::new());
        let k = open(&s, false).await.unwrap();
        topic(&s, "t", 10);
        let inv = s.inventory(true).unwrap();
        k.stop_clean(&[("t".into(), 10)], &inv).await.unwrap();
        let m = s.load_manifest().unwrap().unwrap();
        assert!(m.clean);
        assert_eq!(m.topics["t"].reserved, 10);

        // The same store opens; a store with fewer entries does not.
        open(&s, false).await.unwrap();
        let shorter = Arc::new(MemoryStorage::new());
        shorter.set_store_id(&m.store_id).unwrap();
        topic(&shorter, "t", 4);
        shorter.save_manifest(&m).await.unwrap();
        let e = open(&shorter, false).await.unwrap_err().to_string();
        assert!(
            e.contains("topic t ends at entry 4, the manifest records entries up to 10"),
            "{e}"
        );
        assert!(e.contains("--accept-data-loss"), "{e}");
        // Accepted: it opens, keeps the reservation, and records the loss.
        let k = open(&shorter, true).await.unwrap();
        assert_eq!(k.reserved("t"), 10);
        open(&shorter, false).await.unwrap();
    }

    #[tokio::test]
    async fn an_empty_store_with_a_manifest_of_data_is_refused() {
        let s = Arc::new(MemoryStorage::new());
        let k = open(&s, false).await.unwrap();
        topic(&s, "t", 3);
        k.stop_clean(&[], &s.inventory(true).unwrap())
            .await
            .unwrap();
        let empty = Arc::new(MemoryStorage::new());
        empty
            .save_manifest(&s.load_manifest().unwrap().unwrap())
            .await
            .unwrap();
        let e = open(&empty, false).await.unwrap_err().to_string();
        assert!(e.contains("database is missing or empty"), "{e}");
    }
}
