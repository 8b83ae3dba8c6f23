//! [`AuthorizedAdmin`]: the admin service behind permission checks. Each
//! RPC names the permission it needs (see [`required`]); a caller without
//! it gets PERMISSION_DENIED naming its role and the permission, and the
//! inner service never sees the call. `ListTopics` shows only the topics
//! the caller holds some permission on.

use super::{AUDIT, Auth, Permission, Principal};
use crate::cluster::Cluster;
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::service::{AdminService, CallerRole};
use ricochet_proto::admin_server::Admin;
use ricochet_proto::*;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// What an RPC asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Only to be authenticated (what it returns is filtered).
    Authenticated,
    /// Some permission on the topic or namespace (to see it and its stats).
    Visible,
    /// This permission on the topic or namespace.
    Permission(Permission),
    /// A superuser (cluster operations).
    Superuser,
}

/// The requirement of each RPC of the Admin and Auth services, by method
/// name (`Service/Method`); the data plane's are `Broker/Produce`
/// (produce) and `Broker/Consume` (consume, or dead-letters for a
/// dead-letter reader). `None` for an RPC this table does not know, which
/// a test turns into a failure.
pub fn required(method: &str) -> Option<Requirement> {
    use Permission::*;
    use Requirement as R;
    Some(match method {
        "Admin/ListTopics" => R::Visible,
        "Admin/CreateTopic" | "Admin/DeleteTopic" | "Admin/DeleteSubscription" => {
            R::Permission(Admin)
        }
        "Admin/TopicStats"
        | "Admin/ListSubscriptions"
        | "Admin/SubscriptionStats"
        | "Admin/GetPolicy" => R::Visible,
        "Admin/SetPolicy" | "Admin/SetBreaker" => R::Permission(Policy),
        "Admin/GetMessage" => R::Permission(Consume),
        "Admin/ListDeadLetters"
        | "Admin/ReplayDeadLetters"
        | "Admin/PurgeDeadLetters"
        | "Admin/GroupDeadLetters"
        | "Admin/ListReplayJobs"
        | "Admin/CancelReplayJob" => R::Permission(DeadLetters),
        "Partitions/CreatePartitionedTopic" | "Partitions/UpdatePartitions" => R::Permission(Admin),
        "Partitions/GetPartitions" => R::Visible,
        "Broker/Produce" => R::Permission(Produce),
        "Broker/Consume" => R::Permission(Consume),
        "Auth/GrantPermission" | "Auth/RevokePermission" | "Auth/ListGrants" => {
            R::Permission(Admin)
        }
        "Auth/WhoAmI" => R::Authenticated,
        "Retention/SetRetention" => R::Permission(Admin),
        "Retention/GetRetention" => R::Visible,
        "Tiered/Offload" | "Tiered/SetOffloadPolicy" => R::Permission(Admin),
        "Tiered/OffloadStatus" | "Tiered/GetOffloadPolicy" => R::Visible,
        // Where a topic lives reveals that it exists; the broker list is
        // for anyone signed in, its topic names filtered to those visible.
        "Cluster/Lookup" => R::Visible,
        "Cluster/ListBrokers" => R::Authenticated,
        // Moving topics between brokers is the cluster operator's.
        "Cluster/Drain" | "Cluster/MoveTopic" | "Cluster/ImportTopic" => R::Superuser,
        _ => return None,
    })
}

/// The caller of `r`: `None` with auth off; UNAUTHENTICATED if auth is on
/// and the call carries no principal (the layer refuses those before).
pub(crate) fn principal<T>(auth: &Auth, r: &Request<T>) -> Result<Option<Principal>, Status> {
    if !auth.enabled() {
        return Ok(None);
    }
    r.extensions()
        .get::<Principal>()
        .cloned()
        .map(Some)
        .ok_or_else(|| Status::unauthenticated("no credentials"))
}

/// The role to log for `p`.
pub(crate) fn who(p: Option<&Principal>) -> &str {
    p.map_or("-", |p| p.role.as_str())
}

/// The admin service, checked (and, in cluster mode, routed: a call about
/// a topic another broker owns is refused after the permission check, see
/// [`route`]).
#[derive(Debug, Clone)]
pub struct AuthorizedAdmin {
    inner: AdminService,
    auth: Arc<Auth>,
    cluster: Option<Arc<Cluster>>,
}

