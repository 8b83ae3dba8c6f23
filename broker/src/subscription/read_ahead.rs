//! Reading ahead of dispatch: up to [`READ_AHEAD`] messages are loaded from
//! the topic log (from the read position, up to the topic's durable end)
//! and from the fired schedule (retries and delayed messages now due; those
//! read before they were due come from [`super::prefetch`]). A
//! message published with a future `deliver_at` is put in the schedule
//! instead of the read-ahead.

use super::SubscriptionActor;
use super::delivery::Pending;
use crate::error::Result;
use crate::storage::{ScheduleKey, StorageError, SubMessage, TierEntry, TierId};
use prost::Message as _;
use ricochet_proto::Message;

/// Messages buffered ahead of dispatch.
pub(super) const READ_AHEAD: usize = 1_000;
// Staging takes at most twice what is read ahead.
const _: () = assert!(super::stage::STAGE_MAX == 2 * READ_AHEAD);
/// Most bytes read from the log in one read-ahead step.
const READ_AHEAD_BYTES: usize = 8 * 1024 * 1024;

/// Most read-ahead steps per [`SubscriptionActor::fill`] call that find
/// nothing to dispatch.
const FILL_STEPS: usize = 16;

/// Most entries one read-ahead step passes over in memory (see
/// [`SubscriptionActor::skip_waiting`]).
const SKIP_STEP: u64 = 1 << 18;

