//! End-to-end tests of the dead-letter decisions of `ricochet dlq`
//! (issue #14): dry runs, `list --group-by`, fix and resend
//! (`--payload-file`, `--set-property`, `--unset-property`, `--key`) with
//! its history, `export` / `import` as JSON lines, and `--to-topic`.

use crate::common;

use common::{Env, u};
use serde_json::Value;

/// Produces `payloads` on `topic` (each with properties `schema=v1` and
/// `junk=x`) and dead-letters them in subscription `billing` by nacking each
/// delivery (`backoff:fixed=100ms,max=1`).
async fn dead_letters(env: &Env, topic: &str, payloads: &[&str]) -> Vec<u64> {
    dead_letters_because(env, topic, payloads, "card declined").await
}

/// Like [`dead_letters`], nacking with `reason`; returns every dead letter's
/// id in the subscription (earlier ones included).
async fn dead_letters_because(env: &Env, topic: &str, payloads: &[&str], reason: &str) -> Vec<u64> {
    let mut args = vec!["produce", topic, "-p", "schema=v1", "-p", "junk=x"];
    for p in payloads {
        args.extend(["-m", p]);
    }
    env.ok(&args).await;
    let seen = env.nack_all(topic, reason).await;
    assert_eq!(seen.len(), payloads.len() * 2, "{seen:?}");
    let list = env.json(&["dlq", "list", topic, "billing"]).await;
    list["dead_letters"]
        .as_array()
        .expect("dead letters")
        .iter()
        .map(|d| u(&d["entry_id"]))
        .collect()
}

async fn total(env: &Env, topic: &str) -> u64 {
    u(&env.json(&["dlq", "list", topic, "billing"]).await["total"])
}

