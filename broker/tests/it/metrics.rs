//! The Prometheus endpoint: scraped from a broker child process while a
//! scripted failure scenario runs; the text must parse and the retry and DLQ
//! series must move.

use crate::common;
use common::*;
use ricochet_proto::*;
use ricochet_testkit::BrokerProcess;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn scrape(addr: SocketAddr) -> String {
    // The exporter binds its listener in the background: give it a moment.
    let mut tries = 0;
    let mut s = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => break s,
            Err(e) if tries < 500 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("metrics listener on {addr}: {e}"),
        }
    };
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    assert!(
        body.starts_with("HTTP/1.1 200"),
        "{}",
        body.lines().next().unwrap_or("")
    );
    body.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// Parses Prometheus text exposition: `name{labels} value` lines and `#` comments.
/// Returns `"name{labels}" -> value`; panics on a malformed line.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "bad metric name in {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "unterminated labels in {line}");
        }
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        out.insert(series.to_owned(), v);
    }
    out
}

/// Sum of every series of `name` whose labels contain all of `labels`.
fn value(m: &HashMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    m.iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| *v)
        .sum()
}

#[tokio::test]
async fn retry_and_dead_letter_series_move_with_a_scripted_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics, _) =
        BrokerProcess::spawn_on_free_addr(dir.path(), |a| options().metrics_listen(a)).await;
    let url = broker.url();

    let policy = DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::Backoff(
            BackoffPolicyConfig {
                backoff: Some(backoff_policy_config::Backoff::FixedDelayMs(100)),
                max_redeliver_count: 1,
            },
        )),
        ..Default::default()
    };
    let opts = SubOpts {
        sub_type: SubscriptionType::Shared,
        policy: Some(policy),
        ..Default::default()
    };
    let mut c = RawConsumer::subscribe(url, "metered", "s", opts)
        .await
        .unwrap();
    c.flow(100).await;
    let mut p = RawProducer::open(url, "metered", "p").await.unwrap();
    p.send(&["retry-me", "kill-me"]).await;
    let got = c.take(2, WAIT).await;
    let before = parse(&scrape(metrics).await);
    let sub = "subscription=\"s\"";
    assert_eq!(
        value(&before, "ricochet_messages_published_total", &["metered"]),
        2.0
    );
    assert_eq!(
        value(&before, "ricochet_retries_scheduled_total", &[sub]),
        0.0
    );

    // One retry through the retry tier, then acked: a success.
    c.reconsume_later(
        got[0].id.clone().unwrap(),
        reconsume_later::Delay::DelayMs(50),
        1,
    )
    .await;
    // Two nacks exhaust max_redeliver_count = 1.
    c.nack(got[1].id.clone().unwrap(), "bad", 2).await;
    let again = loop {
        let m = c.next(WAIT).await.expect("redelivery");
        if text(&m) == "kill-me" {
            break m;
        }
        c.ack(vec![m.id.clone().unwrap()], 3).await;
    };
    c.nack(again.id.clone().unwrap(), "still bad", 4).await;
    if let Some(m) = c.next(Duration::from_millis(500)).await {
        c.ack(vec![m.id.clone().unwrap()], 5).await;
    }
    // Gauges are refreshed when the subscription persists its state.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = parse(&scrape(metrics).await);
    assert_eq!(
        value(&after, "ricochet_retries_scheduled_total", &[sub]),
        1.0
    );
    assert_eq!(value(&after, "ricochet_retries_fired_total", &[sub]), 1.0);
    assert_eq!(value(&after, "ricochet_retry_succeeded_total", &[sub]), 1.0);
    assert_eq!(value(&after, "ricochet_retry_success_ratio", &[sub]), 1.0);
    assert_eq!(value(&after, "ricochet_retry_queue_size", &[sub]), 0.0);
    assert_eq!(
        value(
            &after,
            "ricochet_dead_lettered_total",
            &[sub, "reason=\"nack\""]
        ),
        1.0
    );
    assert_eq!(value(&after, "ricochet_dlq_size", &[sub]), 1.0);
    assert_eq!(
        value(
            &after,
            "ricochet_redeliveries_total",
            &[sub, "reason=\"nack\""]
        ),
        2.0
    );
    assert_eq!(
        value(
            &after,
            "ricochet_redeliveries_total",
            &[sub, "reason=\"reconsume_later\""]
        ),
        1.0
    );
    assert_eq!(
        value(&after, "ricochet_retry_delay_seconds_count", &[sub]),
        1.0
    );
    assert!(value(&after, "ricochet_retry_lateness_seconds_count", &[sub]) >= 1.0);
    assert!(value(&after, "ricochet_messages_dispatched_total", &[sub]) >= 4.0);
    assert_eq!(value(&after, "ricochet_backlog_messages", &[sub]), 0.0);
    // Every dispatch records its delivery count: 0 twice, then 1 (retry) and 1 (nack).
    assert!(value(&after, "ricochet_delivery_attempts_count", &[sub]) >= 4.0);
    assert!(value(&after, "ricochet_delivery_attempts_sum", &[sub]) >= 2.0);
    // The storage gauges are refreshed every half second.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = parse(&scrape(metrics).await);
    assert_eq!(value(&after, "ricochet_storage_healthy", &[]), 1.0);
    assert!(value(&after, "ricochet_storage_bytes", &[]) > 0.0);
    // Every series the book's configuration page documents is in the scrape.
    let missing: Vec<String> = documented_metrics()
        .into_iter()
        .filter(|name| !ONLY_WHEN_THROTTLED.contains(&name.as_str()))
        .filter(|name| !ONLY_WHEN_REPLICATED.contains(&name.as_str()))
        .filter(|name| {
            !after.keys().any(|k| {
                let series = k.split('{').next().unwrap_or("");
                series == name || series == format!("{name}_count")
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "documented but never emitted: {missing:?}"
    );
    // So is every series the shipped alerting rules and dashboard use, but
    // the two only a refused limit and a count of connections produce
    // (checked in `limit_rejections_and_connections_are_counted`).
    // The replication panels' series are checked against a cluster, in
    // the client's `replicated_latency`.
    assert_deployed_in(&after, |name| {
        !ONLY_UNDER_LIMITS.contains(&name)
            && !ONLY_WITH_A_BREAKER.contains(&name)
            && !ONLY_WHEN_REPLICATED.iter().any(|r| name.starts_with(r))
    });
    broker.kill9();
}

/// Deployed series this file's failure scenario does not produce.
const ONLY_UNDER_LIMITS: [&str; 2] = ["ricochet_limit_rejections_total", "ricochet_connections"];

/// Documented series only a throttled consumer stream produces (checked
/// in `a_throttled_consumer_stream_is_counted_and_logged`).
const ONLY_WHEN_THROTTLED: [&str; 2] = [
    "ricochet_consumer_stream_throttled_total",
    "ricochet_consumer_streams_throttled",
];

/// Documented series only replicated topics produce: a leader's coalesced
/// Raft entries (checked in the client's `replicated_coalescing`) and the
/// replication latencies (`replicated_latency`), both against a cluster of
/// brokers and etcd.
const ONLY_WHEN_REPLICATED: [&str; 6] = [
    "ricochet_raft_coalesced_entries_total",
    "ricochet_raft_coalesced_commands_total",
    "ricochet_raft_log_append_seconds",
    "ricochet_raft_append_entries_seconds",
    "ricochet_raft_apply_seconds",
    "ricochet_raft_commit_seconds",
];

/// Deployed series only a subscription with an outage breaker exports
/// (checked in `breaker_state_and_trips_are_exported`).
const ONLY_WITH_A_BREAKER: [&str; 2] = ["ricochet_breaker_state", "ricochet_breaker_trips_total"];

/// A subscription's outage breaker: its state gauge (0 closed, 1 open) and
/// its trips counter follow an operator forcing it open and closed.
#[tokio::test]
async fn breaker_state_and_trips_are_exported() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics, _) =
        BrokerProcess::spawn_on_free_addr(dir.path(), |a| options().metrics_listen(a)).await;
    let url = broker.url();
    let _c = RawConsumer::simple(url, "guarded", "s", SubscriptionType::Shared).await;
    let mut admin = ricochet_proto::admin_client::AdminClient::new(channel(url).await);
    admin
        .set_policy(SetPolicyRequest {
            topic: "guarded".into(),
            subscription: "s".into(),
            policy: Some(DeadLetterPolicyConfig {
                breaker: Some(BreakerConfig {
                    failures: 3,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let force = |mode: BreakerMode| SetBreakerRequest {
        topic: "guarded".into(),
        subscription: "s".into(),
        mode: mode as i32,
    };
    let sub = "subscription=\"s\"";
    let m = parse(&scrape(metrics).await);
    assert_eq!(value(&m, "ricochet_breaker_state", &[sub]), 0.0);
    admin
        .set_breaker(force(BreakerMode::ForcedOpen))
        .await
        .unwrap();
    let m = parse(&scrape(metrics).await);
    assert_eq!(value(&m, "ricochet_breaker_state", &[sub]), 1.0);
    assert_eq!(value(&m, "ricochet_breaker_trips_total", &[sub]), 1.0);
    assert_deployed_in(&m, |name| ONLY_WITH_A_BREAKER.contains(&name));
    admin
        .set_breaker(force(BreakerMode::ForcedClosed))
        .await
        .unwrap();
    let m = parse(&scrape(metrics).await);
    assert_eq!(value(&m, "ricochet_breaker_state", &[sub]), 0.0);
    broker.kill9();
}

/// The series names `deploy/` (Prometheus rules, Grafana dashboard) uses.
/// The dashboard is parsed as JSON and must have the shape Grafana imports
/// (panels, each but a row with a query), so a broken file fails here.
fn deployed_metrics() -> Vec<String> {
    let rules = include_str!("../../../deploy/prometheus/ricochet-rules.yml");
    let mut strings: Vec<String> = vec![rules.to_owned()];
    strings.extend(dashboard_strings(include_str!(
        "../../../deploy/grafana/ricochet-dashboard.json"
    )));
    let mut names: Vec<String> = strings
        .iter()
        .flat_map(|f| f.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| w.starts_with("ricochet_") && w.len() > "ricochet_".len())
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 15, "parsed {names:?}");
    names
}

/// Every string in the Grafana dashboard `json` (queries, variables),
/// after checking that it parses and that each panel but a row has a
/// query (`targets[].expr`).
fn dashboard_strings(json: &str) -> Vec<String> {
    let d: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("the dashboard is not JSON: {e}"));
    let panels = d["panels"].as_array().expect("the dashboard has panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for p in panels.iter().filter(|p| p["type"] != "row") {
        let exprs: Vec<&str> = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("a panel without targets: {p}"))
            .iter()
            .filter_map(|t| t["expr"].as_str())
            .filter(|e| e.contains("ricochet_"))
            .collect();
        assert!(!exprs.is_empty(), "a panel without a query: {}", p["title"]);
    }
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            serde_json::Value::Object(o) => o.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&d, &mut out);
    out
}

/// A dashboard that does not parse, or with a panel that queries nothing,
/// is refused (the check above is not one that passes whatever the file).
#[test]
fn a_broken_dashboard_is_refused() {
    let good = include_str!("../../../deploy/grafana/ricochet-dashboard.json");
    assert!(!dashboard_strings(good).is_empty());
    let truncated = &good[..good.len() / 2];
    assert!(std::panic::catch_unwind(|| dashboard_strings(truncated)).is_err());
    let no_query = good.replace("\"expr\"", "\"exp\"");
    assert!(std::panic::catch_unwind(|| dashboard_strings(&no_query)).is_err());
}

/// Asserts that each deployed series name `wanted` keeps is in `scrape`
/// (histograms by their `_bucket` series, as the rules use them).
fn assert_deployed_in(scrape: &HashMap<String, f64>, wanted: impl Fn(&str) -> bool) {
    let missing: Vec<String> = deployed_metrics()
        .into_iter()
        .filter(|name| wanted(name))
        .filter(|name| {
            !scrape
                .keys()
                .any(|k| k.split('{').next() == Some(name.as_str()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "deploy/ names series the broker does not export: {missing:?}"
    );
}

/// The metric names the "Metrics" paragraph of the book's configuration
/// page lists.
fn documented_metrics() -> Vec<String> {
    let readme = include_str!("../../../docs/src/configuration.md");
    let start = readme
        .find("- **Metrics.**")
        .expect("the configuration page documents the metrics");
    let rest = &readme[start + 2..];
    let paragraph = &rest[..rest.find("\n- **").unwrap_or(rest.len())];
    let mut names: Vec<String> = paragraph
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("ricochet_"))
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 15, "parsed {names:?}");
    names
}

/// The retry-queue and DLQ gauges come back after a crash: they are derived
/// from persisted state (the retry tier's cursor), not from in-memory counters.
#[tokio::test]
async fn queue_gauges_are_rebuilt_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics, _) =
        BrokerProcess::spawn_on_free_addr(dir.path(), |a| options().metrics_listen(a)).await;
    let url = broker.url();
    let opts = || SubOpts {
        sub_type: SubscriptionType::Shared,
        ..Default::default()
    };
    let mut c = RawConsumer::subscribe(url, "gauged", "s", opts())
        .await
        .unwrap();
    c.flow(100).await;
    let mut p = RawProducer::open(url, "gauged", "p").await.unwrap();
    p.send(&["a", "b", "c", "d"]).await;
    let got = c.take(4, WAIT).await;
    // Three wait an hour in the retry tier; one is terminated into the DLQ.
    for (i, m) in got[..3].iter().enumerate() {
        c.reconsume_later(
            m.id.clone().unwrap(),
            reconsume_later::Delay::DelayMs(3_600_000),
            i as u64 + 1,
        )
        .await;
    }
    c.terminate(got[3].id.clone().unwrap(), "poison", 4).await;
    for _ in 0..4 {
        let r = c.result(WAIT).await.expect("confirmation");
        assert_eq!(r.code, 0, "{r:?}");
    }
    broker.kill9();

    let broker = BrokerProcess::spawn(dir.path(), &options().metrics_listen(metrics)).await;
    let url = broker.url();
    // The subscription's actors start with the broker; a consumer makes sure
    // this one has persisted and refreshed its gauges at least once.
    let mut c = RawConsumer::subscribe(url, "gauged", "s", opts())
        .await
        .unwrap();
    c.flow(100).await;
    assert!(c.next(Duration::from_millis(300)).await.is_none());
    let m = parse(&scrape(metrics).await);
    let sub = "subscription=\"s\"";
    assert_eq!(value(&m, "ricochet_retry_queue_size", &[sub]), 3.0);
    assert_eq!(value(&m, "ricochet_dlq_size", &[sub]), 1.0);
    // The admin view agrees, with the three due within the hour.
    let stats = ricochet_proto::admin_client::AdminClient::new(channel(url).await)
        .subscription_stats(SubscriptionRequest {
            topic: "gauged".into(),
            subscription: "s".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (stats.scheduled_retries, stats.dead_lettered, stats.backlog),
        (3, 1, 3)
    );
    let by_due: Vec<(&str, u64)> = stats
        .scheduled_by_due
        .iter()
        .map(|b| (b.label.as_str(), b.count))
        .collect();
    assert_eq!(
        by_due,
        [
            ("overdue", 0),
            ("1m", 0),
            ("10m", 0),
            ("1h", 3),
            ("2h", 0),
            ("later", 0)
        ]
    );
    broker.kill9();
}

/// Limits are visible: each refusal counts in
/// `ricochet_limit_rejections_total{limit}`, and `ricochet_connections`
/// follows the connections served.
#[tokio::test]
async fn limit_rejections_and_connections_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(
        &config,
        "max_connections = 3\nmax_topics_per_namespace = 1\nmax_subscriptions_per_topic = 1\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let (broker, metrics, _) = BrokerProcess::spawn_on_free_addr(&data, |a| {
        options()
            .metrics_listen(a)
            .args(["--config".into(), config.clone().into_os_string()])
    })
    .await;
    let url = broker.url();
    let _c = RawConsumer::simple(url, "only", "s", SubscriptionType::Shared).await;
    let e = RawConsumer::subscribe(url, "only", "s2", SubOpts::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    let e = RawProducer::open(url, "second", "p").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    let m = parse(&scrape(metrics).await);
    let rejected = |limit: &str| {
        value(
            &m,
            "ricochet_limit_rejections_total",
            &[&format!("limit=\"{limit}\"")],
        )
    };
    assert_eq!(rejected("subscriptions_per_topic"), 1.0);
    assert_eq!(rejected("topics_per_namespace"), 1.0);
    // The refused calls' connections close a moment after their refusal.
    let connections = || async {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let n = value(&parse(&scrape(metrics).await), "ricochet_connections", &[]);
            if n <= 1.0 || tokio::time::Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert_eq!(connections().await, 1.0, "the consumer's");
    // Three more connections: two fit, the third is refused.
    let held = [channel(url).await, channel(url).await];
    let extra = channel(url).await;
    let admin = ricochet_proto::admin_client::AdminClient::new;
    for ch in &held {
        admin(ch.clone())
            .list_topics(ListTopicsRequest::default())
            .await
            .unwrap();
    }
    let e = admin(extra)
        .list_topics(ListTopicsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    let m = parse(&scrape(metrics).await);
    assert_eq!(value(&m, "ricochet_connections", &[]), 3.0);
    assert_deployed_in(&m, |name| ONLY_UNDER_LIMITS.contains(&name));
    assert_eq!(
        value(
            &m,
            "ricochet_limit_rejections_total",
            &["limit=\"connections\""]
        ),
        1.0
    );
    drop(held);
}

/// Key order's gauges and stats: a key blocked by a failed message is one
/// blocked key with its held messages behind it, blocked since a fixed time
/// and for longer at each look; both gauges go back to zero once the
/// failed message comes back and is acked.
#[tokio::test]
async fn key_order_gauges_and_stats_follow_a_blocked_key() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, metrics, _) =
        BrokerProcess::spawn_on_free_addr(dir.path(), |a| options().metrics_listen(a)).await;
    let url = broker.url();
    let mut c = RawConsumer::simple(url, "ordered", "s", SubscriptionType::Exclusive).await;
    ricochet_proto::admin_client::AdminClient::new(channel(url).await)
        .set_policy(SetPolicyRequest {
            topic: "ordered".into(),
            subscription: "s".into(),
            policy: Some(DeadLetterPolicyConfig {
                key_order: Some(KeyOrderConfig { poison_after_ms: 0 }),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    c.flow(100).await;
    let mut p = RawProducer::open(url, "ordered", "p").await.unwrap();
    let keyed = |p: &mut RawProducer, i: u32| OutboundMessage {
        key: "a".into(),
        ..p.msg(format!("a:{i}"))
    };
    let first = keyed(&mut p, 0);
    p.send_messages(vec![first]).await;
    let m = c.next(WAIT).await.expect("a:0");
    let failed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // Back in 8 s: long enough to look at the block on a loaded machine.
    c.reconsume_later(m.id.unwrap(), reconsume_later::Delay::DelayMs(8_000), 1)
        .await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    let later: Vec<_> = (1..4).map(|i| keyed(&mut p, i)).collect();
    p.send_messages(later).await;

    let sub = "subscription=\"s\"";
    let gauges = |m: &HashMap<String, f64>| {
        (
            value(m, "ricochet_key_order_blocked_keys", &[sub]),
            value(m, "ricochet_key_order_held_messages", &[sub]),
        )
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = gauges(&parse(&scrape(metrics).await));
        if got == (1.0, 3.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "gauges {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // How long: blocked since the failure, for longer at the second look.
    let s1 = sub_stats(url, "ordered", "s").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let s2 = sub_stats(url, "ordered", "s").await;
    assert_eq!((s1.blocked_keys, s2.held_messages), (1, 3), "{s2:?}");
    let since = s1.top_blocked_keys[0].blocked_since_ms;
    assert_eq!(since, s2.top_blocked_keys[0].blocked_since_ms);
    assert!(
        since + 1_000 >= failed_at && since <= failed_at + 1_000,
        "blocked since {since}, failed at {failed_at}"
    );
    assert!(
        s2.oldest_blocked_ms >= s1.oldest_blocked_ms + 300,
        "{} then {}",
        s1.oldest_blocked_ms,
        s2.oldest_blocked_ms
    );

    // The retry comes back first; its ack releases the three held ones,
    // which come one at a time (one message of a key out at a time).
    let back = c.next(Duration::from_secs(15)).await.expect("the retry");
    assert_eq!(text(&back), "a:0");
    c.ack(vec![back.id.unwrap()], 2).await;
    for i in 1..4u64 {
        let m = c.next(WAIT).await.expect("a held message");
        assert_eq!(text(&m), format!("a:{i}"));
        c.ack(vec![m.id.unwrap()], 2 + i).await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = gauges(&parse(&scrape(metrics).await));
        if got == (0.0, 0.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "gauges {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = sub_stats(url, "ordered", "s").await;
    assert_eq!((s.blocked_keys, s.oldest_blocked_ms), (0, 0), "{s:?}");
    broker.kill9();
}

/// A consumer stream flooded with nacks and not read is throttled
/// (`max_pending_requests_per_consumer = 16`): the throttle counter moves,
/// the gauge shows the one stream paused, and the broker logs it at INFO.
#[tokio::test]
async fn a_throttled_consumer_stream_is_counted_and_logged() {
    use futures::StreamExt as _;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, "max_pending_requests_per_consumer = 16\n").unwrap();
    let (broker, metrics, _) = BrokerProcess::spawn_on_free_addr(&dir.path().join("data"), |a| {
        options().metrics_listen(a).config(&config).rust_log("info")
    })
    .await;
    let url = broker.url();
    const TOPIC: &str = "persistent://public/default/flood";
    let subscribe = ConsumeRequest {
        request: Some(consume_request::Request::Subscribe(Subscribe {
            topic: TOPIC.into(),
            subscription: "flood".into(),
            subscription_type: SubscriptionType::Shared as i32,
            ..Default::default()
        })),
    };
    // 1 kB frames, more than the HTTP/2 windows hold (64 KiB ours).
    let nacks = futures::stream::iter(1..=5_000u64).map(|rid| ConsumeRequest {
        request: Some(consume_request::Request::Redeliver(Redeliver {
            request_id: rid,
            messages: vec![FailedDelivery {
                id: Some(MessageId {
                    topic: TOPIC.into(),
                    entry_id: 1_000_000 + rid,
                }),
                detail: "x".repeat(1_000),
                ..Default::default()
            }],
        })),
    });
    let ch = tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .initial_stream_window_size(64 << 10)
        .initial_connection_window_size(64 << 10)
        .connect()
        .await
        .unwrap();
    let _unread = broker_client::BrokerClient::new(ch)
        .consume(futures::stream::once(async { subscribe }).chain(nacks))
        .await
        .expect("subscribed");
    let documented = documented_metrics();
    for name in ONLY_WHEN_THROTTLED {
        assert!(
            documented.iter().any(|d| d == name),
            "{name} is not documented"
        );
    }
    let sub = "subscription=\"flood\"";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let m = parse(&scrape(metrics).await);
        let counted = value(&m, "ricochet_consumer_stream_throttled_total", &[sub]);
        let paused = value(&m, "ricochet_consumer_streams_throttled", &[sub]);
        if counted >= 1.0 && paused == 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "throttled {counted} times, {paused} paused now"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The log is read from the broker's stdout by a thread: a moment.
    let logged = || {
        broker
            .log_tail()
            .iter()
            .any(|l| l.contains("INFO") && l.contains("consumer stream throttled"))
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    while !logged() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no INFO line: {:?}",
            broker.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.kill9();
}
