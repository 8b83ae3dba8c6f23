//! The control-plane commands on the admin API: `topics`, `subscriptions`,
//! `message get` and `policy`. Each one is a single unary RPC (two for
//! `policy get`'s schedule, which is computed locally); the answer is turned
//! into a [`crate::view`] and rendered as a table or JSON.

use std::io::Write;

use ricochet_client::MessageId;
use ricochet_policy::{
    DeadLetterPolicy, FailureReason, Outcome, PolicySpec, Tier, explain, explain_table,
};
use ricochet_proto as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::{MessageCommand, PolicyCommand, SubscriptionsCommand, TopicsCommand};
use crate::confirm::confirm;
use crate::error::{CliError, Result};
use crate::output::{Block, Table, write_json};
use crate::view::{MessageInfoView, SubscriptionStatsView, full_topic_name, write_attempts};

#[derive(Debug, Serialize)]
struct TopicList {
    topics: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitioned: Vec<crate::partitions::PartitionedView>,
}

#[derive(Debug, Serialize)]
struct TopicDone {
    topic: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted: Option<bool>,
}

/// `topics stats`.
#[derive(Debug, Serialize)]
struct TopicStatsView {
    topic: String,
    message_count: u64,
    first_entry_id: u64,
    next_entry_id: u64,
    producers: u64,
    messages_in: u64,
    bytes_in: u64,
    subscriptions: Vec<SubscriptionStatsView>,
    #[serde(skip_serializing_if = "is_zero")]
    partition_count: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitions: Vec<crate::partitions::PartitionStatsView>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub(crate) async fn topics(ctx: &mut Ctx<'_>, c: TopicsCommand) -> Result<()> {
    let admin = ctx.admin().await?;
    match c {
        TopicsCommand::List {
            namespace,
            include_system_topics,
        } => {
            let r = admin
                .list_topics(namespace.as_deref(), include_system_topics)
                .await?;
            let mut topics = r.topics;
            topics.sort();
            let partitioned = crate::partitions::views(r.partitioned);
            if ctx.json() {
                return write_json(
                    ctx.out,
                    &TopicList {
                        topics,
                        partitioned,
                    },
                );
            }
            let mut t = Table::new(&["topic"]);
            for topic in topics {
                t.row(vec![topic]);
            }
            t.write(ctx.out)?;
            crate::partitions::write_partitioned(ctx.out, &partitioned)
        }
        TopicsCommand::UpdatePartitions { topic, partitions } => {
            crate::partitions::update(ctx, topic, partitions).await
        }
        TopicsCommand::Create {
            topic,
            partitions: Some(n),
            replicas,
        } => crate::partitions::create(ctx, topic, n, replicas.unwrap_or(0)).await,
        TopicsCommand::Create {
            topic,
            partitions: None,
            replicas,
        } => {
            let r = admin
                .create_replicated_topic(&topic, replicas.unwrap_or(0))
                .await?;
            if ctx.json() {
                return write_json(
                    ctx.out,
                    &TopicDone {
                        topic: r.topic,
                        created: Some(r.created),
                        deleted: None,
                    },
                );
            }
            writeln!(ctx.out, "created {}", r.topic)?;
            Ok(())
        }
        TopicsCommand::Delete { topic, force, yes } => {
            confirm(&format!("delete topic {topic} and all its messages"), yes)?;
            admin.delete_topic(&topic, force).await?;
            if ctx.json() {
                return write_json(
                    ctx.out,
                    &TopicDone {
                        topic,
                        created: None,
                        deleted: Some(true),
                    },
                );
            }
            writeln!(ctx.out, "deleted {topic}")?;
            Ok(())
        }
        TopicsCommand::SetRetention { topic, limits } => {
            crate::retention::set(ctx, String::new(), topic, limits).await
        }
        TopicsCommand::GetRetention { topic } => {
            crate::retention::get(ctx, String::new(), topic).await
        }
        TopicsCommand::Offload { topic } => crate::tiered::offload(ctx, topic).await,
        TopicsCommand::OffloadStatus { topic } => crate::tiered::status(ctx, topic).await,
        TopicsCommand::SetOffload { topic, policy } => {
            crate::tiered::set(ctx, String::new(), topic, policy).await
        }
        TopicsCommand::GetOffload { topic } => crate::tiered::get(ctx, String::new(), topic).await,
        TopicsCommand::Stats { topic } => {
            let r = admin.topic_stats(&topic).await?;
            let partitions = crate::partitions::PartitionStatsView::list(&r.partitions);
            let view = TopicStatsView {
                topic: r.topic,
                message_count: r.message_count,
                first_entry_id: r.first_entry_id,
                next_entry_id: r.next_entry_id,
                producers: r.producers,
                messages_in: r.messages_in,
                bytes_in: r.bytes_in,
                subscriptions: r
                    .subscriptions
                    .iter()
                    .map(SubscriptionStatsView::from_proto)
                    .collect(),
                partition_count: r.partition_count,
                partitions,
            };
            if ctx.json() {
                return write_json(ctx.out, &view);
            }
            let mut b = Block::new();
            b.kv("topic", &view.topic)
                .kv("messages stored", view.message_count)
                .kv(
                    "entry ids",
                    format!("{} .. {}", view.first_entry_id, view.next_entry_id),
                )
                .kv("producers", view.producers)
                .kv("messages in", view.messages_in)
                .kv("bytes in", view.bytes_in)
                .kv("subscriptions", view.subscriptions.len());
            b.write(ctx.out, 0)?;
            if !view.subscriptions.is_empty() {
                writeln!(ctx.out)?;
                subscription_table(&view.subscriptions).write(ctx.out)?;
            }
            crate::partitions::write_partition_stats(ctx.out, &view.partitions)
        }
    }
}

/// One row per subscription: the `mqadmin consumerProgress` view.
fn subscription_table(subs: &[SubscriptionStatsView]) -> Table {
    let mut t = Table::new(&[
        "subscription",
        "type",
        ">backlog",
        ">unacked",
        ">scheduled",
        "next retry",
        ">dead-lettered",
        ">consumers",
    ]);
    for s in subs {
        t.row(vec![
            s.subscription.clone(),
            s.sub_type.clone(),
            s.backlog.to_string(),
            s.unacked.to_string(),
            s.scheduled_retries.to_string(),
            if s.next_retry_due_ms == 0 {
                "-".to_owned()
            } else {
                crate::timearg::fmt_relative(s.next_retry_due_ms)
            },
            s.dead_lettered.to_string(),
            s.consumers.len().to_string(),
        ]);
    }
    t
}

#[derive(Debug, Serialize)]
struct SubscriptionList {
    topic: String,
    subscriptions: Vec<String>,
}

#[derive(Debug, Serialize)]
struct SubscriptionDeleted {
    topic: String,
    subscription: String,
    deleted: bool,
}

pub(crate) async fn subscriptions(ctx: &mut Ctx<'_>, c: SubscriptionsCommand) -> Result<()> {
    let admin = ctx.admin().await?;
    match c {
        SubscriptionsCommand::List { topic } => {
            let subscriptions = admin.list_subscriptions(&topic).await?;
            if ctx.json() {
                return write_json(
                    ctx.out,
                    &SubscriptionList {
                        topic: full_topic_name(&topic),
                        subscriptions,
                    },
                );
            }
            let mut t = Table::new(&["subscription"]);
            for s in subscriptions {
                t.row(vec![s]);
            }
            t.write(ctx.out)
        }
        SubscriptionsCommand::Stats {
            topic,
            subscription,
        } => {
            let r = admin.subscription_stats(&topic, &subscription).await?;
            let view = SubscriptionStatsView::from_proto(&r);
            if ctx.json() {
                return write_json(ctx.out, &view);
            }
            view.write_table(ctx.out)
        }
        SubscriptionsCommand::Delete {
            topic,
            subscription,
            force,
            yes,
        } => {
            confirm(
                &format!(
                    "delete subscription {subscription} of {topic} with its retry schedule and dead letters"
                ),
                yes,
            )?;
            admin
                .delete_subscription(&topic, &subscription, force)
                .await?;
            if ctx.json() {
                return write_json(
                    ctx.out,
                    &SubscriptionDeleted {
                        topic,
                        subscription,
                        deleted: true,
                    },
                );
            }
            writeln!(ctx.out, "deleted subscription {subscription} of {topic}")?;
            Ok(())
        }
        SubscriptionsCommand::Breaker(a) => crate::breaker::force(ctx, a).await,
    }
}

pub(crate) async fn message(ctx: &mut Ctx<'_>, c: MessageCommand) -> Result<()> {
    let MessageCommand::Get { topic, id } = c;
    let admin = ctx.admin().await?;
    let r = admin.message(&MessageId::new(topic, id)).await?;
    let mut view = MessageInfoView::from_proto(&r);
    // The broker echoes the id as asked; show the full topic name.
    view.message.id.topic = full_topic_name(&view.message.id.topic);
    if ctx.json() {
        return write_json(ctx.out, &view);
    }
    view.message.block().write(ctx.out, 0)?;
    if view.subscriptions.is_empty() {
        writeln!(ctx.out, "\n(no subscription on this topic)")?;
    }
    for s in &view.subscriptions {
        writeln!(
            ctx.out,
            "\nsubscription {}: {} (delivery count {})",
            s.subscription, s.state, s.delivery_count
        )?;
        write_attempts(ctx.out, &s.attempts, 2)?;
    }
    Ok(())
}

/// A subscription's policy (`policy get` / `policy set`).
#[derive(Debug, Serialize)]
struct PolicyView {
    topic: String,
    subscription: String,
    /// `admin`, `client`, `config` or `default`.
    source: String,
    /// The compact form, `None` when no policy is in force.
    spec: Option<String>,
    /// The policy as structured JSON (the broker's config format).
    policy: Option<PolicySpec>,
    retry_topic: String,
    dead_letter_topic: String,
    /// Per-key ordered retries, when on.
    #[serde(skip_serializing_if = "Option::is_none")]
    key_order: Option<ricochet_policy::KeyOrder>,
    /// The outage breaker in force, compact form.
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker: Option<String>,
}

impl PolicyView {
    fn new(topic: String, subscription: String, r: pb::PolicyResponse) -> Result<Self> {
        let cfg = r.policy.unwrap_or_default();
        let policy = match &cfg.kind {
            Some(_) => Some(PolicySpec::try_from(&cfg).map_err(|e| {
                CliError::Other(format!(
                    "the broker sent a policy this CLI cannot read: {e}"
                ))
            })?),
            None => None,
        };
        Ok(Self {
            topic: full_topic_name(&topic),
            subscription,
            source: if r.source.is_empty() {
                "default".to_owned()
            } else {
                r.source
            },
            spec: policy.as_ref().map(ToString::to_string),
            policy,
            breaker: cfg
                .breaker
                .as_ref()
                .and_then(|b| ricochet_policy::BreakerSpec::try_from(b).ok())
                .map(|b| b.to_string()),
            retry_topic: cfg.retry_topic,
            dead_letter_topic: cfg.dead_letter_topic,
            key_order: cfg.key_order.as_ref().map(Into::into),
        })
    }

