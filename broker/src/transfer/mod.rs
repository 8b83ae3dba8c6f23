//! Moving a topic's data from one broker to another (cluster drain and
//! `MoveTopic`). In this step each topic's data lives on the broker it is
//! placed on, so moving a topic means copying all of it: its log, its
//! subscriptions' retry and dead-letter tiers, every subscription record
//! with its cursors, failure records (delivery counts), schedule entries,
//! dead letters, the producers' sequence ids (so a producer that resends
//! after the move is de-duplicated) and the topic's own retention policy.
//!
//! The copy has two phases, so the topic is stopped only for the tail:
//! while the source keeps serving it, the entries its log holds at that
//! moment are sent (a *pre-copy* state naming only the topic's log, then
//! those entries: a log only grows or loses whole segments to retention, so
//! they cannot change meanwhile); then the source stops serving it, seals
//! its logs and sends the final state (every log, every subscription), the
//! entries the log took meanwhile, and the tiers whole (small, and a
//! dead-letter tier loses single entries to purges, so it is not pre-copied).
//! If retention trimmed the log meanwhile, the target drops what it
//! pre-copied and the log is sent whole again while stopped (never a stale
//! entry kept).
//!
//! The order makes it safe to stop at any point ([`mover`]): the source
//! stops serving the topic and seals its logs; the target writes the copy
//! and flushes it before it answers; only then does the source switch the
//! placement in etcd (one transaction, only if the topic is still placed
//! on it), and only after that does it delete its own copy. A crash before
//! the switch leaves the source the owner (the target's copy is never
//! served, and is replaced by the next attempt); a crash after it leaves a
//! stale copy on the source that is never served (placement says
//! elsewhere). Numeric subscription ids are per broker, so the target gives
//! each subscription a new one; entry ids are kept, so message ids,
//! cursors and dead-letter ids mean the same on both sides.

pub mod mover;

use crate::core::BrokerCore;
use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use crate::node::Node;
use crate::storage::{
    RetentionRecord, ScheduleKey, SubscriptionRecord, SubscriptionState, TopicKind, TopicRecord,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Entries read per chunk when a log is sent.
pub(crate) const CHUNK_ENTRIES: usize = 1_000;
/// Bytes read per chunk (about; a chunk stops once it passes this).
pub(crate) const CHUNK_BYTES: usize = 2 << 20;

/// One log that moves (the topic's or a tier's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogState {
    /// Its record.
    pub record: TopicRecord,
    /// First entry id held.
    pub first: u64,
    /// Ids below this were handed out (the next id to give).
    pub next: u64,
    /// Producers' last stored sequence ids.
    pub sequences: Vec<(String, u64)>,
}

/// Everything about a topic except its entries, as it moves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TopicState {
    /// The topic's log first, then its subscriptions' tiers that exist.
    pub logs: Vec<LogState>,
    /// Each subscription with what it keeps apart from its record (the
    /// record's numeric id is the source broker's).
    pub subscriptions: Vec<(SubscriptionRecord, SubscriptionState)>,
    /// The retention policy set on the topic itself, if any.
    pub retention: Option<RetentionRecord>,
    /// A state sent before the topic stopped: only the topic's log, with
    /// the entries it held then; the final state follows those entries.
    #[serde(default)]
    pub precopy: bool,
}

impl TopicState {
    /// The topic's name.
    pub fn topic(&self) -> &str {
        self.logs.first().map_or("", |l| l.record.name.as_str())
    }
}

/// The state of `name` on this broker, once it is sealed and its
/// subscriptions have settled (see [`BrokerCore::unload`]).
pub(crate) fn capture(
    node: &Node,
    name: &TopicName,
    next: &HashMap<String, u64>,
) -> Result<TopicState> {
    let storage = &node.core.storage;
    let records: HashMap<String, TopicRecord> = storage
        .list_topics()?
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect();
    let subs = storage.list_subscriptions(name.as_str())?;
    let mut names = vec![name.to_string()];
    for s in &subs {
        let (retry, dlq) = crate::tier_owners::tier_names(s)?;
        names.extend([retry, dlq].into_iter().filter(|t| records.contains_key(t)));
    }
    let mut logs = Vec::with_capacity(names.len());
    for log in names {
        let Some(record) = records.get(&log).cloned() else {
            return Err(BrokerError::TopicNotFound(log));
        };
        let (first, stored_next) = storage.entry_range(&log)?;
        logs.push(LogState {
            first,
            next: stored_next.max(next.get(&log).copied().unwrap_or(0)),
            sequences: storage.producer_sequences(&log)?,
            record,
        });
    }
    let subscriptions = subs
        .into_iter()
        .map(|s| {
            let state = storage.subscription_state(s.id)?;
            Ok((s, state))
        })
        .collect::<Result<_>>()?;
    Ok(TopicState {
        logs,
        subscriptions,
        retention: node.retention.policies().get(name.as_str()),
        precopy: false,
    })
}

