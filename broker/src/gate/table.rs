//! The RPC table: one row per RPC of every service, in proto order. A row
//! reads `Method => handler(Request) -> Response: requirement, scope`,
//! then optional `.route(…)`, `.writes_to(…)` and `.shown(…)` (see
//! [`Rule`]), and `audit …`: the line logged under
//! [`AUDIT`](crate::auth::AUDIT) once the call succeeded, with the
//! caller's role, the request and the answer. The macro turns each
//! service's rows into its trait implementation for [`Guarded`], so the
//! method names (`Service/Method`) are spelled once, here, as identifiers.

use super::{Guarded, Rule};
use crate::auth::{AUDIT, Auth, AuthService, Permission, Principal, Requirement, Scope};
use crate::service::{
    AdminService, ClusterService, PartitionsService, RetentionService, Route, TieredService,
};
use ricochet_proto::*;
use tonic::{Request, Response, Status, Streaming};

use Permission::{Admin, Consume, DeadLetters, Policy, Produce};
use Requirement::{Authenticated, Superuser, Visible};

macro_rules! table {
    (
        $(
            service $service:ident ($server:path) for $svc:ty {
                $(
                    $method:ident => $fn:ident($req:ty) -> $resp:ty:
                        $need:expr, $on:expr
                        $(, .$opt:ident($val:expr))*
                        $(, audit $audit:expr)?;
                )*
            }
        )*
        data plane $dp:ident { $($dpm:ident: $dpneed:expr;)* }
    ) => {
        $(
            #[tonic::async_trait]
            impl $server for Guarded<$svc> {
                $(
                    async fn $fn(&self, r: Request<$req>) -> Result<Response<$resp>, Status> {
                        let rule = Rule::<$req, $resp>::new($need, $on)$(.$opt($val))*;
                        let method = concat!(stringify!($service), "/", stringify!($method));
                        table!(@call self, method, rule, r, $fn $(, $audit)?)
                    }
                )*
            }
        )*

        /// Every row: the method (`Service/Method`) and its requirement.
        pub(super) fn rows() -> Vec<(&'static str, Requirement)> {
            vec![
                $($((
                    concat!(stringify!($service), "/", stringify!($method)),
                    Rule::<$req, $resp>::new($need, $on).need,
                ),)*)*
                $((concat!(stringify!($dp), "/", stringify!($dpm)), $dpneed),)*
            ]
        }
    };
    (@call $s:tt, $m:ident, $rule:ident, $r:ident, $fn:ident) => {
        $s.gate.call($m, &$rule, $r, |r| $s.inner.$fn(r)).await.map(|(_, resp)| resp)
    };
    (@call $s:tt, $m:ident, $rule:ident, $r:ident, $fn:ident, $audit:expr) => {
        $s.gate.call_audited($m, &$rule, $r, |r| $s.inner.$fn(r), $audit).await
    };
}

/// The requirement of `method` (`Service/Method`), or `None` for a name
/// the table does not hold.
pub fn required(method: &str) -> Option<Requirement> {
    rows()
        .into_iter()
        .find(|(m, _)| *m == method)
        .map(|(_, need)| need)
}

