//! The cluster on the command line: `cluster brokers` (the brokers, their
//! load and what each owns) and `cluster lookup TOPIC` (which broker owns a
//! topic, or each partition of a partitioned one), over the broker's
//! `Cluster` service; and [`topic_of`], the topic a command is about, which
//! [`crate::Ctx`] routes topic-scoped calls by (to the owner's broker).

use clap::Subcommand;
use ricochet_client::TopicOwner;
use ricochet_proto as pb;
use ricochet_proto::partitions::partition_name;
use serde::Serialize;

use crate::Ctx;
use crate::args::{
    Command, DlqCommand, MessageCommand, PolicyCommand, SubscriptionsCommand, TopicsCommand,
};
use crate::error::{CliError, Result};
use crate::output::{Table, write_json};
use crate::timearg::Ms;

/// `cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The brokers of the cluster: id, URL, whether live, how many topics
    /// are placed on and owned by each, load, when it registered.
    Brokers {
        /// Also list the topics each broker owns.
        #[arg(long)]
        topics: bool,
    },
    /// Which broker owns a topic (every partition of a partitioned topic):
    /// its id, URL and ownership epoch.
    Lookup {
        /// Topic.
        topic: String,
    },
    /// Moves every topic placed on a broker, with its data, to the other
    /// live brokers, and keeps new topics off it until it restarts (before
    /// taking it down). Each topic is unavailable while it moves; clients
    /// reconnect to its new broker on their own. The broker's replicas of
    /// replicated topics are handed to brokers outside their groups (the
    /// topic served meanwhile). Superusers only. Exits 1 if a topic could
    /// not be moved (it stays, served where it was).
    Drain {
        /// The broker's id (`cluster brokers` lists them).
        broker: String,
    },
    /// Evens out the live brokers: moves topics, with their data, from the
    /// brokers that own the most to those that own the fewest until no two
    /// differ by more than one (a broker added later takes its share).
    /// Superusers only. Exits 1 if a move failed.
    Rebalance {
        /// Print the moves without making them.
        #[arg(long)]
        dry_run: bool,
    },
    /// Moves one topic (or one partition) with its data to another broker.
    /// A replicated topic's leader hands its replica to a broker outside
    /// the group (the topic served while it catches up). Superusers only.
    Move {
        /// Topic.
        topic: String,
        /// The broker to move it to (default: the live broker with the
        /// fewest topics).
        #[arg(long)]
        to: Option<String>,
    },
}

/// The topic a command is about, when its calls go to that topic's owner.
/// Produce, consume and perf route themselves (the client looks their
/// topics up); cluster-wide commands (topic lists, partition counts,
/// namespaces, auth) stay on the given URL.
pub(crate) fn topic_of(cmd: &Command) -> Option<String> {
    let t = |s: &String| Some(s.clone());
    match cmd {
        Command::Topics(c) => match c {
            TopicsCommand::Create {
                topic,
                partitions: None,
                ..
            }
            | TopicsCommand::Delete { topic, .. }
            | TopicsCommand::Stats { topic }
            | TopicsCommand::SetRetention { topic, .. }
            | TopicsCommand::GetRetention { topic }
            | TopicsCommand::Offload { topic }
            | TopicsCommand::OffloadStatus { topic }
            | TopicsCommand::SetOffload { topic, .. }
            | TopicsCommand::GetOffload { topic } => t(topic),
            TopicsCommand::Create { .. }
            | TopicsCommand::List { .. }
            | TopicsCommand::UpdatePartitions { .. } => None,
        },
        Command::Subscriptions(c) => match c {
            SubscriptionsCommand::List { topic }
            | SubscriptionsCommand::Stats { topic, .. }
            | SubscriptionsCommand::Delete { topic, .. } => t(topic),
            SubscriptionsCommand::Breaker(a) => t(&a.topic),
        },
        Command::Message(MessageCommand::Get { topic, .. }) => t(topic),
        Command::Policy(c) => match c {
            PolicyCommand::Get { target } | PolicyCommand::Set { target, .. } => t(&target.topic),
            PolicyCommand::Explain { .. } => None,
        },
        Command::Dlq(c) => match c {
            DlqCommand::List { target, .. }
            | DlqCommand::Peek { target, .. }
            | DlqCommand::Replay { target, .. }
            | DlqCommand::Purge { target, .. }
            | DlqCommand::Export { target, .. }
            | DlqCommand::Import { target, .. } => t(&target.topic),
            DlqCommand::Jobs { topic, .. } | DlqCommand::CancelJob { topic, .. } => topic.clone(),
        },
        Command::Produce(_)
        | Command::Consume(_)
        | Command::Perf(_)
        | Command::Token(_)
        | Command::Auth(_)
        | Command::Namespaces(_)
        | Command::Cluster(_)
        | Command::Events(_) => None,
    }
}

