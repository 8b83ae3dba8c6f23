//! `ricochet topics create --partitions`, `topics update-partitions`, and
//! the partitioned topic as a whole in `topics list` and `topics stats`.

use crate::common;

use common::{Env, stderr, u};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_topics_on_the_command_line() {
    let env = Env::start().await;
    let created = env
        .json(&["topics", "create", "orders", "--partitions", "4"])
        .await;
    assert_eq!(created["topic"], "persistent://public/default/orders");
    assert_eq!(u(&created["partitions"]), 4);

    let list = env.json(&["topics", "list"]).await;
    assert_eq!(
        list["partitioned"],
        serde_json::json!([{"topic": "persistent://public/default/orders", "partitions": 4}])
    );
    assert_eq!(list["topics"].as_array().unwrap().len(), 4, "{list}");

    for key in ["a", "b", "c", "d", "e", "f"] {
        env.ok(&["produce", "orders", "-m", "x", "-k", key]).await;
    }
    let stats = env.json(&["topics", "stats", "orders"]).await;
    assert_eq!(u(&stats["partition_count"]), 4);
    assert_eq!(u(&stats["message_count"]), 6);
    let parts = stats["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 4);
    let sum: u64 = parts.iter().map(|p| u(&p["message_count"])).sum();
    assert_eq!(sum, 6);

    let lower = env
        .run(&["topics", "update-partitions", "orders", "2"])
        .await;
    assert_eq!(lower.status.code(), Some(1));
    let msg = stderr(&lower);
    assert!(
        msg.starts_with("error: InvalidArgument: cannot lower the partition count"),
        "{msg}"
    );
    let raised = env
        .json(&["topics", "update-partitions", "orders", "6"])
        .await;
    assert_eq!(u(&raised["partitions"]), 6);
    let table = env.ok(&["topics", "list"]).await;
    let out = String::from_utf8_lossy(&table.stdout);
    assert!(out.contains("partitioned topic"), "{out}");
    assert!(out.contains("orders-partition-5"), "{out}");
}