table! {
    service Admin (admin_server::Admin) for AdminService {
        ListTopics => list_topics(ListTopicsRequest) -> ListTopicsResponse:
            Visible, |r| Scope::NamespaceOrAll(&r.namespace), .shown(visible_topics);
        CreateTopic => create_topic(CreateTopicRequest) -> TopicInfo:
            Requirement::Permission(Admin), |r| Scope::Topic(&r.topic), .route(Route::Place),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "create-topic", topic = %r.topic, replicas = r.replicas)
            };
        DeleteTopic => delete_topic(DeleteTopicRequest) -> DeleteTopicResponse:
            Requirement::Permission(Admin), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "delete-topic", topic = %r.topic, force = r.force)
            };
        TopicStats => topic_stats(TopicRequest) -> TopicStatsResponse:
            Visible, |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut);
        ListSubscriptions => list_subscriptions(TopicRequest) -> ListSubscriptionsResponse:
            Visible, |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut);
        SubscriptionStats => subscription_stats(SubscriptionRequest) -> SubscriptionStatsResponse:
            Visible, |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut);
        DeleteSubscription => delete_subscription(DeleteSubscriptionRequest) -> DeleteSubscriptionResponse:
            Requirement::Permission(Admin), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "delete-subscription", topic = %r.topic, subscription = %r.subscription, force = r.force)
            };
        GetPolicy => get_policy(SubscriptionRequest) -> PolicyResponse:
            Visible, |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut);
        SetPolicy => set_policy(SetPolicyRequest) -> PolicyResponse:
            Requirement::Permission(Policy), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            .writes_to(policy_tiers),
            audit |role, r, resp| {
                tracing::info!(
                    target: AUDIT,
                    role,
                    action = "set-policy",
                    topic = %r.topic,
                    subscription = %r.subscription,
                    policy = ?resp.policy,
                    "dead-letter policy set"
                )
            };
        GetMessage => get_message(GetMessageRequest) -> GetMessageResponse:
            Requirement::Permission(Consume),
            |r| r.id.as_ref().map_or(Scope::Missing("id is required"), |id| Scope::Topic(&id.topic)),
            .route(Route::Owner), .shown(event_excerpt);
        ListDeadLetters => list_dead_letters(ListDeadLettersRequest) -> ListDeadLettersResponse:
            Requirement::Permission(DeadLetters), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut);
        ReplayDeadLetters => replay_dead_letters(ReplayDeadLettersRequest) -> ReplayDeadLettersResponse:
            Requirement::Permission(DeadLetters), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            audit |role, r, resp| {
                tracing::info!(
                    target: AUDIT,
                    role,
                    action = "replay-dead-letters",
                    topic = %r.topic,
                    subscription = %r.subscription,
                    filter = ?r.filter,
                    replayed = resp.replayed,
                    new_ids = ?resp.new_ids.iter().map(|i| i.entry_id).collect::<Vec<_>>(),
                    "dead letters replayed"
                )
            };
        PurgeDeadLetters => purge_dead_letters(PurgeDeadLettersRequest) -> PurgeDeadLettersResponse:
            Requirement::Permission(DeadLetters), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            audit |role, r, resp| {
                tracing::info!(
                    target: AUDIT,
                    role,
                    action = "purge-dead-letters",
                    topic = %r.topic,
                    subscription = %r.subscription,
                    filter = ?r.filter,
                    purged = resp.purged,
                    "dead letters purged"
                )
            };
        GroupDeadLetters => group_dead_letters(GroupDeadLettersRequest) -> GroupDeadLettersResponse:
            Requirement::Permission(DeadLetters), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut);
        ListReplayJobs => list_replay_jobs(ListReplayJobsRequest) -> ListReplayJobsResponse:
            Requirement::Permission(DeadLetters), |r| Scope::TopicOrAll(&r.topic),
            .route(Route::OwnerOrFanOut), .shown(replayable_jobs);
        CancelReplayJob => cancel_replay_job(CancelReplayJobRequest) -> CancelReplayJobResponse:
            Requirement::Permission(DeadLetters), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "cancel-replay-job", job = r.id, topic = %r.topic)
            };
        SetBreaker => set_breaker(SetBreakerRequest) -> BreakerStatus:
            Requirement::Permission(Policy), |r| Scope::Topic(&r.topic), .route(Route::OwnerOrFanOut),
            audit |role, r, resp| {
                tracing::info!(
                    target: AUDIT,
                    role,
                    action = "set-breaker",
                    topic = %r.topic,
                    subscription = %r.subscription,
                    mode = r.mode,
                    state = %resp.state,
                    "breaker forced"
                )
            };
        SetNamespaceReplication => set_namespace_replication(SetNamespaceReplicationRequest) -> NamespaceReplication:
            Requirement::Permission(Admin), |r| Scope::Target { namespace: &r.namespace, topic: "" },
            audit |role, r, resp| {
                tracing::info!(target: AUDIT, role, action = "set-namespace-replication", namespace = %r.namespace, replicas = resp.replicas)
            };
        GetNamespaceReplication => get_namespace_replication(GetNamespaceReplicationRequest) -> NamespaceReplication:
            Visible, |r| Scope::Target { namespace: &r.namespace, topic: "" };
    }

    service Partitions (partitions_server::Partitions) for PartitionsService {
        CreatePartitionedTopic => create_partitioned_topic(UpdatePartitionsRequest) -> PartitionedTopicMetadata:
            Requirement::Permission(Admin), |r| Scope::Topic(&r.topic),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "create-partitioned-topic", topic = %r.topic, partitions = r.partitions)
            };
        GetPartitions => get_partitions(PartitionsRequest) -> PartitionedTopicMetadata:
            Visible, |r| Scope::Topic(&r.topic);
        UpdatePartitions => update_partitions(UpdatePartitionsRequest) -> PartitionedTopicMetadata:
            Requirement::Permission(Admin), |r| Scope::Topic(&r.topic),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "update-partitions", topic = %r.topic, partitions = r.partitions)
            };
    }

    service Auth (auth_server::Auth) for AuthService {
        GrantPermission => grant_permission(GrantRequest) -> GrantResponse:
            Requirement::Permission(Admin), |r| Scope::Grant(&r.resource);
        RevokePermission => revoke_permission(RevokeRequest) -> GrantResponse:
            Requirement::Permission(Admin), |r| Scope::Grant(&r.resource);
        // A role may list its own grants: the service checks the rest.
        ListGrants => list_grants(ListGrantsRequest) -> ListGrantsResponse:
            Requirement::Permission(Admin), |_| Scope::Service;
        WhoAmI => who_am_i(WhoAmIRequest) -> WhoAmIResponse:
            Authenticated, |_| Scope::None;
    }

    service Retention (retention_server::Retention) for RetentionService {
        SetRetention => set_retention(SetRetentionRequest) -> RetentionResponse:
            Requirement::Permission(Admin),
            |r| Scope::Target { namespace: &r.namespace, topic: &r.topic },
            .route(Route::Owner),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "set-retention", namespace = %r.namespace, topic = %r.topic, policy = ?r.policy)
            };
        GetRetention => get_retention(GetRetentionRequest) -> RetentionResponse:
            Visible, |r| Scope::Target { namespace: &r.namespace, topic: &r.topic },
            .route(Route::Owner);
    }

    service Tiered (tiered_server::Tiered) for TieredService {
        Offload => offload(TieredOffloadRequest) -> TieredOffloadResponse:
            Requirement::Permission(Admin), |r| Scope::Target { namespace: "", topic: &r.topic },
            .route(Route::Owner),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "offload", topic = %r.topic)
            };
        OffloadStatus => offload_status(TieredStatusRequest) -> TieredStatusResponse:
            Visible, |r| Scope::Target { namespace: "", topic: &r.topic }, .route(Route::Owner);
        SetOffloadPolicy => set_offload_policy(SetOffloadPolicyRequest) -> OffloadPolicyResponse:
            Requirement::Permission(Admin),
            |r| Scope::Target { namespace: &r.namespace, topic: &r.topic },
            .route(Route::Owner),
            audit |role, r, _| {
                tracing::info!(target: AUDIT, role, action = "set-offload-policy", namespace = %r.namespace, topic = %r.topic, policy = ?r.policy)
            };
        GetOffloadPolicy => get_offload_policy(GetOffloadPolicyRequest) -> OffloadPolicyResponse:
            Visible, |r| Scope::Target { namespace: &r.namespace, topic: &r.topic },
            .route(Route::Owner);
    }

    service Cluster (cluster_server::Cluster) for ClusterService {
        // Where a topic lives reveals that it exists.
        Lookup => lookup(LookupRequest) -> LookupResponse:
            Visible, |r| Scope::Topic(&r.topic);
        // For anyone signed in, its topic names filtered to those visible.
        ListBrokers => list_brokers(ListBrokersRequest) -> ListBrokersResponse:
            Authenticated, |_| Scope::None, .shown(visible_broker_topics);
        // Moving topics between brokers is the cluster operator's.
        Drain => drain(DrainRequest) -> DrainResponse:
            Superuser, |_| Scope::None;
        MoveTopic => move_topic(MoveTopicRequest) -> MoveTopicResponse:
            Superuser, |_| Scope::None;
        ImportTopic => import_topic(Streaming<TopicTransferPart>) -> ImportTopicResponse:
            Superuser, |_| Scope::None;
    }

    // The streams check their topic once when they open (a dead-letter
    // reader needs dead-letters, not consume): `service/produce.rs`,
    // `service/consume.rs`.
    data plane Broker {
        Produce: Requirement::Permission(Produce);
        Consume: Requirement::Permission(Consume);
    }
}

