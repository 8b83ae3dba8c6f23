//! Retention on the command line: `namespaces set-retention|get-retention`
//! and `topics set-retention|get-retention`, over the broker's `Retention`
//! service; and a namespace's replication factor, `namespaces
//! set-replication|get-replication`. A limit is shown as a duration or a byte count with its unit.

use std::time::Duration;

use ricochet_client::admin::RetentionTarget;
use ricochet_proto as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::{NamespacesCommand, QuotaActionArg, RetentionArgs};
use crate::error::Result;
use crate::output::write_json;

/// `namespaces …`.
pub(crate) async fn namespaces(ctx: &mut Ctx<'_>, c: NamespacesCommand) -> Result<()> {
    match c {
        NamespacesCommand::SetRetention { namespace, limits } => {
            set(ctx, namespace, String::new(), limits).await
        }
        NamespacesCommand::GetRetention { namespace } => get(ctx, namespace, String::new()).await,
        NamespacesCommand::SetOffload { namespace, policy } => {
            crate::tiered::set(ctx, namespace, String::new(), policy).await
        }
        NamespacesCommand::GetOffload { namespace } => {
            crate::tiered::get(ctx, namespace, String::new()).await
        }
        NamespacesCommand::SetReplication {
            namespace,
            replicas,
        } => {
            let admin = ctx.admin().await?;
            let r = admin
                .set_namespace_replication(&namespace, replicas)
                .await?;
            write_replication(ctx, r)
        }
        NamespacesCommand::GetReplication { namespace } => {
            let r = ctx.admin().await?.namespace_replication(&namespace).await?;
            write_replication(ctx, r)
        }
    }
}

/// A namespace's replication factor as printed.
#[derive(Debug, Serialize)]
struct ReplicationView {
    namespace: String,
    replicas: Option<u32>,
    effective: u32,
}

fn write_replication(ctx: &mut Ctx<'_>, r: pb::NamespaceReplication) -> Result<()> {
    let v = ReplicationView {
        namespace: r.namespace,
        replicas: (r.replicas > 0).then_some(r.replicas),
        effective: r.effective,
    };
    if ctx.json() {
        return write_json(ctx.out, &v);
    }
    match v.replicas {
        Some(n) => writeln!(ctx.out, "{}: replication factor {n}", v.namespace)?,
        None => writeln!(
            ctx.out,
            "{}: no replication factor of its own; new topics get {} (the cluster's default)",
            v.namespace, v.effective
        )?,
    }
    Ok(())
}

/// A policy as printed.
#[derive(Debug, Serialize)]
struct PolicyView {
    max_age_ms: Option<i64>,
    max_size_bytes: Option<i64>,
    backlog_quota_bytes: Option<i64>,
    quota_action: String,
}

/// A `RetentionResponse` as printed.
#[derive(Debug, Serialize)]
struct RetentionView {
    target: String,
    policy: Option<PolicyView>,
    effective: Option<PolicyView>,
    effective_from: String,
}

fn view(p: Option<pb::RetentionPolicy>) -> Option<PolicyView> {
    p.map(|p| PolicyView {
        max_age_ms: p.max_age_ms,
        max_size_bytes: p.max_size_bytes,
        backlog_quota_bytes: p.backlog_quota_bytes,
        quota_action: p.quota_action,
    })
}

fn describe(p: &Option<PolicyView>) -> String {
    let Some(p) = p else {
        return "none (messages are kept until consumed)".into();
    };
    let age = p.max_age_ms.map(|ms| {
        let d = Duration::from_millis(ms.max(0) as u64);
        format!("max age {}", humantime::format_duration(d))
    });
    let size = p.max_size_bytes.map(|b| format!("max size {}", bytes(b)));
    let quota = p.backlog_quota_bytes.map(|b| {
        format!(
            "backlog quota {} ({})",
            bytes(b),
            p.quota_action.replace('_', "-")
        )
    });
    [age, size, quota]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
}

fn bytes(b: i64) -> String {
    const UNITS: [(&str, i64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if b >= size && b % size == 0 {
            return format!("{}{unit}", b / size);
        }
    }
    format!("{b} B")
}

/// What a command's policy is set on: exactly one of `namespace` and
/// `topic` is given (the other is empty).
fn target(namespace: String, topic: String) -> RetentionTarget {
    if topic.is_empty() {
        RetentionTarget::Namespace(namespace)
    } else {
        RetentionTarget::Topic(topic)
    }
}

fn write(ctx: &mut Ctx<'_>, r: pb::RetentionResponse, topic: bool) -> Result<()> {
    let v = RetentionView {
        target: r.target,
        policy: view(r.policy),
        effective: view(r.effective),
        effective_from: r.effective_from,
    };
    if ctx.json() {
        return write_json(ctx.out, &v);
    }
    writeln!(ctx.out, "{}: {}", v.target, describe(&v.policy))?;
    if topic && v.effective_from != v.target {
        let from = if v.effective_from.is_empty() {
            "no policy applies".to_owned()
        } else {
            format!("from {}", v.effective_from)
        };
        writeln!(ctx.out, "in force ({from}): {}", describe(&v.effective))?;
    }
    Ok(())
}

/// Sets (or with `--clear` removes) a namespace's or topic's policy.
pub(crate) async fn set(
    ctx: &mut Ctx<'_>,
    namespace: String,
    topic: String,
    limits: RetentionArgs,
) -> Result<()> {
    let signed = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let policy = pb::RetentionPolicy {
        max_age_ms: limits.max_age.map(|d| signed(d.as_millis() as u64)),
        max_size_bytes: limits.max_size.map(signed),
        backlog_quota_bytes: limits.backlog_quota.map(signed),
        quota_action: match limits.quota_action {
            None | Some(QuotaActionArg::Refuse) => String::new(),
            Some(QuotaActionArg::DropOldest) => "drop_oldest".into(),
        },
    };
    let is_topic = !topic.is_empty();
    let r = ctx
        .admin()
        .await?
        .set_retention(&target(namespace, topic), policy)
        .await?;
    write(ctx, r, is_topic)
}

/// Shows a namespace's or topic's policy.
pub(crate) async fn get(ctx: &mut Ctx<'_>, namespace: String, topic: String) -> Result<()> {
    let is_topic = !topic.is_empty();
    let r = ctx
        .admin()
        .await?
        .retention(&target(namespace, topic))
        .await?;
    write(ctx, r, is_topic)
}
