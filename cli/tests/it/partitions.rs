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

/// `dlq replay --detach` on a partitioned topic's base name starts a job
/// on each partition and prints each; `dlq jobs` on the base name lists
/// them, and `dlq cancel-job --topic <base>` cancels one by its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_jobs_on_a_base_name_from_the_command_line() {
    let env = Env::start().await;
    env.ok(&["topics", "create", "refunds", "--partitions", "2"])
        .await;
    // Six keys, so both partitions get some (the two jobs below say so),
    // and more than one dead letter each, so a job at 1/s is running.
    for key in ["a", "b", "c", "d", "e", "f"] {
        env.ok(&["produce", "refunds", "-m", "x", "-m", "y", "-k", key])
            .await;
    }
    env.nack_all("refunds", "bad").await;
    let replay = env
        .run(&[
            "dlq", "replay", "refunds", "billing", "--rate", "1", "--detach", "-y",
        ])
        .await;
    assert!(replay.status.success(), "{}", stderr(&replay));
    let out = String::from_utf8_lossy(&replay.stdout);
    assert!(out.contains("2 replay jobs started"), "{out}");
    for p in 0..2 {
        assert!(out.contains(&format!("refunds-partition-{p} (")), "{out}");
    }
    let jobs = env.json(&["dlq", "jobs", "refunds"]).await;
    let jobs = jobs.as_array().expect("a list of jobs");
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    let id = u(&jobs[0]["id"]).to_string();
    env.ok(&["dlq", "cancel-job", &id, "--topic", "refunds"])
        .await;
    let left = env.json(&["dlq", "jobs", "refunds"]).await;
    let left = left.as_array().expect("a list of jobs");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(u(&left[0]["id"]).to_string(), id);
}
