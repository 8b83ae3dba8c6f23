//! The replication latency histograms (`ricochet_replication::latency`)
//! through each broker's `/metrics`, after writes to a topic of factor 3:
//! the leader reports its commits, its log appends and its
//! `AppendEntries` to each of the two followers (label `peer`); every
//! member reports its log appends and applies. Their buckets are the
//! replication ones (from 0.1 ms), not the retry-delay ones every other
//! `_seconds` series has, and they are what the shipped dashboard's
//! replication panels plot. Etcd and three brokers as child processes,
//! each with its own metrics address.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ricochet_testkit::{SpawnOptions, etcd_or_skip, free_addr};

use super::replicated::{ONE_CLUSTER, client, create_r3};
use super::replicated_coalescing::scrape;

/// The `_count` of each series of histogram `name` in a `/metrics` text
/// whose line contains `label` (an empty `label`: every series), with the
/// series (name and labels).
fn counts(text: &str, name: &str, label: &str) -> Vec<(String, u64)> {
    let prefix = format!("{name}_count");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse::<f64>().ok()? as u64))
        })
        .collect()
}

/// The total `_count` of histogram `name`.
fn count(text: &str, name: &str) -> u64 {
    counts(text, name, "").iter().map(|(_, n)| n).sum()
}

#[tokio::test]
async fn each_member_exports_where_a_replicated_writes_time_goes() {
    // The series are in the book's metrics list (the broker's scripted
    // metrics test exempts them: one broker, no group).
    let book = include_str!("../../../docs/src/configuration.md");
    for name in [
        "ricochet_raft_log_append_seconds",
        "ricochet_raft_append_entries_seconds",
        "ricochet_raft_apply_seconds",
        "ricochet_raft_commit_seconds",
    ] {
        assert!(book.contains(name), "{name} is not documented");
    }
    let _one = ONE_CLUSTER.lock().await;
    let Some(etcd) = etcd_or_skip("each_member_exports_where_a_replicated_writes_time_goes").await
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let metrics: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    let brokers = ricochet_testkit::spawn_cluster_each(
        &etcd,
        "rlat",
        3,
        root.path(),
        Duration::from_secs(10),
        &SpawnOptions::new(),
        |i, o| o.metrics_listen(metrics[i]),
    )
    .await;
    let t = "latency";
    let (ids, at) = create_r3(&brokers, t).await;
    let leader = &ids[at];
    let c = client(&brokers[at].url()).await;
    let before = count(&scrape(metrics[at]).await, "ricochet_raft_commit_seconds");
    let p = c.producer(t).batching(false).create().await.unwrap();
    const WRITES: u64 = 50;
    for i in 0..WRITES {
        p.send(vec![i as u8; 100]).await.unwrap();
    }

    // Followers apply once they learn the commit (the next message from
    // the leader), so their series may trail the receipts briefly.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let texts = futures::future::join_all(metrics.iter().map(|m| scrape(*m))).await;
        let lead = &texts[at];
        let peers: BTreeSet<String> = counts(lead, "ricochet_raft_append_entries_seconds", "peer=")
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(series, _)| series)
            .collect();
        let commits = count(lead, "ricochet_raft_commit_seconds") - before;
        let members_ok = texts.iter().all(|t| {
            count(t, "ricochet_raft_log_append_seconds") > 0
                && count(t, "ricochet_raft_apply_seconds") > 0
        });
        if commits >= WRITES && peers.len() == 2 && members_ok {
            // The replication buckets, not the retry-delay ones (whose
            // smallest bound is 1 ms).
            assert!(
                lead.contains("ricochet_raft_commit_seconds_bucket{le=\"0.0001\"}"),
                "the commit histogram lacks the 0.1 ms bucket:\n{}",
                lead.lines()
                    .filter(|l| l.starts_with("ricochet_raft_commit_seconds"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            // So is every replication series the shipped dashboard plots.
            let dashboard = include_str!("../../../deploy/grafana/ricochet-dashboard.json");
            let plotted: BTreeSet<&str> = dashboard
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("ricochet_raft_"))
                .collect();
            assert!(plotted.len() >= 3, "the dashboard plots {plotted:?}");
            for name in &plotted {
                assert!(
                    texts.iter().any(|t| t.lines().any(|l| l.starts_with(name))),
                    "the dashboard plots {name}, which no member exports"
                );
            }
            let sum: f64 = lead
                .lines()
                .find_map(|l| l.strip_prefix("ricochet_raft_commit_seconds_sum "))
                .and_then(|v| v.parse().ok())
                .expect("a commit sum");
            assert!(
                sum > 0.0 && sum / ((commits + before) as f64) < 5.0,
                "commit seconds: sum {sum} over {} commits",
                commits + before
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {WRITES} receipted writes: leader {leader} commits {commits}, peers with AppendEntries {peers:?}, every member appending and applying: {members_ok}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
