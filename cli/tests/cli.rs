//! End-to-end tests of the `ricochet` binary: each test starts a broker in
//! this process (`TestBroker` on a fresh data dir and port), runs the real
//! binary as a child process against it, and asserts on its `--output
//! json`, its stderr and its exit code.

use std::process::{Output, Stdio};
use std::time::Duration;

use ricochet_testkit::InProcessBroker;
use serde_json::Value;

struct Env {
    url: String,
    broker: Option<InProcessBroker>,
}

impl Env {
    async fn start() -> Env {
        let broker = InProcessBroker::start().await;
        Env {
            url: broker.url(),
            broker: Some(broker),
        }
    }

    /// Runs `ricochet ARGS` with stdin closed (so never a terminal).
    async fn run(&self, args: &[&str]) -> Output {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_ricochet"))
            .args(args)
            .env("RICOCHET_URL", &self.url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ricochet");
        tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("ricochet {args:?} did not finish in 60 s"))
            .expect("ricochet output")
    }

    /// Runs `ricochet -o json ARGS`, asserts success, parses stdout.
    async fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(&with_json(args)).await;
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ricochet {args:?}: stdout is not JSON ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Runs `ricochet -o json ARGS` (a stream), asserts success, parses each line.
    async fn json_lines(&self, args: &[&str]) -> Vec<Value> {
        let out = self.ok(&with_json(args)).await;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
            .collect()
    }

    async fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "ricochet {args:?} failed ({:?}):\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // `shutdown` may wait on connected clients; a test only needs it gone.
        if let Some(b) = self.broker.take() {
            b.abort();
        }
    }
}

