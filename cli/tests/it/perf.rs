//! End-to-end tests of `ricochet perf`: `produce` and `redeliver` runs
//! against a broker, their JSON summaries and the table output.

use crate::common;

use common::{Env, u};
use serde_json::Value;

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