impl AuthorizedAdmin {
    /// Checks calls to `inner` against `auth`.
    pub fn new(inner: AdminService, auth: Arc<Auth>) -> Self {
        Self {
            inner,
            auth,
            cluster: None,
        }
    }

    /// In cluster mode, also refuses calls about topics this broker does
    /// not own.
    pub fn routed(mut self, cluster: Option<Arc<Cluster>>) -> Self {
        self.cluster = cluster;
        self
    }

    async fn route(&self, topic: &str, place: bool) -> Result<(), Status> {
        route(self.cluster.as_ref(), topic, place).await
    }

    /// The caller, after checking `method`'s requirement on `topic`.
    fn check<T>(
        &self,
        r: &Request<T>,
        method: &str,
        topic: &str,
    ) -> Result<Option<Principal>, Status> {
        check_call(&self.auth, r, method, topic)
    }
}

/// Cluster mode: `Ok` when this broker serves `topic` (owns it, or it is
/// placed nowhere and `place` is false: the call is answered here), else
/// FAILED_PRECONDITION naming the owner in the `ricochet-owner` and
/// `ricochet-owner-url` trailers (or UNAVAILABLE when this broker lost its
/// lease). Standalone (`None`): always `Ok`. Checked after the permission,
/// so a caller without it learns nothing about where a topic lives.
pub(crate) async fn route(
    cluster: Option<&Arc<Cluster>>,
    topic: &str,
    place: bool,
) -> Result<(), Status> {
    if let Some(c) = cluster {
        c.route(&TopicName::parse(topic)?, place).await?;
    }
    Ok(())
}

/// The caller of `r`, after checking `method`'s requirement (see
/// [`required`]) on `topic`.
pub(crate) fn check_call<T>(
    auth: &Auth,
    r: &Request<T>,
    method: &str,
    topic: &str,
) -> Result<Option<Principal>, Status> {
    let p = principal(auth, r)?;
    if auth.is_superuser(p.as_ref()) {
        return Ok(p);
    }
    let topic = TopicName::parse(topic)?;
    match required(method) {
        Some(Requirement::Permission(perm)) => auth.check(p.as_ref(), &topic, perm)?,
        Some(Requirement::Visible) => auth.check_visible(p.as_ref(), &topic)?,
        Some(Requirement::Authenticated) => {}
        Some(Requirement::Superuser) => return Err(superusers_only(method, p.as_ref()).into()),
        None => {
            return Err(BrokerError::PermissionDenied(format!(
                "{method} has no permission mapping"
            ))
            .into());
        }
    }
    Ok(p)
}

/// The refusal of a superuser-only `method` to `p` (not a superuser).
pub(crate) fn superusers_only(method: &str, p: Option<&Principal>) -> BrokerError {
    let who = p.map_or("anonymous", |p| p.role.as_str());
    BrokerError::PermissionDenied(format!(
        "{method} is for superusers; role \"{who}\" is not one"
    ))
}

#[tonic::async_trait]
impl Admin for AuthorizedAdmin {
    async fn list_topics(
        &self,
        r: Request<ListTopicsRequest>,
    ) -> Result<Response<ListTopicsResponse>, Status> {
        let p = principal(&self.auth, &r)?;
        if self.auth.is_superuser(p.as_ref()) {
            return self.inner.list_topics(r).await;
        }
        let ns = r.get_ref().namespace.clone();
        if !ns.is_empty() {
            let ns = crate::name::parse_namespace(&ns)?;
            self.auth.check_namespace_visible(p.as_ref(), ns)?;
        }
        let mut resp = self.inner.list_topics(r).await?;
        let visible = |t: &str| {
            TopicName::parse_stored(t)
                .is_ok_and(|t| self.auth.check_visible(p.as_ref(), &t).is_ok())
        };
        let listed = resp.get_mut();
        listed.topics.retain(|t| visible(t));
        listed.partitioned.retain(|t| visible(&t.topic));
        Ok(resp)
    }

    async fn create_topic(&self, r: Request<TopicRequest>) -> Result<Response<TopicInfo>, Status> {
        let topic = r.get_ref().topic.clone();
        let p = self.check(&r, "Admin/CreateTopic", &topic)?;
        self.route(&topic, true).await?;
        let resp = self.inner.create_topic(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "create-topic", %topic);
        Ok(resp)
    }

