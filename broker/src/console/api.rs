//! The console's one door into the broker: every read and every action the
//! console takes goes through the in-process [`AdminService`], the same
//! implementation the gRPC admin API serves, so the console can show and do
//! nothing an operator could not do with `ricochet` or a gRPC client, and
//! answers with the same validation and the same errors (a
//! [`tonic::Status`], mapped to an HTTP status by [`super::ConsoleError`]).
//!
//! When the admin API grows (edit-and-replay, subscription-scoped replay,
//! dry runs and group-by on branch `dlq`), its calls are added here as one
//! method each; pages and actions only see these methods.

use crate::service::AdminService;
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use tonic::{Request, Status};

/// The result of an admin call.
pub(crate) type ApiResult<T> = Result<T, Status>;

/// Which dead letters a page or an action means: the admin API's
/// [`DeadLetterFilter`], parsed from a query string by [`super::pages`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DeadLetterQuery {
    /// Only those whose reason (or an attempt's detail) contains this.
    pub reason: String,
    /// Dead-lettered at or after this time (ms since epoch; 0: unbounded).
    pub since_ms: u64,
    /// Dead-lettered before this time (ms since epoch; 0: unbounded).
    pub until_ms: u64,
    /// Only these dead-letter entry ids (empty: all).
    pub ids: Vec<u64>,
}

impl DeadLetterQuery {
    fn to_filter(&self) -> Option<DeadLetterFilter> {
        (self != &Self::default()).then(|| DeadLetterFilter {
            entry_ids: self.ids.clone(),
            reason_contains: self.reason.clone(),
            since_ms: self.since_ms,
            until_ms: self.until_ms,
        })
    }
}

/// What the dead-letter list can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupBy {
    /// The dead letter's reason, exactly.
    Reason,
    /// The consumer of the last failed attempt.
    Consumer,
    /// The UTC hour it was dead-lettered in.
    Hour,
}

impl GroupBy {
    /// `reason`, `consumer` or `hour`; empty is no grouping; `None` for
    /// anything else.
    pub(crate) fn parse(s: &str) -> Option<Option<Self>> {
        match s {
            "" => Some(None),
            "reason" => Some(Some(Self::Reason)),
            "consumer" => Some(Some(Self::Consumer)),
            "hour" => Some(Some(Self::Hour)),
            _ => None,
        }
    }
}

/// One group of dead letters and how many it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    /// The reason, consumer, or the hour's start (ms since epoch) as text.
    pub key: String,
    /// For [`GroupBy::Hour`], the hour's start, ms since epoch.
    pub hour_ms: Option<u64>,
    pub count: u64,
}

/// Most dead letters a grouping reads.
const GROUP_LIMIT: u32 = 10_000;

/// The admin calls the console makes.
#[derive(Debug, Clone)]
pub(crate) struct ConsoleApi {
    admin: AdminService,
}

impl ConsoleApi {
    pub(crate) fn new(admin: AdminService) -> Self {
        Self { admin }
    }

    /// Every topic, tier topics included, sorted.
    pub(crate) async fn topics(&self) -> ApiResult<Vec<String>> {
        let r = self
            .admin
            .list_topics(Request::new(ListTopicsRequest::default()))
            .await?;
        Ok(r.into_inner().topics)
    }

