//! `ricochet topics offload|offload-status|set-offload|get-offload` and
//! `namespaces set-offload|get-offload` against a broker offloading to a
//! local directory: an offload moves the sealed segments out and the
//! status says so, policies come back with their source, and bad values
//! are usage errors (exit 2) or the broker's answer (exit 1).

use crate::common;

use common::{Env, stderr, u};
use ricochet_testkit::InProcessBroker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_storage_on_the_command_line() {
    let root = tempfile::tempdir().unwrap();
    let url = format!("file://{}", root.path().display());
    let b = InProcessBroker::start_with(move |c| {
        c.segment_entries = 10;
        c.tiered = Some(ricochet_broker::storage::tiered::TieredConfig {
            url,
            ..Default::default()
        });
    })
    .await;
    let env = Env::at(b.url());
    let msgs: Vec<String> = (0..30).map(|i| format!("m{i}")).collect();
    let mut args = vec!["produce", "orders"];
    for m in &msgs {
        args.extend(["-m", m.as_str()]);
    }
    env.ok(&args).await;
    let done = env.json(&["topics", "offload", "orders"]).await;
    assert!(u(&done["offloaded_segments"]) >= 1, "{done}");
    assert_eq!(done["offloaded_segments"], done["local_deleted"], "{done}");
    let s = env.json(&["topics", "offload-status", "orders"]).await;
    assert_eq!(s["remote_only_segments"], done["offloaded_segments"], "{s}");
    assert_eq!(u(&s["local_segments"]), 1, "{s}");
    let text = env.ok(&["topics", "offload-status", "orders"]).await;
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(out.contains(" remote "), "{out}");

    let ns = env
        .json(&[
            "namespaces",
            "set-offload",
            "public/default",
            "--after",
            "1h",
            "--delete-lag",
            "10m",
        ])
        .await;
    assert_eq!(u(&ns["policy"]["offload_after_ms"]), 3_600_000);
    assert_eq!(u(&ns["policy"]["delete_lag_ms"]), 600_000);
    let t = env.json(&["topics", "get-offload", "orders"]).await;
    assert!(t["policy"].is_null(), "{t}");
    assert_eq!(t["effective_from"], "public/default");
    env.ok(&[
        "topics",
        "set-offload",
        "orders",
        "--local-limit",
        "1GiB",
        "--keep-local",
    ])
    .await;
    let shown = env.ok(&["topics", "get-offload", "orders"]).await;
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(out.contains("keep local copies"), "{out}");
    env.ok(&["topics", "set-offload", "orders", "--clear"])
        .await;
    let t = env.json(&["topics", "get-offload", "orders"]).await;
    assert_eq!(t["effective_from"], "public/default", "{t}");

    // Nothing to set is a usage error; an unknown topic the broker's answer.
    let bad = env.run(&["topics", "set-offload", "orders"]).await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    let bad = env.run(&["topics", "offload", "nope"]).await;
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("nope"), "{}", stderr(&bad));
}
