//! End-to-end tests of the `ricochet` binary's publish and subscribe
//! commands: `produce` and `consume` round trips, subscription stats with
//! scheduled retries, and `message get` with a message's state and failure
//! history. Each test starts its own broker (see [`common::Env`]).

use crate::common;

use common::{Env, stderr, u};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_consume_round_trip() {
    let env = Env::start().await;
    let sent = env
        .json(&[
            "produce",
            "rt",
            "-m",
            "hello",
            "-m",
            "world",
            "-k",
            "user-7",
            "-p",
            "source=test",
            "-p",
            "n=1",
        ])
        .await;
    assert_eq!(u(&sent["sent"]), 2);
    assert_eq!(u(&sent["ids"][1]["entry_id"]), 1);

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("binary.bin");
    std::fs::write(&file, [0xffu8, 0x00, 0x10]).expect("write file");
    env.json(&["produce", "rt", "-f", file.to_str().expect("utf8 path")])
        .await;

    let msgs = env
        .json_lines(&[
            "consume",
            "rt",
            "-s",
            "reader",
            "-n",
            "3",
            "--timeout",
            "10s",
        ])
        .await;
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert_eq!(msgs[0]["payload"], "hello");
    assert_eq!(msgs[1]["payload"], "world");
    assert_eq!(msgs[0]["key"], "user-7");
    assert_eq!(msgs[0]["properties"]["source"], "test");
    assert_eq!(msgs[0]["properties"]["n"], "1");
    assert_eq!(u(&msgs[0]["delivery_count"]), 0);
    assert_eq!(msgs[0]["id"]["topic"], "persistent://public/default/rt");
    assert_eq!(msgs[2]["payload_hex"], "ff0010");
    assert!(msgs[2].get("payload").is_none());

    let stats = env.json(&["subscriptions", "stats", "rt", "reader"]).await;
    assert_eq!(u(&stats["backlog"]), 0, "{stats}");
    assert_eq!(stats["type"], "exclusive");
    let subs = env.json(&["subscriptions", "list", "rt"]).await;
    assert_eq!(subs["subscriptions"], serde_json::json!(["reader"]));

    // Nothing left: an idle timeout ends the command successfully.
    let none = env
        .json_lines(&[
            "consume",
            "rt",
            "-s",
            "reader",
            "-n",
            "1",
            "--timeout",
            "300ms",
        ])
        .await;
    assert!(none.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_stats_show_scheduled_retries() {
    let env = Env::start().await;
    env.ok(&["produce", "sched", "-m", "retry me"]).await;
    // Delay levels route a nack through the retry tier: the broker holds it
    // for 10 minutes, whether or not a consumer is connected.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    env.ok(&[
        "consume",
        "sched",
        "-s",
        "slow",
        "-t",
        "shared",
        "-n",
        "1",
        "--nack",
        "--policy",
        "delay-levels:levels=10m,start=1,max=1",
        "--timeout",
        "10s",
    ])
    .await;
    let stats = env.json(&["subscription", "stats", "sched", "slow"]).await;
    assert_eq!(stats["type"], "shared");
    assert_eq!(u(&stats["scheduled_retries"]), 1, "{stats}");
    let buckets = stats["scheduled_by_due"].as_array().expect("buckets");
    let total: u64 = buckets.iter().map(|b| u(&b["count"])).sum();
    assert_eq!(total, 1, "{stats}");
    // Scheduled 10 minutes out when asked a moment later: "within 10m".
    let ten = buckets
        .iter()
        .find(|b| b["due"] == "10m")
        .expect("10m bucket");
    assert_eq!(u(&ten["count"]), 1, "{stats}");
    assert_eq!(u(&stats["backlog"]), 1, "{stats}");
    assert_eq!(u(&stats["dead_lettered"]), 0, "{stats}");
    let due = u(&stats["next_retry_due_ms"]);
    assert!(
        due >= before + 590_000 && due <= before + 700_000,
        "due {due}, before {before}"
    );
    assert_eq!(
        stats["retry_topic"],
        "persistent://public/default/sched-slow-RETRY"
    );
    assert_eq!(stats["consumers"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_get_shows_state_and_history() {
    let env = Env::start().await;
    env.ok(&["produce", "hist", "-m", "fragile", "-p", "order=9"])
        .await;
    env.ok(&[
        "consume",
        "hist",
        "-s",
        "audit",
        "-n",
        "2",
        "--nack",
        "--nack-reason",
        "downstream 503",
        "--policy",
        "backoff:fixed=100ms,max=5",
        "--timeout",
        "10s",
    ])
    .await;
    // The second nack, still held by the client (100 ms) when `consume`
    // closes, is handed to the broker with the rest of its delay: after it,
    // the message is pending again.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let info = env.json(&["message", "get", "hist", "0"]).await;
    assert_eq!(info["message"]["payload"], "fragile");
    assert_eq!(info["message"]["properties"]["order"], "9");
    let subs = info["subscriptions"].as_array().expect("subscriptions");
    assert_eq!(subs.len(), 1, "{info}");
    assert_eq!(subs[0]["subscription"], "audit");
    assert_eq!(subs[0]["state"], "pending", "{info}");
    // Two failures, both recorded as nacks with their reason.
    assert_eq!(u(&subs[0]["delivery_count"]), 2, "{info}");
    let attempts = subs[0]["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{info}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a["reason"], "nack", "{info}");
        assert_eq!(a["detail"], "downstream 503", "{info}");
        assert_eq!(u(&a["delivery_count"]), i as u64 + 1);
    }

    // Once the policy gives up, the state is dead_lettered and the history
    // is complete: a dead-letter decision is sent at once, never held.
    env.ok(&["produce", "hist", "-m", "doomed"]).await;
    env.ok(&[
        "consume",
        "hist",
        "-s",
        "strict",
        "-n",
        "0",
        "--nack",
        "--nack-reason",
        "schema mismatch",
        "--policy",
        "backoff:fixed=100ms,max=1",
        "--timeout",
        "3s",
    ])
    .await;
    let info = env.json(&["message", "get", "hist", "1"]).await;
    let strict = info["subscriptions"]
        .as_array()
        .expect("subscriptions")
        .iter()
        .find(|s| s["subscription"] == "strict")
        .expect("strict subscription")
        .clone();
    assert_eq!(strict["state"], "dead_lettered", "{info}");
    assert_eq!(u(&strict["delivery_count"]), 2, "{info}");
    let attempts = strict["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{info}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a["reason"], "nack");
        assert_eq!(a["detail"], "schema mismatch");
        assert_eq!(u(&a["delivery_count"]), i as u64 + 1);
    }

    let missing = env.run(&["message", "get", "hist", "99"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).starts_with("error: NotFound: "),
        "{}",
        stderr(&missing)
    );
}