    /// A topic's counters with every subscription's stats.
    pub(crate) async fn topic_stats(&self, topic: &str) -> ApiResult<TopicStatsResponse> {
        let r = self
            .admin
            .topic_stats(Request::new(TopicRequest {
                topic: topic.to_owned(),
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// One subscription's stats (backlog, unacked, retries by due time, ...).
    pub(crate) async fn subscription_stats(
        &self,
        topic: &str,
        sub: &str,
    ) -> ApiResult<SubscriptionStatsResponse> {
        let r = self
            .admin
            .subscription_stats(Request::new(sub_request(topic, sub)))
            .await?;
        Ok(r.into_inner())
    }

    /// The dead-letter policy in force and where it came from.
    pub(crate) async fn policy(&self, topic: &str, sub: &str) -> ApiResult<PolicyResponse> {
        let r = self
            .admin
            .get_policy(Request::new(sub_request(topic, sub)))
            .await?;
        Ok(r.into_inner())
    }

    /// A stored message and its state in every subscription of its topic.
    pub(crate) async fn message(
        &self,
        topic: &str,
        entry_id: u64,
    ) -> ApiResult<GetMessageResponse> {
        let r = self
            .admin
            .get_message(Request::new(GetMessageRequest {
                id: Some(MessageId {
                    topic: topic.to_owned(),
                    entry_id,
                }),
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// Up to `limit` dead letters matching `query` after `after`, and how
    /// many match in all.
    pub(crate) async fn dead_letters(
        &self,
        topic: &str,
        sub: &str,
        query: &DeadLetterQuery,
        limit: u32,
        after: Option<u64>,
    ) -> ApiResult<ListDeadLettersResponse> {
        let r = self
            .admin
            .list_dead_letters(Request::new(ListDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: query.to_filter(),
                limit,
                after_entry_id: after,
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// The dead letters matching `query`, counted by `by` (largest group
    /// first; by hour, oldest first), and whether there were more than
    /// could be read. The admin API has no group-by yet (branch `dlq` adds
    /// one), so this counts a listing of at most 10 000; when it has, this
    /// method becomes that call.
    pub(crate) async fn group_dead_letters(
        &self,
        topic: &str,
        sub: &str,
        query: &DeadLetterQuery,
        by: GroupBy,
    ) -> ApiResult<(Vec<Group>, bool)> {
        let listed = self
            .dead_letters(topic, sub, query, GROUP_LIMIT, None)
            .await?;
        let mut groups: Vec<Group> = Vec::new();
        for d in &listed.dead_letters {
            let (key, hour_ms) = match by {
                GroupBy::Reason => (d.reason.clone(), None),
                GroupBy::Consumer => (
                    d.attempts
                        .last()
                        .map(|a| a.consumer.clone())
                        .unwrap_or_default(),
                    None,
                ),
                GroupBy::Hour => {
                    let h = d.dead_lettered_at_ms / 3_600_000 * 3_600_000;
                    (h.to_string(), Some(h))
                }
            };
            match groups.iter_mut().find(|g| g.key == key) {
                Some(g) => g.count += 1,
                None => groups.push(Group {
                    key,
                    hour_ms,
                    count: 1,
                }),
            }
        }
        match by {
            GroupBy::Hour => groups.sort_by_key(|g| g.hour_ms),
            _ => groups.sort_by(|a, b| b.count.cmp(&a.count).then(a.key.cmp(&b.key))),
        }
        Ok((groups, listed.total > listed.dead_letters.len() as u64))
    }

    /// Replays exactly the dead letters `ids` (the admin API's default
    /// replay: each moves into the subscription's own retry tier, due now,
    /// in one transaction). An empty `ids` is refused: the admin API reads an empty id
    /// list as "every dead letter".
    pub(crate) async fn replay(
        &self,
        topic: &str,
        sub: &str,
        ids: &[u64],
    ) -> ApiResult<ReplayDeadLettersResponse> {
        let filter = explicit_ids(ids)?;
        let r = self
            .admin
            .replay_dead_letters(Request::new(ReplayDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: Some(filter),
                // Into this subscription's own retry tier, due now, in one
                // transaction: no other subscription sees it.
                mode: ricochet_proto::ReplayMode::RetryTier as i32,
                ..Default::default()
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// Discards exactly the dead letters `ids`; how many went. An empty
    /// `ids` is refused, as for [`replay`](Self::replay).
    pub(crate) async fn purge(&self, topic: &str, sub: &str, ids: &[u64]) -> ApiResult<u64> {
        let filter = explicit_ids(ids)?;
        let r = self
            .admin
            .purge_dead_letters(Request::new(PurgeDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: Some(filter),
                dry_run: false,
            }))
            .await?;
        Ok(r.into_inner().purged)
    }
}

fn sub_request(topic: &str, sub: &str) -> SubscriptionRequest {
    SubscriptionRequest {
        topic: topic.to_owned(),
        subscription: sub.to_owned(),
    }
}

fn explicit_ids(ids: &[u64]) -> ApiResult<DeadLetterFilter> {
    if ids.is_empty() {
        return Err(Status::invalid_argument(
            "no dead letters named: the console acts on explicit ids only",
        ));
    }
    Ok(DeadLetterFilter {
        entry_ids: ids.to_vec(),
        ..Default::default()
    })
}
