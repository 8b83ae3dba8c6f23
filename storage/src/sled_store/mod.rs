//! [`Storage`] on sled 0.34.
//!
//! Layout: a topic's log lives in segment trees named `seg/<topic>/<n>` (entry
//! id `/ segment_entries`), keyed by big-endian entry id, so consumed data is
//! dropped a whole tree at a time (per-key deletes make sled's files grow).
//! Each value is a run of at most 7 KiB of one batch's entries, keyed by its
//! first id ([`frame`]), so that log leaves stay under sled's blob threshold.
//! Small records live in shared trees: `meta` (topics, subscriptions, id
//! floors), `prodseq`, `failures`, the retry schedule in chunks per due-time
//! bucket (`sched`, keyed by big-endian bucket start; records too large for
//! a chunk in `sched_big`; [`sched`]) and `deadletters`. Tier moves are one
//! multi-tree transaction; a move into the retry tier stores the failure
//! record in the schedule entry rather than under its own key, because sled
//! holds page metadata in memory per stored key and scheduled retries are
//! the records that pile up; a message held in place (a broker-held nack)
//! does the same ([`held`]). The `schedule` tree is the layout before
//! chunks (one key per entry), emptied into chunks at open.
//!
//! Every value is sealed with a CRC-32C of its key and body
//! ([`codec::seal`]) and checked on every read; `meta` also holds the store
//! identity the manifest ([`super::manifest`]) names, and the manifest is a
//! file beside sled's own.

mod ahead;
mod append;
pub(crate) mod checkpoint;
mod codec;
mod dropping;
mod frame;
mod held;
mod keys;
mod meta;
mod moves;
mod open;
mod reads;
mod ref_frame;
mod refs;
mod returns;
mod sched;
mod settle;
#[cfg(test)]
mod split_tests;
mod transfer;
mod verify;

use super::*;
pub(crate) use checkpoint::COVERED;
use codec::{be, decode_failures, encode_failures, from_json, json, read_be, seal, unseal};
use keys::*;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::{Batch, Db, Tree};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Mutex;
pub use verify::VerifyReport;

/// The `meta` key of the store identity.
const STORE_ID_KEY: &[u8] = b"id:store";

/// sled-backed storage.
pub struct SledStorage {
    db: Db,
    dir: std::path::PathBuf,
    meta: Tree,
    prodseq: Tree,
    failures: Tree,
    /// The schedule as it was stored before chunks (one key per entry):
    /// emptied into `sched` at open ([`sched`]).
    schedule: Tree,
    /// The schedule in chunks per due-time bucket ([`sched`]).
    sched: Tree,
    /// Schedule entries' records too large for their chunk.
    sched_big: Tree,
    deadletters: Tree,
    /// sled's blob files, fsynced before each flush.
    sync: crate::sled_sync::SledSync,
    segment_entries: u64,
    /// Open segment trees per topic, by segment number.
    segments: Mutex<HashMap<String, BTreeMap<u64, Tree>>>,
    /// Dead letters and schedule entries per subscription id, counted by a
    /// clean [`Self::verify`] pass or read ahead of a start
    /// ([`Self::read_ahead_of_start`]), taken by the next counted inventory
    /// instead of a second scan.
    verified_counts: Mutex<Option<HashMap<u64, manifest::SubCounts>>>,
    /// The main-tier failure heads per subscription id, from a clean
    /// [`Self::verify`] pass or one scan of the failures and schedule
    /// trees, each subscription's taken once by its start
    /// ([`SubscriptionStore::failure_heads`]); a subscription's are read
    /// afresh once its records are written ([`held`]).
    heads: Mutex<Option<held::HeadCache>>,
    /// Where that one scan splits each subscription's heads: holds ending
    /// later are gathered as entry ids only ([`Self::gather_heads_by`];
    /// `u64::MAX`, the default: none).
    heads_cut: std::sync::atomic::AtomicU64,
    /// Producer sequence ids of logged topics' appends not checkpointed to
    /// `prodseq` yet ([`checkpoint`]).
    pending_sequences: Mutex<HashMap<String, checkpoint::Pending>>,
    /// Schedule chunks written (inserted, or removed once emptied) by
    /// committed writes since open ([`Self::schedule_chunk_writes`]).
    chunk_writes: std::sync::atomic::AtomicU64,
    /// Keys of `meta` the inventory read (a test counts them).
    #[cfg(test)]
    meta_keys_read: std::sync::atomic::AtomicUsize,
    /// Chunks the scan of the schedule for counts and heads read (a test
    /// counts them).
    #[cfg(test)]
    chunks_scanned: std::sync::atomic::AtomicUsize,
}

