//! Tiered storage: sealed segments of ordinary topics offloaded to an
//! object store ([`object_store`]: S3-compatible servers or a local
//! directory) and read back from it transparently.
//!
//! [`Tiered`] owns the second tier: the object store, the offload state of
//! every segment (in sled's `meta`, `o:s:<topic>\0<first>`: *offloading*,
//! then *offloaded* with the object's key, size and CRC-32C once it was
//! written and read back), the offload policies ([`policy`]), the
//! background offloader ([`offload`]) and the read path for segments whose
//! local copy is gone ([`read`]). A segment's local copy is deleted only
//! once its *offloaded* state is durable, through the segment log's own
//! trim (the `start` file moves past it), so at start every segment below
//! the log's first local one must be offloaded and the chain of segments
//! must hold across the two tiers, or the store is refused
//! ([`StorageError::Corrupt`]). Objects are named by the segment (topic,
//! first id, creation time), so an offload a crash interrupted is redone
//! onto the same key: no duplicate, no hole.
//!
//! Object store calls run on a small runtime of their own, so the sync
//! [`Storage`](super::Storage) read path can wait for one from any thread
//! and a slow store never occupies the broker's workers; publishing never
//! waits for the object store.

use crate::prelude::*;
mod cache;
pub mod config;
pub mod group;
mod identity;
mod object;
mod offload;
pub mod policy;
mod read;
mod upkeep;

use super::segments::{SegmentInfo, SegmentLog};
use super::{SledStorage, StorageError, StorageResult as Result};
pub use config::TieredConfig;
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Where a segment's offload stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Being written to the object store (or a crash interrupted that):
    /// the local copy is the only one that counts.
    Offloading,
    /// In the object store, verified (size and CRC-32C read back).
    Offloaded,
}

/// One segment's offload state, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegmentState {
    pub topic: String,
    /// The segment's first id (its file name) and one past its last.
    pub first: u64,
    pub next: u64,
    pub first_entry: Option<u64>,
    pub entries: u64,
    /// The segment file header's chain fields.
    pub seq: u64,
    pub prev_next: u64,
    pub created_ms: u64,
    /// The segment file's length (what the object holds before its footer).
    pub file_len: u64,
    pub phase: Phase,
    pub key: String,
    pub object_size: u64,
    pub object_crc: u32,
    pub offloaded_ms: u64,
    /// Recorded by a replication group's command (a replicated topic):
    /// its object is the group's, deleted only by a group's command (a
    /// trim below it, the topic's delete), never by this broker on its own
    /// ([`group`]). Left out of the encoding while false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub group: bool,
    /// A group's record: when replicas drop their local copies of the
    /// range, as its leader resolved the policy at the offload (every
    /// replica follows this, not its own namespace policy or defaults,
    /// unless the topic has its own policy, the group's). Absent in
    /// records of brokers that predate it (each replica's policy in force
    /// decides, as then) and in a factor-1 topic's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<policy::LocalCopies>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl SegmentState {
    fn of(topic: &str, info: &SegmentInfo, key: String) -> Self {
        Self {
            topic: topic.to_owned(),
            first: info.header.first,
            next: info.next,
            first_entry: info.first_entry,
            entries: info.entries,
            seq: info.header.seq,
            prev_next: info.header.prev_next,
            created_ms: info.header.created_ms,
            file_len: info.len,
            phase: Phase::Offloading,
            key,
            object_size: 0,
            object_crc: 0,
            offloaded_ms: 0,
            group: false,
            local: None,
        }
    }

    fn stored_key(&self) -> String {
        state_key(&self.topic, self.first)
    }
}

fn state_key(topic: &str, first: u64) -> String {
    format!("{STATE_PREFIX}{topic}\0{first:020}")
}

const STATE_PREFIX: &str = "s:";

/// A topic's folder of objects: bytes outside `[A-Za-z0-9.-]` as `_XX`
/// (no `%`, which object stores' paths would encode again).
fn object_dir(topic: &str) -> String {
    let mut out = String::with_capacity(topic.len() + 16);
    for b in topic.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02X}"));
        }
    }
    out
}

/// The object store's own runtime (dropped without waiting, even from
/// inside another runtime).
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The second tier.
pub struct Tiered {
    config: TieredConfig,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    sled: Arc<SledStorage>,
    log: Arc<SegmentLog>,
    io: IoRuntime,
    /// Offload states by topic and first id.
    states: Mutex<HashMap<String, BTreeMap<u64, SegmentState>>>,
    policies: policy::Policies,
    cache: Mutex<cache::BlockCache>,
    /// One offload pass at a time (background or triggered).
    offloading: tokio::sync::Mutex<()>,
    /// The last offload error per topic.
    last_error: Mutex<HashMap<String, String>>,
    /// Replicated topics: offloaded by their group's leader through the
    /// group ([`group`]), never by the background offloader.
    grouped: Mutex<HashSet<String>>,
    /// The replicated topics this broker leads, as its leader pass last
    /// said ([`upkeep`]).
    leading: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Tiered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiered")
            .field("url", &self.config.url)
            .finish_non_exhaustive()
    }
}

