//! A topic at run time: its writer (entry ids, producer de-duplication), the
//! durable end of its log that subscriptions read up to, and retention.
//!
//! Entry ids are handed out only below a ceiling the manifest holds on disk
//! ([`ManifestKeeper::reserve`]), raised a block at a time ahead of use, so
//! an id that reached a receipt or a delivery is never handed out again,
//! even when a crash lost its entry (`interval` durability). A topic opened
//! after such a crash starts at the ceiling; the ids in between (its
//! [`Topic::void`]) never had a durable entry, and subscriptions treat them
//! as acknowledged. A replicated topic has no such ceiling nor void: the
//! group's committed log is the authority on its ids (see [`Topic::open`]).
//!
//! Retention ([`Topic::enforce_retention`]) drops whole segments of an
//! ordinary topic's log, oldest first, by age and by size, whether or not
//! subscriptions consumed them; the bytes each segment holds are counted
//! once (a scan when a size limit first applies) and then per batch written.
//! Besides its own timer, retention is told when a write starts a new
//! segment ([`SegmentRolled`]), so a topic written fast stays within about
//! a segment of its size limit rather than a timer's worth of writes.

use crate::clock::SharedClock;
use crate::error::{BrokerError, Result};
use crate::flusher::Flusher;
use crate::keeper::ManifestKeeper;
use crate::name::TopicName;
use crate::storage::{Storage, TopicKind};
use prost::Message as _;
use ricochet_proto::{Message, MessageId, OutboundMessage, SendReceipt};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Told when a write to a topic starts a new segment (the one before it
/// is then whole and may be dropped by retention).
pub trait SegmentRolled: Send + Sync + std::fmt::Debug {
    /// A write to `topic` started a new segment.
    fn rolled(&self, topic: &TopicName);
}

/// Per-topic counters for stats and metrics.
#[derive(Debug, Default)]
pub struct TopicCounters {
    /// Messages stored.
    pub messages_in: AtomicU64,
    /// Payload bytes stored.
    pub bytes_in: AtomicU64,
    /// Connected producers.
    pub producers: AtomicU64,
}

/// Ids reserved at a time: a reservation costs one manifest write, and the
/// next one starts when half of the block is used, so publishers do not
/// wait for it; a crash leaves a gap of at most this many ids.
pub const ID_BLOCK: u64 = 65_536;

#[derive(Debug)]
struct Writer {
    next_id: u64,
    /// Last stored sequence id per producer name.
    sequences: HashMap<String, u64>,
    /// Set by a clean stop: no more ids.
    sealed: bool,
}

/// The durable id ceiling of a topic, shared with the task that raises it.
#[derive(Debug)]
struct Ceiling {
    keeper: Arc<ManifestKeeper>,
    topic: String,
    /// Ids below this are reserved on disk.
    reserved: AtomicU64,
    /// A reservation ahead of use is under way.
    extending: AtomicBool,
}

impl Ceiling {
    /// Reserves ids below `need` plus a block; returns the new ceiling.
    async fn extend(&self, need: u64) -> Result<u64> {
        crate::util::failpoint("publish.reserve.before");
        let granted = self
            .keeper
            .reserve(&self.topic, need.saturating_add(ID_BLOCK))
            .await?;
        crate::util::failpoint("publish.reserve.after");
        Ok(self
            .reserved
            .fetch_max(granted, Ordering::AcqRel)
            .max(granted))
    }
}

/// A batch [`Topic::write`] stored, for [`Topic::settle`].
#[derive(Debug)]
pub struct Written {
    receipts: Vec<SendReceipt>,
    end: u64,
}

/// One topic.
#[derive(Debug)]
pub struct Topic {
    name: TopicName,
    kind: TopicKind,
    storage: Arc<dyn Storage>,
    flusher: Flusher,
    sync: bool,
    segment_entries: u64,
    writer: Mutex<Writer>,
    ceiling: Arc<Ceiling>,
    /// Ids skipped at open: handed out before a crash, never durable.
    void: Option<Range<u64>>,
    /// Every entry id below this value is durable and may be dispatched.
    durable_end: watch::Sender<u64>,
    /// Mark-delete position per subscription id, for retention.
    marks: Mutex<HashMap<u64, u64>>,
    first_entry: AtomicU64,
    /// Counters.
    pub counters: TopicCounters,
    metrics: crate::metrics::TopicMetrics,
    clock: SharedClock,
    /// Set once the topic is deleted: publishes fail from then on.
    closed: std::sync::atomic::AtomicBool,
    /// Stored message bytes per segment number, once a size limit needed
    /// them (`None` before); kept under the writer lock's protection: the
    /// scan that fills it and the writes that add to it hold the writer.
    segment_bytes: Mutex<Option<std::collections::BTreeMap<u64, u64>>>,
    /// Backlog quota that refuses publishes, in bytes (0: none); set from
    /// the effective retention policy (see `crate::retention`).
    refuse_above: AtomicU64,
    /// Written through a replicated partition's group: an append is only
    /// queued there, and [`Topic::settle`] waits for its commit
    /// (`Storage::flush` of that storage) instead of the flusher.
    replicated: bool,
    /// Told when a write starts a new segment (set once, by retention).
    on_roll: std::sync::OnceLock<Arc<dyn SegmentRolled>>,
}

/// What one retention pass dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Whole segments dropped.
    pub segments: u64,
    /// Stored message bytes they held (0 when only an age limit applied
    /// and sizes were never counted).
    pub bytes: u64,
    /// The topic's first entry id afterwards.
    pub first: u64,
}