/// One broker as printed.
#[derive(Debug, Serialize)]
struct BrokerView {
    id: String,
    url: String,
    live: bool,
    placed_topics: u64,
    owned_topics: u64,
    load: f64,
    registered_at_ms: u64,
    draining: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    topics: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
struct BrokersView {
    cluster: String,
    brokers: Vec<BrokerView>,
    /// Replicated topics' Raft groups (absent when there are none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    groups: Vec<GroupView>,
}

/// A replicated topic's group as printed.
#[derive(Debug, Serialize)]
struct GroupView {
    topic: String,
    replicas: u32,
    members: Vec<String>,
    /// The member that leads and serves it (where it is placed); empty
    /// while none has taken it.
    leader: String,
    /// The leader's last log index, as its latest report says.
    last_index: u64,
    /// Each member's matched index, lag and health, from that report.
    member_status: Vec<MemberView>,
    /// How old the report is, ms (0: none).
    status_age_ms: u64,
}

/// A member of a replicated topic's group as printed.
#[derive(Debug, Serialize)]
struct MemberView {
    broker_id: String,
    matched_index: u64,
    lag: u64,
    /// `ok`, `lagging`, `down` or `unknown`.
    health: String,
}

/// One topic's (or partition's) owner as printed.
#[derive(Debug, Serialize)]
struct OwnerView {
    topic: String,
    broker_id: String,
    url: String,
    live: bool,
    epoch: u64,
    /// Why there is no live owner (its broker is down).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct LookupView {
    topic: String,
    cluster: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<u32>,
    owners: Vec<OwnerView>,
}

fn unimplemented(ctx: &Ctx<'_>, e: CliError) -> CliError {
    match e {
        CliError::Status {
            code: tonic::Code::Unimplemented,
            ..
        } => CliError::status(
            tonic::Code::Unimplemented,
            format!(
                "the broker at {} has no Cluster service (a version before clusters)",
                ctx.url
            ),
        ),
        e => e,
    }
}

/// Runs `cluster …`.
pub(crate) async fn run(ctx: &mut Ctx<'_>, c: ClusterCommand) -> Result<()> {
    match c {
        ClusterCommand::Brokers { topics } => brokers(ctx, topics).await,
        ClusterCommand::Lookup { topic } => lookup(ctx, topic).await,
        ClusterCommand::Drain { broker } => drain(ctx, broker).await,
        ClusterCommand::Move { topic, to } => move_topic(ctx, topic, to).await,
        ClusterCommand::Rebalance { dry_run } => rebalance(ctx, dry_run).await,
    }
}

/// The moves (topic, from, to) that even out `owned` (broker id → the
/// topics it owns, live brokers that take topics only): one topic at a
/// time from a broker with the most to one with the fewest, until no two
/// differ by more than one. Deterministic: ties go to the smaller id, and
/// a broker gives its last topic by name.
pub(crate) fn plan_moves(
    owned: &std::collections::BTreeMap<String, Vec<String>>,
) -> Vec<(String, String, String)> {
    let mut owned = owned.clone();
    for topics in owned.values_mut() {
        topics.sort();
    }
    let mut moves = Vec::new();
    loop {
        let most = owned
            .iter()
            .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
            .map(|(id, t)| (id.clone(), t.len()));
        let fewest = owned
            .iter()
            .min_by(|a, b| a.1.len().cmp(&b.1.len()).then(a.0.cmp(b.0)))
            .map(|(id, t)| (id.clone(), t.len()));
        let (Some((from, hi)), Some((to, lo))) = (most, fewest) else {
            return moves;
        };
        if hi <= lo + 1 {
            return moves;
        }
        let Some(topic) = owned.get_mut(&from).and_then(Vec::pop) else {
            return moves;
        };
        if let Some(t) = owned.get_mut(&to) {
            t.push(topic.clone());
            t.sort();
        }
        moves.push((topic, from, to));
    }
}

async fn rebalance(ctx: &mut Ctx<'_>, dry_run: bool) -> Result<()> {
    let admin = ctx.admin().await?;
    let r = admin
        .brokers(true)
        .await
        .map_err(|e| unimplemented(ctx, e.into()))?;
    let owned: std::collections::BTreeMap<String, Vec<String>> = r
        .brokers
        .into_iter()
        .filter(|b| b.live && !b.draining)
        .map(|b| (b.id, b.topics))
        .collect();
    let plan = plan_moves(&owned);
    let mut moved = Vec::new();
    let mut failed = Vec::new();
    for (topic, from, to) in &plan {
        if dry_run {
            moved.push(MovedView {
                topic: topic.clone(),
                to_broker: to.clone(),
                entries: 0,
                millis: 0,
            });
            continue;
        }
        match admin.move_topic(topic, Some(to)).await {
            Ok(m) => moved.push(moved_view(m)),
            Err(e) => failed.push(NotMovedView {
                topic: topic.clone(),
                reason: format!("from {from} to {to}: {e}"),
            }),
        }
    }
    if ctx.json() {
        write_json(
            ctx.out,
            &serde_json::json!({ "dry_run": dry_run, "moved": moved, "not_moved": failed }),
        )?;
    } else {
        writeln!(
            ctx.out,
            "{} {} topic(s){}",
            if dry_run { "would move" } else { "moved" },
            moved.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(", {} not moved", failed.len())
            }
        )?;
        if !moved.is_empty() {
            moved_table(&moved).write(ctx.out)?;
        }
        for n in &failed {
            writeln!(ctx.out, "not moved: {}: {}", n.topic, n.reason)?;
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Other(format!(
            "{} topic(s) could not be moved",
            failed.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::plan_moves;
    use std::collections::BTreeMap;

    fn brokers(counts: &[(&str, usize)]) -> BTreeMap<String, Vec<String>> {
        counts
            .iter()
            .map(|(id, n)| {
                (
                    id.to_string(),
                    (0..*n).map(|i| format!("{id}-t{i}")).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_new_broker_takes_its_share_and_no_two_differ_by_more_than_one() {
        let plan = plan_moves(&brokers(&[("b0", 5), ("b1", 4), ("b2", 0)]));
        assert_eq!(plan.len(), 3, "{plan:?}");
        assert!(plan.iter().all(|(_, _, to)| to == "b2"), "{plan:?}");
        assert_eq!(plan.iter().filter(|(_, from, _)| from == "b0").count(), 2);
        // Every topic moves at most once, and only from where it is.
        let mut topics: Vec<&String> = plan.iter().map(|(t, ..)| t).collect();
        topics.dedup();
        assert_eq!(topics.len(), 3);
        assert!(plan.iter().all(|(t, from, _)| t.starts_with(from.as_str())));
        // Already even: nothing; one broker or none: nothing.
        assert!(plan_moves(&brokers(&[("a", 3), ("b", 2), ("c", 3)])).is_empty());
        assert!(plan_moves(&brokers(&[("a", 7)])).is_empty());
        assert!(plan_moves(&BTreeMap::new()).is_empty());
    }
}

#[derive(Debug, Serialize)]
struct MovedView {
    topic: String,
    to_broker: String,
    entries: u64,
    millis: u64,
}

#[derive(Debug, Serialize)]
struct NotMovedView {
    topic: String,
    reason: String,
}

#[derive(Debug, Serialize)]
struct DrainView {
    broker_id: String,
    millis: u64,
    moved: Vec<MovedView>,
    not_moved: Vec<NotMovedView>,
}

fn moved_view(m: pb::TopicMoved) -> MovedView {
    MovedView {
        topic: m.topic,
        to_broker: m.to_broker,
        entries: m.entries,
        millis: m.millis,
    }
}

fn moved_table(moved: &[MovedView]) -> Table {
    let mut t = Table::new(&["topic", "to", ">entries", ">unavailable ms"]);
    for m in moved {
        t.row(vec![
            m.topic.clone(),
            m.to_broker.clone(),
            m.entries.to_string(),
            m.millis.to_string(),
        ]);
    }
    t
}

async fn drain(ctx: &mut Ctx<'_>, broker: String) -> Result<()> {
    let admin = ctx.admin().await?;
    let r = admin
        .drain_broker(&broker)
        .await
        .map_err(|e| unimplemented(ctx, e.into()))?;
    let view = DrainView {
        broker_id: r.broker_id,
        millis: r.millis,
        moved: r.moved.into_iter().map(moved_view).collect(),
        not_moved: r
            .not_moved
            .into_iter()
            .map(|n| NotMovedView {
                topic: n.topic,
                reason: n.reason,
            })
            .collect(),
    };
    if ctx.json() {
        write_json(ctx.out, &view)?;
    } else {
        writeln!(
            ctx.out,
            "broker {}: {} topic(s) moved in {} ms, {} not moved",
            view.broker_id,
            view.moved.len(),
            view.millis,
            view.not_moved.len()
        )?;
        if !view.moved.is_empty() {
            moved_table(&view.moved).write(ctx.out)?;
        }
        for n in &view.not_moved {
            writeln!(ctx.out, "not moved: {}: {}", n.topic, n.reason)?;
        }
    }
    if view.not_moved.is_empty() {
        Ok(())
    } else {
        Err(CliError::Other(format!(
            "{} topic(s) could not be moved off broker {}",
            view.not_moved.len(),
            view.broker_id
        )))
    }
}

async fn move_topic(ctx: &mut Ctx<'_>, topic: String, to: Option<String>) -> Result<()> {
    let admin = ctx.admin().await?;
    let m = admin
        .move_topic(&topic, to.as_deref())
        .await
        .map_err(|e| unimplemented(ctx, e.into()))?;
    let view = moved_view(m);
    if ctx.json() {
        return write_json(ctx.out, &view);
    }
    moved_table(std::slice::from_ref(&view)).write(ctx.out)?;
    Ok(())
}

async fn brokers(ctx: &mut Ctx<'_>, with_topics: bool) -> Result<()> {
    let admin = ctx.admin().await?;
    let r = admin
        .brokers(with_topics)
        .await
        .map_err(|e| unimplemented(ctx, e.into()))?;
    let mut brokers: Vec<BrokerView> = r
        .brokers
        .into_iter()
        .map(|b: pb::BrokerInfo| BrokerView {
            id: b.id,
            url: b.url,
            live: b.live,
            placed_topics: b.placed_topics,
            owned_topics: b.owned_topics,
            load: b.load,
            registered_at_ms: b.registered_at_ms,
            draining: b.draining,
            topics: with_topics.then(|| {
                let mut t = b.topics;
                t.sort();
                t
            }),
        })
        .collect();
    brokers.sort_by(|a, b| a.id.cmp(&b.id));
    let mut groups: Vec<GroupView> = r
        .groups
        .into_iter()
        .map(|g| GroupView {
            topic: g.topic,
            replicas: g.replicas,
            members: g.members,
            leader: g.leader,
            last_index: g.last_index,
            member_status: g
                .member_status
                .into_iter()
                .map(|m| MemberView {
                    broker_id: m.broker_id,
                    matched_index: m.matched_index,
                    lag: m.lag,
                    health: m.health,
                })
                .collect(),
            status_age_ms: g.status_age_ms,
        })
        .collect();
    groups.sort_by(|a, b| a.topic.cmp(&b.topic));
    let view = BrokersView {
        cluster: r.cluster,
        brokers,
        groups,
    };
    if ctx.json() {
        return write_json(ctx.out, &view);
    }
    if view.cluster.is_empty() {
        writeln!(ctx.out, "standalone broker (no cluster)")?;
    } else {
        writeln!(ctx.out, "cluster {}", view.cluster)?;
    }
    let mut t = Table::new(&[
        "id",
        "url",
        "live",
        ">placed",
        ">owned",
        ">load",
        "registered",
    ]);
    for b in &view.brokers {
        t.row(vec![
            b.id.clone(),
            b.url.clone(),
            match (b.live, b.draining) {
                (true, false) => "yes",
                (true, true) => "draining",
                (false, _) => "no",
            }
            .into(),
            b.placed_topics.to_string(),
            b.owned_topics.to_string(),
            format!("{:.1}", b.load),
            if b.registered_at_ms == 0 {
                "-".into()
            } else {
                Ms(b.registered_at_ms).to_string()
            },
        ]);
    }
    t.write(ctx.out)?;
    if !view.groups.is_empty() {
        writeln!(ctx.out)?;
        let mut t = Table::new(&["replicated topic", ">replicas", "members", "leader"]);
        for g in &view.groups {
            t.row(vec![
                g.topic.clone(),
                g.replicas.to_string(),
                g.members.join(","),
                if g.leader.is_empty() {
                    "-".into()
                } else {
                    g.leader.clone()
                },
            ]);
        }
        t.write(ctx.out)?;
        writeln!(ctx.out)?;
        let mut t = Table::new(&["replicated topic", "member", ">matched", ">lag", "health"]);
        for g in &view.groups {
            for m in &g.member_status {
                t.row(vec![
                    g.topic.clone(),
                    m.broker_id.clone(),
                    m.matched_index.to_string(),
                    m.lag.to_string(),
                    m.health.clone(),
                ]);
            }
        }
        t.write(ctx.out)?;
    }
    if with_topics {
        for b in &view.brokers {
            let topics = b.topics.as_deref().unwrap_or_default();
            writeln!(ctx.out)?;
            writeln!(ctx.out, "{} owns {} topic(s):", b.id, topics.len())?;
            for topic in topics {
                writeln!(ctx.out, "  {topic}")?;
            }
        }
    }
    Ok(())
}

fn owner_view(o: TopicOwner) -> OwnerView {
    OwnerView {
        topic: o.topic,
        broker_id: o.broker_id,
        url: o.url,
        live: o.live,
        epoch: o.epoch,
        error: None,
    }
}

async fn lookup(ctx: &mut Ctx<'_>, topic: String) -> Result<()> {
    let admin = ctx.admin().await?;
    let partitioned = admin
        .partitions(&topic)
        .await?
        .map(|m| (m.topic, m.partitions));
    let names: Vec<String> = match &partitioned {
        Some((base, n)) => (0..*n).map(|i| partition_name(base, i)).collect(),
        None => vec![topic.clone()],
    };
    let mut owners = Vec::with_capacity(names.len());
    let mut cluster = String::new();
    let mut down = Vec::new();
    for name in names {
        match admin.lookup(&name).await {
            Ok(o) => {
                cluster.clone_from(&o.cluster);
                owners.push(owner_view(o));
            }
            // One partition down: say so in its row, and fail at the end.
            Err(e) if partitioned.is_some() && e.owner_down().is_some() => {
                let id = e.owner_down().unwrap_or_default().to_owned();
                down.push(id.clone());
                owners.push(OwnerView {
                    topic: name,
                    broker_id: id,
                    url: String::new(),
                    live: false,
                    epoch: 0,
                    error: Some(e.to_string()),
                });
            }
            Err(e) => return Err(unimplemented(ctx, e.into())),
        }
    }
    let view = LookupView {
        topic: partitioned
            .as_ref()
            .map_or_else(|| owners[0].topic.clone(), |(b, _)| b.clone()),
        cluster,
        partitions: partitioned.as_ref().map(|(_, n)| *n),
        owners,
    };
    if ctx.json() {
        write_json(ctx.out, &view)?;
    } else {
        let mut t = Table::new(&["topic", "broker", "url", ">epoch", "live"]);
        for o in &view.owners {
            t.row(vec![
                o.topic.clone(),
                if o.broker_id.is_empty() {
                    "-".into()
                } else {
                    o.broker_id.clone()
                },
                if o.url.is_empty() {
                    "-".into()
                } else {
                    o.url.clone()
                },
                o.epoch.to_string(),
                if o.live { "yes" } else { "DOWN" }.into(),
            ]);
        }
        t.write(ctx.out)?;
    }
    if !down.is_empty() {
        down.sort();
        down.dedup();
        return Err(CliError::status(
            tonic::Code::Unavailable,
            format!(
                "{} partition(s) of {} are unavailable: broker(s) {} down",
                view.owners.iter().filter(|o| !o.live).count(),
                view.topic,
                down.join(", ")
            ),
        ));
    }
    Ok(())
}
