//! The offloader: once every `interval` (and when an operator triggers
//! it) it seals idle active segments past `segment_max_age`, picks each
//! topic's sealed segments its policy says to offload, writes each as one
//! object (paced to `pace_bytes_per_second`), reads it back to check its
//! size and CRC-32C, records it *offloaded* durably, and only then lets
//! the local copy go (after the policy's lag, never with `keep_local`).
//!
//! It runs on the object store's runtime and holds no lock a publish
//! takes, so a slow or failing store never blocks publishing: a failure
//! is a rate-limited WARN, `ricochet_tiered_offload_errors_total`, and a
//! retry after a growing backoff. Test failpoints
//! (`RICOCHET_FAILPOINT=tiered.offload.after_put|after_verified|after_drop`)
//! abort the broker between the steps.

use super::{Phase, SegmentState, Tiered};
use crate::prelude::*;
use crate::segments::SegmentInfo;
use crate::{StorageError, StorageResult as Result};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Parts of a multipart upload (S3's minimum is 5 MiB).
const PART: usize = 8 << 20;
/// The longest wait between failing passes.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// At most one WARN about a failing object store this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// What an offload pass of one topic did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub segments: u32,
    pub bytes: u64,
    pub local_deleted: u32,
}

/// An object store failure, with the chain of its causes (the top one
/// alone often says only "HTTP error").
fn remote(what: &str, e: impl std::error::Error) -> StorageError {
    let mut text = format!("{what}: {e}");
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    StorageError::Remote(text)
}

