//! `ricochet events --follow` and `--subscription`: a follower keeps running
//! past `--idle`, prints an event published after it started, and shows
//! only the subscription it was asked for.

use crate::common;

use std::time::Duration;

use common::Env;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Dead-letters one message of `topic` in subscription `sub` (nacked on
/// each delivery, `backoff:fixed=100ms,max=1`: the second failure
/// dead-letters it).
async fn dead_letter_one(env: &Env, topic: &str, sub: &str) {
    env.ok(&["produce", topic, "-m", &format!("for {sub}")])
        .await;
    env.ok(&[
        "consume",
        topic,
        "-s",
        sub,
        "-t",
        "shared",
        "-n",
        "0",
        "--nack",
        "--nack-reason",
        "card declined",
        "--policy",
        "backoff:fixed=100ms,max=1",
        "--timeout",
        "3s",
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_prints_later_events_of_one_subscription() {
    let env = Env::start().await;
    let mut follower = env.spawn(&[
        "-o",
        "json",
        "events",
        "--follow",
        "--subscription",
        "billing",
        "--idle",
        "500ms",
    ]);
    let mut lines = BufReader::new(follower.stdout.take().unwrap()).lines();
    // Well past `--idle`: without `--follow` it would have stopped.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        follower.try_wait().unwrap().is_none(),
        "the follower stopped"
    );
    // Another subscription's event first, then billing's.
    dead_letter_one(&env, "orders", "audit").await;
    dead_letter_one(&env, "invoices", "billing").await;
    let mut seen: Vec<Value> = Vec::new();
    let wait = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            let done = v["kind"] == "dead_lettered";
            seen.push(v);
            if done {
                break;
            }
        }
    })
    .await;
    assert!(wait.is_ok(), "no event printed: {seen:#?}");
    let e = seen.last().unwrap();
    assert_eq!(e["subscription"], "billing", "{seen:#?}");
    assert_eq!(e["cause"], "card declined", "{e}");
    assert!(
        seen.iter().all(|e| e["subscription"] == "billing"),
        "another subscription's event: {seen:#?}"
    );
    // Still following after printing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        follower.try_wait().unwrap().is_none(),
        "the follower stopped"
    );
    follower.kill().await.unwrap();
    // Nothing else was printed (the audit event never is).
    while let Some(line) = lines.next_line().await.unwrap() {
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["subscription"], "billing", "{line}");
    }
}