/// Main-tier failure heads of one subscription's messages: by entry id,
/// sorted by entry, those of holds ending after the cut as ids only.
type HeadList = MainHeads;

/// Main-tier failure heads per subscription id.
type Heads = HashMap<u64, HeadList>;

impl std::fmt::Debug for SledStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStorage")
            .field("segment_entries", &self.segment_entries)
            .finish_non_exhaustive()
    }
}

impl SledStorage {
    /// Opens (or creates) the store in `dir`. Damage sled panics on is
    /// [`StorageError::Corrupt`], like damage it reports ([`open::guarded`]).
    pub fn open(dir: &Path, segment_entries: u64, cache_capacity: u64) -> Result<Self> {
        open::guarded(|| Self::open_unguarded(dir, segment_entries, cache_capacity))
    }

    /// [`Self::open`], waiting up to `wait` for the lock of a store whose
    /// last handle was just dropped: sled 0.34 releases it from a
    /// background thread a moment later (longer on a loaded machine). For
    /// tools and tests that reopen a store they closed; a broker's start
    /// uses [`Self::open`] and refuses a store another process holds.
    pub fn open_waiting(
        dir: &Path,
        segment_entries: u64,
        cache_capacity: u64,
        wait: std::time::Duration,
    ) -> Result<Self> {
        waiting_for_lock(wait, || Self::open(dir, segment_entries, cache_capacity))
    }

    /// After a clean stop, once every handle on the store is gone: opens
    /// it once more and closes it, so that sled records a snapshot of where
    /// its pages live now. sled 0.34 writes that snapshot only when it opens,
    /// so otherwise the next start replays every write made since the
    /// previous start (seconds after a long run: 5.19 s at 5 million parked
    /// retries); this moves that replay to the stop. Waits up to `wait` for
    /// the stopped store's lock to be released. Writes no data of its own.
    pub fn snapshot_stopped(dir: &Path, wait: std::time::Duration) -> Result<()> {
        let db = waiting_for_lock(wait, || {
            open::guarded(|| Ok(sled::Config::new().path(dir).flush_every_ms(None).open()?))
        })?;
        db.flush()?;
        Ok(())
    }