/// The pre-copy state of `name` while it is still served: its log's record
/// and the entries it holds now (`first..next`).
pub(crate) fn precapture(node: &Node, name: &TopicName) -> Result<TopicState> {
    let storage = &node.core.storage;
    let Some(record) = storage
        .list_topics()?
        .into_iter()
        .find(|r| r.name == name.as_str())
    else {
        return Err(BrokerError::TopicNotFound(name.to_string()));
    };
    let (first, next) = storage.entry_range(name.as_str())?;
    Ok(TopicState {
        logs: vec![LogState {
            record,
            first,
            next,
            sequences: Vec::new(),
        }],
        subscriptions: Vec::new(),
        retention: None,
        precopy: true,
    })
}

/// Where the tail of the topic's log starts once `last` (the final state)
/// follows `pre` (the pre-copy state): after what was pre-copied, or at the
/// log's first entry when retention trimmed it meanwhile (the target then
/// drops its pre-copy, see [`Incoming::resume`]).
pub(crate) fn tail_start(pre: &LogState, last: &LogState) -> u64 {
    if last.first == pre.first && last.next >= pre.next {
        pre.next
    } else {
        last.first
    }
}

/// Runs of consecutive ids in `chunk`: `(first id, entries)`.
pub(crate) fn runs(chunk: Vec<(u64, Vec<u8>)>) -> Vec<(u64, Vec<Vec<u8>>)> {
    let mut out: Vec<(u64, Vec<Vec<u8>>)> = Vec::new();
    for (id, bytes) in chunk {
        match out.last_mut() {
            Some((first, run)) if *first + run.len() as u64 == id => run.push(bytes),
            _ => out.push((id, vec![bytes])),
        }
    }
    out
}

/// A topic arriving on this broker: written as it comes, registered once
/// complete and durable.
#[derive(Debug)]
pub(crate) struct Incoming {
    state: TopicState,
    /// Entries received per log name, and the ids each allows.
    received: HashMap<String, (u64, std::ops::Range<u64>)>,
}

impl Incoming {
    /// Checks `state` and clears the way for it on `core`: a copy of the
    /// topic left by an earlier, unfinished move is deleted first; a tier
    /// name used by something else refuses the move.
    pub(crate) async fn begin(core: &BrokerCore, state: TopicState) -> Result<Self> {
        let Some(main) = state.logs.first() else {
            return Err(BrokerError::InvalidArgument(
                "a moved topic without logs".into(),
            ));
        };
        if main.record.kind != TopicKind::Normal {
            return Err(BrokerError::InvalidArgument(format!(
                "{} is a {:?} tier, not a topic that moves on its own",
                main.record.name, main.record.kind
            )));
        }
        let name = TopicName::parse_stored(&main.record.name)?;
        if core.topic(&name).await.is_ok() {
            tracing::warn!(topic = %name, "replacing a copy left by an unfinished move");
            core.delete_topic(&name, true).await?;
        }
        for log in &state.logs[1..] {
            let tier = TopicName::parse_stored(&log.record.name)?;
            if core.topic(&tier).await.is_ok() {
                return Err(BrokerError::Conflict(format!(
                    "{tier} exists on this broker already and cannot receive {name}'s tier"
                )));
            }
        }
        for log in &state.logs {
            core.storage.put_topic(&log.record)?;
        }
        let received = state
            .logs
            .iter()
            .map(|l| (l.record.name.clone(), (0, l.first..l.next)))
            .collect();
        Ok(Self { state, received })
    }

    /// Whether the final state is still to come (a pre-copy began this).
    pub(crate) fn awaits_final(&self) -> bool {
        self.state.precopy
    }

