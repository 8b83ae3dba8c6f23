//! End-to-end tests of topic administration (`topics create|list|stats|
//! delete`) and of how every command reports errors: one line on stderr
//! with the gRPC code, exit code 1, or 2 for usage errors.

use crate::common;

use common::{Env, stderr, u};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_create_list_stats() {
    let env = Env::start().await;
    let created = env.json(&["topics", "create", "orders"]).await;
    assert_eq!(created["topic"], "persistent://public/default/orders");
    assert_eq!(created["created"], true);
    env.json(&["topics", "create", "acme/billing/invoices"])
        .await;

    let list = env.json(&["topics", "list"]).await;
    let topics: Vec<&str> = list["topics"]
        .as_array()
        .expect("topics array")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        topics.contains(&"persistent://public/default/orders"),
        "{list}"
    );
    assert!(
        topics.contains(&"persistent://acme/billing/invoices"),
        "{list}"
    );
    let only = env
        .json(&["topics", "list", "--namespace", "acme/billing"])
        .await;
    assert_eq!(
        only["topics"],
        serde_json::json!(["persistent://acme/billing/invoices"])
    );

    env.ok(&["produce", "orders", "-m", "a", "-m", "bb", "-n", "2"])
        .await;
    let stats = env.json(&["topics", "stats", "orders"]).await;
    assert_eq!(stats["topic"], "persistent://public/default/orders");
    assert_eq!(u(&stats["message_count"]), 4);
    assert_eq!(u(&stats["messages_in"]), 4);
    assert_eq!(u(&stats["bytes_in"]), 6);
    assert_eq!(u(&stats["next_entry_id"]), 4);
    assert_eq!(stats["subscriptions"], serde_json::json!([]));

    // Table output is for people, but it must name the topic too.
    let table = env.ok(&["topics", "stats", "orders"]).await;
    assert!(String::from_utf8_lossy(&table.stdout).contains("messages stored: 4"));

    let deleted = env
        .json(&["topics", "delete", "acme/billing/invoices", "--yes"])
        .await;
    assert_eq!(deleted["deleted"], true);
    let list = env
        .json(&["topics", "list", "--namespace", "acme/billing"])
        .await;
    assert_eq!(list["topics"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_with_the_grpc_code() {
    let env = Env::start().await;
    let bad = env.run(&["topics", "create", "a/b"]).await;
    assert_eq!(bad.status.code(), Some(1));
    let msg = stderr(&bad);
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(
        msg.starts_with("error: InvalidArgument: invalid topic name"),
        "{msg}"
    );
    assert!(bad.stdout.is_empty());

    let missing = env
        .run(&["subscription", "stats", "nowhere", "nobody"])
        .await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).starts_with("error: NotFound: "),
        "{}",
        stderr(&missing)
    );

    // Usage errors exit with 2.
    let usage = env.run(&["produce", "t"]).await;
    assert_eq!(usage.status.code(), Some(2));
    let usage = env
        .run(&["dlq", "list", "t", "s", "--since", "last tuesday"])
        .await;
    assert_eq!(usage.status.code(), Some(2));

    // No broker there.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let down = env.run(&["--url", &url, "topics", "list"]).await;
    assert_eq!(down.status.code(), Some(1));
    let msg = stderr(&down);
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(
        msg.starts_with("error: Unavailable: cannot reach the broker at"),
        "{msg}"
    );
}