    fn write_table(&self, out: &mut dyn Write) -> Result<()> {
        let mut b = Block::new();
        b.kv("topic", &self.topic)
            .kv("subscription", &self.subscription)
            .kv(
                "policy",
                self.spec
                    .as_deref()
                    .unwrap_or("none (nacks redeliver forever)"),
            )
            .kv("source", &self.source);
        if let Some(k) = &self.key_order {
            b.kv("ordering", k.to_string());
        }
        if let Some(br) = &self.breaker {
            b.kv("breaker", br);
        }
        if !self.retry_topic.is_empty() {
            b.kv("retry topic", &self.retry_topic);
        }
        if !self.dead_letter_topic.is_empty() {
            b.kv("dead-letter topic", &self.dead_letter_topic);
        }
        b.write(out, 0)?;
        if let Some(p) = self.policy.as_ref().and_then(|p| p.build().ok()) {
            writeln!(out)?;
            write!(out, "{}", explain_table(&*p, default_reason(&*p)))?;
        }
        Ok(())
    }
}

/// The failure a schedule is explained for by default: `reconsume_later`
/// for policies that use the retry tier (delay levels), `nack` otherwise.
fn default_reason(p: &dyn DeadLetterPolicy) -> FailureReason {
    match p.spec() {
        Some(PolicySpec::DelayLevels { .. }) => FailureReason::ReconsumeLater,
        _ => FailureReason::Nack,
    }
}

#[derive(Debug, Serialize)]
struct ExplainRowView {
    attempt: u32,
    /// `None` for the dead letter.
    delay_ms: Option<u64>,
    cumulative_ms: u64,
    /// `redeliver` or `dead_letter`.
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tier: Option<Tier>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_letter_reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct ExplainView {
    policy: String,
    reason: FailureReason,
    rows: Vec<ExplainRowView>,
    /// True when the schedule was cut before a dead letter.
    truncated: bool,
    /// `--breaker`, described.
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker: Option<crate::breaker::BreakerExplainView>,
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) async fn policy(ctx: &mut Ctx<'_>, c: PolicyCommand) -> Result<()> {
    match c {
        PolicyCommand::Explain {
            spec,
            reason,
            breaker,
        } => {
            let p = spec.build().map_err(|e| {
                CliError::Usage(format!(
                    "cannot explain {spec}: {e} (named policies are only known to the broker that registers them)"
                ))
            })?;
            let reason = reason.unwrap_or_else(|| default_reason(&*p));
            if !ctx.json() {
                write!(ctx.out, "{}", explain_table(&*p, reason))?;
                if let Some(b) = &breaker {
                    crate::breaker::explain(ctx.out, b)?;
                }
                return Ok(());
            }
            let rows = explain(&*p, reason);
            let truncated = rows.last().is_some_and(|r| r.delay.is_some());
            let view = ExplainView {
                policy: spec.to_string(),
                reason,
                truncated,
                breaker: breaker
                    .as_ref()
                    .map(crate::breaker::BreakerExplainView::new),
                rows: rows
                    .into_iter()
                    .map(|r| {
                        let (outcome, tier, dead_letter_reason) = match r.outcome {
                            Outcome::Redeliver(t) => ("redeliver", Some(t), None),
                            Outcome::DeadLetter { reason } => ("dead_letter", None, Some(reason)),
                        };
                        ExplainRowView {
                            attempt: r.attempt,
                            delay_ms: r.delay.map(ms),
                            cumulative_ms: ms(r.cumulative),
                            outcome,
                            tier,
                            dead_letter_reason,
                        }
                    })
                    .collect(),
            };
            write_json(ctx.out, &view)
        }
        PolicyCommand::Get { target } => {
            let admin = ctx.admin().await?;
            let r = admin.policy(&target.topic, &target.subscription).await?;
            let view = PolicyView::new(target.topic, target.subscription, r)?;
            if ctx.json() {
                return write_json(ctx.out, &view);
            }
            view.write_table(ctx.out)
        }
        PolicyCommand::Set {
            target,
            spec,
            clear,
            key_order,
            poison_key_after,
            breaker,
        } => {
            let (topic, sub) = (&target.topic, &target.subscription);
            let key_order = key_order.then_some(ricochet_policy::KeyOrder {
                poison_after: poison_key_after,
            });
            let admin = ctx.admin().await?;
            let r = match (spec, clear, key_order, breaker) {
                (None, true, None, None) => admin.clear_policy(topic, sub).await?,
                (Some(s), false, None, None) => admin.set_policy(topic, sub, &s).await?,
                (s, false, k, b) if k.is_some() || b.is_some() => {
                    admin
                        .set_policy_options(topic, sub, s.as_ref(), k, b.as_ref())
                        .await?
                }
                _ => {
                    return Err(CliError::Usage(
                        "give a SPEC, --key-order, --breaker or --clear".into(),
                    ));
                }
            };
            let view = PolicyView::new(target.topic, target.subscription, r)?;
            if ctx.json() {
                return write_json(ctx.out, &view);
            }
            view.write_table(ctx.out)
        }
    }
}
