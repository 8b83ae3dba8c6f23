//! Tiered storage on the command line, over the broker's `Tiered`
//! service: `topics offload TOPIC` (offload every sealed segment now),
//! `topics offload-status TOPIC` (where each segment is), and the offload
//! policies: `namespaces set-offload|get-offload`, `topics
//! set-offload|get-offload` (consistent with `set-retention`).

use std::time::Duration;

use clap::{ArgGroup, Args};
use ricochet_proto as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::{parse_duration, parse_size};
use crate::error::Result;
use crate::output::write_json;

/// The thresholds of `set-offload`; at least one, or `--clear`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("offload").required(true).multiple(true).args(["after", "local_limit", "delete_lag", "keep_local", "clear"])))]
pub struct OffloadArgs {
    /// Offload sealed segments this long after they were created (`1h`, `0s`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub after: Option<Duration>,
    /// Offload the oldest sealed segments while the topic's local ones hold
    /// more than this (`10GiB`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub local_limit: Option<u64>,
    /// Delete the local copy this long after the offload was verified
    /// (default: at once).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub delete_lag: Option<Duration>,
    /// Never delete local copies (the object store holds a second copy).
    #[arg(long)]
    pub keep_local: bool,
    /// Remove the policy (a topic then follows its namespace's, a
    /// namespace the broker's `[tiered]` default).
    #[arg(long, conflicts_with_all = ["after", "local_limit", "delete_lag", "keep_local"])]
    pub clear: bool,
}

async fn client(
    ctx: &Ctx<'_>,
) -> Result<pb::tiered_client::TieredClient<ricochet_client::Transport>> {
    // The typed admin API has no tiered calls yet: the generated client,
    // on the topic owner's connection when the command is about a topic.
    let client = ctx.client().await?;
    let transport = match &ctx.topic {
        Some(t) => client.transport_for(t).await?,
        None => client.transport(),
    };
    Ok(pb::tiered_client::TieredClient::new(transport))
}

/// `topics offload TOPIC`.
pub(crate) async fn offload(ctx: &mut Ctx<'_>, topic: String) -> Result<()> {
    let r = client(ctx)
        .await?
        .offload(pb::TieredOffloadRequest {
            topic: topic.clone(),
        })
        .await?
        .into_inner();
    #[derive(Serialize)]
    struct Done {
        topic: String,
        offloaded_segments: u32,
        offloaded_bytes: u64,
        local_deleted: u32,
    }
    let d = Done {
        topic,
        offloaded_segments: r.offloaded_segments,
        offloaded_bytes: r.offloaded_bytes,
        local_deleted: r.local_deleted,
    };
    if ctx.json() {
        return write_json(ctx.out, &d);
    }
    writeln!(
        ctx.out,
        "{}: offloaded {} segment(s), {} bytes; {} local cop(y/ies) deleted",
        d.topic, d.offloaded_segments, d.offloaded_bytes, d.local_deleted
    )?;
    Ok(())
}

#[derive(Debug, Serialize)]
struct SegmentView {
    first: u64,
    next: u64,
    state: String,
    bytes: u64,
    object: String,
}

#[derive(Debug, Serialize)]
struct StatusView {
    topic: String,
    local_segments: u32,
    local_bytes: u64,
    offloaded_segments: u32,
    offloaded_bytes: u64,
    remote_only_segments: u32,
    policy: Option<PolicyView>,
    policy_from: String,
    last_error: String,
    segments: Vec<SegmentView>,
}

