//! A subscription's retry and dead-letter tiers, and moving messages into
//! them: each batch of moves is one storage transaction (append the copy to
//! the tier + ack the source + carry the failure record), so a message is
//! never lost and never in two tiers. The moved copies become readable (and
//! a retry enters the timer) only once the move is durable; the actor does
//! not wait for that flush, the request's reply does.

use super::SubscriptionActor;
use super::acks::Cleanup;
use super::failure::Failure;
use super::intake::millis;
use super::requests::MessageRef;
use crate::error::Result;
use crate::events::{EventKind, FailureEvent, excerpt};
use crate::storage::{
    Arrival, DeadLetterRecord, FailureRecord, MoveItem, ScheduleKey, Storage, SubMessage,
    SubscriptionRecord, TierEntry, TierId, TierMove, TopicKind,
};
use crate::topic::Topic;
use prost::Message as _;
use ricochet_policy::{DeadLetterPolicy, PolicySpec};
use ricochet_proto::{Message, props};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What a subscription needs from the rest of the broker.
#[async_trait::async_trait]
pub trait BrokerLink: Send + Sync + std::fmt::Debug {
    /// The topic of a retry or dead-letter tier, created on first use.
    async fn tier_topic(&self, name: &str, kind: TopicKind) -> Result<Arc<Topic>>;
    /// Builds a policy from its spec (resolving named, registered policies).
    fn build_policy(&self, spec: &PolicySpec) -> Result<Arc<dyn DeadLetterPolicy>>;
    /// The configured default policy for a topic.
    fn configured_policy(&self, topic: &str) -> Option<PolicySpec>;
    /// Publishes failure events (in the background; see `crate::events`).
    fn emit(&self, events: Vec<FailureEvent>);
    /// The configured outage breaker for a topic.
    fn configured_breaker(&self, _topic: &str) -> Option<ricochet_policy::BreakerSpec> {
        None
    }
}

/// The names of a subscription's tiers and, once used, their topics.
#[derive(Debug)]
pub(super) struct Tiers {
    pub retry_name: String,
    pub dead_letter_name: String,
    pub retry: Option<Arc<Topic>>,
    pub dead_letter: Option<Arc<Topic>>,
}

impl Tiers {
    /// The tiers of `rec`: its overrides, or `<topic>-<sub>-RETRY` / `-DLQ`.
    pub fn for_subscription(rec: &SubscriptionRecord) -> Result<Self> {
        let (retry_name, dead_letter_name) = crate::tier_owners::tier_names(rec)?;
        Ok(Self {
            retry_name,
            dead_letter_name,
            retry: None,
            dead_letter: None,
        })
    }

    /// The name of `rec`'s retry tier topic.
    pub fn retry_name_of(rec: &SubscriptionRecord) -> Result<String> {
        Ok(Self::for_subscription(rec)?.retry_name)
    }

    /// Messages queued in the retry tier: every entry the retry cursor has
    /// not acked (a message leaving the tier acks its entry), so the count
    /// comes from the cursor, not from a scan of the schedule.
    pub fn queued_retries(&self, storage: &dyn Storage, rec: &SubscriptionRecord) -> Result<u64> {
        let (_, end) = storage.entry_range(&self.retry_name)?;
        let mark = rec.retry.mark_delete.min(end);
        Ok((end - mark) - rec.retry.acked_between(mark, end))
    }

    /// The topic holding a tier's entries.
    pub fn topic_of<'a>(&'a self, rec: &'a SubscriptionRecord, tier: TierId) -> &'a str {
        match tier {
            TierId::Main => &rec.topic,
            TierId::Retry => &self.retry_name,
        }
    }

    /// The tier and entry a consumer's message id names, if it is ours.
    pub fn locate(&self, rec: &SubscriptionRecord, id: &MessageRef) -> Option<TierEntry> {
        if id.topic == rec.topic {
            Some(TierEntry::main(id.entry_id))
        } else if id.topic == self.retry_name {
            Some(TierEntry::retry(id.entry_id))
        } else {
            None
        }
    }
}

impl SubscriptionActor {
    /// The retry or dead-letter tier's topic, created on first use.
    pub(super) async fn tier_topic(&mut self, kind: TopicKind) -> Result<Arc<Topic>> {
        let (slot, name) = match kind {
            TopicKind::DeadLetter => (&mut self.tiers.dead_letter, &self.tiers.dead_letter_name),
            _ => (&mut self.tiers.retry, &self.tiers.retry_name),
        };
        if let Some(t) = slot {
            return Ok(t.clone());
        }
        let t = self.deps.link.tier_topic(name, kind).await?;
        *slot = Some(t.clone());
        // Retry-tier ids lost to a crash count as acked (the move that
        // follows stores the cursor with its entries).
        if kind == TopicKind::Retry
            && let Some(void) = t.void()
            && self.rec.retry.ack_range(void)
        {
            self.dirty = true;
        }
        Ok(t)
    }

