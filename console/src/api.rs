//! The console's one door into the broker: every read and every action the
//! console takes is a call of the admin gRPC API through the [`Backend`]
//! the console was given (in the broker, its own authentication layer and
//! guarded services, called in process), with the signed-in user's token as
//! `authorization: Bearer …` metadata. So the console can show and do
//! nothing its user could not do with `ricochet` or a gRPC client, and
//! answers with the same validation, permission checks, audit lines and
//! errors (a [`tonic::Status`], mapped to an HTTP status by
//! [`super::ConsoleError`]).
//!
//! Pages and actions only see these methods: listings, the broker's own
//! group-by, dry runs that resolve a filter to the exact ids a change would
//! touch, replay (retry tier or topic, now or later, with an edit, at once
//! or as a paced job), purge, and replay jobs.

use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::auth_client::AuthClient;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Status};

/// An error a service handed to the console may fail with (its transport,
/// not a gRPC status).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A [`Backend`]'s failure. A type of its own rather than [`BoxError`]: the
/// generated clients need their service's error to convert into a boxed
/// error of every lifetime, which a concrete error type does.
#[derive(Debug)]
pub struct BackendError(BoxError);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// The service the console calls: any service answering the `Admin` and
/// `Auth` gRPC services, boxed.
pub type Backend = tower::util::BoxCloneSyncService<
    axum::http::Request<tonic::body::Body>,
    axum::http::Response<tonic::body::Body>,
    BackendError,
>;

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
    /// Why it died as the consumer saw it (`DeadLetter.cause`).
    Reason,
    /// The policy's verdict.
    Verdict,
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
            "verdict" => Some(Some(Self::Verdict)),
            "consumer" => Some(Some(Self::Consumer)),
            "hour" => Some(Some(Self::Hour)),
            _ => None,
        }
    }

    fn wire(self) -> DeadLetterGroupBy {
        match self {
            Self::Reason => DeadLetterGroupBy::Reason,
            Self::Verdict => DeadLetterGroupBy::Verdict,
            Self::Consumer => DeadLetterGroupBy::Consumer,
            Self::Hour => DeadLetterGroupBy::Hour,
        }
    }
}

/// How a replay is carried out, beyond which dead letters it takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReplayOptions {
    /// Published again on the topic (every subscription) instead of into
    /// the subscription's own retry tier.
    pub to_topic: bool,
    /// Retry tier only: delivered at this time (ms since epoch; 0: now).
    pub deliver_at_ms: u64,
    /// Fix and resend: the changes applied to each replayed dead letter.
    pub edit: Option<ReplayEdit>,
    /// Paced at this many per second as a background job (0: at once,
    /// answered when done).
    pub rate_per_second: u32,
    /// Keep the delivery count of an edited dead letter (the admin API
    /// resets it by default: an edit is a new attempt).
    pub keep_count: bool,
}

