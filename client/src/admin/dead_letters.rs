//! Dead letters of a subscription: listed and paged
//! ([`Admin::list_dead_letters`]), counted in groups
//! ([`Admin::group_dead_letters`]), replayed (into the subscription's retry
//! tier or onto the topic, optionally fixed first, paced as a replay job:
//! [`Admin::replay_dead_letters`] with [`ReplayOptions`]) or purged.
//! Every call selects with a [`DeadLetterFilter`]; its default selects all.

use ricochet_proto::{
    GroupDeadLettersRequest, ListDeadLettersRequest, PurgeDeadLettersRequest,
    ReplayDeadLettersRequest,
};

use super::{
    Admin, DeadLetterFilter, DeadLetterGroupBy, DeadLetterGroups, DeadLetterPage, PurgeOutcome,
    ReplayEdit, ReplayMode, ReplayOutcome,
};
use crate::error::Result;

/// How [`Admin::replay_dead_letters`] replays: which dead letters, where
/// to, when, how fast, with what fix. The default replays every dead letter
/// into the subscription's retry tier, due now, at the broker's default
/// rate, unchanged, and answers when the replay is done.
///
/// ```
/// use ricochet_client::admin::{DeadLetterFilter, ReplayEdit, ReplayOptions};
/// let fixed = ReplayOptions::new()
///     .filter(DeadLetterFilter { reason_contains: "schema".into(), ..Default::default() })
///     .edit(ReplayEdit { payload: Some(b"{\"v\":2}".to_vec()), ..Default::default() })
///     .rate_per_second(100);
/// let preview = fixed.clone().dry_run(true);
/// # let _ = preview;
/// ```
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    filter: DeadLetterFilter,
    reset_delivery_count: Option<bool>,
    rate_per_second: u32,
    to_topic: bool,
    deliver_at_ms: u64,
    edit: Option<ReplayEdit>,
    dry_run: bool,
    detach: bool,
}

impl ReplayOptions {
    /// The defaults (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Replays only the dead letters `filter` selects.
    pub fn filter(mut self, filter: DeadLetterFilter) -> Self {
        self.filter = filter;
        self
    }

    /// Starts the replayed messages' delivery count from 0 again (`true`)
    /// or keeps it (`false`). Unset: reset when an [edit](Self::edit) is
    /// given, kept otherwise.
    pub fn reset_delivery_count(mut self, reset: bool) -> Self {
        self.reset_delivery_count = Some(reset);
        self
    }

    /// At most `rate` messages per second (0: the broker's default).
    pub fn rate_per_second(mut self, rate: u32) -> Self {
        self.rate_per_second = rate;
        self
    }

    /// Publishes the dead letters again on the topic, where every
    /// subscription sees them, instead of into this subscription's retry
    /// tier (the default, which only this subscription sees).
    pub fn to_topic(mut self, to_topic: bool) -> Self {
        self.to_topic = to_topic;
        self
    }

    /// Into the retry tier, due at `ms` since the epoch (0: now).
    pub fn deliver_at_ms(mut self, ms: u64) -> Self {
        self.deliver_at_ms = ms;
        self
    }

    /// Fixes each replayed message first (payload, properties, key); the
    /// edit is recorded in its history.
    pub fn edit(mut self, edit: ReplayEdit) -> Self {
        self.edit = Some(edit);
        self
    }

    /// Only says what would be replayed (count and ids), changing nothing.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Answers at once with the replay job's id instead of when the replay
    /// is done ([`Admin::list_replay_jobs`] follows it).
    pub fn detach(mut self, detach: bool) -> Self {
        self.detach = detach;
        self
    }

    fn request(&self, topic: &str, subscription: &str) -> ReplayDeadLettersRequest {
        ReplayDeadLettersRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            filter: Some(self.filter.clone()),
            reset_delivery_count: self.reset_delivery_count,
            rate_per_second: self.rate_per_second,
            mode: if self.to_topic {
                ReplayMode::Topic
            } else {
                ReplayMode::RetryTier
            } as i32,
            deliver_at_ms: self.deliver_at_ms,
            edit: self.edit.clone(),
            dry_run: self.dry_run,
            detach: self.detach,
        }
    }
}

impl Admin {
    /// Up to `limit` dead letters of `subscription` on `topic` that
    /// `filter` selects, in entry id order, starting after entry id
    /// `after` (paging: the last id of the previous page); the page's
    /// `total` counts every match.
    pub async fn list_dead_letters(
        &self,
        topic: &str,
        subscription: &str,
        filter: &DeadLetterFilter,
        limit: u32,
        after: Option<u64>,
    ) -> Result<DeadLetterPage> {
        let req = ListDeadLettersRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            filter: Some(filter.clone()),
            limit,
            after_entry_id: after,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).list_dead_letters(r).await
        })
        .await
    }

    /// The dead letters `filter` selects, counted by cause, verdict,
    /// consumer or hour, with the first `ids_per_group` entry ids of each
    /// group (0: 10).
    pub async fn group_dead_letters(
        &self,
        topic: &str,
        subscription: &str,
        filter: &DeadLetterFilter,
        by: DeadLetterGroupBy,
        ids_per_group: u32,
    ) -> Result<DeadLetterGroups> {
        let req = GroupDeadLettersRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            filter: Some(filter.clone()),
            group_by: by as i32,
            ids_per_group,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).group_dead_letters(r).await
        })
        .await
    }

    /// Replays dead letters of `subscription` on `topic` as `options` say;
    /// see [`ReplayOptions`]. A replay is a durable job: resumed after a
    /// broker restart, never replaying one message twice.
    pub async fn replay_dead_letters(
        &self,
        topic: &str,
        subscription: &str,
        options: &ReplayOptions,
    ) -> Result<ReplayOutcome> {
        let req = options.request(topic, subscription);
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).replay_dead_letters(r).await
        })
        .await
    }

    /// Deletes for good the dead letters `filter` selects (with `dry_run`:
    /// only says which).
    pub async fn purge_dead_letters(
        &self,
        topic: &str,
        subscription: &str,
        filter: &DeadLetterFilter,
        dry_run: bool,
    ) -> Result<PurgeOutcome> {
        let req = PurgeDeadLettersRequest {
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            filter: Some(filter.clone()),
            dry_run,
        };
        self.on_topic(topic, req, |t, r| async move {
            Self::rpc(t).purge_dead_letters(r).await
        })
        .await
    }
}
