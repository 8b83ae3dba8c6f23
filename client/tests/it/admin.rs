//! The typed admin API ([`ricochet_client::Admin`]) against an in-process
//! broker: each concern (topics, messages, subscriptions, policies, dead
//! letters, replay jobs, retention, partitions, grants, the cluster's
//! brokers) at least once, the broker's refusals as the right
//! [`ErrorKind`], and a topic-scoped call routed to the topic's owner.

use crate::common;

use std::time::Duration;

use common::{recv, start, topic};
use ricochet_client::admin::{
    DeadLetterFilter, DeadLetterGroupBy, ReplayEdit, ReplayOptions, RetentionPolicy,
    RetentionTarget,
};
use ricochet_client::{Client, ErrorKind, InitialPosition, PolicySpec, SubscriptionType};
use ricochet_testkit::{FakeAnswer, FakeCluster, InProcessBroker};

const T: Duration = Duration::from_secs(10);

/// `n` messages on `t`, then a consumer of subscription `s` that
/// terminates each one (straight to the dead-letter tier).
async fn dead_letters(client: &Client, t: &str, n: usize) {
    let mut c = client
        .consumer(t)
        .subscription("s")
        .subscription_type(SubscriptionType::Shared)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    // Unbatched, so a partitioned topic's sends go round the partitions.
    let p = client.producer(t).batching(false).create().await.unwrap();
    for i in 0..n {
        p.send(format!("m{i}")).await.unwrap();
    }
    for i in 0..n {
        let m = recv(&mut c, T).await;
        c.terminate(&m, if i % 2 == 0 { "even" } else { "odd" })
            .await
            .unwrap();
    }
    c.flush().await.unwrap();
    c.close().await.unwrap();
    p.close().await.unwrap();
}

#[tokio::test]
async fn topics_messages_and_subscriptions() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-topics");
    let info = admin.create_topic(&t).await.unwrap();
    assert_eq!(info.topic, format!("persistent://public/default/{t}"));
    assert!(info.created);
    let listed = admin
        .list_topics(Some("public/default"), false)
        .await
        .unwrap();
    assert!(listed.topics.contains(&info.topic), "{listed:?}");

    let p = env.client.producer(&t).create().await.unwrap();
    let id = p.send("hello").await.unwrap();
    p.close().await.unwrap();
    let mut c = env
        .client
        .consumer(&t)
        .subscription("s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    let m = recv(&mut c, T).await;

    let stats = admin.topic_stats(&t).await.unwrap();
    assert_eq!(stats.message_count, 1, "{stats:?}");
    assert_eq!(admin.list_subscriptions(&t).await.unwrap(), ["s"]);
    let s = admin.subscription_stats(&t, "s").await.unwrap();
    assert_eq!(
        (s.backlog, s.unacked, s.consumers.len()),
        (1, 1, 1),
        "{s:?}"
    );

    let info = admin.message(&id).await.unwrap();
    assert_eq!(info.message.as_ref().unwrap().payload, b"hello");
    assert_eq!(info.subscriptions[0].state, "in_flight", "{info:?}");

    // A connected consumer keeps its subscription unless forced.
    let e = admin.delete_subscription(&t, "s", false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    c.ack(&m).await.unwrap();
    c.close().await.unwrap();
    // A topic with a subscription is kept unless forced.
    let e = admin.delete_topic(&t, false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::FailedPrecondition, "{e:?}");
    admin.delete_subscription(&t, "s", false).await.unwrap();
    assert!(admin.list_subscriptions(&t).await.unwrap().is_empty());

    let c = env
        .client
        .consumer(&t)
        .subscription("s2")
        .subscribe()
        .await
        .unwrap();
    c.close().await.unwrap();
    admin.delete_topic(&t, true).await.unwrap();
    let e = admin.topic_stats(&t).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
    assert_eq!(e.grpc_code(), Some(5));
}

#[tokio::test]
async fn policies_set_read_and_cleared() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-policy");
    let _c = env
        .client
        .consumer(&t)
        .subscription("s")
        .subscribe()
        .await
        .unwrap();
    let before = admin.policy(&t, "s").await.unwrap();
    assert_ne!(before.source, "admin", "{before:?}");
    let spec = PolicySpec::fixed_backoff(Duration::from_millis(200), 3);
    let set = admin.set_policy(&t, "s", &spec).await.unwrap();
    assert_eq!(set.source, "admin", "{set:?}");
    assert_eq!(admin.policy(&t, "s").await.unwrap(), set);
    let cleared = admin.clear_policy(&t, "s").await.unwrap();
    assert_eq!(cleared.source, before.source, "{cleared:?}");
}