impl Tiered {
    /// Starts the background offloader (until `stop`).
    pub fn spawn(self: &Arc<Self>, stop: CancellationToken) {
        let Some(rt) = &self.io.0 else { return };
        let me = Arc::downgrade(self);
        let every = self.config.interval;
        rt.spawn(async move {
            let mut failures = 0u32;
            let mut warned: Option<Instant> = None;
            loop {
                let wait = if failures == 0 {
                    every
                } else {
                    (every * 2u32.saturating_pow(failures.min(16))).min(MAX_BACKOFF)
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => break,
                }
                let Some(me) = me.upgrade() else { break };
                match me.pass().await {
                    Ok(()) => {
                        if failures > 0 {
                            tracing::info!("tiered: the object store answers again; offloading resumed");
                        }
                        failures = 0;
                    }
                    Err(e) => {
                        failures += 1;
                        if warned.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                            warned = Some(Instant::now());
                            tracing::warn!(error = %e, failures, "tiered: offload failed; publishing continues, segments stay local, retrying with backoff");
                        }
                    }
                }
            }
        });
    }

    /// One background pass over every topic of the log.
    async fn pass(self: &Arc<Self>) -> Result<()> {
        // Replicated topics' idle segments are sealed by their groups'
        // leaders through the group (every replica at the same id).
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.log.seal_idle(|t| me.is_grouped(t)))
            .await
            .map_err(StorageError::joined)??;
        let mut first_error = None;
        let mut dropped = 0;
        for topic in self.log.topics() {
            if self.is_grouped(&topic) {
                // A replicated topic: its group's leader offloads it; every
                // replica lets its local copies go once the policy's lag
                // after the recorded offload passed (a restart within the
                // lag, say).
                match self.drop_due_group(&topic, crate::util::wall_ms()) {
                    Ok(n) => dropped += n,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
                continue;
            }
            match self.offload_topic(&topic, false).await {
                Ok(_) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if dropped > 0 {
            self.release_dropped_files().await?;
        }
        let (lag_s, pending) = self.offload_lag();
        metrics::gauge!("ricochet_tiered_offload_lag_seconds").set(lag_s as f64);
        metrics::gauge!("ricochet_tiered_offload_pending_bytes").set(pending as f64);
        first_error.map_or(Ok(()), Err)
    }

    /// How far `topic` is behind its policy: the age in seconds of the
    /// oldest segment due for offload and not offloaded, and the bytes due.
    pub(super) fn lag(&self, topic: &str) -> (u64, u64) {
        let Some((policy, _)) = self.effective(topic) else {
            return (0, 0);
        };
        let (sealed, local_bytes) = self.sealed(topic);
        let now = crate::util::wall_ms();
        let due = policy.choose(now, local_bytes, &tuples(&sealed, &self.states(topic)));
        let age = due.first().map_or(0, |i| {
            now.saturating_sub(sealed[*i].header.created_ms) / 1000
        });
        (age, due.iter().map(|i| sealed[*i].len).sum())
    }

    /// The policy in force for `topic` and where it comes from.
    pub fn effective(&self, topic: &str) -> Option<(super::policy::OffloadPolicy, String)> {
        self.policies.effective(topic, namespace_of(topic))
    }

    /// `topic`'s sealed local segments and the bytes of all its local ones.
    fn sealed(&self, topic: &str) -> (Vec<SegmentInfo>, u64) {
        let all = self.log.segment_infos(topic);
        let bytes = all.iter().map(|s| s.len).sum();
        (all.into_iter().filter(|s| !s.active).collect(), bytes)
    }

    /// Offloads what `topic`'s policy says (with `force`, every sealed
    /// segment, the active one sealed first), then deletes the local
    /// copies the policy lets go.
    pub async fn offload_topic(self: &Arc<Self>, topic: &str, force: bool) -> Result<Outcome> {
        if self.is_grouped(topic) {
            return Err(StorageError::Replication(format!(
                "{topic} is replicated: its group's leader offloads it (offload_through)"
            )));
        }
        let _one_pass = self.offloading.lock().await;
        let done = self.offload_locked(topic, force).await;
        self.note_outcome(topic, done)
    }

    async fn offload_locked(self: &Arc<Self>, topic: &str, force: bool) -> Result<Outcome> {
        let policy = self.effective(topic).map(|(p, _)| p);
        if force {
            let (log, t) = (self.log.clone(), topic.to_owned());
            tokio::task::spawn_blocking(move || log.seal_active(&t, None))
                .await
                .map_err(StorageError::joined)??;
        } else if policy.is_none() {
            return Ok(Outcome::default());
        }
        let policy = policy.unwrap_or_default();
        let (sealed, local_bytes) = self.sealed(topic);
        let now = crate::util::wall_ms();
        let states = self.states(topic);
        let chosen: Vec<usize> = if force {
            (0..sealed.len())
                .filter(|i| {
                    states
                        .get(&sealed[*i].header.first)
                        .is_none_or(|s| s.phase != Phase::Offloaded)
                })
                .collect()
        } else {
            policy.choose(now, local_bytes, &tuples(&sealed, &states))
        };
        let mut outcome = Outcome::default();
        for i in chosen {
            if self.offload_one(topic, &sealed[i]).await? {
                outcome.segments += 1;
                outcome.bytes += sealed[i].len;
            }
        }
        // Local copies, oldest first, as far as the policy lets them go.
        let states = self.states(topic);
        let now = crate::util::wall_ms();
        for seg in &sealed {
            let Some(s) = states.get(&seg.header.first) else {
                break;
            };
            if s.phase != Phase::Offloaded || !policy.may_delete_local(now, s.offloaded_ms) {
                break;
            }
            // Producer ids of entries leaving the local log reach sled
            // first (durable with the flush below, before the files go).
            self.sled.checkpoint_sequences(topic)?;
            if !self.log.drop_local(topic, seg.header.first)? {
                break;
            }
            outcome.local_deleted += 1;
        }
        if outcome.local_deleted > 0 {
            crate::util::failpoint("tiered.offload.after_drop");
            // The states are durable already; the files go now, as a
            // retention trim's do after a flush (only trims made before
            // it: a concurrent retention trim's checkpoint may not be).
            self.release_dropped_files().await?;
        }
        Ok(outcome)
    }

    /// Writes one sealed segment as an object, verifies it, records it
    /// offloaded durably. `false` when the segment went meanwhile
    /// (retention, a deleted topic): its object is deleted again.
    async fn offload_one(self: &Arc<Self>, topic: &str, seg: &SegmentInfo) -> Result<bool> {
        let key = self.object_key(topic, seg);
        let mut state = SegmentState::of(topic, seg, key.clone());
        self.put_state(&state)?;
        let (size, crc) = self.upload_object(topic, seg, &key).await?;
        state.phase = Phase::Offloaded;
        state.object_size = size;
        state.object_crc = crc;
        state.offloaded_ms = crate::util::wall_ms();
        let still_there = self
            .log
            .segment_infos(topic)
            .iter()
            .any(|s| s.header.first == seg.header.first);
        if !still_there {
            self.sled.remove_tiered(&state.stored_key())?;
            if let Some(m) = crate::util::lock(&self.states).get_mut(topic) {
                m.remove(&seg.header.first);
            }
            self.delete_after_flush(vec![key], Vec::new());
            return Ok(false);
        }
        self.put_state(&state)?;
        self.sled.flush().await?;
        crate::util::failpoint("tiered.offload.after_verified");
        metrics::counter!("ricochet_tiered_offloaded_bytes_total").increment(seg.len);
        metrics::counter!("ricochet_tiered_offloaded_segments_total").increment(1);
        tracing::debug!(topic, segment = seg.header.first, bytes = seg.len, object = %key, "tiered: segment offloaded and verified");
        Ok(true)
    }

    /// Writes sealed segment `seg` as the object at `key` and reads it back
    /// (size and CRC-32C): the object's size and CRC.
    pub(super) async fn upload_object(
        &self,
        topic: &str,
        seg: &SegmentInfo,
        key: &str,
    ) -> Result<(u64, u32)> {
        let (path, len) = (seg.path.clone(), seg.len);
        let file = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            use std::os::unix::fs::FileExt as _;
            let f = std::fs::File::open(path)?;
            let mut buf = vec![0u8; len as usize];
            f.read_exact_at(&mut buf, 0)?;
            Ok(buf)
        })
        .await
        .map_err(StorageError::joined)??;
        let obj = super::object::build(&file).map_err(|e| {
            StorageError::Corrupt(format!(
                "log of {topic}: sealed segment {} cannot be offloaded: {e}",
                seg.header.first
            ))
        })?;
        let (size, crc) = (obj.len() as u64, crc32c::crc32c(&obj));
        let path = ObjectPath::from(key);
        self.put_paced(&path, obj).await?;
        crate::util::failpoint("tiered.offload.after_put");
        self.verify(&path, size, crc).await?;
        Ok((size, crc))
    }

    /// Keeps `done`'s error (or clears the topic's) for the status, counts
    /// a failure, and hands `done` back.
    pub(super) fn note_outcome(&self, topic: &str, done: Result<Outcome>) -> Result<Outcome> {
        let mut errors = crate::util::lock(&self.last_error);
        match &done {
            Ok(_) => errors.remove(topic),
            Err(e) => {
                metrics::counter!("ricochet_tiered_offload_errors_total").increment(1);
                errors.insert(topic.to_owned(), e.to_string())
            }
        };
        done
    }

    /// Makes what was recorded durable, then deletes the files of the
    /// segments dropped before (only trims made before the flush: a
    /// concurrent retention trim's checkpoint may not be durable yet).
    pub(super) async fn release_dropped_files(&self) -> Result<()> {
        let mark = self.log.trim_mark();
        self.sled.flush().await?;
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || log.finish_trims_before(mark))
            .await
            .map_err(StorageError::joined)??;
        Ok(())
    }

    pub(super) fn put_state(&self, s: &SegmentState) -> Result<()> {
        self.sled.put_tiered(&s.stored_key(), s)?;
        crate::util::lock(&self.states)
            .entry(s.topic.clone())
            .or_default()
            .insert(s.first, s.clone());
        Ok(())
    }

    /// Writes `obj` at `path` (in parts for a large one), sleeping between
    /// parts to hold `pace_bytes_per_second`.
    pub(super) async fn put_paced(&self, path: &ObjectPath, obj: Vec<u8>) -> Result<()> {
        let store = self.store.clone();
        let pace = self.config.pace_bytes_per_second;
        let path = path.clone();
        let Some(rt) = &self.io.0 else {
            return Err(StorageError::Remote("shut down".into()));
        };
        rt.spawn(async move { put(store, path, obj, pace).await })
            .await
            .map_err(StorageError::joined)?
    }

    /// Reads the object back: its size and CRC-32C must be what was written.
    pub(super) async fn verify(&self, path: &ObjectPath, size: u64, crc: u32) -> Result<()> {
        let store = self.store.clone();
        let path = path.clone();
        let Some(rt) = &self.io.0 else {
            return Err(StorageError::Remote("shut down".into()));
        };
        rt.spawn(async move {
            let meta = store.head(&path).await.map_err(|e| remote("head", e))?;
            if meta.size != size {
                return Err(StorageError::Remote(format!(
                    "verify: {path} holds {} bytes, {size} were written",
                    meta.size
                )));
            }
            let got = store
                .get(&path)
                .await
                .map_err(|e| remote("get", e))?
                .bytes()
                .await
                .map_err(|e| remote("get", e))?;
            if got.len() as u64 != size || crc32c::crc32c(&got) != crc {
                return Err(StorageError::Remote(format!(
                    "verify: {path} does not read back as written"
                )));
            }
            Ok(())
        })
        .await
        .map_err(StorageError::joined)?
    }
}