/// The admin calls the console makes, as one caller.
#[derive(Clone)]
pub(crate) struct ConsoleApi {
    admin: AdminClient<Backend>,
    auth: AuthClient<Backend>,
    /// The caller's token (none: an anonymous call, which a broker with
    /// `[auth]` refuses).
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for ConsoleApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleApi")
            .field("signed_in", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl ConsoleApi {
    pub(crate) fn new<S>(service: S) -> Self
    where
        S: tower::Service<
                axum::http::Request<tonic::body::Body>,
                Response = axum::http::Response<tonic::body::Body>,
            > + Clone
            + Send
            + Sync
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        use tower::ServiceExt as _;
        let backend = Backend::new(service.map_err(|e| BackendError(e.into())));
        let limit = ricochet_proto::MAX_GRPC_MESSAGE_BYTES;
        Self {
            admin: AdminClient::new(backend.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            auth: AuthClient::new(backend)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
            token: None,
        }
    }

    /// The same API, calling as the holder of `token`.
    pub(crate) fn signed(&self, token: Option<String>) -> Self {
        Self {
            token: token.map(Arc::from),
            ..self.clone()
        }
    }

    /// `message` as a call of this caller: its token as bearer metadata.
    fn req<T>(&self, message: T) -> Request<T> {
        let mut r = Request::new(message);
        if let Some(t) = &self.token {
            // A token that is no header value (the sign-in refuses those)
            // is sent as none: the broker answers UNAUTHENTICATED.
            if let Ok(v) = format!("Bearer {t}").parse() {
                r.metadata_mut().insert("authorization", v);
            }
        }
        r
    }

    /// Who the broker takes this caller for (`Auth/WhoAmI`).
    pub(crate) async fn who_am_i(&self) -> ApiResult<WhoAmIResponse> {
        let r = self
            .auth
            .clone()
            .who_am_i(self.req(WhoAmIRequest {}))
            .await?;
        Ok(r.into_inner())
    }

    /// Every topic, tier topics and partitions included, sorted, and the
    /// partitioned topics' base names with their partition counts.
    pub(crate) async fn topics(&self) -> ApiResult<ListTopicsResponse> {
        let r = self
            .admin
            .clone()
            .list_topics(self.req(ListTopicsRequest::default()))
            .await?;
        Ok(r.into_inner())
    }

    /// How many partitions `topic` has when it is a partitioned topic's
    /// base name (`None`: an ordinary topic, or a partition).
    pub(crate) async fn partitions(&self, topic: &str) -> ApiResult<Option<u32>> {
        Ok(self
            .topics()
            .await?
            .partitioned
            .into_iter()
            .find(|p| p.topic == topic)
            .map(|p| p.partitions))
    }

    /// A topic's counters with every subscription's stats.
    pub(crate) async fn topic_stats(&self, topic: &str) -> ApiResult<TopicStatsResponse> {
        let r = self
            .admin
            .clone()
            .topic_stats(self.req(TopicRequest {
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
            .clone()
            .subscription_stats(self.req(sub_request(topic, sub)))
            .await?;
        Ok(r.into_inner())
    }

    /// The dead-letter policy in force and where it came from.
    pub(crate) async fn policy(&self, topic: &str, sub: &str) -> ApiResult<PolicyResponse> {
        let r = self
            .admin
            .clone()
            .get_policy(self.req(sub_request(topic, sub)))
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
            .clone()
            .get_message(self.req(GetMessageRequest {
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
            .clone()
            .list_dead_letters(self.req(ListDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: query.to_filter(),
                limit,
                after_entry_id: after,
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// The admin API's group-by of the dead letters matching `query`.
    pub(crate) async fn group_dead_letters(
        &self,
        topic: &str,
        sub: &str,
        query: &DeadLetterQuery,
        by: GroupBy,
    ) -> ApiResult<GroupDeadLettersResponse> {
        let r = self
            .admin
            .clone()
            .group_dead_letters(self.req(GroupDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: query.to_filter(),
                group_by: by.wire() as i32,
                ids_per_group: 0,
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// The ids of the dead letters a replay of `query` would take, as the
    /// broker resolves them (a dry run: nothing changes).
    pub(crate) async fn replay_dry_run(
        &self,
        topic: &str,
        sub: &str,
        query: &DeadLetterQuery,
    ) -> ApiResult<Vec<u64>> {
        let r = self
            .admin
            .clone()
            .replay_dead_letters(self.req(ReplayDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: query.to_filter(),
                dry_run: true,
                ..Default::default()
            }))
            .await?;
        Ok(r.into_inner().dead_letter_ids)
    }

    /// The ids of the dead letters a purge of `query` would remove (a dry
    /// run: nothing changes).
    pub(crate) async fn purge_dry_run(
        &self,
        topic: &str,
        sub: &str,
        query: &DeadLetterQuery,
    ) -> ApiResult<Vec<u64>> {
        let r = self
            .admin
            .clone()
            .purge_dead_letters(self.req(PurgeDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: query.to_filter(),
                dry_run: true,
            }))
            .await?;
        Ok(r.into_inner().dead_letter_ids)
    }

    /// Replays exactly the dead letters `ids` as `options` say (by default
    /// each moves into the subscription's own retry tier, due now, in one
    /// transaction). An empty `ids` is refused: the admin API reads an
    /// empty id list as "every dead letter".
    pub(crate) async fn replay(
        &self,
        topic: &str,
        sub: &str,
        ids: &[u64],
        options: &ReplayOptions,
    ) -> ApiResult<ReplayDeadLettersResponse> {
        let filter = explicit_ids(ids)?;
        let mode = if options.to_topic {
            ReplayMode::Topic
        } else {
            ReplayMode::RetryTier
        };
        let r = self
            .admin
            .clone()
            .replay_dead_letters(self.req(ReplayDeadLettersRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                filter: Some(filter),
                mode: mode as i32,
                deliver_at_ms: options.deliver_at_ms,
                edit: options.edit.clone(),
                rate_per_second: options.rate_per_second,
                detach: options.rate_per_second > 0,
                reset_delivery_count: options.keep_count.then_some(false),
                ..Default::default()
            }))
            .await?;
        Ok(r.into_inner())
    }

    /// The replay jobs of `topic`/`sub` still running.
    pub(crate) async fn replay_jobs(&self, topic: &str, sub: &str) -> ApiResult<Vec<ReplayJob>> {
        let r = self
            .admin
            .clone()
            .list_replay_jobs(self.req(ListReplayJobsRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                local_only: false,
            }))
            .await?;
        Ok(r.into_inner().jobs)
    }

    /// Cancels replay job `id` of `topic` (what it replayed stays
    /// replayed); a job of another topic is not found.
    pub(crate) async fn cancel_replay_job(&self, topic: &str, id: u64) -> ApiResult<()> {
        self.admin
            .clone()
            .cancel_replay_job(self.req(CancelReplayJobRequest {
                id,
                topic: topic.to_owned(),
            }))
            .await?;
        Ok(())
    }

    /// Forces the subscription's outage breaker (or hands it back).
    pub(crate) async fn set_breaker(
        &self,
        topic: &str,
        sub: &str,
        mode: BreakerMode,
    ) -> ApiResult<BreakerStatus> {
        let r = self
            .admin
            .clone()
            .set_breaker(self.req(SetBreakerRequest {
                topic: topic.to_owned(),
                subscription: sub.to_owned(),
                mode: mode as i32,
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
            .clone()
            .purge_dead_letters(self.req(PurgeDeadLettersRequest {
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