/// `topics offload-status TOPIC`.
pub(crate) async fn status(ctx: &mut Ctx<'_>, topic: String) -> Result<()> {
    let r = client(ctx)
        .await?
        .offload_status(pb::TieredStatusRequest { topic })
        .await?
        .into_inner();
    let v = StatusView {
        topic: r.topic,
        local_segments: r.local_segments,
        local_bytes: r.local_bytes,
        offloaded_segments: r.offloaded_segments,
        offloaded_bytes: r.offloaded_bytes,
        remote_only_segments: r.remote_only_segments,
        policy: r.effective.map(view),
        policy_from: r.effective_from,
        last_error: r.last_error,
        segments: r
            .segments
            .into_iter()
            .map(|s| SegmentView {
                first: s.first,
                next: s.next,
                state: s.state,
                bytes: s.bytes,
                object: s.object,
            })
            .collect(),
    };
    if ctx.json() {
        return write_json(ctx.out, &v);
    }
    writeln!(
        ctx.out,
        "{}: local {} segment(s), {} bytes; offloaded {} segment(s), {} bytes ({} in the object store only)",
        v.topic,
        v.local_segments,
        v.local_bytes,
        v.offloaded_segments,
        v.offloaded_bytes,
        v.remote_only_segments
    )?;
    writeln!(ctx.out, "policy: {}", describe(&v.policy, &v.policy_from))?;
    if !v.last_error.is_empty() {
        writeln!(ctx.out, "last offload failed: {}", v.last_error)?;
    }
    for s in &v.segments {
        writeln!(
            ctx.out,
            "  {:>20}..{:<20} {:<10} {:>12} B {}",
            s.first, s.next, s.state, s.bytes, s.object
        )?;
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct PolicyView {
    offload_after_ms: Option<i64>,
    local_limit_bytes: Option<i64>,
    delete_lag_ms: Option<i64>,
    keep_local: bool,
}

fn view(p: pb::OffloadPolicy) -> PolicyView {
    PolicyView {
        offload_after_ms: p.offload_after_ms,
        local_limit_bytes: p.local_limit_bytes,
        delete_lag_ms: p.delete_lag_ms,
        keep_local: p.keep_local,
    }
}

fn describe(p: &Option<PolicyView>, from: &str) -> String {
    let Some(p) = p else {
        return "none (segments are offloaded only when asked)".into();
    };
    let d = |ms: i64| humantime::format_duration(Duration::from_millis(ms.max(0) as u64));
    let parts: Vec<String> = [
        p.offload_after_ms
            .map(|ms| format!("offload after {}", d(ms))),
        p.local_limit_bytes
            .map(|b| format!("offload beyond {b} local bytes")),
        p.delete_lag_ms
            .map(|ms| format!("delete local copies {} later", d(ms))),
        p.keep_local.then(|| "keep local copies".to_owned()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let from = if from.is_empty() {
        String::new()
    } else {
        format!(" (from {from})")
    };
    format!("{}{from}", parts.join(", "))
}

#[derive(Debug, Serialize)]
struct PolicyResponseView {
    target: String,
    policy: Option<PolicyView>,
    effective: Option<PolicyView>,
    effective_from: String,
}

fn write(ctx: &mut Ctx<'_>, r: pb::OffloadPolicyResponse) -> Result<()> {
    let v = PolicyResponseView {
        target: r.target,
        policy: r.policy.map(view),
        effective: r.effective.map(view),
        effective_from: r.effective_from,
    };
    if ctx.json() {
        return write_json(ctx.out, &v);
    }
    writeln!(ctx.out, "{}: {}", v.target, describe(&v.policy, ""))?;
    if v.effective_from != v.target {
        writeln!(
            ctx.out,
            "in force: {}",
            describe(&v.effective, &v.effective_from)
        )?;
    }
    Ok(())
}

/// `namespaces|topics set-offload`.
pub(crate) async fn set(
    ctx: &mut Ctx<'_>,
    namespace: String,
    topic: String,
    a: OffloadArgs,
) -> Result<()> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let policy = pb::OffloadPolicy {
        offload_after_ms: a.after.map(ms),
        local_limit_bytes: a.local_limit.map(signed),
        delete_lag_ms: a.delete_lag.map(ms),
        keep_local: a.keep_local,
    };
    let r = client(ctx)
        .await?
        .set_offload_policy(pb::SetOffloadPolicyRequest {
            namespace,
            topic,
            policy: Some(policy),
        })
        .await?
        .into_inner();
    write(ctx, r)
}

/// `namespaces|topics get-offload`.
pub(crate) async fn get(ctx: &mut Ctx<'_>, namespace: String, topic: String) -> Result<()> {
    let r = client(ctx)
        .await?
        .get_offload_policy(pb::GetOffloadPolicyRequest { namespace, topic })
        .await?
        .into_inner();
    write(ctx, r)
}