async fn consume_one(env: &Env, topic: &str) -> Value {
    let got = env
        .json_lines(&[
            "consume",
            topic,
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
    assert_eq!(got.len(), 1, "{got:?}");
    got[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_and_group_by() {
    let env = Env::start().await;
    let ids = dead_letters(&env, "dry", &["a", "b", "c"]).await;

    let dry = env
        .json(&["dlq", "replay", "dry", "billing", "--dry-run"])
        .await;
    assert_eq!(dry["dry_run"], true);
    assert_eq!(u(&dry["count"]), 3);
    let listed: Vec<u64> = dry["ids"].as_array().unwrap().iter().map(u).collect();
    assert_eq!(listed, ids);
    let dry = env
        .json(&[
            "dlq",
            "purge",
            "dry",
            "billing",
            "--id",
            &ids[1].to_string(),
            "--dry-run",
        ])
        .await;
    assert_eq!((u(&dry["count"]), u(&dry["ids"][0])), (1, ids[1]));
    // Neither asked for confirmation, and nothing changed.
    assert_eq!(total(&env, "dry").await, 3);
    let text = env
        .ok(&["dlq", "purge", "dry", "billing", "--dry-run"])
        .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("would purge 3 dead letter(s)"), "{text}");

    let groups = env
        .json(&["dlq", "list", "dry", "billing", "--group-by", "reason"])
        .await;
    assert_eq!(u(&groups["total"]), 3);
    let g = groups["groups"].as_array().unwrap();
    assert_eq!(g.len(), 1, "{groups}");
    assert_eq!(u(&g[0]["count"]), 3);
    // Grouped by the consumer's reason, with the policy's verdict beside it.
    assert_eq!(g[0]["key"], "card declined", "{groups}");
    assert!(
        g[0]["verdicts"][0]
            .as_str()
            .unwrap()
            .contains("max_redeliver_count"),
        "{groups}"
    );
    let by_verdict = env
        .json(&["dlq", "list", "dry", "billing", "--group-by", "verdict"])
        .await;
    assert!(
        by_verdict["groups"][0]["key"]
            .as_str()
            .unwrap()
            .contains("max_redeliver_count"),
        "{by_verdict}"
    );
    let by_hour = env
        .json(&["dlq", "list", "dry", "billing", "--group-by", "hour"])
        .await;
    assert!(
        by_hour["groups"][0]["key"]
            .as_str()
            .unwrap()
            .ends_with(":00:00Z")
    );
    let by_consumer = env
        .ok(&["dlq", "list", "dry", "billing", "--group-by", "consumer"])
        .await;
    let out = String::from_utf8_lossy(&by_consumer.stdout);
    assert!(out.contains("3 dead letter(s) in 1 group(s)"), "{out}");
    let bad = env
        .run(&["dlq", "list", "dry", "billing", "--group-by", "colour"])
        .await;
    assert_eq!(bad.status.code(), Some(2));
}

/// Six dead letters nacked for two different reasons show two causes in
/// `list`, `peek` and `--group-by reason`, each beside the policy's verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_it_died_is_the_consumers_reason() {
    let env = Env::start().await;
    let timeout = "payment gateway timeout";
    let schema = "schema validation failed: amount < 0";
    dead_letters_because(&env, "why", &["1", "2", "3", "4"], timeout).await;
    dead_letters_because(&env, "why", &["5", "6"], schema).await;

    let groups = env
        .json(&["dlq", "list", "why", "billing", "--group-by", "reason"])
        .await;
    let g = groups["groups"].as_array().unwrap();
    let keys: Vec<(&str, u64)> = g
        .iter()
        .map(|g| (g["key"].as_str().unwrap(), u(&g["count"])))
        .collect();
    assert_eq!(keys, [(timeout, 4), (schema, 2)], "{groups}");
    for g in g {
        assert!(
            g["verdicts"][0]
                .as_str()
                .unwrap()
                .contains("exceeds max_redeliver_count 1"),
            "{groups}"
        );
    }
    let text = env
        .ok(&["dlq", "list", "why", "billing", "--group-by", "reason"])
        .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(timeout) && text.contains(schema), "{text}");
    assert!(text.contains("verdict"), "{text}");

    let list = env.json(&["dlq", "list", "why", "billing"]).await;
    let causes: Vec<&str> = list["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["cause"].as_str().unwrap())
        .collect();
    assert_eq!(causes.iter().filter(|c| **c == timeout).count(), 4);
    assert_eq!(causes.iter().filter(|c| **c == schema).count(), 2);
    let text = env.ok(&["dlq", "list", "why", "billing"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(schema), "{text}");

    // The same six as failure events, filtered to this topic; a purge is
    // one more; a second run of the same reader starts after what it read.
    let events = env
        .json_lines(&["events", "--topic", "why", "--idle", "1s"])
        .await;
    let causes: Vec<&str> = events
        .iter()
        .map(|e| e["cause"].as_str().unwrap())
        .collect();
    assert_eq!(causes, [timeout, timeout, timeout, timeout, schema, schema]);
    assert!(events.iter().all(|e| e["kind"] == "dead_lettered"));
    env.ok(&["dlq", "purge", "why", "billing", "--yes"]).await;
    let text = env
        .ok(&["events", "--kind", "purged", "--idle", "1s"])
        .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("purged  persistent://public/default/why billing  6 dead letter(s)"),
        "{text}"
    );
    assert!(text.ends_with("by anonymous\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fix_and_resend_one_dead_letter() {
    let env = Env::start().await;
    let ids = dead_letters(&env, "fix", &["{\"amount\":\"12\"}"]).await;
    let dir = tempfile::tempdir().unwrap();
    let fixed = dir.path().join("fixed.json");
    std::fs::write(&fixed, "{\"amount\":12}").unwrap();
    let r = env
        .json(&[
            "dlq",
            "replay",
            "fix",
            "billing",
            "--id",
            &ids[0].to_string(),
            "--payload-file",
            fixed.to_str().unwrap(),
            "--set-property",
            "schema=v2",
            "--unset-property",
            "junk",
            "--key",
            "customer-7",
            "--yes",
        ])
        .await;
    assert_eq!(u(&r["replayed"]), 1);
    // Still failing: an edit is a new attempt, so its delivery count starts
    // from 0 again and the policy's one redelivery applies anew: seen
    // twice more (fixed), then back in the DLQ with the edit in its history.
    let seen = env.nack_all("fix", "card declined").await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (u(&seen[0]["delivery_count"]), u(&seen[1]["delivery_count"])),
        (0, 1)
    );
    let m = &seen[0];
    assert_eq!(m["payload"], "{\"amount\":12}");
    assert_eq!(m["key"], "customer-7");
    assert_eq!(m["properties"]["schema"], "v2");
    assert!(m["properties"].get("junk").is_none(), "{m}");
    // Only this subscription saw it: it came from its retry tier.
    assert_eq!(
        m["id"]["topic"],
        "persistent://public/default/fix-billing-RETRY"
    );
    let peek = env.json(&["dlq", "peek", "fix", "billing"]).await;
    let edits = peek["dead_letters"][0]["edits"].as_array().expect("edits");
    assert_eq!(edits.len(), 1, "{peek}");
    assert_eq!(edits[0]["by"], "anonymous");
    assert_eq!(u(&edits[0]["payload_size_before"]), 15);
    assert_eq!(u(&edits[0]["payload_size_after"]), 13);
    assert_eq!(edits[0]["properties_set"][0], "schema");
    assert_eq!(edits[0]["properties_removed"][0], "junk");
    assert_eq!(edits[0]["key_changed"], true);
    let text = env.ok(&["dlq", "peek", "fix", "billing"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("by anonymous: payload 15 → 13 bytes, set schema, removed junk, new key"),
        "{text}"
    );
}

/// `--keep-count` keeps an edited dead letter's delivery count (the
/// default resets it, see above), and `--reset-count` resets an unchanged
/// one's; the confirmation says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_replay_can_keep_its_count() {
    let env = Env::start().await;
    let ids = dead_letters(&env, "keep", &["a", "b"]).await;
    fn replay<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["dlq", "replay", "keep", "billing"];
        args.extend_from_slice(extra);
        args
    }
    let (a, b) = (ids[0].to_string(), ids[1].to_string());
    let asked = env.run(&replay(&["--id", &a, "--key", "k"])).await;
    let question = String::from_utf8_lossy(&asked.stderr);
    assert!(question.contains("delivery count reset"), "{question}");
    let both = env
        .run(&replay(&["--reset-count", "--keep-count", "--yes"]))
        .await;
    assert_eq!(both.status.code(), Some(2), "the two flags conflict");
    let kept = env
        .json(&replay(&[
            "--id",
            &a,
            "--key",
            "k",
            "--keep-count",
            "--yes",
        ]))
        .await;
    assert_eq!(u(&kept["replayed"]), 1);
    let reset = env
        .json(&replay(&["--id", &b, "--reset-count", "--yes"]))
        .await;
    assert_eq!(u(&reset["replayed"]), 1);
    let seen = env.nack_all("keep", "card declined").await;
    let counts = |payload: &str| -> Vec<u64> {
        seen.iter()
            .filter(|m| m["payload"] == payload)
            .map(|m| u(&m["delivery_count"]))
            .collect()
    };
    assert_eq!(counts("a"), vec![2], "edited, count kept: {seen:?}");
    assert_eq!(counts("b"), vec![0, 1], "unchanged, count reset: {seen:?}");
    assert_eq!(total(&env, "keep").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_fix_with_ordinary_tools_and_import() {
    let env = Env::start().await;
    let ids = dead_letters(&env, "batch", &["one", "two", "three"]).await;
    let out = env.ok(&["dlq", "export", "batch", "billing"]).await;
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let exported: Vec<u64> = lines.iter().map(|l| u(&l["id"])).collect();
    assert_eq!(exported, ids);
    assert_eq!(lines[0]["payload"], "b25l", "base64 of `one`");
    assert_eq!(lines[0]["properties"]["schema"], "v1");
    assert!(
        lines[0]["reason"]
            .as_str()
            .unwrap()
            .contains("max_redeliver_count")
    );
    assert_eq!(u(&lines[0]["attempts"]), 2);

    // Fix the second one (new payload, a property), leave the others, drop
    // the third from the batch.
    let mut edited = lines[..2].to_vec();
    edited[1]["payload"] = Value::from("VFdP"); // "TWO"
    edited[1]["properties"]["fixed"] = Value::from("yes");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("batch.jsonl");
    let body: Vec<String> = edited.iter().map(Value::to_string).collect();
    std::fs::write(&file, body.join("\n") + "\n").unwrap();
    let path = file.to_str().unwrap();

    let dry = env
        .json(&["dlq", "import", "batch", "billing", "-f", path, "--dry-run"])
        .await;
    assert_eq!((u(&dry["count"]), u(&dry["edited"])), (2, 1), "{dry}");
    assert_eq!(total(&env, "batch").await, 3, "a dry run changes nothing");
    let refused = env
        .run(&["dlq", "import", "batch", "billing", "-f", path])
        .await;
    assert_eq!(refused.status.code(), Some(2), "no --yes, no terminal");

    let r = env
        .json(&["dlq", "import", "batch", "billing", "-f", path, "--yes"])
        .await;
    assert_eq!(u(&r["replayed"]), 2);
    let left = env.json(&["dlq", "list", "batch", "billing"]).await;
    assert_eq!(u(&left["total"]), 1);
    assert_eq!(u(&left["dead_letters"][0]["entry_id"]), ids[2]);
    let mut got: Vec<(String, Option<String>)> = Vec::new();
    for _ in 0..2 {
        let m = consume_one(&env, "batch").await;
        got.push((
            m["payload"].as_str().unwrap().to_owned(),
            m["properties"]["fixed"].as_str().map(str::to_owned),
        ));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("TWO".to_owned(), Some("yes".to_owned())),
            ("one".to_owned(), None)
        ]
    );
    // Importing the same file again finds them gone: nothing doubles.
    let again = env
        .json(&["dlq", "import", "batch", "billing", "-f", path, "--yes"])
        .await;
    assert_eq!(u(&again["replayed"]), 0);
    // A broken line is a usage error naming the line.
    std::fs::write(&file, "{\"id\": 1, \"payload\": \"***\"}\n").unwrap();
    let bad = env
        .run(&["dlq", "import", "batch", "billing", "-f", path, "--yes"])
        .await;
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        common::stderr(&bad).contains("line 1"),
        "{}",
        common::stderr(&bad)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_topic_replays_for_every_subscription() {
    let env = Env::start().await;
    dead_letters(&env, "all", &["x"]).await;
    // A second subscription (from the earliest message) consumes and acks it.
    let audit = env
        .json_lines(&[
            "consume",
            "all",
            "-s",
            "audit",
            "-n",
            "1",
            "--timeout",
            "10s",
        ])
        .await;
    assert_eq!(audit.len(), 1);
    let r = env
        .json(&["dlq", "replay", "all", "billing", "--to-topic", "--yes"])
        .await;
    assert_eq!(r["new_ids"][0]["topic"], "persistent://public/default/all");
    let again = env
        .json_lines(&[
            "consume",
            "all",
            "-s",
            "audit",
            "-n",
            "1",
            "--timeout",
            "10s",
        ])
        .await;
    assert_eq!(again[0]["payload"], "x", "audit sees it again");
    let bad = env
        .run(&[
            "dlq",
            "replay",
            "all",
            "billing",
            "--to-topic",
            "--delay",
            "1m",
            "--yes",
        ])
        .await;
    assert_eq!(bad.status.code(), Some(2), "--delay is for the retry tier");
}