    /// The copy of `entry` a tier receives: Pulsar's properties added
    /// (`REAL_TOPIC`, `ORIGIN_MESSAGE_ID` once, `RECONSUMETIMES` updated),
    /// and the consumer's extra properties.
    fn tier_copy(
        &self,
        mut m: Message,
        entry: TierEntry,
        rec: &FailureRecord,
        extra: &HashMap<String, String>,
    ) -> Message {
        m.properties
            .entry(props::REAL_TOPIC.into())
            .or_insert_with(|| self.rec.topic.clone());
        let origin = self.wire_id(entry);
        m.properties
            .entry(props::ORIGIN_MESSAGE_ID.into())
            .or_insert(origin);
        m.properties
            .insert(props::RECONSUME_TIMES.into(), rec.count.to_string());
        for (k, v) in extra {
            m.properties.insert(k.clone(), v.clone());
        }
        m
    }

    /// The stored messages of `items`' failed entries (see
    /// [`Self::source_messages`]).
    fn failed_sources<T, U>(&self, items: &[(Failure, T, U)]) -> Result<Vec<Message>> {
        let entries: Vec<TierEntry> = items.iter().map(|(f, _, _)| f.entry).collect();
        self.source_messages(&entries)
    }

    /// Where a message first came from: its `ORIGIN_MESSAGE_ID`, or itself.
    fn origin_of(&self, m: &Message, entry: TierEntry) -> (String, u64) {
        if let Some((t, e)) = m
            .properties
            .get(props::ORIGIN_MESSAGE_ID)
            .and_then(|o| o.rsplit_once(':'))
            && let Ok(e) = e.parse()
        {
            return (t.to_owned(), e);
        }
        (self.rec.topic.clone(), entry.entry_id)
    }

    /// Marks `entry` acked in `sub` (the copy of the record a move writes)
    /// and returns its storage key and, if it was scheduled, its schedule
    /// entry (both removed by the move).
    fn leave(
        &self,
        sub: &mut SubscriptionRecord,
        entry: TierEntry,
    ) -> (SubMessage, Option<ScheduleKey>) {
        let from = entry.of(sub.id);
        sub.cursor_mut(entry.tier).ack(entry.entry_id);
        let schedule = self
            .deliveries
            .in_flight
            .get(&entry)
            .and_then(|i| i.due_ms)
            .map(|due_ms| ScheduleKey {
                due_ms,
                message: from,
            });
        (from, schedule)
    }

    /// Moves failed messages into the retry tier, each due after its delay.
    pub(super) async fn move_to_retry(
        &mut self,
        items: Vec<(Failure, FailureRecord, Duration)>,
        now: u64,
    ) -> Result<()> {
        let topic = self.tier_topic(TopicKind::Retry).await?;
        let first_id = topic.reserve_ids(items.len() as u64).await?;
        let mut sub = self.rec.clone();
        let mut move_items = Vec::with_capacity(items.len());
        let mut new_keys = Vec::with_capacity(items.len());
        let stored = self.failed_sources(&items)?;
        for (i, ((f, rec, after), m)) in items.iter().zip(stored).enumerate() {
            // From when the request reached the subscription, if it says,
            // less what it waited in the client (at most the delay: never
            // due before the request arrived), rounded up: never due
            // before the delay is over.
            let from = retry_from(f, *after, now);
            let due_ms = from.saturating_add(millis(*after));
            let mut m = self.tier_copy(m, f.entry, rec, &f.extra_props);
            m.properties
                .insert(props::DELAY_TIME.into(), millis(*after).to_string());
            m.deliver_at_ms = due_ms;
            let target = first_id + i as u64;
            let (from, from_schedule) = self.leave(&mut sub, f.entry);
            tracing::debug!(
                sub = %self.rec.name,
                message = %format!("{}:{target}", topic.name()),
                origin = %m.properties.get(props::ORIGIN_MESSAGE_ID).map_or("", String::as_str),
                attempt = rec.count,
                delay_ms = millis(*after),
                reason = %f.reason,
                detail = %f.detail,
                "retry scheduled"
            );
            new_keys.push(ScheduleKey {
                due_ms,
                message: TierEntry::retry(target).of(sub.id),
            });
            move_items.push(MoveItem {
                from,
                from_schedule,
                payload: m.encode_to_vec(),
                target_entry_id: target,
                failures: rec.clone(),
                arrival: Arrival::Retry { due_ms },
                // A retry with properties of its own is always a copy.
                source: f.extra_props.is_empty().then(|| {
                    let topic = self.tiers.topic_of(&self.rec, f.entry.tier);
                    (topic.to_owned(), f.entry.entry_id)
                }),
            });
        }
        let sources: Vec<TierEntry> = items.iter().map(|(f, _, _)| f.entry).collect();
        let moved: Vec<_> = new_keys
            .iter()
            .zip(&sources)
            .map(|(k, s)| (*s, Some((TierEntry::retry(k.message.entry_id), k.due_ms))))
            .collect();
        self.key_order_moves(&mut sub, &moved);
        let from_retry = self.store_move(&topic, sub, move_items, &sources)?;
        // Bookkeeping for metrics: what entered and left the retry tier.
        let c = &mut self.counters;
        c.retry_queue = c.retry_queue.saturating_sub(from_retry) + items.len() as u64;
        c.retries_scheduled += items.len() as u64;
        self.metrics.retries_scheduled.increment(items.len() as u64);
        for (f, _, after) in &items {
            self.metrics.retry_delay.record(after.as_secs_f64());
            self.failures.retried(f.reason, 1);
        }
        // The timer learns of them once they are durable.
        let scheduler = self.deps.scheduler.clone();
        self.when_durable(topic, first_id + items.len() as u64, move || {
            scheduler.add(new_keys)
        });
        Ok(())
    }