impl Tiered {
    /// The offload policies of namespaces and topics.
    pub fn policies(&self) -> &policy::Policies {
        &self.policies
    }

    /// Opens the second tier over `log` and `sled`: loads the offload
    /// states and policies and checks that every segment below the first
    /// local one of each topic is offloaded (`logged`: the ordinary
    /// topics; states of other topics are deleted with their objects).
    pub fn open(
        config: TieredConfig,
        sled: Arc<SledStorage>,
        log: Arc<SegmentLog>,
        logged: &HashSet<String>,
    ) -> Result<Arc<Self>> {
        let opened = config.open()?;
        let io = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ricochet-tiered")
            .enable_all()
            .build()?;
        let mut states: HashMap<String, BTreeMap<u64, SegmentState>> = HashMap::new();
        for s in sled.tiered_records::<SegmentState>(STATE_PREFIX)? {
            states
                .entry(s.topic.clone())
                .or_default()
                .insert(s.first, s);
        }
        let policies = policy::Policies::load(&sled, config.default_policy())?;
        let cache = cache::BlockCache::new(config.cache_bytes);
        let t = Self {
            store: opened.store,
            prefix: opened.prefix,
            config,
            sled,
            log,
            io: IoRuntime(Some(io)),
            states: Mutex::new(HashMap::new()),
            policies,
            cache: Mutex::new(cache),
            offloading: tokio::sync::Mutex::new(()),
            last_error: Mutex::new(HashMap::new()),
            grouped: Mutex::new(HashSet::new()),
            leading: Mutex::new(HashSet::new()),
        };
        for (topic, segs) in states {
            if segs.values().any(|s| s.group) {
                let kept = t.check_group_topic(&topic, segs, logged.contains(&topic))?;
                if !kept.is_empty() {
                    crate::util::lock(&t.states).insert(topic, kept);
                }
                continue;
            }
            if !logged.contains(&topic) {
                tracing::info!(%topic, "tiered: the topic was deleted; deleting its objects");
                for s in segs.values() {
                    t.sled.remove_tiered(&s.stored_key())?;
                }
                t.delete_after_flush(Vec::new(), vec![topic]);
                continue;
            }
            let kept = t.check_topic(&topic, segs)?;
            crate::util::lock(&t.states).insert(topic, kept);
        }
        Ok(Arc::new(t))
    }

    /// Checks one topic's states against its local segments; returns those
    /// that still stand for a segment.
    fn check_topic(
        &self,
        topic: &str,
        segs: BTreeMap<u64, SegmentState>,
    ) -> Result<BTreeMap<u64, SegmentState>> {
        let local = self.log.segment_infos(topic);
        let local_start = local.first().map_or(u64::MAX, |s| s.header.first);
        let mut kept = BTreeMap::new();
        let mut prev: Option<&SegmentState> = None;
        for s in segs.values() {
            if s.first >= local_start {
                if local.iter().any(|l| l.header.first == s.first) {
                    kept.insert(s.first, s.clone());
                } else {
                    // Trimmed (its state's removal was not yet durable).
                    self.sled.remove_tiered(&s.stored_key())?;
                    self.delete_after_flush(vec![s.key.clone()], Vec::new());
                }
                continue;
            }
            if s.phase != Phase::Offloaded {
                return Err(StorageError::Corrupt(format!(
                    "log of {topic}: segment {} is gone locally and its offload was never verified",
                    s.first
                )));
            }
            if let Some(p) = prev
                && (s.prev_next != p.next || s.seq <= p.seq)
            {
                return Err(StorageError::Corrupt(format!(
                    "log of {topic}: offloaded segment {} does not follow offloaded segment {}: a segment is missing",
                    s.first, p.first
                )));
            }
            prev = Some(s);
            kept.insert(s.first, s.clone());
        }
        if let (Some(p), Some(l)) = (prev, local.first())
            && (l.header.prev_next != p.next || l.header.seq <= p.seq)
        {
            return Err(StorageError::Corrupt(format!(
                "log of {topic}: local segment {} does not follow offloaded segment {}: a segment is missing",
                l.header.first, p.first
            )));
        }
        Ok(kept)
    }