    fn open_unguarded(dir: &Path, segment_entries: u64, cache_capacity: u64) -> Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_capacity)
            .flush_every_ms(None)
            .open()?;
        let mut segments: HashMap<String, BTreeMap<u64, Tree>> = HashMap::new();
        for name in db.tree_names() {
            if let Some((topic, seg)) = parse_seg_tree_name(&name) {
                segments
                    .entry(topic)
                    .or_default()
                    .insert(seg, db.open_tree(&name)?);
            }
        }
        let mut store = Self {
            meta: db.open_tree("meta")?,
            prodseq: db.open_tree("prodseq")?,
            failures: db.open_tree("failures")?,
            schedule: db.open_tree("schedule")?,
            sched: db.open_tree("sched")?,
            sched_big: db.open_tree("sched_big")?,
            deadletters: db.open_tree("deadletters")?,
            // Opened with sled's flusher off: every flush is the store's.
            sync: crate::sled_sync::SledSync::open(dir)?.sole_flusher(),
            db,
            dir: dir.to_owned(),
            segment_entries,
            segments: Mutex::new(segments),
            verified_counts: Mutex::new(None),
            heads: Mutex::new(None),
            heads_cut: std::sync::atomic::AtomicU64::new(u64::MAX),
            pending_sequences: Mutex::new(HashMap::new()),
            chunk_writes: Default::default(),
            #[cfg(test)]
            meta_keys_read: Default::default(),
            #[cfg(test)]
            chunks_scanned: Default::default(),
        };
        // A store written with one schedule key per entry is converted
        // (once; logged when anything moved).
        store.upgrade_schedule()?;
        Ok(store)
    }

    fn segment(&self, topic: &str, seg: u64) -> Result<Tree> {
        let mut map = crate::util::lock(&self.segments);
        let topic_segs = map.entry(topic.to_owned()).or_default();
        if let Some(t) = topic_segs.get(&seg) {
            return Ok(t.clone());
        }
        let tree = self.db.open_tree(seg_tree_name(topic, seg))?;
        topic_segs.insert(seg, tree.clone());
        Ok(tree)
    }

    fn segments_of(&self, topic: &str) -> Result<Vec<(u64, Tree)>> {
        let map = crate::util::lock(&self.segments);
        Ok(map
            .get(topic)
            .map(|m| m.iter().map(|(k, t)| (*k, t.clone())).collect())
            .unwrap_or_default())
    }

    fn segment_if_open(&self, topic: &str, seg: u64) -> Result<Option<Tree>> {
        Ok(crate::util::lock(&self.segments)
            .get(topic)
            .and_then(|m| m.get(&seg).cloned()))
    }

    fn id_floor(&self, topic: &str) -> Result<u64> {
        let key = format!("n:{topic}");
        match self.meta.get(&key)? {
            Some(v) => read_be(unseal(key.as_bytes(), &v)?),
            None => Ok(0),
        }
    }

    fn raise_id_floor(&self, topic: &str, next: u64) -> Result<()> {
        if next > self.id_floor(topic)? {
            let key = format!("n:{topic}");
            self.meta
                .insert(key.as_bytes(), seal(key.as_bytes(), &be(next)))?;
        }
        Ok(())
    }

    /// Flips one bit at byte `at` of the stored frame holding `topic`'s
    /// entry `id` (damage, for tests).
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn damage_entry(&self, topic: &str, id: u64, at: usize) {
        let tree = self.segment(topic, id / self.segment_entries).unwrap();
        let (k, v) = tree.range(..=be(id)).next_back().unwrap().unwrap();
        let mut v = v.to_vec();
        v[at] ^= 0x10;
        tree.insert(k, v).unwrap();
    }

    /// The JSON records under `prefix` in `meta`, checked.
    fn meta_records<T: for<'de> serde::Deserialize<'de>>(&self, prefix: &[u8]) -> Result<Vec<T>> {
        self.meta
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv?;
                from_json(unseal(&k, &v)?)
            })
            .collect()
    }
}

impl SledStorage {
    /// Tiered storage's records in `meta`: `value` as checked JSON under
    /// `o:<key>` (not durable until flushed).
    pub(crate) fn put_tiered<T: serde::Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let k = [TIERED_PREFIX, key.as_bytes()].concat();
        self.meta.insert(k.as_slice(), seal(&k, &json(value)))?;
        Ok(())
    }

    /// The tiered records under `o:<prefix>`, checked.
    pub(crate) fn tiered_records<T: for<'de> serde::Deserialize<'de>>(
        &self,
        prefix: &str,
    ) -> Result<Vec<T>> {
        self.meta_records(&[TIERED_PREFIX, prefix.as_bytes()].concat())
    }

    /// Removes the tiered record `o:<key>`.
    pub(crate) fn remove_tiered(&self, key: &str) -> Result<()> {
        self.meta.remove([TIERED_PREFIX, key.as_bytes()].concat())?;
        Ok(())
    }
}

/// Replaces `dir/name` with `bytes`: written to a temporary file, fsynced,
/// renamed over it, and the directory fsynced, so a crash leaves the old
/// file or the new one.
pub(super) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

impl LogStore for SledStorage {
    fn append(
        &self,
        topic: &str,
        first_id: u64,
        entries: &[Vec<u8>],
        producer: Option<(&str, u64)>,
    ) -> Result<()> {
        self.append_atomically(topic, first_id, entries, producer)
    }

    fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let first_seg = from / self.segment_entries;
        for (seg, tree) in self.segments_of(topic)? {
            if seg < first_seg {
                continue;
            }
            // The frame holding `from` may start before it.
            let start = match tree.range(..=be(from)).next_back() {
                Some(kv) => kv?.0,
                None => be(from).to_vec().into(),
            };
            for kv in tree.range(start..) {
                let (k, v) = kv?;
                for (id, entry) in frame::entries(read_be(&k)?, unseal(&k, &v)?)? {
                    if id < from {
                        continue;
                    }
                    bytes += entry.len();
                    out.push((id, entry.into_owned()));
                    if out.len() >= max || bytes >= max_bytes {
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }

    fn read_one(&self, topic: &str, id: u64) -> Result<Option<Vec<u8>>> {
        let Some(tree) = self.segment_if_open(topic, id / self.segment_entries)? else {
            return Ok(None);
        };
        let Some(kv) = tree.range(..=be(id)).next_back() else {
            return Ok(None);
        };
        let (k, v) = kv?;
        Ok(frame::entry(read_be(&k)?, unseal(&k, &v)?, id)?.map(|e| e.into_owned()))
    }

    fn read_many(&self, topic: &str, ids: &[u64]) -> Result<Vec<Option<Vec<u8>>>> {
        self.read_entries(topic, ids)
    }

    fn entry_range(&self, topic: &str) -> Result<(u64, u64)> {
        let segs = self.segments_of(topic)?;
        let mut first = None;
        let mut last = None;
        for (_, tree) in &segs {
            if let Some((k, _)) = tree.first()? {
                first = Some(read_be(&k)?);
                break;
            }
        }
        for (_, tree) in segs.iter().rev() {
            if let Some((k, v)) = tree.last()? {
                last = Some(read_be(&k)? + frame::count(unseal(&k, &v)?)? as u64);
                break;
            }
        }
        let floor = self.id_floor(topic)?;
        let next = last.map_or(floor, |l| l.max(floor));
        Ok((first.unwrap_or(next).min(next), next))
    }

    fn trim(&self, topic: &str, below: u64) -> Result<()> {
        let segs = self.segments_of(topic)?;
        let Some(highest) = segs.last().map(|(s, _)| *s) else {
            return Ok(());
        };
        let doomed: Vec<u64> = segs
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| *s != highest && (s + 1) * self.segment_entries <= below)
            .collect();
        if doomed.is_empty() {
            return Ok(());
        }
        let (_, next) = self.entry_range(topic)?;
        self.raise_id_floor(topic, next)?;
        {
            let mut map = crate::util::lock(&self.segments);
            for seg in &doomed {
                if let Some(m) = map.get_mut(topic) {
                    m.remove(seg);
                }
            }
        }
        // Outside the lock: emptying a segment reads it, and writers take
        // the lock to find their segment.
        for seg in doomed {
            self.drop_segment(topic, seg)?;
        }
        Ok(())
    }

    fn remove_entries(&self, topic: &str, ids: &[u64]) -> Result<()> {
        let (_, next) = self.entry_range(topic)?;
        self.raise_id_floor(topic, next)?;
        for id in ids {
            let Some(tree) = self.segment_if_open(topic, id / self.segment_entries)? else {
                continue;
            };
            let Some(kv) = tree.range(..=be(*id)).next_back() else {
                continue;
            };
            let (k, v) = kv?;
            let first = read_be(&k)?;
            match frame::without(first, unseal(&k, &v)?, *id)? {
                Some(rest) if frame::live(&rest)? == 0 => {
                    tree.remove(k)?;
                }
                Some(rest) => {
                    let sealed = seal(&k, &rest);
                    tree.insert(k, sealed)?;
                }
                None => {}
            }
        }
        Ok(())
    }

    fn producer_sequences(&self, topic: &str) -> Result<Vec<(String, u64)>> {
        let prefix = format!("{topic}\0");
        self.prodseq
            .scan_prefix(&prefix)
            .map(|kv| {
                let (k, v) = kv?;
                let name = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
                Ok((name, read_be(unseal(&k, &v)?)?))
            })
            .collect()
    }

    fn restore_producer_sequences(&self, topic: &str, sequences: &[(String, u64)]) -> Result<()> {
        // What appends gathered goes first, so the restored ids land last.
        self.checkpoint_sequences(topic)?;
        self.write_producer_sequences(topic, sequences)
    }
}

impl SubscriptionStore for SledStorage {
    fn list_subscriptions(&self, topic: &str) -> Result<Vec<SubscriptionRecord>> {
        self.meta_records(&sub_key(topic, ""))
    }

    fn put_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        let key = sub_key(&record.topic, &record.name);
        let value = seal(&key, &json(record));
        self.meta.insert(key, value)?;
        Ok(())
    }

    fn delete_subscription(&self, record: &SubscriptionRecord) -> Result<()> {
        let mut batch = Batch::default();
        for k in self.failures.scan_prefix(be(record.id)).keys() {
            batch.remove(k?);
        }
        self.failures.apply_batch(batch)?;
        let mut batch = Batch::default();
        for k in self.deadletters.scan_prefix(be(record.id)).keys() {
            batch.remove(k?);
        }
        self.deadletters.apply_batch(batch)?;
        let mut mine = Vec::new();
        for chunk in self.chunks_in(None, None) {
            let (ck, chunk) = chunk?;
            if sched::chunk_sub(&ck) == record.id {
                mine.extend(chunk.keys(&ck).map(|(k, _)| k));
            }
        }
        for keys in mine.chunks(sched::TX_BATCH) {
            self.sched_tx(|w| {
                for k in keys {
                    w.remove(k)?;
                }
                Ok(())
            })?;
        }
        self.meta.remove(sub_key(&record.topic, &record.name))?;
        self.touch_heads([record.id]);
        Ok(())
    }

    fn failure(&self, message: SubMessage, due_ms: Option<u64>) -> Result<Option<FailureRecord>> {
        let key = message.key();
        if let Some(v) = self.failures.get(key)? {
            return decode_failures(unseal(&key, &v)?).map(Some);
        }
        // A retry-tier move or a hold keeps it in the schedule entry.
        let Some(due_ms) = due_ms else {
            return Ok(None);
        };
        match self.sched_get(&ScheduleKey { due_ms, message })? {
            Some(body) if !body.is_empty() => decode_failures(&body).map(Some),
            _ => Ok(None),
        }
    }

    fn failures_many(
        &self,
        keys: &[(SubMessage, Option<u64>)],
    ) -> Result<Vec<Option<FailureRecord>>> {
        let mut out = Vec::with_capacity(keys.len());
        // Those not under their own key, by schedule key: read by chunk.
        let mut in_sched = Vec::new();
        let mut sched_keys = Vec::new();
        for &(message, due_ms) in keys {
            let key = message.key();
            if let Some(v) = self.failures.get(key)? {
                out.push(Some(decode_failures(unseal(&key, &v)?)?));
                continue;
            }
            if let Some(due_ms) = due_ms {
                in_sched.push(out.len());
                sched_keys.push(ScheduleKey { due_ms, message });
            }
            out.push(None);
        }
        for (i, body) in in_sched.into_iter().zip(self.sched_get_many(&sched_keys)?) {
            if let Some(body) = body.filter(|b| !b.is_empty()) {
                out[i] = Some(decode_failures(&body)?);
            }
        }
        Ok(out)
    }

    fn failures_of(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureRecord)>> {
        let mut prefix = be(sub_id).to_vec();
        prefix.push(tier as u8);
        let own: Vec<(SubMessage, FailureRecord)> = self
            .failures
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv?;
                let m = SubMessage::from_key(&k)
                    .ok_or_else(|| StorageError::Corrupt("bad failure key".into()))?;
                Ok((m, decode_failures(unseal(&k, &v)?)?))
            })
            .collect::<Result<_>>()?;
        if tier != TierId::Main {
            return Ok(own);
        }
        // Held messages' records are in their schedule entries; a record
        // under its own key wins.
        let mut all: BTreeMap<u64, (SubMessage, FailureRecord)> = self
            .held_records(sub_id)?
            .into_iter()
            .map(|(m, r)| (m.entry_id, (m, r)))
            .collect();
        for (m, r) in own {
            all.insert(m.entry_id, (m, r));
        }
        Ok(all.into_values().collect())
    }

    fn main_failure_heads(&self, sub_id: u64) -> Result<Vec<(u64, FailureHead)>> {
        Ok(self.main_heads(sub_id, u64::MAX)?.near)
    }

    fn main_failure_heads_by(&self, sub_id: u64, horizon_ms: u64) -> Result<MainHeads> {
        self.main_heads(sub_id, horizon_ms)
    }

    fn held_heads_due(
        &self,
        sub_id: u64,
        after_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, FailureHead)>> {
        self.sched_heads_due(sub_id, after_ms, to_ms)
    }

    fn failure_heads(&self, sub_id: u64, tier: TierId) -> Result<Vec<(SubMessage, FailureHead)>> {
        if tier == TierId::Main {
            return Ok(self
                .main_heads(sub_id, u64::MAX)?
                .near
                .into_iter()
                .map(|(entry_id, h)| {
                    let m = SubMessage {
                        sub_id,
                        tier: TierId::Main,
                        entry_id,
                    };
                    (m, h)
                })
                .collect());
        }
        let mut prefix = be(sub_id).to_vec();
        prefix.push(tier as u8);
        self.failures
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv?;
                let m = SubMessage::from_key(&k)
                    .ok_or_else(|| StorageError::Corrupt("bad failure key".into()))?;
                Ok((m, codec::decode_failure_head(unseal(&k, &v)?)?))
            })
            .collect()
    }

    fn put_failures(&self, records: &[(SubMessage, Option<FailureRecord>)]) -> Result<()> {
        let mut batch = Batch::default();
        for (m, rec) in records {
            match rec {
                Some(r) => batch.insert(&m.key(), seal(&m.key(), &encode_failures(r))),
                None => batch.remove(&m.key()),
            }
        }
        let written = self.failures.apply_batch(batch);
        self.touch_heads(records.iter().map(|(m, _)| m.sub_id));
        Ok(written?)
    }

    fn put_held(
        &self,
        held: &[(ScheduleKey, FailureRecord)],
        unschedule: &[ScheduleKey],
    ) -> Result<()> {
        self.put_held_tx(held, unschedule)
    }

    fn scheduled(
        &self,
        after: Option<ScheduleKey>,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<ScheduleKey>> {
        // Chunks are ordered by bucket, then subscription, tier and ids:
        // a bucket is read whole and sorted, and the read stops at the end
        // of the bucket that fills `limit`.
        let from = after.map(|a| a.due_ms - a.due_ms % sched::BUCKET_MS);
        let after = after.map(|a| a.key());
        let mut out: Vec<ScheduleKey> = Vec::new();
        let mut bucket: Option<u64> = None;
        for kv in self.raw_chunks(from, Some(to_ms)) {
            let (ck, v) = kv?;
            let this = read_be(&ck[..8])?;
            if bucket.is_some_and(|b| b != this) && out.len() >= limit {
                break;
            }
            bucket = Some(this);
            let bad_key = || StorageError::Corrupt("bad schedule chunk key".into());
            let mut keys = Vec::new();
            sched::visit(unseal(&ck, &v)?, |i| {
                keys.push(sched::key_of(&ck, i.due_ms, i.entry_id))
            })?;
            for k in keys {
                let k = k.ok_or_else(bad_key)?;
                if k.due_ms < to_ms && after.is_none_or(|a| k.key() > a) {
                    out.push(k);
                }
            }
        }
        out.sort_unstable_by_key(ScheduleKey::key);
        out.truncate(limit);
        Ok(out)
    }

    fn put_schedule(&self, keys: &[(ScheduleKey, bool)]) -> Result<()> {
        let written = self.sched_tx(|w| {
            for (k, add) in keys {
                if !*add {
                    w.remove(k)?;
                } else if !w.contains(k)? {
                    // An entry already there keeps the record it holds (a
                    // retry's, a hold's); its subscription alone writes it.
                    w.insert(k, &[])?;
                }
            }
            Ok(())
        });
        self.touch_heads(keys.iter().map(|(k, _)| k.message.sub_id));
        written
    }

    fn move_messages(&self, mv: &TierMove) -> Result<()> {
        let written = self.move_messages_tx(mv);
        self.touch_heads([mv.subscription.id]);
        written
    }

    fn dead_letters(
        &self,
        sub_id: u64,
        after: Option<u64>,
    ) -> Result<Vec<(u64, DeadLetterRecord)>> {
        let start = dl_key(sub_id, after.map_or(0, |a| a.saturating_add(1)));
        let end = dl_key(sub_id, u64::MAX);
        let mut out = Vec::new();
        for kv in self.deadletters.range(start..=end) {
            let (k, v) = kv?;
            if after.is_some_and(|a| a == u64::MAX) {
                break;
            }
            let id = k
                .get(8..)
                .ok_or_else(|| StorageError::Corrupt("bad dead-letter key".into()))?;
            out.push((read_be(id)?, from_json(unseal(&k, &v)?)?));
        }
        Ok(out)
    }

    fn count_dead_letters(&self, sub_id: u64) -> Result<u64> {
        let mut n = 0;
        for k in self
            .deadletters
            .range(dl_key(sub_id, 0)..=dl_key(sub_id, u64::MAX))
            .keys()
        {
            k?;
            n += 1;
        }
        Ok(n)
    }

    fn remove_dead_letters(&self, sub_id: u64, ids: &[u64]) -> Result<()> {
        let mut batch = Batch::default();
        for id in ids {
            batch.remove(&dl_key(sub_id, *id));
        }
        self.deadletters.apply_batch(batch)?;
        Ok(())
    }

    fn dead_letters_by_id(&self, sub_id: u64, ids: &[u64]) -> Result<Vec<(u64, DeadLetterRecord)>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let k = dl_key(sub_id, *id);
            if let Some(v) = self.deadletters.get(k)? {
                out.push((*id, from_json(unseal(&k, &v)?)?));
            }
        }
        Ok(out)
    }

    fn put_dead_letters(&self, sub_id: u64, records: &[(u64, DeadLetterRecord)]) -> Result<()> {
        let mut batch = Batch::default();
        for (id, rec) in records {
            let k = dl_key(sub_id, *id);
            batch.insert(&k, seal(&k, &json(rec)));
        }
        self.deadletters.apply_batch(batch)?;
        Ok(())
    }

    fn return_dead_letters(&self, mv: &DeadLetterReturn) -> Result<()> {
        let written = self.return_dead_letters_tx(mv);
        self.touch_heads([mv.subscription.id]);
        written
    }

    fn subscription_state(&self, sub_id: u64) -> Result<SubscriptionState> {
        self.read_subscription_state(sub_id)
    }

    fn restore_subscription_state(&self, sub_id: u64, state: &SubscriptionState) -> Result<()> {
        let written = self.write_subscription_state(sub_id, state);
        self.touch_heads([sub_id]);
        written
    }

    fn replay_jobs(&self, with_ids: bool) -> Result<Vec<ReplayJobRecord>> {
        self.replay_jobs_stored(with_ids)
    }

    fn put_replay_job(&self, job: &ReplayJobRecord) -> Result<()> {
        self.put_replay_job_stored(job)
    }

    fn remove_replay_job(&self, id: u64) -> Result<()> {
        self.remove_replay_job_stored(id)
    }
}

/// Calls `open` until it does not fail on sled's file lock, for up to
/// `wait` (20 ms apart).
fn waiting_for_lock<T>(
    wait: std::time::Duration,
    mut open: impl FnMut() -> Result<T>,
) -> Result<T> {
    let until = std::time::Instant::now() + wait;
    loop {
        match open() {
            Err(StorageError::Engine(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => return opened,
        }
    }
}

/// Opens the store in `dir` (tests), waiting for a dropped handle's lock.
#[cfg(test)]
pub(crate) fn reopen_waiting(dir: &std::path::Path, segment_entries: u64) -> SledStorage {
    SledStorage::open_waiting(
        dir,
        segment_entries,
        8 << 20,
        std::time::Duration::from_secs(10),
    )
    .expect("reopen the store")
}
