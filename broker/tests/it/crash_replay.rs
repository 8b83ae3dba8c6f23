//! Crash tests for dead-letter replay (issue #14): the broker runs as a
//! child process and dies at each step of a replay, then restarts on the
//! same directory; every replayed dead letter must end up in exactly one
//! place — still a dead letter, or delivered once — never both, never lost.
//!
//! Two ways to die: a test failpoint (`RICOCHET_FAILPOINT=<step>`: the
//! broker aborts, as a SIGKILL would, exactly there; see
//! `broker/src/subscription/replay.rs`), and a real SIGKILL in the middle of
//! a paced replay job, which must then resume after the restart and finish
//! without doubling.

use crate::common;
use common::*;
use ricochet_proto::admin_client::AdminClient;
use ricochet_proto::*;
use ricochet_testkit::BrokerProcess;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const TOPIC: &str = "crashy";

async fn admin(url: &str) -> AdminClient<Channel> {
    AdminClient::new(channel(url).await)
}

async fn spawn_with(dir: &Path, failpoint: Option<&str>) -> BrokerProcess {
    let mut o = options().rust_log("error");
    if let Some(f) = failpoint {
        o = o.env("RICOCHET_FAILPOINT", f);
    }
    BrokerProcess::spawn(dir, &o).await
}

fn payloads(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}")).collect()
}

/// Publishes `n` messages; subscription `s` dead-letters each (durably:
/// the terminate's result comes once the move is durable) and `other`
/// subscribes too (it keeps the originals unacked; replayed copies are told
/// apart by their entry ids, `>= n`).
async fn dead_letter(url: &str, n: usize) {
    let mut s = RawConsumer::simple(url, TOPIC, "s", SubscriptionType::Shared).await;
    let _other = RawConsumer::simple(url, TOPIC, "other", SubscriptionType::Shared).await;
    s.flow(n as u32).await;
    let mut p = RawProducer::open(url, TOPIC, "p").await.unwrap();
    let all = payloads(n);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    p.send(&refs).await;
    let got = s.take(n, WAIT).await;
    assert_eq!(got.len(), n);
    for (i, m) in got.iter().enumerate() {
        s.terminate(m.id.clone().unwrap(), "poison", i as u64 + 1)
            .await;
        assert_eq!(s.result(WAIT).await.unwrap().code, 0);
    }
}

async fn dlq_payloads(url: &str) -> Vec<String> {
    admin(url)
        .await
        .list_dead_letters(ListDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .dead_letters
        .iter()
        .map(|d| text(d.message.as_ref().unwrap()))
        .collect()
}

/// Everything `sub` receives (without acking) until `quiet` passes with
/// nothing new, skipping main-topic entries below `first_new`.
async fn received(url: &str, sub: &str, first_new: u64, want: usize) -> Vec<String> {
    let mut c = RawConsumer::simple(url, TOPIC, sub, SubscriptionType::Shared).await;
    c.flow(10_000).await;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Wait generously for what is expected, then a quiet spell for extras.
    while out.len() < want && Instant::now() < deadline {
        let Some(m) = c.next(WAIT).await else { break };
        let id = m.id.as_ref().unwrap();
        if id.topic.ends_with(&format!("/{TOPIC}")) && id.entry_id < first_new {
            continue;
        }
        out.push(text(&m));
    }
    while let Some(m) = c.next(QUIET * 2).await {
        let id = m.id.as_ref().unwrap();
        if id.topic.ends_with(&format!("/{TOPIC}")) && id.entry_id < first_new {
            continue;
        }
        out.push(text(&m));
    }
    out
}

fn counts(list: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for p in list {
        *m.entry(p.clone()).or_default() += 1;
    }
    m
}

/// Each of the `n` payloads is exactly once in `delivered` or `dlq`.
fn exactly_one_place(n: usize, delivered: &[String], dlq: &[String], what: &str) {
    let d = counts(delivered);
    let q = counts(dlq);
    for p in payloads(n) {
        let (a, b) = (
            d.get(&p).copied().unwrap_or(0),
            q.get(&p).copied().unwrap_or(0),
        );
        assert_eq!(
            a + b,
            1,
            "{what}: {p} delivered {a} time(s) and {b} time(s) in the DLQ"
        );
    }
    assert!(
        d.keys().chain(q.keys()).all(|p| payloads(n).contains(p)),
        "{what}: unknown payloads"
    );
}

/// Replays the `n` dead letters of `s` in `mode` with the broker set to die
/// at `failpoint`, restarts it, and returns what `s` then receives, what
/// `other` receives of replayed copies, and the DLQ left.
async fn die_at(
    failpoint: &str,
    mode: ReplayMode,
    n: usize,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let b = spawn_with(dir.path(), Some(failpoint)).await;
    dead_letter(b.url(), n).await;
    let r = admin(b.url())
        .await
        .replay_dead_letters(ReplayDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            mode: mode as i32,
            ..Default::default()
        })
        .await;
    assert!(
        r.is_err(),
        "{failpoint}: the broker should have died: {r:?}"
    );
    b.kill9(); // reaps it (it is already gone)
    let b = spawn_with(dir.path(), None).await;
    let s = received(b.url(), "s", n as u64, n).await;
    let other = if mode == ReplayMode::Topic {
        received(b.url(), "other", n as u64, n).await
    } else {
        Vec::new()
    };
    let dlq = dlq_payloads(b.url()).await;
    b.stop().await;
    (s, other, dlq)
}