#[tokio::test]
async fn dead_letters_listed_grouped_replayed_and_purged() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-dlq");
    dead_letters(&env.client, &t, 6).await;
    let all = DeadLetterFilter::default();

    let page = admin
        .list_dead_letters(&t, "s", &all, 4, None)
        .await
        .unwrap();
    assert_eq!((page.total, page.dead_letters.len()), (6, 4));
    let last = page.dead_letters[3]
        .message
        .as_ref()
        .unwrap()
        .id
        .as_ref()
        .unwrap()
        .entry_id;
    let rest = admin
        .list_dead_letters(&t, "s", &all, 4, Some(last))
        .await
        .unwrap();
    assert_eq!(rest.dead_letters.len(), 2);

    let groups = admin
        .group_dead_letters(&t, "s", &all, DeadLetterGroupBy::Reason, 0)
        .await
        .unwrap();
    let mut counts: Vec<(String, u64)> = groups
        .groups
        .iter()
        .map(|g| (g.key.clone(), g.count))
        .collect();
    counts.sort();
    assert_eq!(counts, [("even".to_owned(), 3), ("odd".to_owned(), 3)]);

    // A dry run names them and changes nothing.
    let odd = DeadLetterFilter {
        reason_contains: "odd".into(),
        ..Default::default()
    };
    let dry = admin
        .replay_dead_letters(
            &t,
            "s",
            &ReplayOptions::new().filter(odd.clone()).dry_run(true),
        )
        .await
        .unwrap();
    assert!(dry.dry_run);
    assert_eq!(dry.dead_letter_ids.len(), 3);
    assert_eq!(
        admin
            .list_dead_letters(&t, "s", &all, 10, None)
            .await
            .unwrap()
            .total,
        6
    );

    // Replayed onto the topic, fixed: a new consumer sees the fix.
    let fixed = ReplayOptions::new()
        .filter(odd)
        .to_topic(true)
        .edit(ReplayEdit {
            payload: Some(b"fixed".to_vec()),
            ..Default::default()
        });
    let done = admin.replay_dead_letters(&t, "s", &fixed).await.unwrap();
    assert_eq!((done.replayed, done.new_ids.len()), (3, 3), "{done:?}");
    let after = admin
        .list_dead_letters(&t, "s", &all, 10, None)
        .await
        .unwrap();
    assert_eq!(after.total, 3);
    let first_new = &done.new_ids[0];
    let info = admin
        .message(&ricochet_client::MessageId::new(
            first_new.topic.as_str(),
            first_new.entry_id,
        ))
        .await
        .unwrap();
    assert_eq!(info.message.unwrap().payload, b"fixed");

    // Purge: dry run, then for good.
    let dry = admin.purge_dead_letters(&t, "s", &all, true).await.unwrap();
    assert_eq!((dry.dry_run, dry.dead_letter_ids.len()), (true, 3));
    let purged = admin
        .purge_dead_letters(&t, "s", &all, false)
        .await
        .unwrap();
    assert_eq!(purged.purged, 3);
    assert_eq!(
        admin
            .list_dead_letters(&t, "s", &all, 10, None)
            .await
            .unwrap()
            .total,
        0
    );
}

#[tokio::test]
async fn replay_jobs_listed_and_cancelled() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-jobs");
    dead_letters(&env.client, &t, 20).await;
    // One a second, detached: the job is still running when listed.
    let slow = ReplayOptions::new().rate_per_second(1).detach(true);
    let started = admin.replay_dead_letters(&t, "s", &slow).await.unwrap();
    assert_ne!(started.job_id, 0, "{started:?}");
    let jobs = admin.list_replay_jobs(Some(&t), Some("s")).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!((jobs[0].id, jobs[0].total), (started.job_id, 20));
    assert_eq!(admin.list_replay_jobs(None, None).await.unwrap().len(), 1);
    admin
        .cancel_replay_job(started.job_id, Some(&t))
        .await
        .unwrap();
    assert!(admin.list_replay_jobs(None, None).await.unwrap().is_empty());
    let e = admin
        .cancel_replay_job(started.job_id, None)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
}

