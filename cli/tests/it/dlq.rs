//! End-to-end tests of `ricochet dlq`: listing with filters, peeking,
//! replaying and purging dead letters, and the refusal of destructive
//! commands without a terminal or `--yes`.

use crate::common;

use common::{Env, stderr, u};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_peek_replay_purge_round_trip() {
    let env = Env::start().await;
    env.ok(&[
        "produce", "pay", "-m", "charge 1", "-m", "charge 2", "-m", "charge 3",
    ])
    .await;
    // Every delivery fails; after 1 redelivery the policy dead-letters.
    let seen = env.nack_all("pay", "card declined").await;
    assert_eq!(seen.len(), 6, "each message delivered twice: {seen:?}");

    let stats = env.json(&["subscription", "stats", "pay", "billing"]).await;
    assert_eq!(u(&stats["dead_lettered"]), 3, "{stats}");
    assert_eq!(u(&stats["backlog"]), 0, "{stats}");

    let list = env.json(&["dlq", "list", "pay", "billing"]).await;
    assert_eq!(u(&list["total"]), 3);
    let letters = list["dead_letters"].as_array().expect("dead letters");
    assert_eq!(letters.len(), 3);
    let first = &letters[0];
    assert_eq!(first["origin"]["topic"], "persistent://public/default/pay");
    assert_eq!(u(&first["delivery_count"]), 2);
    assert!(
        first["reason"]
            .as_str()
            .expect("reason")
            .contains("max_redeliver_count 1")
    );
    assert_eq!(
        first["message"]["properties"]["REAL_TOPIC"],
        "persistent://public/default/pay"
    );
    let ids: Vec<u64> = letters.iter().map(|d| u(&d["entry_id"])).collect();

    // Filters: by text found in the attempts, and by time.
    let by_reason = env
        .json(&["dlq", "list", "pay", "billing", "--reason", "card declined"])
        .await;
    assert_eq!(u(&by_reason["total"]), 3);
    let none = env
        .json(&["dlq", "list", "pay", "billing", "--reason", "no such text"])
        .await;
    assert_eq!(u(&none["total"]), 0);
    let recent = env
        .json(&["dlq", "list", "pay", "billing", "--since", "10m"])
        .await;
    assert_eq!(u(&recent["total"]), 3);
    let future = env
        .json(&[
            "dlq",
            "list",
            "pay",
            "billing",
            "--until",
            "2001-01-01T00:00:00Z",
        ])
        .await;
    assert_eq!(u(&future["total"]), 0);

    let peek = env
        .json(&["dlq", "peek", "pay", "billing", "--id", &ids[1].to_string()])
        .await;
    let one = &peek["dead_letters"][0];
    assert_eq!(one["message"]["payload"], "charge 2");
    let attempts = one["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2);
    assert!(
        attempts
            .iter()
            .all(|a| a["reason"] == "nack" && a["detail"] == "card declined")
    );

    // Destructive commands refuse without a terminal or --yes, and change nothing.
    let refused = env.run(&["dlq", "replay", "pay", "billing"]).await;
    assert_eq!(refused.status.code(), Some(2));
    let msg = stderr(&refused);
    assert!(
        msg.starts_with("error: refusing to replay 3 dead letter(s)"),
        "{msg}"
    );
    assert!(msg.contains("--yes"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
    let refused = env.run(&["dlq", "purge", "pay", "billing"]).await;
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        u(&env.json(&["dlq", "list", "pay", "billing"]).await["total"]),
        3
    );

    // Replay one, with its count reset: it goes back into the subscription's
    // own retry tier (the default).
    let replayed = env
        .json(&[
            "dlq",
            "replay",
            "pay",
            "billing",
            "--id",
            &ids[0].to_string(),
            "--reset-count",
            "--rate",
            "100",
            "--yes",
        ])
        .await;
    assert_eq!(u(&replayed["replayed"]), 1);
    assert_eq!(
        replayed["new_ids"][0]["topic"],
        "persistent://public/default/pay-billing-RETRY"
    );
    let stats = env.json(&["subscription", "stats", "pay", "billing"]).await;
    assert_eq!(u(&stats["dead_lettered"]), 2, "{stats}");
    let again = env
        .json_lines(&[
            "consume",
            "pay",
            "-s",
            "billing",
            "-t",
            "shared",
            "-n",
            "1",
            "--timeout",
            "10s",
        ])
        .await;
    assert_eq!(again[0]["payload"], "charge 1");
    assert_eq!(u(&again[0]["delivery_count"]), 0);

    // Purge the rest.
    let purged = env.json(&["dlq", "purge", "pay", "billing", "--yes"]).await;
    assert_eq!(u(&purged["purged"]), 2);
    let list = env.json(&["dlq", "list", "pay", "billing"]).await;
    assert_eq!(u(&list["total"]), 0);
    let stats = env.json(&["subscription", "stats", "pay", "billing"]).await;
    assert_eq!(u(&stats["dead_lettered"]), 0);
    assert_eq!(u(&stats["backlog"]), 0);
}