fn with_json<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["-o", "json"];
    v.extend_from_slice(args);
    v
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

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
    let info = env.json(&["message", "get", "hist", "0"]).await;
    assert_eq!(info["message"]["payload"], "fragile");
    assert_eq!(info["message"]["properties"]["order"], "9");
    let subs = info["subscriptions"].as_array().expect("subscriptions");
    assert_eq!(subs.len(), 1, "{info}");
    assert_eq!(subs[0]["subscription"], "audit");
    assert_eq!(subs[0]["state"], "pending", "{info}");
    // Two failures. The second nack is still held by the client (100 ms)
    // when `consume` closes, so the broker may record it as the consumer's
    // loss rather than as a nack: only the first attempt's reason is certain.
    assert_eq!(u(&subs[0]["delivery_count"]), 2, "{info}");
    let attempts = subs[0]["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{info}");
    assert_eq!(attempts[0]["reason"], "nack");
    assert_eq!(attempts[0]["detail"], "downstream 503");
    assert_eq!(u(&attempts[0]["delivery_count"]), 1);
    assert_eq!(u(&attempts[1]["delivery_count"]), 2);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_explain_get_set() {
    let env = Env::start().await;
    let ex = env
        .json(&[
            "policy",
            "explain",
            "delay-levels:levels=10ms 20ms 40ms,start=1,max=3",
        ])
        .await;
    assert_eq!(ex["reason"], "reconsume_later");
    let rows = ex["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    assert_eq!(u(&rows[0]["delay_ms"]), 10);
    assert_eq!(rows[0]["tier"], "retry");
    assert_eq!(u(&rows[2]["cumulative_ms"]), 70);
    assert_eq!(rows[3]["outcome"], "dead_letter");
    assert!(rows[3]["delay_ms"].is_null());
    assert_eq!(ex["truncated"], false);

    let nack = env
        .json(&["policy", "explain", "backoff:min=1s,max-delay=4s,max=4"])
        .await;
    assert_eq!(nack["reason"], "nack");
    let delays: Vec<u64> = nack["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|r| r["delay_ms"].as_u64())
        .collect();
    assert_eq!(delays, [1000, 2000, 4000, 4000]);

    let text = env.ok(&["policy", "explain", "delay-levels"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("     16  2h"), "{text}");

    // A subscription exists once a consumer has subscribed.
    env.ok(&[
        "consume",
        "pol",
        "-s",
        "ops",
        "-n",
        "1",
        "--timeout",
        "200ms",
        "--policy",
        "backoff:fixed=1s,max=3",
    ])
    .await;
    let got = env.json(&["policy", "get", "pol", "ops"]).await;
    assert_eq!(got["source"], "client");
    assert_eq!(got["spec"], "backoff:fixed=1s,max=3");
    assert_eq!(got["policy"]["type"], "backoff");
    assert_eq!(
        got["dead_letter_topic"],
        "persistent://public/default/pol-ops-DLQ"
    );

    let set = env
        .json(&[
            "policy",
            "set",
            "pol",
            "ops",
            "delay-levels:levels=1s 2s,start=1,max=2",
        ])
        .await;
    assert_eq!(set["source"], "admin");
    assert_eq!(set["policy"]["type"], "delay_levels");
    assert_eq!(set["policy"]["max_reconsume_times"], 2);
    let got = env.json(&["policy", "get", "pol", "ops"]).await;
    assert_eq!(got["spec"], "delay-levels:start=1,max=2,levels=1s 2s");

    let cleared = env.json(&["policy", "set", "pol", "ops", "--clear"]).await;
    assert_ne!(cleared["source"], "admin");

    // A malformed spec is a usage error, caught before anything is sent.
    let bad = env
        .run(&["policy", "set", "pol", "ops", "backoff:fixed=1s"])
        .await;
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_peek_replay_purge_round_trip() {
    let env = Env::start().await;
    env.ok(&[
        "produce", "pay", "-m", "charge 1", "-m", "charge 2", "-m", "charge 3",
    ])
    .await;
    // Every delivery fails; after 1 redelivery the policy dead-letters.
    let seen = env
        .json_lines(&[
            "consume",
            "pay",
            "-s",
            "billing",
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

    // Replay one, with its count reset: it goes back to the topic.
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
        "persistent://public/default/pay"
    );
    let stats = env.json(&["subscription", "stats", "pay", "billing"]).await;
    assert_eq!(u(&stats["dead_lettered"]), 2, "{stats}");
    assert_eq!(u(&stats["backlog"]), 1, "{stats}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_produce_and_redeliver_print_summaries() {
    let env = Env::start().await;
    let out = env
        .ok(&[
            "-o",
            "json",
            "perf",
            "produce",
            "--topic",
            "bench",
            "--duration",
            "1s",
            "--rate",
            "300",
            "--size",
            "100",
        ])
        .await;
    let s: Value = serde_json::from_slice(&out.stdout).expect("summary JSON");
    assert_eq!(s["mode"], "produce");
    let n = u(&s["messages"]);
    assert!((150..=400).contains(&n), "{s}");
    assert_eq!(u(&s["errors"]), 0);
    assert_eq!(u(&s["bytes"]), n * 100);
    assert!(s["msg_per_s"].as_f64().expect("rate") > 100.0, "{s}");
    let lat = &s["latency_ms"];
    assert_eq!(u(&lat["samples"]), n);
    let p50 = lat["p50"].as_f64().expect("p50");
    let p99 = lat["p99"].as_f64().expect("p99");
    let max = lat["max"].as_f64().expect("max");
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{lat}");
    let stats = env.json(&["topics", "stats", "bench"]).await;
    assert_eq!(u(&stats["message_count"]), n);

    let text = env
        .ok(&[
            "perf",
            "produce",
            "--topic",
            "bench",
            "--duration",
            "1s",
            "--rate",
            "100",
        ])
        .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("throughput") && text.contains("p999"),
        "{text}"
    );

    let out = env
        .ok(&[
            "-o",
            "json",
            "perf",
            "redeliver",
            "--topic",
            "loop",
            "--duration",
            "1s",
            "--rate",
            "100",
        ])
        .await;
    let s: Value = serde_json::from_slice(&out.stdout).expect("summary JSON");
    assert_eq!(s["mode"], "redeliver");
    assert!(u(&s["messages"]) >= 50, "{s}");
    assert_eq!(s["settings"]["not_redelivered"], 0, "{s}");
    // Every redelivery waited at least the policy's 100 ms.
    assert!(
        s["latency_ms"]["p50"].as_f64().expect("p50") >= 100.0,
        "{s}"
    );
}