/// Replay jobs of a partitioned topic through its base name: a detached
/// replay starts one job per partition and names each; the base name
/// lists them all, and cancels one by its id alone.
#[tokio::test]
async fn replay_jobs_of_a_partitioned_topic_by_its_base_name() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-jobs-parted");
    admin.create_partitioned_topic(&t, 3).await.unwrap();
    dead_letters(&env.client, &t, 30).await;
    let slow = ReplayOptions::new().rate_per_second(1).detach(true);
    let started = admin.replay_dead_letters(&t, "s", &slow).await.unwrap();
    let mut each: Vec<(String, u64)> = started
        .jobs
        .iter()
        .map(|j| (j.topic.clone(), j.total))
        .collect();
    each.sort();
    let want: Vec<(String, u64)> = (0..3)
        .map(|i| (format!("persistent://public/default/{t}-partition-{i}"), 10))
        .collect();
    assert_eq!(each, want, "one job per partition: {started:?}");
    let max = started.jobs.iter().map(|j| j.id).max();
    assert_eq!(Some(started.job_id), max);
    let ids = |jobs: &[ricochet_client::admin::ReplayJob]| {
        let mut ids: Vec<u64> = jobs.iter().map(|j| j.id).collect();
        ids.sort();
        ids
    };
    let listed = admin.list_replay_jobs(Some(&t), Some("s")).await.unwrap();
    assert_eq!(ids(&listed), ids(&started.jobs), "{listed:?}");

    // Cancelled by the base name and the id: that partition's job alone.
    let gone = &started.jobs[1];
    admin.cancel_replay_job(gone.id, Some(&t)).await.unwrap();
    let left = admin.list_replay_jobs(Some(&t), None).await.unwrap();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|j| j.id != gone.id), "{left:?}");
    let e = admin
        .cancel_replay_job(gone.id, Some(&t))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e:?}");
    for j in left {
        admin.cancel_replay_job(j.id, Some(&t)).await.unwrap();
    }
    assert!(
        admin
            .list_replay_jobs(Some(&t), None)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn retention_on_a_topic_and_its_namespace() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-retention");
    admin.create_topic(&t).await.unwrap();
    let ns = RetentionTarget::Namespace("public/default".into());
    let day = RetentionPolicy {
        max_age_ms: Some(86_400_000),
        ..Default::default()
    };
    admin.set_retention(&ns, day.clone()).await.unwrap();
    let on_topic = RetentionTarget::Topic(t.clone());
    let r = admin.retention(&on_topic).await.unwrap();
    assert_eq!(r.policy, None, "{r:?}");
    assert_eq!(
        r.effective.as_ref().and_then(|p| p.max_age_ms),
        Some(86_400_000)
    );
    assert_eq!(r.effective_from, "public/default");

    let small = RetentionPolicy {
        max_size_bytes: Some(1 << 20),
        ..Default::default()
    };
    let r = admin.set_retention(&on_topic, small.clone()).await.unwrap();
    assert_eq!(r.policy, Some(small));
    assert_eq!(r.effective_from, r.target);
    let r = admin.remove_retention(&on_topic).await.unwrap();
    assert_eq!(r.effective_from, "public/default", "{r:?}");
    admin.remove_retention(&ns).await.unwrap();
    assert_eq!(admin.retention(&ns).await.unwrap().policy, None);

    let negative = RetentionPolicy {
        max_age_ms: Some(-1),
        ..Default::default()
    };
    let e = admin.set_retention(&on_topic, negative).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e:?}");
}

#[tokio::test]
async fn partitioned_topics() {
    let env = start().await;
    let admin = env.client.admin();
    let t = topic("adm-parts");
    let created = admin.create_partitioned_topic(&t, 3).await.unwrap();
    assert_eq!(created.partitions, 3);
    let e = admin.create_partitioned_topic(&t, 3).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e:?}");
    let raised = admin.update_partitions(&t, 5).await.unwrap();
    assert_eq!(raised.partitions, 5);
    assert_eq!(admin.partitions(&t).await.unwrap(), Some(raised));
    let e = admin.update_partitions(&t, 2).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e:?}");
    let plain = topic("adm-plain");
    admin.create_topic(&plain).await.unwrap();
    assert_eq!(admin.partitions(&plain).await.unwrap(), None);
    let listed = admin.list_topics(None, false).await.unwrap();
    assert!(
        listed.partitioned.iter().any(|p| p.partitions == 5),
        "{listed:?}"
    );
    // Admin calls on the base name are answered over the partitions.
    assert_eq!(admin.topic_stats(&t).await.unwrap().partition_count, 5);
}