/// `(created ms, bytes, offloaded)` of each sealed segment, for
/// [`super::policy::OffloadPolicy::choose`].
fn tuples(
    sealed: &[SegmentInfo],
    states: &std::collections::BTreeMap<u64, SegmentState>,
) -> Vec<(u64, u64, bool)> {
    sealed
        .iter()
        .map(|s| {
            let done = states
                .get(&s.header.first)
                .is_some_and(|st| st.phase == Phase::Offloaded);
            (s.header.created_ms, s.len, done)
        })
        .collect()
}

async fn put(store: Arc<dyn ObjectStore>, path: ObjectPath, obj: Vec<u8>, pace: u64) -> Result<()> {
    let started = Instant::now();
    let total = obj.len() as u64;
    let paced = |sent: u64| async move {
        if pace > 0 {
            let due = Duration::from_secs_f64(sent as f64 / pace as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
    };
    if obj.len() <= PART {
        store
            .put(&path, PutPayload::from(obj))
            .await
            .map_err(|e| remote("put", e))?;
        paced(total).await;
        return Ok(());
    }
    let mut upload = store
        .put_multipart(&path)
        .await
        .map_err(|e| remote("put", e))?;
    let obj = bytes::Bytes::from(obj);
    let mut sent = 0u64;
    for chunk in obj.chunks(PART) {
        let part = obj.slice_ref(chunk);
        if let Err(e) = upload.put_part(PutPayload::from(part)).await {
            let _ = upload.abort().await;
            return Err(remote("put part", e));
        }
        sent += chunk.len() as u64;
        paced(sent).await;
    }
    upload
        .complete()
        .await
        .map_err(|e| remote("complete upload", e))?;
    Ok(())
}

/// The `tenant/namespace` of a stored topic name (`persistent://tenant/namespace/topic`);
/// empty for a name without both parts.
fn namespace_of(topic: &str) -> &str {
    let rest = topic.strip_prefix("persistent://").unwrap_or(topic);
    match rest.rfind('/') {
        Some(end) if rest[..end].contains('/') => &rest[..end],
        _ => "",
    }
}
