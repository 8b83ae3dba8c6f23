//! [`call`]: one call of every RPC of every service, by method name, for
//! the permission table test (a new RPC needs a case here).

use super::*;

/// Calls `method` (`Service/Method`) on `TOPIC` / namespace `NS`.
pub(crate) async fn call(url: &str, method: &str, token: Option<&str>) -> Result<(), Status> {
    let ch = channel(url).await;
    let mut admin = AdminClient::new(ch.clone());
    let mut auth = AuthClient::new(ch.clone());
    let mut partitions = PartitionsClient::new(ch.clone());
    let mut retention = RetentionClient::new(ch.clone());
    let mut tiered = TieredClient::new(ch.clone());
    let mut cluster = ClusterClient::new(ch);
    let t = || TOPIC.to_owned();
    let s = || "s".to_owned();
    let sub = || SubscriptionRequest {
        topic: t(),
        subscription: s(),
    };
    match method {
        "Admin/ListTopics" => admin
            .list_topics(req(
                ListTopicsRequest {
                    namespace: NS.into(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/CreateTopic" => admin
            .create_topic(req(
                CreateTopicRequest {
                    topic: t(),
                    replicas: 0,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/DeleteTopic" => admin
            .delete_topic(req(
                DeleteTopicRequest {
                    topic: t(),
                    force: false,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/TopicStats" => admin
            .topic_stats(req(TopicRequest { topic: t() }, token))
            .await
            .map(drop),
        "Admin/ListSubscriptions" => admin
            .list_subscriptions(req(TopicRequest { topic: t() }, token))
            .await
            .map(drop),
        "Admin/SubscriptionStats" => admin.subscription_stats(req(sub(), token)).await.map(drop),
        "Admin/DeleteSubscription" => admin
            .delete_subscription(req(
                DeleteSubscriptionRequest {
                    topic: t(),
                    subscription: s(),
                    force: false,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/GetPolicy" => admin.get_policy(req(sub(), token)).await.map(drop),
        "Admin/SetPolicy" => admin
            .set_policy(req(
                SetPolicyRequest {
                    topic: t(),
                    subscription: s(),
                    policy: None,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/GetMessage" => admin
            .get_message(req(
                GetMessageRequest {
                    id: Some(MessageId {
                        topic: t(),
                        entry_id: 0,
                    }),
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/ListDeadLetters" => admin
            .list_dead_letters(req(
                ListDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/ReplayDeadLetters" => admin
            .replay_dead_letters(req(
                ReplayDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/PurgeDeadLetters" => admin
            .purge_dead_letters(req(
                PurgeDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    filter: None,
                    dry_run: false,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/GroupDeadLetters" => admin
            .group_dead_letters(req(
                GroupDeadLettersRequest {
                    topic: t(),
                    subscription: s(),
                    ..Default::default()
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/ListReplayJobs" => admin
            .list_replay_jobs(req(
                ListReplayJobsRequest {
                    topic: t(),
                    subscription: s(),
                    local_only: false,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/SetBreaker" => admin
            .set_breaker(req(
                SetBreakerRequest {
                    topic: t(),
                    subscription: s(),
                    mode: BreakerMode::Auto as i32,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/SetNamespaceReplication" => admin
            .set_namespace_replication(req(
                SetNamespaceReplicationRequest {
                    namespace: NS.into(),
                    replicas: 1,
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/GetNamespaceReplication" => admin
            .get_namespace_replication(req(
                GetNamespaceReplicationRequest {
                    namespace: NS.into(),
                },
                token,
            ))
            .await
            .map(drop),
        "Admin/CancelReplayJob" => admin
            .cancel_replay_job(req(CancelReplayJobRequest { id: 1, topic: t() }, token))
            .await
            .map(drop),
        "Partitions/CreatePartitionedTopic" => partitions
            .create_partitioned_topic(req(
                UpdatePartitionsRequest {
                    topic: format!("{TOPIC}-parted"),
                    partitions: 2,
                    replicas: 0,
                },
                token,
            ))
            .await
            .map(drop),
        "Partitions/GetPartitions" => partitions
            .get_partitions(req(PartitionsRequest { topic: t() }, token))
            .await
            .map(drop),
        "Partitions/UpdatePartitions" => partitions
            .update_partitions(req(
                UpdatePartitionsRequest {
                    topic: t(),
                    partitions: 2,
                    replicas: 0,
                },
                token,
            ))
            .await
            .map(drop),
        "Broker/Produce" => produce(url, TOPIC, token).await,
        "Broker/Consume" => consume(url, TOPIC, false, token).await,
        "Auth/GrantPermission" => auth
            .grant_permission(req(
                GrantRequest {
                    role: "someone".into(),
                    resource: NS.into(),
                    permissions: vec!["produce".into()],
                },
                token,
            ))
            .await
            .map(drop),
        "Auth/RevokePermission" => auth
            .revoke_permission(req(
                RevokeRequest {
                    role: "someone".into(),
                    resource: NS.into(),
                    permissions: vec![],
                },
                token,
            ))
            .await
            .map(drop),
        "Auth/ListGrants" => auth
            .list_grants(req(
                ListGrantsRequest {
                    role: String::new(),
                    namespace: NS.into(),
                },
                token,
            ))
            .await
            .map(drop),
        "Auth/WhoAmI" => auth.who_am_i(req(WhoAmIRequest {}, token)).await.map(drop),
        "Retention/SetRetention" => retention
            .set_retention(req(
                SetRetentionRequest {
                    namespace: NS.into(),
                    topic: String::new(),
                    policy: Some(RetentionPolicy {
                        max_age_ms: Some(3_600_000),
                        ..Default::default()
                    }),
                },
                token,
            ))
            .await
            .map(drop),
        "Retention/GetRetention" => retention
            .get_retention(req(
                GetRetentionRequest {
                    namespace: String::new(),
                    topic: t(),
                },
                token,
            ))
            .await
            .map(drop),
        "Tiered/Offload" => tiered
            .offload(req(TieredOffloadRequest { topic: t() }, token))
            .await
            .map(drop),
        "Tiered/OffloadStatus" => tiered
            .offload_status(req(TieredStatusRequest { topic: t() }, token))
            .await
            .map(drop),
        "Tiered/SetOffloadPolicy" => tiered
            .set_offload_policy(req(
                SetOffloadPolicyRequest {
                    namespace: NS.into(),
                    topic: String::new(),
                    policy: Some(OffloadPolicy {
                        offload_after_ms: Some(3_600_000),
                        ..Default::default()
                    }),
                },
                token,
            ))
            .await
            .map(drop),
        "Tiered/GetOffloadPolicy" => tiered
            .get_offload_policy(req(
                GetOffloadPolicyRequest {
                    namespace: String::new(),
                    topic: t(),
                },
                token,
            ))
            .await
            .map(drop),
        "Cluster/Lookup" => cluster
            .lookup(req(LookupRequest { topic: t() }, token))
            .await
            .map(drop),
        "Cluster/ListBrokers" => cluster
            .list_brokers(req(ListBrokersRequest { with_topics: true }, token))
            .await
            .map(drop),
        "Cluster/Drain" => cluster
            .drain(req(
                DrainRequest {
                    broker_id: "b1".into(),
                },
                token,
            ))
            .await
            .map(drop),
        "Cluster/MoveTopic" => cluster
            .move_topic(req(
                MoveTopicRequest {
                    topic: t(),
                    to_broker: String::new(),
                },
                token,
            ))
            .await
            .map(drop),
        "Cluster/ImportTopic" => cluster
            .import_topic(req(
                futures::stream::iter(Vec::<TopicTransferPart>::new()),
                token,
            ))
            .await
            .map(drop),
        other => panic!(
            "no case for RPC {other}: give it a row in the RPC table (ricochet_broker::gate) and a case here"
        ),
    }
}