    /// Moves failed messages into the dead-letter tier with their history.
    pub(super) async fn move_to_dead_letter(
        &mut self,
        items: Vec<(Failure, FailureRecord, String)>,
        now: u64,
    ) -> Result<()> {
        let topic = self.tier_topic(TopicKind::DeadLetter).await?;
        let first_id = topic.reserve_ids(items.len() as u64).await?;
        let mut sub = self.rec.clone();
        let mut move_items = Vec::with_capacity(items.len());
        let mut events = Vec::with_capacity(items.len());
        let stored = self.failed_sources(&items)?;
        for (i, ((f, rec, reason), m)) in items.iter().zip(stored).enumerate() {
            let mut m = self.tier_copy(m, f.entry, rec, &f.extra_props);
            m.properties
                .insert(props::DEAD_LETTER_REASON.into(), reason.clone());
            m.deliver_at_ms = 0;
            let (origin_topic, origin_entry_id) = self.origin_of(&m, f.entry);
            let (from, from_schedule) = self.leave(&mut sub, f.entry);
            tracing::debug!(
                sub = %self.rec.name, topic = %self.rec.topic, origin = %format!("{origin_topic}:{origin_entry_id}"),
                attempt = rec.count, reason = %reason, "message dead-lettered"
            );
            let record = DeadLetterRecord {
                origin_topic,
                origin_entry_id,
                reason: reason.clone(),
                at_ms: now,
                failures: rec.clone(),
                replay: None,
            };
            let mut ev = FailureEvent::new(
                EventKind::DeadLettered,
                now,
                &self.rec.topic,
                &self.rec.name,
            );
            ev.message_id = Some(format!("{}:{}", topic.name(), first_id + i as u64));
            ev.origin_id = Some(format!(
                "{}:{}",
                record.origin_topic, record.origin_entry_id
            ));
            ev.cause = Some(record.cause());
            ev.verdict = Some(reason.clone());
            ev.attempts = Some(rec.count);
            ev.consumer = rec.attempts.last().map(|a| a.consumer.clone());
            ev.payload_excerpt = Some(excerpt(&m.payload));
            events.push(ev);
            move_items.push(MoveItem {
                from,
                from_schedule,
                payload: m.encode_to_vec(),
                target_entry_id: first_id + i as u64,
                failures: rec.clone(),
                arrival: Arrival::DeadLetter(record),
                source: None,
            });
        }
        let sources: Vec<TierEntry> = items.iter().map(|(f, _, _)| f.entry).collect();
        let gone: Vec<_> = sources.iter().map(|s| (*s, None)).collect();
        let released = self.key_order_moves(&mut sub, &gone);
        let from_retry = self.store_move(&topic, sub, move_items, &sources)?;
        self.keys_released(released, "dead-lettered");
        self.counters.retry_queue = self.counters.retry_queue.saturating_sub(from_retry);
        self.counters.dlq_size += items.len() as u64;
        for (f, _, _) in &items {
            self.metrics.dead_lettered(f.reason.as_str(), 1);
            self.failures.dead_lettered(f.reason, 1);
        }
        // Readable by dead-letter consumers once durable; then announced.
        let link = self.deps.link.clone();
        self.when_durable(topic, first_id + items.len() as u64, move || {
            link.emit(events)
        });
        Ok(())
    }