    /// Runs `f` on the object store's runtime and waits for it (from any
    /// thread, inside a runtime or not).
    fn block<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        let Some(rt) = &self.io.0 else {
            return Err(StorageError::Remote("shut down".into()));
        };
        futures::executor::block_on(rt.spawn(f)).map_err(StorageError::joined)
    }

    /// The object key of a segment.
    fn object_key(&self, topic: &str, info: &SegmentInfo) -> String {
        let name = format!(
            "{}/{:020}-{}.seg",
            object_dir(topic),
            info.header.first,
            info.header.created_ms
        );
        if self.prefix.is_empty() {
            name
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    fn topic_prefix(&self, topic: &str) -> ObjectPath {
        let name = object_dir(topic);
        if self.prefix.is_empty() {
            ObjectPath::from(name)
        } else {
            ObjectPath::from(format!("{}/{name}", self.prefix))
        }
    }

    /// Whether any segment of `topic` has an offload state (a cheap test
    /// that keeps reads of topics never offloaded on the local path).
    pub fn has_states(&self, topic: &str) -> bool {
        crate::util::lock(&self.states)
            .get(topic)
            .is_some_and(|m| !m.is_empty())
    }

    /// Offloaded segments of `topic` whose local copy is gone (below the
    /// first local segment), oldest first.
    pub fn remote(&self, topic: &str) -> Vec<SegmentState> {
        if !self.has_states(topic) {
            return Vec::new();
        }
        let local_start = self
            .log
            .segment_starts(topic)
            .first()
            .copied()
            .unwrap_or(u64::MAX);
        crate::util::lock(&self.states)
            .get(topic)
            .map(|m| m.range(..local_start).map(|(_, s)| s.clone()).collect())
            .unwrap_or_default()
    }

    /// `(first entry, next)` of the remote-only segments, if any.
    pub fn remote_range(&self, topic: &str) -> Option<(u64, u64)> {
        let remote = self.remote(topic);
        let first = remote.iter().find_map(|s| s.first_entry)?;
        Some((first, remote.last()?.next))
    }

    /// Drops the offload states of segments holding only ids `< below` and
    /// deletes their objects after the next flush (retention and consumed
    /// segments cover both tiers).
    pub fn trim(&self, topic: &str, below: u64) -> Result<()> {
        let mut states = crate::util::lock(&self.states);
        let Some(m) = states.get_mut(topic) else {
            return Ok(());
        };
        let doomed: Vec<u64> = m
            .iter()
            .take_while(|(_, s)| s.next <= below)
            .map(|(k, _)| *k)
            .collect();
        let mut keys = Vec::new();
        for k in doomed {
            if let Some(s) = m.remove(&k) {
                self.sled.remove_tiered(&s.stored_key())?;
                keys.push(s.key);
            }
        }
        drop(states);
        self.delete_after_flush(keys, Vec::new());
        Ok(())
    }

    /// Forgets a deleted topic's states; its objects go after the next
    /// flush.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        if self.is_grouped(topic) {
            // A replicated topic's objects are the group's: its delete
            // command deletes them ([`Tiered::delete_group_objects`]).
            self.forget_topic(topic)?;
            return Ok(());
        }
        if let Some(m) = crate::util::lock(&self.states).remove(topic) {
            for s in m.values() {
                self.sled.remove_tiered(&s.stored_key())?;
            }
        }
        self.delete_after_flush(Vec::new(), vec![topic.to_owned()]);
        Ok(())
    }

    /// Deletes objects no longer referenced (`keys`, and every object of
    /// the deleted `topics`) in the background, once a sled flush made the
    /// removal of their states durable; a failure leaves an unreferenced
    /// object (logged, `ricochet_tiered_delete_errors_total`).
    fn delete_after_flush(&self, keys: Vec<String>, topics: Vec<String>) {
        if keys.is_empty() && topics.is_empty() {
            return;
        }
        let Some(rt) = &self.io.0 else { return };
        let store = self.store.clone();
        let sled = self.sled.clone();
        let prefixes: Vec<ObjectPath> = topics.iter().map(|t| self.topic_prefix(t)).collect();
        rt.spawn(async move {
            use futures::TryStreamExt as _;
            if let Err(e) = sled.flush().await {
                tracing::warn!(error = %e, "tiered: flush failed; unreferenced objects stay");
                return;
            }
            let mut paths: Vec<ObjectPath> = keys.into_iter().map(ObjectPath::from).collect();
            for p in prefixes {
                match store.list(Some(&p)).try_collect::<Vec<_>>().await {
                    Ok(objects) => paths.extend(objects.into_iter().map(|o| o.location)),
                    Err(e) => tracing::warn!(prefix = %p, error = %e, "tiered: cannot list a deleted topic's objects; they stay"),
                }
            }
            for p in paths {
                match store.delete(&p).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => {
                        metrics::counter!("ricochet_tiered_delete_errors_total").increment(1);
                        tracing::warn!(object = %p, error = %e, "tiered: cannot delete an unreferenced object; it stays");
                    }
                }
            }
        });
    }

    /// The offload states of `topic`, by first id.
    pub fn states(&self, topic: &str) -> BTreeMap<u64, SegmentState> {
        crate::util::lock(&self.states)
            .get(topic)
            .cloned()
            .unwrap_or_default()
    }

    /// The last offload error of `topic`, if its last attempt failed.
    pub fn last_error(&self, topic: &str) -> Option<String> {
        crate::util::lock(&self.last_error).get(topic).cloned()
    }

    /// Sets (or, when empty, removes) the offload policy of `target`
    /// (durable after the next flush).
    pub fn set_policy(&self, target: &str, policy: policy::OffloadPolicy) -> Result<()> {
        self.policies.set(&self.sled, target, policy)
    }

    /// How often the background offloader looks (`[tiered] interval`).
    pub fn interval(&self) -> std::time::Duration {
        self.config.interval
    }

    /// The segment-file log this tier extends.
    pub fn log(&self) -> &SegmentLog {
        &self.log
    }
}

#[cfg(test)]
mod group_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod upkeep_tests;