    /// Takes the final state after the pre-copied entries: the tiers'
    /// records are written (checked as [`Self::begin`] does), the topic's
    /// log may take its tail, and a log retention trimmed meanwhile is
    /// emptied to be sent whole again ([`tail_start`]).
    pub(crate) async fn resume(&mut self, core: &BrokerCore, last: TopicState) -> Result<()> {
        if last.precopy {
            return Err(BrokerError::InvalidArgument(
                "a second pre-copy state in one move".into(),
            ));
        }
        let (Some(pre), Some(main)) = (self.state.logs.first(), last.logs.first()) else {
            return Err(BrokerError::InvalidArgument(
                "a moved topic without logs".into(),
            ));
        };
        if pre.record.name != main.record.name {
            return Err(BrokerError::InvalidArgument(format!(
                "the final state is {}'s, the pre-copy was {}'s",
                main.record.name, pre.record.name
            )));
        }
        for log in &last.logs[1..] {
            let tier = TopicName::parse_stored(&log.record.name)?;
            if self.received.contains_key(&log.record.name) || core.topic(&tier).await.is_ok() {
                return Err(BrokerError::Conflict(format!(
                    "{tier} exists on this broker already and cannot receive {}'s tier",
                    main.record.name
                )));
            }
        }
        let resend = tail_start(pre, main) != pre.next;
        let main = main.record.name.clone();
        // From here on an abort removes every log of the final state.
        self.state = last;
        if resend {
            tracing::info!(topic = %main, "trimmed during the pre-copy: the log is sent again");
            core.storage.delete_topic(&main)?;
            self.received.insert(main, (0, 0..0));
        }
        for log in &self.state.logs {
            core.storage.put_topic(&log.record)?;
            let (count, _) = self.received.remove(&log.record.name).unwrap_or_default();
            self.received
                .insert(log.record.name.clone(), (count, log.first..log.next));
        }
        Ok(())
    }

    /// Writes entries `first_id..` of `log` (not durable yet).
    pub(crate) fn entries(
        &mut self,
        core: &BrokerCore,
        log: &str,
        first_id: u64,
        entries: &[Vec<u8>],
    ) -> Result<()> {
        let Some((count, allowed)) = self.received.get_mut(log) else {
            return Err(BrokerError::InvalidArgument(format!(
                "entries for {log}, which is not part of this move"
            )));
        };
        let end = first_id.saturating_add(entries.len() as u64);
        if first_id < allowed.start || end > allowed.end {
            return Err(BrokerError::InvalidArgument(format!(
                "entries {first_id}..{end} of {log} lie outside {}..{}",
                allowed.start, allowed.end
            )));
        }
        core.storage.append(log, first_id, entries, None)?;
        *count += entries.len() as u64;
        Ok(())
    }

    /// Removes what an unfinished import wrote (the move failed).
    pub(crate) async fn abort(&self, core: &BrokerCore) {
        let forgetting = core.keeper.forgetting().await;
        for log in &self.state.logs {
            let name = &log.record.name;
            if let Err(e) = forgetting.topic(name).await {
                tracing::warn!(topic = %name, error = %e, "cannot forget a half-moved topic in the manifest");
            }
            if let Err(e) = core.storage.delete_topic(name) {
                tracing::warn!(topic = %name, error = %e, "cannot remove a half-moved topic");
            }
        }
    }

    /// Checks that every entry arrived (`sent`: the count of each log, as
    /// the source sent them), writes the subscriptions under new
    /// ids, makes it all durable and starts serving-ready state (the topic
    /// is served once etcd places it here). Entries stored.
    pub(crate) async fn finish(&mut self, node: &Node, sent: &HashMap<String, u64>) -> Result<u64> {
        let core = &node.core;
        if self.state.precopy {
            return Err(BrokerError::InvalidArgument(
                "the transfer ended before the topic's final state".into(),
            ));
        }
        for log in &self.state.logs {
            let got = self.received.get(&log.record.name).map_or(0, |r| r.0);
            let expected = sent.get(&log.record.name).copied().unwrap_or(0);
            if got != expected {
                return Err(BrokerError::InvalidArgument(format!(
                    "{}: {got} entries arrived, {expected} were sent",
                    log.record.name
                )));
            }
            core.storage
                .restore_producer_sequences(&log.record.name, &log.sequences)?;
            core.keeper.reserve(&log.record.name, log.next).await?;
        }
        let mut subs = Vec::with_capacity(self.state.subscriptions.len());
        let mut schedule = Vec::new();
        for (rec, state) in std::mem::take(&mut self.state.subscriptions) {
            let rec = SubscriptionRecord {
                id: core.storage.next_id()?,
                ..rec
            };
            core.storage.put_subscription(&rec)?;
            core.storage.restore_subscription_state(rec.id, &state)?;
            schedule.extend(state.schedule.iter().map(|(due_ms, e, _)| ScheduleKey {
                due_ms: *due_ms,
                message: e.of(rec.id),
            }));
            subs.push(rec);
        }
        if let Some(r) = &self.state.retention {
            core.storage.put_retention(r)?;
        }
        core.storage.flush().await?;
        let logs: Vec<(TopicName, TopicKind)> = self
            .state
            .logs
            .iter()
            .map(|l| Ok((TopicName::parse_stored(&l.record.name)?, l.record.kind)))
            .collect::<Result<_>>()?;
        // The policy first: the topic's quota is set as it opens.
        if let Some(r) = self.state.retention.clone() {
            node.retention.policies().adopt(r);
        }
        core.adopt(&logs, subs).await?;
        core.scheduler.add(schedule);
        Ok(self.received.values().map(|(n, _)| n).sum())
    }
}