impl Topic {
    /// Opens a topic whose record exists in storage, at or above the ids
    /// the manifest says were reserved for it. A `replicated` topic (written
    /// through its partition's group, see [`Topic::settle`]) starts at the
    /// end of the group's log instead: only a committed entry got a receipt
    /// or a delivery, so ids a former leader handed out and never committed
    /// are handed out again, and this broker's manifest (a reservation from
    /// when it led before, not the group's) plays no part.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        name: TopicName,
        kind: TopicKind,
        storage: Arc<dyn Storage>,
        flusher: Flusher,
        sync: bool,
        segment_entries: u64,
        clock: SharedClock,
        keeper: Arc<ManifestKeeper>,
        replicated: bool,
    ) -> Result<Self> {
        let (mut first, stored) = storage.entry_range(name.as_str())?;
        let reserved = if replicated {
            stored
        } else {
            keeper.reserved(name.as_str())
        };
        let void = (reserved > stored).then_some(stored..reserved);
        let next = stored.max(reserved);
        if first == stored {
            first = next;
        }
        if let Some(v) = &void {
            tracing::warn!(
                topic = %name, from = v.start, to = v.end,
                "entry ids handed out before a crash were never stored; they are skipped"
            );
        }
        let sequences = storage
            .producer_sequences(name.as_str())?
            .into_iter()
            .collect();
        let metrics = crate::metrics::TopicMetrics::new(name.as_str());
        let ceiling = Arc::new(Ceiling {
            keeper,
            topic: name.to_string(),
            // No local reservation for a replicated topic: its ids are
            // bounded by what the group commits.
            reserved: AtomicU64::new(if replicated { u64::MAX } else { next }),
            extending: AtomicBool::new(false),
        });
        Ok(Self {
            name,
            kind,
            storage,
            flusher,
            sync,
            segment_entries,
            writer: Mutex::new(Writer {
                next_id: next,
                sequences,
                sealed: false,
            }),
            ceiling,
            void,
            durable_end: watch::Sender::new(next),
            marks: Mutex::new(HashMap::new()),
            first_entry: AtomicU64::new(first),
            counters: TopicCounters::default(),
            metrics,
            clock,
            closed: Default::default(),
            segment_bytes: Mutex::new(None),
            refuse_above: AtomicU64::new(0),
            replicated,
            on_roll: std::sync::OnceLock::new(),
        })
    }

    /// Tells `hook` whenever a write starts a new segment of this topic
    /// (the first hook set stays).
    pub fn on_segment_rolled(&self, hook: Arc<dyn SegmentRolled>) {
        let _ = self.on_roll.set(hook);
    }

    /// Marks the topic deleted: later publishes fail with NOT_FOUND.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Ids skipped when the topic was opened: handed out (or reserved)
    /// before a crash and never stored. Subscriptions count them as acked.
    pub fn void(&self) -> Option<Range<u64>> {
        self.void.clone()
    }

    /// Waits until `n` more ids fit below the durable ceiling; returns the
    /// writer locked with them available.
    async fn writer_with_room(&self, n: u64) -> Result<std::sync::MutexGuard<'_, Writer>> {
        loop {
            let need = {
                let w = crate::util::lock(&self.writer);
                if w.sealed {
                    return Err(crate::error::BrokerError::ShuttingDown);
                }
                let need = w.next_id.saturating_add(n);
                if need <= self.ceiling.reserved.load(Ordering::Acquire) {
                    return Ok(w);
                }
                need
            };
            self.ceiling.extend(need).await?;
        }
    }

    /// Starts raising the ceiling in the background once half a block is
    /// left, so publishers rarely wait for a manifest write.
    fn reserve_ahead(&self, next_id: u64) {
        let c = &self.ceiling;
        if c.reserved.load(Ordering::Acquire).saturating_sub(next_id) >= ID_BLOCK / 2
            || c.extending.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let c = self.ceiling.clone();
        tokio::spawn(async move {
            if let Err(e) = c.extend(next_id).await {
                tracing::debug!(error = %e, topic = %c.topic, "id reservation ahead of use failed");
            }
            c.extending.store(false, Ordering::Release);
        });
    }

    /// Stops handing out ids (a clean stop); returns the next id, above
    /// every id handed out.
    pub fn seal(&self) -> u64 {
        let mut w = crate::util::lock(&self.writer);
        w.sealed = true;
        w.next_id
    }

    /// Hands out ids again after [`Topic::seal`] (a move that failed).
    pub fn unseal(&self) {
        crate::util::lock(&self.writer).sealed = false;
    }

    /// The topic's name.
    pub fn name(&self) -> &TopicName {
        &self.name
    }

    /// What the topic is for.
    pub fn kind(&self) -> TopicKind {
        self.kind
    }

    /// Whether the topic is written through a replicated partition's group.
    pub fn is_replicated(&self) -> bool {
        self.replicated
    }

    /// The storage the topic writes through (its group's, when replicated).
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Entry ids below this are durable.
    pub fn durable_end(&self) -> u64 {
        *self.durable_end.borrow()
    }

    /// A receiver that changes whenever the durable end moves.
    pub fn watch_end(&self) -> watch::Receiver<u64> {
        self.durable_end.subscribe()
    }

    /// `(first, next)` entry ids held.
    pub fn entry_range(&self) -> (u64, u64) {
        (self.first_entry.load(Ordering::Relaxed), self.durable_end())
    }

    /// The last stored sequence id of `producer`.
    pub fn last_sequence(&self, producer: &str) -> Option<u64> {
        crate::util::lock(&self.writer)
            .sequences
            .get(producer)
            .copied()
    }

    /// Stores a batch from one producer and returns its receipts once durable
    /// (in sync mode): [`Topic::write`], then [`Topic::settle`].
    pub async fn publish(
        &self,
        producer: &str,
        messages: Vec<OutboundMessage>,
    ) -> Result<Vec<SendReceipt>> {
        let written = self.write(producer, messages).await?;
        self.settle(written).await
    }

    /// Writes a batch from one producer (not yet durable). Messages whose
    /// sequence id is not above the producer's last stored one are dropped
    /// as duplicates; an empty producer name (the broker's own replays)
    /// skips de-duplication. The batch is stored whole or not at all. It may
    /// wait for an id reservation: a producer's next batch must not start
    /// before this returns, or its ids could come first.
    pub async fn write(&self, producer: &str, messages: Vec<OutboundMessage>) -> Result<Written> {
        let bytes: usize = messages.iter().map(|m| m.payload.len()).sum();
        self.flusher.check_room(bytes as u64)?;
        if self.closed.load(Ordering::Acquire) {
            return Err(BrokerError::TopicNotFound(format!(
                "{} (deleted while this producer was connected)",
                self.name
            )));
        }
        self.check_quota()?;
        let now = self.clock.now_ms();
        let (receipts, end) = {
            let mut w = self.writer_with_room(messages.len() as u64).await?;
            let dedup = !producer.is_empty();
            let mut last = if dedup {
                w.sequences.get(producer).copied()
            } else {
                None
            };
            let mut receipts = Vec::with_capacity(messages.len());
            let mut encoded = Vec::with_capacity(messages.len());
            let mut bytes = 0u64;
            let first_id = w.next_id;
            for m in messages {
                if last.is_some_and(|l| m.sequence_id <= l) {
                    receipts.push(SendReceipt {
                        sequence_id: m.sequence_id,
                        message_id: None,
                        duplicate: true,
                    });
                    continue;
                }
                if dedup {
                    last = Some(m.sequence_id);
                }
                let id = first_id + encoded.len() as u64;
                bytes += m.payload.len() as u64;
                receipts.push(SendReceipt {
                    sequence_id: m.sequence_id,
                    message_id: Some(MessageId {
                        topic: self.name.to_string(),
                        entry_id: id,
                    }),
                    duplicate: false,
                });
                let stored = Message {
                    id: None,
                    payload: m.payload,
                    key: m.key,
                    properties: m.properties,
                    publish_time_ms: now,
                    event_time_ms: m.event_time_ms,
                    delivery_count: 0,
                    producer_name: producer.to_owned(),
                    sequence_id: m.sequence_id,
                    deliver_at_ms: m.deliver_at_ms,
                };
                encoded.push(stored.encode_to_vec());
            }
            if !encoded.is_empty() {
                let seq = last.map(|l| (producer, l));
                self.storage
                    .append(self.name.as_str(), first_id, &encoded, seq)?;
                if let Some(sizes) = crate::util::lock(&self.segment_bytes).as_mut() {
                    for (i, e) in encoded.iter().enumerate() {
                        let seg = (first_id + i as u64) / self.segment_entries;
                        *sizes.entry(seg).or_default() += e.len() as u64;
                    }
                }
                w.next_id += encoded.len() as u64;
                if let Some(l) = last {
                    w.sequences.insert(producer.to_owned(), l);
                }
                self.counters
                    .messages_in
                    .fetch_add(encoded.len() as u64, Ordering::Relaxed);
                self.counters.bytes_in.fetch_add(bytes, Ordering::Relaxed);
                self.metrics.published.increment(encoded.len() as u64);
                self.metrics.published_bytes.increment(bytes);
            }
            (receipts, w.next_id)
        };
        self.reserve_ahead(end);
        self.ceiling.keeper.changed();
        if let Some(hook) = self.on_roll.get()
            && let Some(first) = receipts.iter().find_map(|r| r.message_id.as_ref())
            && (end - 1) / self.segment_entries
                > first.entry_id.saturating_sub(1) / self.segment_entries
        {
            hook.rolled(&self.name);
        }
        Ok(Written { receipts, end })
    }

    /// Waits until a written batch is durable (sync mode), makes it readable
    /// and returns its receipts.
    pub async fn settle(&self, written: Written) -> Result<Vec<SendReceipt>> {
        let Written { receipts, end } = written;
        if self.replicated {
            // Committed by a majority and applied here, in either
            // durability mode: this and every batch written before it.
            self.storage.flush().await?;
        } else if self.sync {
            self.flusher.durable().await?;
        }
        crate::util::failpoint("publish.after_flush");
        self.durable_end.send_if_modified(|v| {
            if end > *v {
                *v = end;
                true
            } else {
                false
            }
        });
        Ok(receipts)
    }

    /// Hands out `n` consecutive ids for entries the caller writes itself
    /// (a tier move writes them inside its own transaction); returns the
    /// first.
    pub async fn reserve_ids(&self, n: u64) -> Result<u64> {
        let first = {
            let mut w = self.writer_with_room(n).await?;
            let first = w.next_id;
            w.next_id += n;
            first
        };
        self.reserve_ahead(first + n);
        self.ceiling.keeper.changed();
        Ok(first)
    }

    /// Marks ids below `end` as durable (after a tier move that wrote them).
    pub fn advance_durable_end(&self, end: u64) {
        self.durable_end.send_if_modified(|v| {
            if end > *v {
                *v = end;
                true
            } else {
                false
            }
        });
    }

    /// Records a subscription's mark-delete position and drops segments every
    /// subscription has consumed. Tier topics are trimmed the same way;
    /// dead-letter topics are never trimmed (they are purged explicitly).
    pub fn update_mark(&self, sub_id: u64, mark: u64) -> Result<()> {
        if self.kind == TopicKind::DeadLetter {
            return Ok(());
        }
        let mut min = {
            let mut marks = crate::util::lock(&self.marks);
            marks.insert(sub_id, mark);
            marks.values().copied().min().unwrap_or(0)
        };
        // Only whole segments are dropped: skip the work until one is done.
        let first = self.first_entry.load(Ordering::Relaxed);
        let boundary = (first / self.segment_entries + 1) * self.segment_entries;
        if min >= boundary {
            // Entries parked retries refer to stay (not copied, as a
            // retention trim would have to).
            if let Some(r) = self.storage.lowest_reference(self.name.as_str())? {
                min = min.min(r);
            }
        }
        if min >= boundary {
            self.storage.trim(self.name.as_str(), min)?;
            let (first, _) = self.storage.entry_range(self.name.as_str())?;
            self.first_entry.store(first, Ordering::Relaxed);
            let e = self.segment_entries;
            if let Some(sizes) = crate::util::lock(&self.segment_bytes).as_mut() {
                sizes.retain(|seg, _| (seg + 1) * e > first);
            }
        }
        Ok(())
    }

    /// Forgets a deleted subscription's mark.
    pub fn remove_mark(&self, sub_id: u64) {
        {
            let mut marks = crate::util::lock(&self.marks);
            marks.remove(&sub_id);
        }
    }

    /// Sets the backlog quota that refuses publishes (`None`: no quota, or
    /// one that drops the oldest instead).
    pub fn set_refusing_quota(&self, limit: Option<u64>) {
        self.refuse_above
            .store(limit.unwrap_or(0), Ordering::Relaxed);
    }

    /// RESOURCE_EXHAUSTED when the log holds its refusing backlog quota or
    /// more; one sum over the segments per batch, nothing per message.
    fn check_quota(&self) -> Result<()> {
        let limit = self.refuse_above.load(Ordering::Relaxed);
        if limit == 0 || self.kind != TopicKind::Normal {
            return Ok(());
        }
        let stored = self.stored_bytes()?;
        if stored < limit {
            return Ok(());
        }
        self.metrics.quota_refusals.increment(1);
        Err(BrokerError::LimitReached(format!(
            "backlog quota of {}: {stored} bytes stored, quota {limit} bytes (quota_action refuse); \
             publish again once subscriptions consume or retention drops old messages",
            self.name
        )))
    }

    /// Stored message bytes of the log (counted on first use).
    pub fn stored_bytes(&self) -> Result<u64> {
        self.with_sizes(|sizes| sizes.values().sum())
    }

    /// Runs `f` on the per-segment byte counts, counting them first if
    /// needed (one scan of the log, holding the writer so no batch is
    /// counted twice or missed).
    fn with_sizes<R>(
        &self,
        f: impl FnOnce(&mut std::collections::BTreeMap<u64, u64>) -> R,
    ) -> Result<R> {
        {
            let mut sizes = crate::util::lock(&self.segment_bytes);
            if let Some(s) = sizes.as_mut() {
                return Ok(f(s));
            }
        }
        let _writer = crate::util::lock(&self.writer);
        let mut counted = std::collections::BTreeMap::new();
        let (mut from, _) = self.storage.entry_range(self.name.as_str())?;
        loop {
            let batch = self
                .storage
                .read(self.name.as_str(), from, 4096, 16 << 20)?;
            let Some((last, _)) = batch.last() else { break };
            from = last + 1;
            for (id, bytes) in &batch {
                *counted.entry(id / self.segment_entries).or_default() += bytes.len() as u64;
            }
        }
        let mut sizes = crate::util::lock(&self.segment_bytes);
        Ok(f(sizes.insert(counted)))
    }

    /// Publish time of the first entry at or after `id`, if any.
    fn publish_time_from(&self, id: u64) -> Result<Option<u64>> {
        let entries = self.storage.read(self.name.as_str(), id, 1, usize::MAX)?;
        let Some((_, bytes)) = entries.first() else {
            return Ok(None);
        };
        match Message::decode(bytes.as_slice()) {
            Ok(m) => Ok(Some(m.publish_time_ms)),
            Err(e) => {
                tracing::warn!(topic = %self.name, error = %e, "retention: an entry cannot be decoded; age not checked");
                Ok(None)
            }
        }
    }

    /// Drops whole segments, oldest first, that hold only messages older
    /// than `max_age_ms` or that bring the log above `max_size_bytes`. The
    /// segment being written is never dropped; neither are the logs of
    /// retry and dead-letter tiers (only ordinary topics are retained).
    pub fn enforce_retention(
        &self,
        max_age_ms: Option<u64>,
        max_size_bytes: Option<u64>,
    ) -> Result<Dropped> {
        let (first, end) = self.storage.entry_range(self.name.as_str())?;
        let none = Dropped {
            first,
            ..Default::default()
        };
        if self.kind != TopicKind::Normal
            || first >= end
            || (max_age_ms.is_none() && max_size_bytes.is_none())
        {
            return Ok(none);
        }
        let e = self.segment_entries;
        let last_seg = (end - 1) / e;
        let mut below = first;
        let mut bytes = 0u64;
        if let Some(max) = max_size_bytes {
            (below, bytes) = self.with_sizes(|sizes| {
                // Segments already trimmed (consumed by every subscription).
                sizes.retain(|seg, _| (seg + 1) * e > first);
                let mut total: u64 = sizes.values().sum();
                let mut below = first;
                let mut dropped = 0;
                for (seg, b) in sizes.iter() {
                    if total <= max || *seg >= last_seg {
                        break;
                    }
                    total -= b;
                    dropped += b;
                    below = (seg + 1) * e;
                }
                (below, dropped)
            })?;
        }
        if let Some(age) = max_age_ms {
            let cutoff = self.clock.now_ms().saturating_sub(age);
            let mut seg = below / e;
            // A segment goes when the next one starts with an expired message:
            // everything before that was published earlier still.
            while seg < last_seg {
                match self.publish_time_from((seg + 1) * e)? {
                    Some(t) if t < cutoff => {
                        seg += 1;
                        below = below.max(seg * e);
                    }
                    _ => break,
                }
            }
        }
        if below <= first {
            return Ok(none);
        }
        self.storage.trim(self.name.as_str(), below)?;
        let (new_first, _) = self.storage.entry_range(self.name.as_str())?;
        self.first_entry.fetch_max(new_first, Ordering::Relaxed);
        let segments = below.div_ceil(e).saturating_sub(first / e);
        if let Some(sizes) = crate::util::lock(&self.segment_bytes).as_mut() {
            let gone: u64 = sizes.range(..below / e).map(|(_, b)| *b).sum();
            bytes = bytes.max(gone);
            sizes.retain(|seg, _| *seg >= below / e);
        }
        self.metrics.retention_dropped_segments.increment(segments);
        self.metrics.retention_dropped_bytes.increment(bytes);
        tracing::info!(topic = %self.name, segments, bytes, first = new_first, "retention dropped old segments");
        Ok(Dropped {
            segments,
            bytes,
            first: new_first,
        })
    }
}
