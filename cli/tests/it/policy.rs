//! End-to-end tests of `ricochet policy`: `explain` as JSON and as a
//! table, `get` of a client's policy, `set` and `--clear` by an admin, and
//! a malformed spec rejected as a usage error.

use crate::common;

use common::{Env, stderr, u};

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