impl SubscriptionActor {
    /// The stored messages behind `entries`, in their order: one read per
    /// tier, so a stored batch is read and checked once however many of
    /// its messages a burst of failures moves (a read per message read the
    /// whole batch record each time).
    pub(super) fn source_messages(&self, entries: &[TierEntry]) -> Result<Vec<Message>> {
        let mut out: Vec<Option<Message>> = vec![None; entries.len()];
        for tier in [TierId::Main, TierId::Retry] {
            let at: Vec<usize> = (0..entries.len())
                .filter(|&i| entries[i].tier == tier)
                .collect();
            if at.is_empty() {
                continue;
            }
            let topic = self.tiers.topic_of(&self.rec, tier);
            let ids: Vec<u64> = at.iter().map(|&i| entries[i].entry_id).collect();
            let read = self.deps.storage.read_many(topic, &ids)?;
            for (&i, bytes) in at.iter().zip(read) {
                let bytes = bytes.ok_or_else(|| {
                    StorageError::Missing(format!("entry {topic}:{}", entries[i].entry_id))
                })?;
                out[i] = Some(Message::decode(bytes.as_slice()).map_err(StorageError::from)?);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Reads messages for dispatch (with their failure records, for
    /// retries) into the read-ahead; one that cannot be read is dropped with
    /// a warning. Each tier's entries are read together, so a stored batch
    /// is read and checked once however many of its messages come due.
    pub(super) fn load_into_ready(&mut self, entries: Vec<(TierEntry, Option<u64>)>) {
        for tier in [TierId::Main, TierId::Retry] {
            let batch: Vec<_> = entries.iter().filter(|(e, _)| e.tier == tier).collect();
            if batch.is_empty() {
                continue;
            }
            if tier == TierId::Retry
                && batch
                    .iter()
                    .any(|(e, _)| !self.deliveries.failures.contains_key(e))
            {
                // The records not known yet, read together (a burst's
                // records share the schedule's stored chunks).
                let keys: Vec<(TierEntry, (SubMessage, Option<u64>))> = batch
                    .iter()
                    .filter(|(entry, _)| !self.deliveries.failures.contains_key(entry))
                    .map(|&&(entry, due_ms)| (entry, (entry.of(self.rec.id), due_ms)))
                    .collect();
                let asked: Vec<(SubMessage, Option<u64>)> = keys.iter().map(|(_, k)| *k).collect();
                match self.deps.storage.failures_many(&asked) {
                    Ok(records) => {
                        for ((entry, _), r) in keys.into_iter().zip(records) {
                            if let Some(r) = r {
                                self.deliveries.failures.insert(entry, r);
                            }
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "cannot read failure records"),
                }
            }
            let topic = self.tiers.topic_of(&self.rec, tier).to_owned();
            let ids: Vec<u64> = batch.iter().map(|(e, _)| e.entry_id).collect();
            let read = match self.deps.storage.read_many(&topic, &ids) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, %topic, n = ids.len(), "dropping messages that cannot be read");
                    continue;
                }
            };
            for ((entry, due_ms), bytes) in batch.into_iter().zip(read) {
                let Some(bytes) = bytes else {
                    tracing::warn!(%topic, entry = entry.entry_id, "dropping a message that is no longer stored");
                    continue;
                };
                match Message::decode(bytes.as_slice()) {
                    Ok(msg) => {
                        self.deliveries.ready.insert(
                            *entry,
                            Pending {
                                msg: Box::new(msg),
                                due_ms: *due_ms,
                            },
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, %topic, entry = entry.entry_id, "dropping an undecodable message");
                    }
                }
            }
        }
    }

    /// Loads fired schedule entries into the read-ahead.
    pub(super) fn load_due(&mut self) {
        let room = READ_AHEAD.saturating_sub(self.deliveries.ready.len());
        let mut take = Vec::new();
        let mut early_n = 0usize;
        while take.len() < room {
            let Some((entry, due)) = self.deliveries.due.pop_first() else {
                break;
            };
            // Read before it was due (`prefetch`): taken out of the buffer
            // whatever follows (an acked one is dropped with it).
            let early = self.deliveries.prefetched.take(entry, due);
            if self.rec.is_acked(entry) {
                // A crash left the schedule entry of an acked message behind.
                let stale = ScheduleKey {
                    due_ms: due,
                    message: entry.of(self.rec.id),
                };
                let _ = self.deps.storage.put_schedule(&[(stale, false)]);
                if self.deliveries.held.remove(&entry) {
                    let _ = self
                        .deps
                        .storage
                        .put_failures(&[(entry.of(self.rec.id), None)]);
                }
                continue;
            }
            if self.deliveries.in_flight.contains_key(&entry) {
                continue;
            }
            // Read before it was due: no storage read now.
            if let Some(early) = early {
                if let Some(f) = early.failure {
                    self.deliveries.failures.entry(entry).or_insert(f);
                }
                self.deliveries.ready.insert(
                    entry,
                    Pending {
                        msg: early.msg,
                        due_ms: Some(due),
                    },
                );
                early_n += 1;
                continue;
            }
            take.push((entry, Some(due)));
        }
        let read = take.len();
        if !take.is_empty() {
            self.load_into_ready(take);
        }
        if read + early_n > 0 {
            tracing::trace!(target: "ricochet::burst", read_ahead = early_n, read, "actor: fired entries loaded");
        }
    }

    /// Reads the main topic from the read position into the read-ahead.
    /// Past a stretch of entries that all wait elsewhere (nacks the broker
    /// holds, delayed or acked messages) it reads on, up to [`FILL_STEPS`]
    /// reads per call, then wakes the actor to go on after its other
    /// commands: a consumer behind a million held nacks still gets the next
    /// message, without one call reading them all.
    pub(super) fn fill(&mut self) {
        for _ in 0..FILL_STEPS {
            let before = self.read_pos;
            self.fill_once();
            if !self.deliveries.ready.is_empty()
                || self.read_pos == before
                || self.read_pos >= self.topic.durable_end()
            {
                return;
            }
        }
        if let Some(tx) = self.self_tx.upgrade() {
            let _ = tx.send(super::handle::Command::Ready(Vec::new()));
        }
    }

    /// Whether main-tier entry `id` waits elsewhere than in the log: acked,
    /// in flight, a nack the broker holds (its schedule brings it back), or a
    /// failed message still held.
    fn waits_elsewhere(&self, id: u64, now_ms: u64) -> bool {
        let entry = TierEntry::main(id);
        self.rec.main.is_acked(id)
            || self.deliveries.in_flight.contains_key(&entry)
            || self.deliveries.held.contains_key(&entry)
            || self
                .deliveries
                .failures
                .get(&entry)
                .is_some_and(|r| r.hold_until_ms > now_ms)
    }

    /// Moves the read position past the entries that wait elsewhere
    /// ([`Self::waits_elsewhere`], known from memory) without reading them
    /// from the log: a subscription restarted behind millions of held nacks
    /// reads none of them to reach the next message. Passes at most
    /// [`SKIP_STEP`]; true when it stopped there (more may follow).
    fn skip_waiting(&mut self, end: u64) -> bool {
        let now = self.deps.clock.now_ms();
        let stop = self.read_pos.saturating_add(SKIP_STEP).min(end);
        while self.read_pos < stop && self.waits_elsewhere(self.read_pos, now) {
            self.read_pos += 1;
        }
        self.read_pos == stop && stop < end
    }

    /// One read of the main topic into the read-ahead.
    fn fill_once(&mut self) {
        self.skip_trimmed();
        let end = self.topic.durable_end();
        let ready = self.deliveries.ready.len();
        if ready >= READ_AHEAD || self.read_pos >= end {
            return;
        }
        if self.skip_waiting(end) || self.read_pos >= end {
            // Moved on by a whole step (`fill` goes on), or to the end.
            return;
        }
        let entries = match self.deps.storage.read(
            &self.rec.topic,
            self.read_pos,
            READ_AHEAD - ready,
            READ_AHEAD_BYTES,
        ) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, topic = %self.rec.topic, "cannot read topic");
                return;
            }
        };
        let now = self.deps.clock.now_ms();
        let mut delayed = Vec::new();
        let mut last = None;
        for (id, bytes) in entries {
            if id >= end {
                break;
            }
            last = Some(id);
            let entry = TierEntry::main(id);
            if self.waits_elsewhere(id, now) {
                continue;
            }
            let msg = match Message::decode(bytes.as_slice()) {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(error = %e, id, "skipping an undecodable entry");
                    continue;
                }
            };
            if msg.deliver_at_ms > now {
                delayed.push(ScheduleKey {
                    due_ms: msg.deliver_at_ms,
                    message: entry.of(self.rec.id),
                });
                continue;
            }
            self.deliveries.ready.insert(
                entry,
                Pending {
                    msg: Box::new(msg),
                    due_ms: None,
                },
            );
        }
        self.read_pos = match last {
            Some(l) => l + 1,
            // Nothing left below `end` (trimmed or a gap): jump to it.
            None => end,
        };
        if !delayed.is_empty() {
            let writes: Vec<_> = delayed.iter().map(|k| (*k, true)).collect();
            match self.deps.storage.put_schedule(&writes) {
                Ok(()) => self.deps.scheduler.add(delayed),
                Err(e) => tracing::error!(error = %e, "cannot schedule delayed messages"),
            }
        }
    }
}
