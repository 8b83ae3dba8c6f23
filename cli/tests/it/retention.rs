//! `ricochet namespaces set-retention|get-retention` and `topics
//! set-retention|get-retention`: sizes and durations with units reach the
//! broker as bytes and milliseconds, a topic shows the policy in force and
//! where it comes from, `--clear` removes one, and bad values are usage
//! errors (exit 2) or the broker's INVALID_ARGUMENT (exit 1). And a
//! namespace's replication factor on a standalone broker: 1 is accepted,
//! above 1 refused in one line (exit 1).

use crate::common;

use common::{Env, stderr, u};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_the_command_line() {
    let env = Env::start().await;
    let ns = env
        .json(&[
            "namespaces",
            "set-retention",
            "public/default",
            "--max-age",
            "1h",
            "--max-size",
            "1GiB",
        ])
        .await;
    assert_eq!(ns["target"], "public/default");
    assert_eq!(u(&ns["policy"]["max_age_ms"]), 3_600_000);
    assert_eq!(u(&ns["policy"]["max_size_bytes"]), 1 << 30);

    let t = env.json(&["topics", "get-retention", "orders"]).await;
    assert_eq!(t["target"], "persistent://public/default/orders");
    assert!(t["policy"].is_null(), "{t}");
    assert_eq!(t["effective_from"], "public/default");

    let q = env
        .json(&[
            "topics",
            "set-retention",
            "clicks",
            "--backlog-quota",
            "512MiB",
            "--quota-action",
            "drop-oldest",
        ])
        .await;
    assert_eq!(u(&q["policy"]["backlog_quota_bytes"]), 512 << 20);
    assert_eq!(q["policy"]["quota_action"], "drop_oldest");
    let shown = env.ok(&["topics", "get-retention", "clicks"]).await;
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(out.contains("backlog quota 512MiB (drop-oldest)"), "{out}");
    env.ok(&["topics", "set-retention", "orders", "--max-size", "512MiB"])
        .await;
    let shown = env.ok(&["topics", "get-retention", "orders"]).await;
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(
        out.contains("persistent://public/default/orders: max size 512MiB"),
        "{out}"
    );
    env.ok(&["topics", "set-retention", "orders", "--clear"])
        .await;
    let shown = env.ok(&["topics", "get-retention", "orders"]).await;
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(
        out.contains("in force (from public/default): max age 1h, max size 1GiB"),
        "{out}"
    );

    for bad in [
        vec!["topics", "set-retention", "orders"],
        vec!["topics", "set-retention", "orders", "--max-size", "0"],
        vec!["topics", "set-retention", "orders", "--max-size", "lots"],
        vec!["topics", "set-retention", "orders", "--max-age", "0s"],
        vec![
            "topics",
            "set-retention",
            "orders",
            "--clear",
            "--max-age",
            "1h",
        ],
        vec![
            "topics",
            "set-retention",
            "orders",
            "--backlog-quota",
            "1MiB",
            "--quota-action",
            "explode",
        ],
        vec![
            "topics",
            "set-retention",
            "orders",
            "--max-age",
            "1h",
            "--quota-action",
            "refuse",
        ],
    ] {
        let r = env.run(&bad).await;
        assert_eq!(r.status.code(), Some(2), "{bad:?}: {}", stderr(&r));
    }
    let r = env
        .run(&["namespaces", "set-retention", "nope", "--max-age", "1h"])
        .await;
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("InvalidArgument"), "{}", stderr(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaces_replication_factor_on_a_standalone_broker() {
    let env = Env::start().await;
    let r = env
        .json(&["namespaces", "get-replication", "public/default"])
        .await;
    assert!(r["replicas"].is_null(), "{r}");
    assert_eq!(u(&r["effective"]), 1, "{r}");
    // Factor 1 is every topic's here already; above 1 needs a cluster.
    let one = env
        .json(&["namespaces", "set-replication", "public/default", "1"])
        .await;
    assert_eq!(u(&one["replicas"]), 1, "{one}");
    let r = env
        .run(&["namespaces", "set-replication", "public/default", "3"])
        .await;
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    let e = stderr(&r);
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(
        e.contains("FailedPrecondition") && e.contains("standalone"),
        "{e}"
    );
    let r = env
        .run(&["namespaces", "set-replication", "public/default", "0"])
        .await;
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("InvalidArgument"), "{}", stderr(&r));
    let r = env
        .run(&["namespaces", "set-replication", "public/default", "many"])
        .await;
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
}
