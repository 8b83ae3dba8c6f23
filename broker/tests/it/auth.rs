//! Authentication and authorization against a live broker: every RPC of
//! every service (enumerated from the proto descriptors, so a new RPC
//! without a permission mapping and a case here fails) refuses anonymous
//! callers and callers without its permission; tokens that are expired,
//! tampered with or signed with another key are refused; a role confined to
//! one tenant cannot see or touch another's topics, dead letters or stats;
//! grants are durable.

#[path = "auth/call.rs"]
mod call;
use crate::common;

use call::call;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use prost::Message as _;
use ricochet_broker::auth::{Permission, Requirement, TokenClaims};
use ricochet_broker::gate::required;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::auth_client::AuthClient;
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::cluster_client::ClusterClient;
use ricochet_proto::partitions_client::PartitionsClient;
use ricochet_proto::retention_client::RetentionClient;
use ricochet_proto::tiered_client::TieredClient;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use std::path::Path;
use tonic::{Code, Request, Status};

const SECRET: &[u8] = b"test-secret-0123456789";
const NS: &str = "a/ns";
const TOPIC: &str = "persistent://a/ns/t";
const OTHER: &str = "persistent://b/ns/t";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token_with(key: &[u8], sub: &str, exp: Option<u64>) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &TokenClaims {
            sub: sub.into(),
            exp,
        },
        &EncodingKey::from_secret(key).unwrap(),
    )
    .unwrap()
}

fn token(sub: &str) -> String {
    token_with(SECRET, sub, Some(now() + 3600))
}

async fn secured_in(dir: tempfile::TempDir) -> InProcessBroker {
    let secret = dir.path().join("secret.key");
    std::fs::write(&secret, SECRET).unwrap();
    InProcessBroker::start_in(dir, |c| {
        c.auth.enabled = true;
        c.auth.token_secret_file = Some(secret);
        c.auth.superusers = vec!["root".into()];
    })
    .await
}

async fn secured() -> InProcessBroker {
    secured_in(tempfile::tempdir().unwrap()).await
}

fn req<T>(msg: T, token: Option<&str>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

async fn grant(url: &str, role: &str, resource: &str, perms: &[&str]) {
    AuthClient::new(channel(url).await)
        .grant_permission(req(
            GrantRequest {
                role: role.into(),
                resource: resource.into(),
                permissions: perms.iter().map(|p| p.to_string()).collect(),
            },
            Some(&token("root")),
        ))
        .await
        .expect("root grants");
}

/// Opens a producer on `topic`; sends one message if it opened.
async fn produce(url: &str, topic: &str, token: Option<&str>) -> Result<(), Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ProduceRequest {
        request: Some(produce_request::Request::Open(ProducerOpen {
            topic: topic.into(),
            producer_name: String::new(),
            resend_in_order: false,
        })),
    })
    .await
    .unwrap();
    let mut client = BrokerClient::new(channel(url).await);
    let mut rx = client
        .produce(req(tokio_stream::wrappers::ReceiverStream::new(rx), token))
        .await?
        .into_inner();
    rx.message().await?;
    tx.send(ProduceRequest {
        request: Some(produce_request::Request::Send(SendBatch {
            request_id: 1,
            messages: vec![OutboundMessage {
                payload: b"x".to_vec(),
                sequence_id: 0,
                ..Default::default()
            }],
        })),
    })
    .await
    .unwrap();
    match rx.message().await?.and_then(|r| r.response) {
        Some(produce_response::Response::Receipts(_)) => Ok(()),
        other => panic!("expected receipts, got {other:?}"),
    }
}