#[tokio::test]
async fn a_retry_tier_replay_cut_at_any_step_leaves_each_message_in_one_place() {
    const N: usize = 6;
    // The replay's job was stored before anything moved, so the restarted
    // broker finishes it: whatever the step, each message ends up replayed
    // once (a half-made or doubled move would show here).
    for step in [
        "replay.retry.before_move",
        "replay.retry.after_move",
        "replay.retry.after_flush",
    ] {
        let (s, _, dlq) = die_at(step, ReplayMode::RetryTier, N).await;
        exactly_one_place(N, &s, &dlq, step);
        assert!(dlq.is_empty(), "{step}: the job did not finish: {dlq:?}");
    }
}

#[tokio::test]
async fn a_topic_replay_cut_between_publish_and_removal_is_finished_once() {
    const N: usize = 6;
    for step in ["replay.topic.after_intent", "replay.topic.after_publish"] {
        let (s, other, dlq) = die_at(step, ReplayMode::Topic, N).await;
        // The job and the intent were durable: the restart finishes it.
        assert!(dlq.is_empty(), "{step}: left in the DLQ: {dlq:?}");
        exactly_one_place(N, &s, &dlq, step);
        // Every other subscription sees each replayed message once too.
        exactly_one_place(N, &other, &[], &format!("{step} (other)"));
    }
}

async fn wait_until(what: &str, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A paced replay job killed with SIGKILL part-way resumes after the
/// restart from where it was and replays each dead letter once.
async fn killed_job(mode: ReplayMode) {
    const N: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let b = spawn_with(dir.path(), None).await;
    dead_letter(b.url(), N).await;
    let r = admin(b.url())
        .await
        .replay_dead_letters(ReplayDeadLettersRequest {
            topic: TOPIC.into(),
            subscription: "s".into(),
            mode: mode as i32,
            rate_per_second: 20,
            detach: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.job_id != 0);
    let url = b.url().to_owned();
    wait_until("part of the replay", async || {
        dlq_payloads(&url).await.len() <= N - 6
    })
    .await;
    b.kill9();

    let b = spawn_with(dir.path(), None).await;
    let jobs = admin(b.url())
        .await
        .list_replay_jobs(ListReplayJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    if let Some(j) = jobs.first() {
        assert_eq!((j.id, j.total), (r.job_id, N as u64));
        assert!(
            j.done > 0,
            "resumed from its cursor, not from the start: {j:?}"
        );
    }
    let url = b.url().to_owned();
    wait_until("the resumed job to finish", async || {
        admin(&url)
            .await
            .list_replay_jobs(ListReplayJobsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .jobs
            .is_empty()
    })
    .await;
    let dlq = dlq_payloads(b.url()).await;
    assert!(dlq.is_empty(), "{mode:?}: left in the DLQ: {dlq:?}");
    let s = received(b.url(), "s", N as u64, N).await;
    exactly_one_place(N, &s, &dlq, &format!("{mode:?} job"));
    if mode == ReplayMode::Topic {
        let other = received(b.url(), "other", N as u64, N).await;
        exactly_one_place(N, &other, &[], "topic job (other)");
    }
    b.stop().await;
}

#[tokio::test]
async fn a_paced_retry_tier_replay_killed_part_way_resumes_without_doubling() {
    killed_job(ReplayMode::RetryTier).await;
}

#[tokio::test]
async fn a_paced_topic_replay_killed_part_way_resumes_without_doubling() {
    killed_job(ReplayMode::Topic).await;
}