#[tokio::test]
async fn a_standalone_broker_answers_the_cluster_calls_itself() {
    let env = start().await;
    let admin = env.client.admin();
    let owner = admin.lookup("anything").await.unwrap();
    assert!(owner.is_standalone(), "{owner:?}");
    assert_eq!(owner.url, env.broker.url());
    let brokers = admin.brokers(true).await;
    // A standalone broker has no cluster to list (UNIMPLEMENTED or empty).
    match brokers {
        Ok(b) => assert!(b.cluster.is_empty(), "{b:?}"),
        Err(e) => assert_eq!(e.grpc_code(), Some(12), "{e:?}"),
    }
    let e = admin.create_topic("not//a topic").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e:?}");
}

// ---- grants and permissions

const SECRET: &[u8] = b"admin-test-secret-0123456789";

pub(crate) fn token(role: &str) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({ "sub": role, "exp": exp }),
        &jsonwebtoken::EncodingKey::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

pub(crate) async fn as_role(url: &str, role: Option<&str>) -> Client {
    let mut b = Client::builder(url);
    if let Some(r) = role {
        b = b.token(token(r));
    }
    b.connect().await.unwrap()
}

/// A broker with `[auth]` on, `root` its superuser, tokens signed with
/// [`SECRET`] (see [`token`]).
pub(crate) async fn secured() -> InProcessBroker {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.key");
    std::fs::write(&secret, SECRET).unwrap();
    InProcessBroker::start_in(dir, |c| {
        c.auth.enabled = true;
        c.auth.token_secret_file = Some(secret);
        c.auth.superusers = vec!["root".into()];
    })
    .await
}

#[tokio::test]
async fn grants_and_the_refusals_of_a_secured_broker() {
    let broker = secured().await;
    let root = as_role(&broker.url(), Some("root")).await.admin();
    let app = as_role(&broker.url(), Some("app")).await.admin();

    let me = app.who_am_i().await.unwrap();
    assert_eq!(
        (me.role.as_str(), me.superuser, me.auth_enabled),
        ("app", false, true)
    );
    assert!(root.who_am_i().await.unwrap().superuser);

    // Without a grant: refused, as PermissionDenied.
    let e = app.topic_stats("persistent://a/ns/t").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e:?}");
    let e = app.grant("app", "a/ns", &["admin"]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e:?}");
    // Without credentials: Unauthenticated.
    let anonymous = as_role(&broker.url(), None).await.admin();
    let e = anonymous.list_topics(None, false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e:?}");

    let g = root
        .grant("app", "a/ns", &["produce", "admin"])
        .await
        .unwrap();
    assert_eq!((g.role.as_str(), g.resource.as_str()), ("app", "a/ns"));
    assert_eq!(g.permissions, ["produce", "admin"]);
    app.create_topic("persistent://a/ns/t").await.unwrap();
    assert_eq!(root.list_grants(Some("app"), None).await.unwrap(), [g]);
    let e = root.grant("app", "a/ns", &["fly"]).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e:?}");

    let left = root.revoke("app", "a/ns", &["admin"]).await.unwrap();
    assert_eq!(left.permissions, ["produce"]);
    // Stats need any permission on the topic; deleting it needs admin.
    app.topic_stats("persistent://a/ns/t").await.unwrap();
    let e = app
        .delete_topic("persistent://a/ns/t", false)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e:?}");
    root.revoke("app", "a/ns", &[]).await.unwrap();
    assert!(
        root.list_grants(Some("app"), None)
            .await
            .unwrap()
            .is_empty()
    );
}

// ---- routing

#[tokio::test]
async fn topic_calls_go_to_the_owner_and_the_others_to_the_service_url() {
    // The service URL is a stand-in cluster with no Admin service; the
    // topic's owner is a real broker.
    let owner = InProcessBroker::start().await;
    let fake = FakeCluster::start("c", FakeAnswer::Unimplemented).await;
    fake.route("routed", FakeAnswer::owner("b1", owner.url()));
    let client = Client::connect(fake.url()).await.unwrap();
    let admin = client.admin();
    let info = admin.create_topic("routed").await.unwrap();
    assert!(info.created);
    let direct = Client::connect(owner.url()).await.unwrap().admin();
    assert_eq!(direct.topic_stats("routed").await.unwrap().message_count, 0);
    // Not about a topic: asked of the service URL, which has no Admin.
    let e = admin.list_topics(None, false).await.unwrap_err();
    assert_eq!(e.grpc_code(), Some(12), "{e:?}");
}
