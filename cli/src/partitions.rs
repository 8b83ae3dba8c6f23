//! Partitioned topics on the command line: `topics update-partitions`, and
//! the partitioned parts of `topics list` (each partitioned topic with its
//! count) and `topics stats` (a row per partition under the totals).
//! `topics create --partitions N` is one field of the create request.

use std::io::Write;

use ricochet_proto as pb;
use serde::Serialize;

use crate::Ctx;
use crate::error::Result;
use crate::output::{Table, write_json};

/// A partitioned topic and its count.
#[derive(Debug, Serialize)]
pub(crate) struct PartitionedView {
    topic: String,
    partitions: u32,
}

/// Views of the broker's list, sorted by name.
pub(crate) fn views(list: Vec<pb::PartitionedTopicMetadata>) -> Vec<PartitionedView> {
    let mut out: Vec<PartitionedView> = list
        .into_iter()
        .map(|m| PartitionedView {
            topic: m.topic,
            partitions: m.partitions,
        })
        .collect();
    out.sort_by(|a, b| a.topic.cmp(&b.topic));
    out
}

/// The partitioned topics as a second table (nothing when there are none).
pub(crate) fn write_partitioned(out: &mut dyn Write, list: &[PartitionedView]) -> Result<()> {
    if list.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    let mut t = Table::new(&["partitioned topic", ">partitions"]);
    for p in list {
        t.row(vec![p.topic.clone(), p.partitions.to_string()]);
    }
    t.write(out)
}

/// One partition's line of `topics stats`.
#[derive(Debug, Serialize)]
pub(crate) struct PartitionStatsView {
    topic: String,
    message_count: u64,
    producers: u64,
    messages_in: u64,
    backlog: u64,
}

impl PartitionStatsView {
    /// From the broker's per-partition stats.
    pub(crate) fn list(parts: &[pb::TopicStatsResponse]) -> Vec<Self> {
        parts
            .iter()
            .map(|p| Self {
                topic: p.topic.clone(),
                message_count: p.message_count,
                producers: p.producers,
                messages_in: p.messages_in,
                backlog: p.subscriptions.iter().map(|s| s.backlog).sum(),
            })
            .collect()
    }
}

/// The per-partition table of `topics stats` (nothing for an ordinary topic).
pub(crate) fn write_partition_stats(
    out: &mut dyn Write,
    parts: &[PartitionStatsView],
) -> Result<()> {
    if parts.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    let mut t = Table::new(&[
        "partition",
        ">messages stored",
        ">producers",
        ">messages in",
        ">backlog (all subs)",
    ]);
    for p in parts {
        t.row(vec![
            p.topic.clone(),
            p.message_count.to_string(),
            p.producers.to_string(),
            p.messages_in.to_string(),
            p.backlog.to_string(),
        ]);
    }
    t.write(out)
}

/// Creates `topic` as a partitioned topic of `partitions` unless a
/// partitioned topic of that name exists (`perf produce --partitions`).
pub(crate) async fn ensure(
    client: &ricochet_client::Client,
    topic: &str,
    partitions: u32,
) -> Result<()> {
    match client
        .admin()
        .create_partitioned_topic(topic, partitions)
        .await
    {
        Err(e) if e.kind() == ricochet_client::ErrorKind::AlreadyExists => Ok(()),
        r => r.map(drop).map_err(Into::into),
    }
}

/// `topics create TOPIC --partitions N [--replicas R]` (0: the default).
pub(crate) async fn create(
    ctx: &mut Ctx<'_>,
    topic: String,
    partitions: u32,
    replicas: u32,
) -> Result<()> {
    let r = ctx
        .admin()
        .await?
        .create_replicated_partitioned_topic(&topic, partitions, replicas)
        .await?;
    show(ctx, r, "created ", " with")
}

/// `topics update-partitions TOPIC N`.
pub(crate) async fn update(ctx: &mut Ctx<'_>, topic: String, partitions: u32) -> Result<()> {
    let r = ctx
        .admin()
        .await?
        .update_partitions(&topic, partitions)
        .await?;
    show(ctx, r, "", " has")
}

/// Prints a partitioned topic's count: JSON, or `{before}TOPIC{after} N partitions`.
fn show(
    ctx: &mut Ctx<'_>,
    r: pb::PartitionedTopicMetadata,
    before: &str,
    after: &str,
) -> Result<()> {
    let view = PartitionedView {
        topic: r.topic,
        partitions: r.partitions,
    };
    if ctx.json() {
        return write_json(ctx.out, &view);
    }
    writeln!(
        ctx.out,
        "{before}{}{after} {} partitions",
        view.topic, view.partitions
    )?;
    Ok(())
}