    async fn delete_topic(
        &self,
        r: Request<DeleteTopicRequest>,
    ) -> Result<Response<DeleteTopicResponse>, Status> {
        let (topic, force) = (r.get_ref().topic.clone(), r.get_ref().force);
        let p = self.check(&r, "Admin/DeleteTopic", &topic)?;
        self.route(&topic, false).await?;
        let resp = self.inner.delete_topic(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "delete-topic", %topic, force);
        Ok(resp)
    }

    async fn topic_stats(
        &self,
        r: Request<TopicRequest>,
    ) -> Result<Response<TopicStatsResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Admin/TopicStats", &topic)?;
        self.route(&topic, false).await?;
        self.inner.topic_stats(r).await
    }

    async fn list_subscriptions(
        &self,
        r: Request<TopicRequest>,
    ) -> Result<Response<ListSubscriptionsResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Admin/ListSubscriptions", &topic)?;
        self.route(&topic, false).await?;
        self.inner.list_subscriptions(r).await
    }

    async fn subscription_stats(
        &self,
        r: Request<SubscriptionRequest>,
    ) -> Result<Response<SubscriptionStatsResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Admin/SubscriptionStats", &topic)?;
        self.route(&topic, false).await?;
        self.inner.subscription_stats(r).await
    }

    async fn delete_subscription(
        &self,
        r: Request<DeleteSubscriptionRequest>,
    ) -> Result<Response<DeleteSubscriptionResponse>, Status> {
        let (topic, sub, force) = (
            r.get_ref().topic.clone(),
            r.get_ref().subscription.clone(),
            r.get_ref().force,
        );
        let p = self.check(&r, "Admin/DeleteSubscription", &topic)?;
        self.route(&topic, false).await?;
        let resp = self.inner.delete_subscription(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "delete-subscription", %topic, subscription = %sub, force);
        Ok(resp)
    }

    async fn get_policy(
        &self,
        r: Request<SubscriptionRequest>,
    ) -> Result<Response<PolicyResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Admin/GetPolicy", &topic)?;
        self.route(&topic, false).await?;
        self.inner.get_policy(r).await
    }

    async fn set_policy(
        &self,
        r: Request<SetPolicyRequest>,
    ) -> Result<Response<PolicyResponse>, Status> {
        let (topic, sub) = (r.get_ref().topic.clone(), r.get_ref().subscription.clone());
        let p = self.check(&r, "Admin/SetPolicy", &topic)?;
        self.route(&topic, false).await?;
        // Tier topics the policy names get written on this role's behalf.
        if let Some(policy) = &r.get_ref().policy {
            for tier in [&policy.retry_topic, &policy.dead_letter_topic] {
                if !tier.is_empty() {
                    let tier = TopicName::parse(tier)?;
                    self.auth.check(p.as_ref(), &tier, Permission::Produce)?;
                }
            }
        }
        let resp = self.inner.set_policy(r).await?;
        tracing::info!(
            target: AUDIT,
            role = who(p.as_ref()),
            action = "set-policy",
            %topic,
            subscription = %sub,
            policy = ?resp.get_ref().policy,
            "dead-letter policy set"
        );
        Ok(resp)
    }

    async fn get_message(
        &self,
        r: Request<GetMessageRequest>,
    ) -> Result<Response<GetMessageResponse>, Status> {
        let topic = r.get_ref().id.as_ref().map(|id| id.topic.clone());
        match topic {
            Some(topic) => {
                self.check(&r, "Admin/GetMessage", &topic)?;
                self.route(&topic, false).await?;
            }
            // The inner service refuses a request without an id; only a
            // superuser gets that far.
            None => {
                let p = principal(&self.auth, &r)?;
                if !self.auth.is_superuser(p.as_ref()) {
                    return Err(Status::invalid_argument("id is required"));
                }
            }
        }
        self.inner.get_message(r).await
    }

    async fn list_dead_letters(
        &self,
        r: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Admin/ListDeadLetters", &topic)?;
        self.route(&topic, false).await?;
        self.inner.list_dead_letters(r).await
    }

    async fn replay_dead_letters(
        &self,
        r: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        let (topic, sub) = (r.get_ref().topic.clone(), r.get_ref().subscription.clone());
        let p = self.check(&r, "Admin/ReplayDeadLetters", &topic)?;
        self.route(&topic, false).await?;
        let filter = r.get_ref().filter.clone();
        let mut r = r;
        if let Some(p) = &p {
            // Named in the dead letter's edit history.
            r.extensions_mut().insert(CallerRole(p.role.clone()));
        }
        let resp = self.inner.replay_dead_letters(r).await?;
        tracing::info!(
            target: AUDIT,
            role = who(p.as_ref()),
            action = "replay-dead-letters",
            %topic,
            subscription = %sub,
            filter = ?filter,
            replayed = resp.get_ref().replayed,
            new_ids = ?resp.get_ref().new_ids.iter().map(|i| i.entry_id).collect::<Vec<_>>(),
            "dead letters replayed"
        );
        Ok(resp)
    }

    async fn purge_dead_letters(
        &self,
        r: Request<PurgeDeadLettersRequest>,
    ) -> Result<Response<PurgeDeadLettersResponse>, Status> {
        let (topic, sub) = (r.get_ref().topic.clone(), r.get_ref().subscription.clone());
        let p = self.check(&r, "Admin/PurgeDeadLetters", &topic)?;
        self.route(&topic, false).await?;
        let filter = r.get_ref().filter.clone();
        let resp = self.inner.purge_dead_letters(r).await?;
        tracing::info!(
            target: AUDIT,
            role = who(p.as_ref()),
            action = "purge-dead-letters",
            %topic,
            subscription = %sub,
            filter = ?filter,
            purged = resp.get_ref().purged,
            "dead letters purged"
        );
        Ok(resp)
    }
    async fn group_dead_letters(
        &self,
        r: Request<GroupDeadLettersRequest>,
    ) -> Result<Response<GroupDeadLettersResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        self.check(&r, "Admin/GroupDeadLetters", &topic)?;
        self.route(&topic, false).await?;
        self.inner.group_dead_letters(r).await
    }

    async fn list_replay_jobs(
        &self,
        r: Request<ListReplayJobsRequest>,
    ) -> Result<Response<ListReplayJobsResponse>, Status> {
        let topic = r.get_ref().topic.clone();
        if topic.is_empty() {
            // Every job: only those on topics the caller may replay on.
            let p = principal(&self.auth, &r)?;
            let mut resp = self.inner.list_replay_jobs(r).await?;
            if !self.auth.is_superuser(p.as_ref()) {
                resp.get_mut().jobs.retain(|j| {
                    TopicName::parse_stored(&j.topic).is_ok_and(|t| {
                        self.auth
                            .check(p.as_ref(), &t, Permission::DeadLetters)
                            .is_ok()
                    })
                });
            }
            return Ok(resp);
        }
        self.check(&r, "Admin/ListReplayJobs", &topic)?;
        self.route(&topic, false).await?;
        self.inner.list_replay_jobs(r).await
    }

    async fn cancel_replay_job(
        &self,
        r: Request<CancelReplayJobRequest>,
    ) -> Result<Response<CancelReplayJobResponse>, Status> {
        let (id, topic) = (r.get_ref().id, r.get_ref().topic.clone());
        let p = principal(&self.auth, &r)?;
        if !(topic.is_empty() && self.auth.is_superuser(p.as_ref())) {
            // Checked on the topic the caller names; the service then finds
            // the job only there.
            self.check(&r, "Admin/CancelReplayJob", &topic)?;
            self.route(&topic, false).await?;
        }
        let resp = self.inner.cancel_replay_job(r).await?;
        tracing::info!(target: AUDIT, role = who(p.as_ref()), action = "cancel-replay-job", job = id, %topic);
        Ok(resp)
    }

    async fn set_breaker(
        &self,
        r: Request<SetBreakerRequest>,
    ) -> Result<Response<BreakerStatus>, Status> {
        let (topic, sub, mode) = (
            r.get_ref().topic.clone(),
            r.get_ref().subscription.clone(),
            r.get_ref().mode,
        );
        let p = self.check(&r, "Admin/SetBreaker", &topic)?;
        self.route(&topic, false).await?;
        let resp = self.inner.set_breaker(r).await?;
        tracing::info!(
            target: AUDIT,
            role = who(p.as_ref()),
            action = "set-breaker",
            %topic,
            subscription = %sub,
            mode,
            state = %resp.get_ref().state,
            "breaker forced"
        );
        Ok(resp)
    }
}
