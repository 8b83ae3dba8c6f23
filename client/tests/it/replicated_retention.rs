//! A replicated topic's own retention policy (issue 22): set through any
//! broker, it is a command of the topic's group (committed by a majority,
//! applied on every replica), so the member that leads after a `kill -9`
//! of the leader has the same policy in force and enforces it; clearing
//! it goes the same way. Etcd and three brokers as child processes.

use std::time::Duration;

use ricochet_client::admin::{RetentionPolicy, RetentionTarget};
use ricochet_client::{Client, ErrorKind, InitialPosition, Producer};
use ricochet_testkit::etcd_or_skip;

use super::replicated::{ONE_CLUSTER, client, led_group, next_leader};

/// The backlog quota set on the topic.
const QUOTA: i64 = 4096;

/// Sends 1 KiB messages through `p` until one is refused: how many were
/// stored first. Fails when none is refused within 64. The producer
/// resends a refused batch until its send timeout, which then names the
/// quota's refusal.
async fn fill_until_refused(p: &Producer) -> usize {
    for sent in 0..64 {
        match p.send(vec![7u8; 1024]).await {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Timeout, "{e:?}");
                assert!(e.to_string().contains("backlog quota"), "{e}");
                return sent;
            }
        }
    }
    panic!("64 KiB published past a {QUOTA} B backlog quota");
}

/// A producer on `t` whose sends give up after a second.
async fn producer(c: &Client, t: &str) -> Producer {
    c.producer(t)
        .send_timeout(Duration::from_secs(1))
        .create()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_topics_own_retention_is_the_groups_and_outlives_its_leader() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("a_replicated_topics_own_retention").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let t = "quota";
    let (mut brokers, ids, leader, victim) = led_group(&etcd, "rret", root.path(), t).await;
    let follower = (victim + 1) % 3;

    // A subscription that consumes nothing: everything published waits.
    let c = client(&brokers[follower].url()).await;
    let _slow = c
        .consumer(t)
        .subscription("slow")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap();
    // Set through a follower: the client follows it to the leader.
    let target = RetentionTarget::Topic(t.to_owned());
    let info = c
        .admin()
        .set_retention(
            &target,
            RetentionPolicy {
                backlog_quota_bytes: Some(QUOTA),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        info.policy.as_ref().and_then(|p| p.backlog_quota_bytes),
        Some(QUOTA),
        "{info:?}"
    );
    let p = producer(&c, t).await;
    let stored = fill_until_refused(&p).await;
    assert!(
        (3..=6).contains(&stored),
        "{stored} KiB stored before the {QUOTA} B quota refused one"
    );
    drop(p);

    // The leader's kill -9: the next one has the group's policy in force
    // (it was applied to its store, never set on it) and refuses too.
    brokers[victim].kill9();
    let (next, next_url) = next_leader(&brokers[follower].url(), t, &ids, &leader).await;
    let c2 = client(&next_url).await;
    let got = c2.admin().retention(&target).await.unwrap();
    assert_eq!(
        got.effective.as_ref().and_then(|p| p.backlog_quota_bytes),
        Some(QUOTA),
        "the new leader {next}'s policy in force: {got:?}"
    );
    let p2 = producer(&c2, t).await;
    assert_eq!(fill_until_refused(&p2).await, 0, "the new leader {next}");

    // Cleared through the new leader: publishes go through again, and the
    // old leader, back, reads the cleared policy from its group when it
    // leads (asked of it, the answer is the leader's).
    let cleared = c2.admin().remove_retention(&target).await.unwrap();
    assert_eq!(cleared.effective, None, "{cleared:?}");
    drop(p2);
    c2.producer(t)
        .create()
        .await
        .unwrap()
        .send(vec![7u8; 1024])
        .await
        .expect("a publish after the quota was cleared");
    brokers[victim].restart().await;
    let back = client(&brokers[victim].url()).await;
    let seen = back.admin().retention(&target).await.unwrap();
    assert_eq!(
        seen.effective, None,
        "asked of the returned broker: {seen:?}"
    );
}
