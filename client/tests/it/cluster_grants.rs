//! Grants in a cluster are the cluster's (kept in etcd): a grant made
//! through one broker lets its role in on every broker within a few
//! seconds, a revoke made through another shuts it out everywhere, and
//! every broker lists the same grants. Etcd and two brokers with TLS and
//! JWT auth, as child processes (the secure cluster of
//! `replicated_secure.rs`).

use std::time::{Duration, Instant};

use ricochet_client::ErrorKind;
use ricochet_testkit::etcd_or_skip;

use super::replicated::ONE_CLUSTER;
use super::replicated_secure::{Secrets, spawn};

/// A topic `Lookup` places on broker `id` (asked as admin of `url`).
async fn topic_on(s: &Secrets, url: &str, id: &str) -> String {
    let c = s.client(url, "admin").await;
    let start = Instant::now();
    loop {
        for i in 0..64 {
            let t = format!("granted-{i}");
            if let Ok(o) = c.lookup(&t).await
                && o.broker_id == id
            {
                return t;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no topic placed on {id}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits until alice's producer on `t` (through `url`) is let in
/// (`allowed`) or refused PERMISSION_DENIED; panics after 10 s.
async fn alice_produces(s: &Secrets, url: &str, t: &str, allowed: bool) {
    let c = s.client(url, "alice").await;
    let start = Instant::now();
    loop {
        match c.producer(t).create().await {
            Ok(p) if allowed => {
                p.send("hello").await.unwrap();
                return;
            }
            Err(e) if !allowed && e.kind() == ErrorKind::PermissionDenied => return,
            other => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "alice on {t} (wanted allowed = {allowed}): {:?}",
                    other.map(|_| "a producer")
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_the_clusters() {
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("grants_are_the_clusters").await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let s = Secrets::new(root.path());
    let b0 = spawn(&s, (&etcd, "grants"), root.path(), 0).await;
    let b1 = spawn(&s, (&etcd, "grants"), root.path(), 1).await;
    let (t0, t1) = (
        topic_on(&s, &b0.url, "b0").await,
        topic_on(&s, &b0.url, "b1").await,
    );
    // Nothing granted: alice is refused on both brokers' topics.
    alice_produces(&s, &b0.url, &t0, false).await;
    alice_produces(&s, &b0.url, &t1, false).await;

    // Granted through b0: in force on b1's topic too.
    s.client(&b0.url, "admin")
        .await
        .admin()
        .grant("alice", "public/default", &["produce"])
        .await
        .unwrap();
    alice_produces(&s, &b1.url, &t1, true).await;
    alice_produces(&s, &b1.url, &t0, true).await;
    let listed = |url: String| {
        let s = &s;
        async move {
            let grants = s
                .client(&url, "admin")
                .await
                .admin()
                .list_grants(None, None)
                .await
                .unwrap();
            grants
                .into_iter()
                .map(|g| (g.role, g.resource, g.permissions))
                .collect::<Vec<_>>()
        }
    };
    let want = vec![(
        "alice".to_owned(),
        "public/default".to_owned(),
        vec!["produce".to_owned()],
    )];
    assert_eq!(listed(b0.url.clone()).await, want);
    assert_eq!(listed(b1.url.clone()).await, want);

    // Revoked through b1: refused on b0's topic too.
    s.client(&b1.url, "admin")
        .await
        .admin()
        .revoke("alice", "public/default", &[])
        .await
        .unwrap();
    alice_produces(&s, &b0.url, &t0, false).await;
    alice_produces(&s, &b0.url, &t1, false).await;
    assert_eq!(listed(b0.url.clone()).await, vec![]);
}