/// Subscribes to `topic`; `Ok` once the broker confirms.
async fn consume(
    url: &str,
    topic: &str,
    dlq_reader: bool,
    token: Option<&str>,
) -> Result<(), Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(Subscribe {
            topic: topic.into(),
            subscription: "s".into(),
            dead_letter_reader: dlq_reader,
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut client = BrokerClient::new(channel(url).await);
    let mut rx = client
        .consume(req(tokio_stream::wrappers::ReceiverStream::new(rx), token))
        .await?
        .into_inner();
    rx.message().await?;
    drop(tx);
    Ok(())
}

/// RocketMQ's default delay levels, as a wire policy kind.
fn delay_levels() -> dead_letter_policy_config::Kind {
    dead_letter_policy_config::Kind::DelayLevels(DelayLevelPolicyConfig::default())
}

/// Every RPC of every service (Admin, Auth, Broker, Cluster, Partitions, Retention, Tiered), from the descriptors.
fn every_rpc() -> Vec<String> {
    let fds = prost_types::FileDescriptorSet::decode(ricochet_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut out = Vec::new();
    for file in &fds.file {
        for service in &file.service {
            for m in &service.method {
                out.push(format!("{}/{}", service.name(), m.name()));
            }
        }
    }
    out
}

#[tokio::test]
async fn every_rpc_refuses_anonymous_callers_and_roles_without_its_permission() {
    let broker = secured().await;
    let url = broker.url();
    let rpcs = every_rpc();
    let services: std::collections::BTreeSet<&str> =
        rpcs.iter().filter_map(|m| m.split('/').next()).collect();
    assert_eq!(
        services.into_iter().collect::<Vec<_>>(),
        vec![
            "Admin",
            "Auth",
            "Broker",
            "Cluster",
            "Partitions",
            "Retention",
            "Tiered"
        ]
    );
    assert!(rpcs.len() >= 19, "{rpcs:?}");
    // One role holding every permission but p, one holding only p, per p.
    for p in Permission::ALL {
        let others: Vec<&str> = Permission::ALL
            .into_iter()
            .filter(|o| *o != p)
            .map(|o| o.name())
            .collect();
        grant(&url, &format!("all-but-{p}"), NS, &others).await;
        grant(&url, &format!("only-{p}"), NS, &[p.name()]).await;
    }
    // Something in another tenant, so "stranger" has no grant here but exists.
    grant(&url, "stranger", "b/ns", &["produce", "consume", "admin"]).await;
    for rpc in &rpcs {
        let requirement =
            required(rpc).unwrap_or_else(|| panic!("{rpc} has no permission mapping"));
        let anonymous = call(&url, rpc, None).await.unwrap_err();
        assert_eq!(
            anonymous.code(),
            Code::Unauthenticated,
            "{rpc}: {anonymous:?}"
        );
        let stranger = call(&url, rpc, Some(&token("stranger"))).await;
        match requirement {
            Requirement::Authenticated => {
                stranger.unwrap_or_else(|e| panic!("{rpc}: {e:?}"));
            }
            Requirement::Visible => {
                let e = stranger.unwrap_err();
                assert_eq!(e.code(), Code::PermissionDenied, "{rpc}: {e:?}");
                assert!(e.message().contains("\"stranger\""), "{rpc}: {e:?}");
            }
            Requirement::Superuser => {
                // Not even a role holding every permission on the namespace.
                for role in ["stranger", "only-admin"] {
                    let e = call(&url, rpc, Some(&token(role))).await.unwrap_err();
                    assert_eq!(e.code(), Code::PermissionDenied, "{rpc} as {role}: {e:?}");
                    assert!(e.message().contains("superusers"), "{rpc}: {e:?}");
                }
            }
            Requirement::Permission(p) => {
                let e = stranger.unwrap_err();
                assert_eq!(e.code(), Code::PermissionDenied, "{rpc}: {e:?}");
                let role = format!("all-but-{p}");
                let e = call(&url, rpc, Some(&token(&role))).await.unwrap_err();
                assert_eq!(e.code(), Code::PermissionDenied, "{rpc} as {role}: {e:?}");
                assert!(
                    e.message().contains(&format!("\"{role}\"")) && e.message().contains(p.name()),
                    "{rpc}: the refusal names the role and the permission: {e:?}"
                );
                // With the permission, the call gets past the check (it may
                // still fail on its own terms, e.g. NOT_FOUND).
                let role = format!("only-{p}");
                if let Err(e) = call(&url, rpc, Some(&token(&role))).await {
                    assert!(
                        !matches!(e.code(), Code::PermissionDenied | Code::Unauthenticated),
                        "{rpc} as {role}: {e:?}"
                    );
                }
            }
        }
        // A superuser passes every check.
        if let Err(e) = call(&url, rpc, Some(&token("root"))).await {
            assert!(
                !matches!(e.code(), Code::PermissionDenied | Code::Unauthenticated),
                "{rpc} as root: {e:?}"
            );
        }
    }
}

#[tokio::test]
async fn bad_tokens_are_refused_with_a_reason() {
    let broker = secured().await;
    let url = broker.url();
    grant(&url, "app", NS, &["produce"]).await;
    let expired = token_with(SECRET, "app", Some(now() - 3600));
    let wrong_key = token_with(b"another-secret", "app", Some(now() + 3600));
    let good = token("app");
    let forged_payload = token_with(b"x", "root", None)
        .split('.')
        .nth(1)
        .unwrap()
        .to_owned();
    let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
    parts[1] = forged_payload;
    let tampered = parts.join(".");
    let cases = [
        (expired.as_str(), "expired"),
        (wrong_key.as_str(), "signature"),
        (tampered.as_str(), "signature"),
        ("garbage", "malformed"),
    ];
    for (tok, why) in cases {
        let e = produce(&url, TOPIC, Some(tok)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{why}: {e:?}");
        assert!(e.message().contains(why), "{why}: {e:?}");
    }
    let mut r = Request::new(WhoAmIRequest {});
    r.metadata_mut()
        .insert("authorization", "Basic abc".parse().unwrap());
    let e = AuthClient::new(channel(&url).await)
        .who_am_i(r)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(e.message().contains("Bearer"), "{e:?}");
    // The good token works, and the stream carries messages.
    produce(&url, TOPIC, Some(&good)).await.unwrap();
    let me = AuthClient::new(channel(&url).await)
        .who_am_i(req(WhoAmIRequest {}, Some(&good)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (me.role.as_str(), me.superuser, me.auth_enabled),
        ("app", false, true)
    );
}

#[tokio::test]
async fn a_tenant_role_cannot_see_or_touch_another_tenants_topics() {
    let broker = secured().await;
    let url = broker.url();
    let root = token("root");
    for t in [TOPIC, OTHER, "persistent://a/other/t"] {
        AdminClient::new(channel(&url).await)
            .create_topic(req(
                CreateTopicRequest {
                    topic: t.into(),
                    replicas: 0,
                },
                Some(&root),
            ))
            .await
            .unwrap();
    }
    consume(&url, OTHER, false, Some(&root)).await.unwrap();
    grant(
        &url,
        "a-app",
        NS,
        &["produce", "consume", "dead-letters", "policy"],
    )
    .await;
    let app = token("a-app");
    let mut admin = AdminClient::new(channel(&url).await);
    let listed = admin
        .list_topics(req(ListTopicsRequest::default(), Some(&app)))
        .await
        .unwrap()
        .into_inner()
        .topics;
    assert_eq!(
        listed,
        vec![TOPIC.to_owned()],
        "only its own namespace's topics"
    );
    let all = admin
        .list_topics(req(ListTopicsRequest::default(), Some(&root)))
        .await
        .unwrap()
        .into_inner()
        .topics;
    assert!(all.len() >= 3, "{all:?}");
    let denied = |r: Result<(), Status>, what: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
    };
    denied(
        admin
            .list_topics(req(
                ListTopicsRequest {
                    namespace: "b/ns".into(),
                    ..Default::default()
                },
                Some(&app),
            ))
            .await
            .map(drop),
        "list b/ns",
    );
    denied(
        admin
            .topic_stats(req(
                TopicRequest {
                    topic: OTHER.into(),
                },
                Some(&app),
            ))
            .await
            .map(drop),
        "stats",
    );
    denied(
        admin
            .subscription_stats(req(
                SubscriptionRequest {
                    topic: OTHER.into(),
                    subscription: "s".into(),
                },
                Some(&app),
            ))
            .await
            .map(drop),
        "subscription stats",
    );
    denied(
        admin
            .list_dead_letters(req(
                ListDeadLettersRequest {
                    topic: OTHER.into(),
                    subscription: "s".into(),
                    ..Default::default()
                },
                Some(&app),
            ))
            .await
            .map(drop),
        "dead letters",
    );
    denied(
        admin
            .purge_dead_letters(req(
                PurgeDeadLettersRequest {
                    topic: OTHER.into(),
                    subscription: "s".into(),
                    filter: None,
                    dry_run: false,
                },
                Some(&app),
            ))
            .await
            .map(drop),
        "purge",
    );
    denied(produce(&url, OTHER, Some(&app)).await, "produce");
    denied(consume(&url, OTHER, false, Some(&app)).await, "consume");
    denied(
        consume(&url, "persistent://b/ns/t-s-DLQ", true, Some(&app)).await,
        "dead-letter reader",
    );
    // Nor can it make the broker write there through a policy's tier topic.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(Subscribe {
            topic: TOPIC.into(),
            subscription: "sneaky".into(),
            dead_letter_policy: Some(DeadLetterPolicyConfig {
                kind: Some(delay_levels()),
                dead_letter_topic: "persistent://b/ns/stolen".into(),
                ..Default::default()
            }),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let e = BrokerClient::new(channel(&url).await)
        .consume(req(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            Some(&app),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("persistent://b/ns/stolen"), "{e:?}");
    let e = admin
        .set_policy(req(
            SetPolicyRequest {
                topic: TOPIC.into(),
                subscription: "s".into(),
                policy: Some(DeadLetterPolicyConfig {
                    kind: Some(delay_levels()),
                    retry_topic: "persistent://b/ns/stolen-retry".into(),
                    ..Default::default()
                }),
            },
            Some(&app),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // Its own tenant works, including its dead-letter tier.
    produce(&url, TOPIC, Some(&app)).await.unwrap();
    consume(&url, TOPIC, false, Some(&app)).await.unwrap();
    admin
        .subscription_stats(req(
            SubscriptionRequest {
                topic: TOPIC.into(),
                subscription: "s".into(),
            },
            Some(&app),
        ))
        .await
        .unwrap();
    // Anonymous purge: refused before anything is looked at.
    let e = admin
        .purge_dead_letters(req(
            PurgeDeadLettersRequest {
                topic: TOPIC.into(),
                subscription: "s".into(),
                filter: None,
                dry_run: false,
            },
            None,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

#[tokio::test]
async fn a_grant_on_a_partitioned_topic_covers_its_partitions_only() {
    let b = secured().await;
    let url = &b.url();
    let base = "persistent://a/ns/parted";
    PartitionsClient::new(channel(url).await)
        .create_partitioned_topic(req(
            UpdatePartitionsRequest {
                topic: base.into(),
                partitions: 2,
                replicas: 0,
            },
            Some(&token("root")),
        ))
        .await
        .unwrap();
    grant(url, "writer", base, &["produce"]).await;
    let writer = token("writer");
    for i in 0..2 {
        let partition = format!("{base}-partition-{i}");
        produce(url, &partition, Some(&writer)).await.unwrap();
    }
    // Not another topic of the namespace, nor one whose name merely starts
    // with the base's.
    let denied = produce(url, "persistent://a/ns/other", Some(&writer))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let denied = produce(url, "persistent://a/ns/parted-x-partition-0", Some(&writer))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
}

#[tokio::test]
async fn grants_are_durable_and_revocable_and_health_needs_no_token() {
    let broker = secured().await;
    let url = broker.url();
    grant(&url, "app", TOPIC, &["produce"]).await;
    let dir = broker.shutdown().await;
    let broker = secured_in(dir).await;
    let url = broker.url();
    let app = token("app");
    produce(&url, TOPIC, Some(&app))
        .await
        .expect("the grant survived a restart");
    // A topic grant covers that topic only.
    let e = produce(&url, "persistent://a/ns/other", Some(&app))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let mut auth = AuthClient::new(channel(&url).await);
    let listed = auth
        .list_grants(req(
            ListGrantsRequest {
                role: "app".into(),
                namespace: String::new(),
            },
            Some(&app),
        ))
        .await
        .expect("a role may list its own grants")
        .into_inner()
        .grants;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].permissions, vec!["produce".to_owned()]);
    // A role cannot grant itself more.
    let e = auth
        .grant_permission(req(
            GrantRequest {
                role: "app".into(),
                resource: NS.into(),
                permissions: vec!["admin".into()],
            },
            Some(&app),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = auth
        .grant_permission(req(
            GrantRequest {
                role: "app".into(),
                resource: NS.into(),
                permissions: vec!["write".into()],
            },
            Some(&token("root")),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    auth.revoke_permission(req(
        RevokeRequest {
            role: "app".into(),
            resource: TOPIC.into(),
            permissions: vec![],
        },
        Some(&token("root")),
    ))
    .await
    .unwrap();
    let e = produce(&url, TOPIC, Some(&app)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // Health checks are open to probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&url).await);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health without a token");
}

#[tokio::test]
async fn a_broker_exposed_without_auth_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ricochet_broker::BrokerConfig::for_dir(dir.path());
    config.listen = "0.0.0.0:0".parse().unwrap();
    let e = ricochet_broker::Broker::builder(config.clone())
        .open()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("--allow-insecure"), "{e}");
    config.auth.allow_insecure = true;
    ricochet_broker::Broker::builder(config)
        .open()
        .await
        .unwrap();
    // A missing key file stops it at start, naming the file.
    let mut config = ricochet_broker::BrokerConfig::for_dir(dir.path().join("2"));
    config.auth.enabled = true;
    config.auth.token_secret_file = Some(Path::new("/nonexistent/secret").into());
    let e = ricochet_broker::Broker::builder(config)
        .open()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/secret"), "{e}");
}

#[tokio::test]
async fn list_brokers_shows_only_the_topics_the_caller_may_see() {
    let broker = secured().await;
    let url = broker.url();
    let root = token("root");
    produce(&url, TOPIC, Some(&root)).await.unwrap();
    produce(&url, OTHER, Some(&root)).await.unwrap();
    grant(&url, "app", NS, &["consume"]).await;
    let list = |tok: String| {
        let url = url.clone();
        async move {
            let resp = ClusterClient::new(channel(&url).await)
                .list_brokers(req(ListBrokersRequest { with_topics: true }, Some(&tok)))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(resp.brokers.len(), 1, "{resp:?}");
            resp.brokers[0].topics.clone()
        }
    };
    assert_eq!(
        list(root.clone()).await,
        vec![TOPIC.to_owned(), OTHER.to_owned()]
    );
    assert_eq!(list(token("app")).await, vec![TOPIC.to_owned()]);
    // Lookup needs a permission on the topic: "app" may look up its own.
    let mut cluster = ClusterClient::new(channel(&url).await);
    let own = cluster
        .lookup(req(
            LookupRequest {
                topic: TOPIC.into(),
            },
            Some(&token("app")),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((own.live, own.epoch, own.cluster.as_str()), (true, 0, ""));
    let e = cluster
        .lookup(req(
            LookupRequest {
                topic: OTHER.into(),
            },
            Some(&token("app")),
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}

/// Every listing RPC (each `List*` of every service, from the
/// descriptors), asked by a role confined to one tenant, names nothing of
/// another tenant: not its topics, not its partitioned topics, not its
/// replay jobs, grants or roles. A new `List*` RPC without a case here fails.
#[tokio::test]
async fn no_listing_shows_another_tenants_names() {
    let broker = secured().await;
    let url = broker.url();
    let root = token("root");
    let mut partitions = PartitionsClient::new(channel(&url).await);
    for (t, n) in [
        ("persistent://a/ns/parted", 2),
        ("persistent://b/ns/hidden-parted", 3),
    ] {
        partitions
            .create_partitioned_topic(req(
                UpdatePartitionsRequest {
                    topic: t.into(),
                    partitions: n,
                    replicas: 0,
                },
                Some(&root),
            ))
            .await
            .unwrap();
    }
    produce(&url, TOPIC, Some(&root)).await.unwrap();
    produce(&url, OTHER, Some(&root)).await.unwrap();
    grant(&url, "a-app", NS, &["produce", "consume", "dead-letters"]).await;
    grant(&url, "b-app", "b/ns", &["produce"]).await;
    let app = Some(token("a-app"));
    let app = app.as_deref();
    let ch = channel(&url).await;
    let mut listed = std::collections::BTreeMap::new();
    for rpc in every_rpc().into_iter().filter(|m| m.contains("/List")) {
        let answer = match rpc.as_str() {
            "Admin/ListTopics" => {
                let r = AdminClient::new(ch.clone())
                    .list_topics(req(ListTopicsRequest::default(), app))
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(r.topics.len(), 3, "{r:?}");
                assert_eq!(
                    r.partitioned
                        .iter()
                        .map(|p| p.topic.as_str())
                        .collect::<Vec<_>>(),
                    vec!["persistent://a/ns/parted"],
                    "only its own partitioned topic"
                );
                format!("{r:?}")
            }
            "Admin/ListSubscriptions" => format!(
                "{:?}",
                AdminClient::new(ch.clone())
                    .list_subscriptions(req(
                        TopicRequest {
                            topic: TOPIC.into()
                        },
                        app
                    ))
                    .await
                    .unwrap()
            ),
            "Admin/ListDeadLetters" => format!(
                "{:?}",
                AdminClient::new(ch.clone())
                    .list_dead_letters(req(
                        ListDeadLettersRequest {
                            topic: TOPIC.into(),
                            subscription: "s".into(),
                            ..Default::default()
                        },
                        app
                    ))
                    .await
            ),
            "Admin/ListReplayJobs" => format!(
                "{:?}",
                AdminClient::new(ch.clone())
                    .list_replay_jobs(req(ListReplayJobsRequest::default(), app))
                    .await
                    .unwrap()
            ),
            "Auth/ListGrants" => format!(
                "{:?}",
                AuthClient::new(ch.clone())
                    .list_grants(req(
                        ListGrantsRequest {
                            role: "a-app".into(),
                            namespace: String::new(),
                        },
                        app
                    ))
                    .await
                    .unwrap()
            ),
            "Cluster/ListBrokers" => format!(
                "{:?}",
                ClusterClient::new(ch.clone())
                    .list_brokers(req(ListBrokersRequest { with_topics: true }, app))
                    .await
                    .unwrap()
            ),
            other => panic!("{other}: a listing without a case in this test"),
        };
        for leak in ["b/ns", "b-app", "hidden-parted"] {
            assert!(!answer.contains(leak), "{rpc} shows {leak:?}: {answer}");
        }
        listed.insert(rpc, answer);
    }
    assert!(listed.len() >= 6, "{listed:?}");
    // The same listings as root do show the other tenant: the check can fail.
    let all = AdminClient::new(ch)
        .list_topics(req(ListTopicsRequest::default(), Some(&root)))
        .await
        .unwrap()
        .into_inner();
    assert!(
        format!("{all:?}").contains("hidden-parted"),
        "root sees every partitioned topic: {all:?}"
    );
}