/// The tier topics a dead-letter policy names: written on the caller's
/// behalf.
fn policy_tiers(r: &SetPolicyRequest) -> Vec<&str> {
    r.policy.as_ref().map_or_else(Vec::new, |p| {
        [p.retry_topic.as_str(), p.dead_letter_topic.as_str()]
            .into_iter()
            .filter(|t| !t.is_empty())
            .collect()
    })
}

/// `ListTopics`: the topics the caller holds some permission on.
fn visible_topics(auth: &Auth, p: Option<&Principal>, listed: &mut ListTopicsResponse) {
    listed.topics.retain(|t| auth.may_see(p, t));
    listed.partitioned.retain(|t| auth.may_see(p, &t.topic));
}

/// `ListReplayJobs`: the jobs on topics the caller may replay on.
fn replayable_jobs(auth: &Auth, p: Option<&Principal>, listed: &mut ListReplayJobsResponse) {
    listed.jobs.retain(|j| auth.holds(p, &j.topic, DeadLetters));
}

/// `ListBrokers`: each broker's topics the caller may see.
fn visible_broker_topics(auth: &Auth, p: Option<&Principal>, listed: &mut ListBrokersResponse) {
    for b in &mut listed.brokers {
        b.topics.retain(|t| auth.may_see(p, t));
    }
}

/// `GetMessage` of a failure event: its payload excerpt only for a caller
/// that may read the failed message's topic.
fn event_excerpt(auth: &Auth, p: Option<&Principal>, got: &mut GetMessageResponse) {
    if let Some(m) = got.message.as_mut()
        && m.id
            .as_ref()
            .is_some_and(|id| crate::name::is_system_topic(&id.topic))
    {
        crate::service::hide_excerpt(auth, p, m);
    }
}