    /// After a tier move wrote `topic`'s ids below `end`: once they are
    /// durable (in either mode: a moved copy is never read before its move is),
    /// makes them readable and runs
    /// `then`. The actor does not wait for the flush; the request's reply does.
    pub(super) fn when_durable(
        &self,
        topic: Arc<Topic>,
        end: u64,
        then: impl FnOnce() + Send + 'static,
    ) {
        let flusher = self.deps.flusher.clone();
        tokio::spawn(async move {
            if flusher.durable().await.is_ok() {
                topic.advance_durable_end(end);
                then();
            }
        });
    }

    /// Stores one batch of moves into `topic` in one transaction (the
    /// sources acked in `sub`), then adopts the record it wrote and forgets
    /// the sources. Returns how many of them left the retry tier.
    fn store_move(
        &mut self,
        topic: &Topic,
        sub: SubscriptionRecord,
        items: Vec<MoveItem>,
        sources: &[TierEntry],
    ) -> Result<u64> {
        let mv = TierMove {
            target_topic: topic.name().to_string(),
            subscription: sub,
            items,
        };
        self.deps.storage.move_messages(&mv)?;
        self.rec = mv.subscription;
        let mut done = Cleanup::default();
        for &e in sources {
            self.settle(e, &mut done);
            self.deliveries.ready.remove(&e);
            self.deliveries.due.remove(&e);
        }
        // The transaction already removed the records and schedule entries;
        // only the timer still holds some.
        self.deps.scheduler.remove(done.unschedule);
        self.dirty = true;
        Ok(sources.iter().filter(|e| e.tier == TierId::Retry).count() as u64)
    }
}

/// The millisecond a retry's delay `after` runs from: when its request
/// reached the subscription (`now`, in ms, if the failure does not say),
/// less what the request waited in the client before it was sent, at most
/// the whole (whole-millisecond) delay so the retry is never due before its
/// request arrived; rounded up, so never due before the delay is over.
fn retry_from(f: &Failure, after: Duration, now: u64) -> u64 {
    let since_us = f.since_us.unwrap_or(now.saturating_mul(1000));
    let waited_us = u64::try_from(f.waited.as_micros()).unwrap_or(u64::MAX);
    let back = waited_us.min(millis(after).saturating_mul(1000));
    since_us.saturating_sub(back).div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::TierEntry;
    use ricochet_policy::FailureReason;

    fn failure(since_us: Option<u64>, waited: Duration) -> Failure {
        Failure {
            since_us,
            waited,
            ..Failure::new(
                TierEntry::main(7),
                FailureReason::ReconsumeLater,
                "c".into(),
            )
        }
    }

    #[test]
    fn a_retry_runs_from_its_arrival_less_what_the_client_reports_it_waited() {
        let after = Duration::from_millis(200);
        // An older client (nothing waited): from the arrival, rounded up.
        let f = failure(Some(1_000_400), Duration::ZERO);
        assert_eq!(retry_from(&f, after, 0), 1_001);
        // 12.3 ms in the client's queues: the delay started that much earlier.
        let f = failure(Some(1_000_400), Duration::from_micros(12_300));
        assert_eq!(retry_from(&f, after, 0), 989);
        // Without the subscription's arrival time: from `now`.
        let f = failure(None, Duration::from_millis(5));
        assert_eq!(retry_from(&f, after, 2_000), 1_995);
    }

    #[test]
    fn what_the_client_reports_it_waited_never_makes_a_retry_due_before_it_arrived() {
        // A client claiming an hour (a bug, or hostile) gets its retry at the
        // frame's arrival at the earliest, never before.
        for after in [
            Duration::ZERO,
            Duration::from_micros(200_999),
            Duration::from_secs(1),
        ] {
            let f = failure(Some(5_000_000_400), Duration::from_secs(3_600));
            let due = retry_from(&f, after, 0) + millis(after);
            assert!(
                due * 1000 >= 5_000_000_400,
                "due at {due} ms, before the arrival at 5 000 000.4 ms (delay {after:?})"
            );
        }
        // Nor wraps around at zero.
        let f = failure(Some(300), Duration::from_secs(3_600));
        assert_eq!(retry_from(&f, Duration::from_secs(1), 0), 0);
    }
}
