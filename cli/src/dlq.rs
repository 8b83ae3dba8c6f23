//! `dlq list|peek|replay|purge|export|import|jobs`: a subscription's dead
//! letters, for a human to look at and decide on (the decisions are in
//! [`crate::dlq_decide`]). Every command takes the same filters (`--id`,
//! `--reason`, `--since`, `--until`). `replay` and `purge` first count what
//! matches, ask for confirmation (see [`crate::confirm`]), and then act on
//! what had been dead-lettered when the question was asked: a message
//! dead-lettered while the operator reads the prompt is left alone.

use ricochet_client::Admin;
use ricochet_proto as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::{DlqCommand, DlqFilterArgs, SubscriptionArgs};
use crate::confirm::confirm;
use crate::dlq_decide;
use crate::error::{CliError, Result};
use crate::output::{Block, Table, write_json};
use crate::timearg::{Ms, fmt_ms, now_ms};
use crate::view::{DeadLetterView, full_topic_name, write_attempts};

#[derive(Debug, Serialize)]
struct DeadLetters {
    topic: String,
    subscription: String,
    /// How many match the filters (all pages).
    total: u64,
    dead_letters: Vec<DeadLetterView>,
}

#[derive(Debug, Serialize)]
struct Purged {
    purged: u64,
}

/// The wire filter; `None` when nothing filters.
pub(crate) fn filter(f: &DlqFilterArgs) -> Result<Option<pb::DeadLetterFilter>> {
    let since_ms = f.since.map_or(0, |t| t.as_ms());
    let until_ms = f.until.map_or(0, |t| t.as_ms());
    if since_ms != 0 && until_ms != 0 && since_ms >= until_ms {
        return Err(CliError::Usage(format!(
            "--since ({}) must be before --until ({})",
            fmt_ms(since_ms),
            fmt_ms(until_ms)
        )));
    }
    let wire = pb::DeadLetterFilter {
        entry_ids: f.ids.clone(),
        reason_contains: f.reason.clone().unwrap_or_default(),
        since_ms,
        until_ms,
    };
    Ok((wire != pb::DeadLetterFilter::default()).then_some(wire))
}

/// `filter` bounded to what was dead-lettered up to now.
fn pinned(f: Option<pb::DeadLetterFilter>) -> pb::DeadLetterFilter {
    let mut f = f.unwrap_or_default();
    if f.until_ms == 0 {
        f.until_ms = now_ms() + 1;
    }
    f
}

async fn list(
    admin: &Admin,
    target: &SubscriptionArgs,
    filter: Option<pb::DeadLetterFilter>,
    limit: u32,
    after: Option<u64>,
) -> Result<DeadLetters> {
    let r = admin
        .list_dead_letters(
            &target.topic,
            &target.subscription,
            &filter.unwrap_or_default(),
            limit,
            after,
        )
        .await?;
    Ok(DeadLetters {
        topic: full_topic_name(&target.topic),
        subscription: target.subscription.clone(),
        total: r.total,
        dead_letters: r
            .dead_letters
            .iter()
            .map(DeadLetterView::from_proto)
            .collect(),
    })
}

pub(crate) async fn run(ctx: &mut Ctx<'_>, c: DlqCommand) -> Result<()> {
    let admin = ctx.admin().await?;
    match c {
        DlqCommand::List {
            target,
            filter: f,
            limit,
            after,
            group_by,
        } => {
            if let Some(by) = group_by {
                return dlq_decide::group(ctx, &admin, target, filter(&f)?, by).await;
            }
            if limit == 0 {
                return Err(CliError::Usage("--limit must be at least 1".into()));
            }
            let v = list(&admin, &target, filter(&f)?, limit, after).await?;
            if ctx.json() {
                return write_json(ctx.out, &v);
            }
            let mut t = Table::new(&[
                ">id",
                "dead-lettered at",
                ">failures",
                "cause",
                "verdict",
                "origin",
                "payload",
            ]);
            for d in &v.dead_letters {
                t.row(vec![
                    d.entry_id.to_string(),
                    fmt_ms(d.dead_lettered_at_ms),
                    d.delivery_count.to_string(),
                    d.cause.clone(),
                    d.reason.clone(),
                    d.origin.to_string(),
                    d.message.payload_preview(40),
                ]);
            }
            t.write(ctx.out)?;
            writeln!(
                ctx.out,
                "{} of {} dead letter(s) in {}",
                v.dead_letters.len(),
                v.total,
                dead_letter_topic(&v)
            )?;
            Ok(())
        }
        DlqCommand::Peek {
            target,
            filter: f,
            count,
        } => {
            if count == 0 {
                return Err(CliError::Usage("-n/--count must be at least 1".into()));
            }
            let v = list(&admin, &target, filter(&f)?, count, None).await?;
            if ctx.json() {
                return write_json(ctx.out, &v);
            }
            if v.dead_letters.is_empty() {
                writeln!(ctx.out, "no dead letter matches")?;
            }
            for (i, d) in v.dead_letters.iter().enumerate() {
                if i > 0 {
                    writeln!(ctx.out)?;
                }
                writeln!(ctx.out, "dead letter {}", d.entry_id)?;
                let mut b = Block::new();
                b.kv("origin", &d.origin)
                    .kv("cause", &d.cause)
                    .kv("verdict", &d.reason)
                    .kv("dead-lettered at", Ms(d.dead_lettered_at_ms))
                    .kv("failures", d.delivery_count)
                    .extend(d.message.block());
                b.write(ctx.out, 2)?;
                writeln!(ctx.out, "  attempts:")?;
                write_attempts(ctx.out, &d.attempts, 4)?;
                if !d.edits.is_empty() {
                    writeln!(ctx.out, "  edits:")?;
                    for e in &d.edits {
                        writeln!(ctx.out, "    {}", e.line())?;
                    }
                }
            }
            if v.total > u64::from(count) {
                writeln!(
                    ctx.out,
                    "\n({} more; use -n or the filters to see them)",
                    v.total - v.dead_letters.len() as u64
                )?;
            }
            Ok(())
        }
        DlqCommand::Replay {
            target,
            filter: f,
            rate,
            count,
            to_topic,
            at,
            delay,
            edit,
            dry_run,
            detach,
            yes,
        } => {
            let f = pinned(filter(&f)?);
            let a = dlq_decide::ReplayArgs {
                rate,
                count,
                to_topic,
                at,
                delay,
                edit,
                dry_run,
                detach,
                yes,
            };
            dlq_decide::replay(ctx, &admin, target, f, a).await
        }
        DlqCommand::Purge {
            target,
            filter: f,
            dry_run,
            yes,
        } => {
            let f = pinned(filter(&f)?);
            if dry_run {
                return dlq_decide::purge_dry_run(ctx, &admin, target, f).await;
            }
            let total = list(&admin, &target, Some(f.clone()), 1, None).await?.total;
            if total == 0 {
                eprintln!("no dead letter matches; nothing purged");
            } else {
                confirm(
                    &format!(
                        "purge {total} dead letter(s) of subscription {} on {} for good",
                        target.subscription, target.topic
                    ),
                    yes,
                )?;
            }
            let purged = if total == 0 {
                0
            } else {
                admin
                    .purge_dead_letters(&target.topic, &target.subscription, &f, false)
                    .await?
                    .purged
            };
            if ctx.json() {
                return write_json(ctx.out, &Purged { purged });
            }
            writeln!(ctx.out, "purged {purged} dead letter(s)")?;
            Ok(())
        }
        DlqCommand::Export { target, filter: f } => {
            dlq_decide::export(ctx, &admin, target, filter(&f)?).await
        }
        DlqCommand::Import {
            target,
            file,
            count,
            to_topic,
            dry_run,
            yes,
        } => {
            let a = dlq_decide::ImportArgs {
                file,
                count,
                to_topic,
                dry_run,
                yes,
            };
            dlq_decide::import(ctx, &admin, target, a).await
        }
        DlqCommand::Jobs {
            topic,
            subscription,
        } => dlq_decide::jobs(ctx, &admin, topic, subscription).await,
        DlqCommand::CancelJob { id, topic } => dlq_decide::cancel_job(ctx, &admin, id, topic).await,
    }
}

fn dead_letter_topic(v: &DeadLetters) -> String {
    v.dead_letters.first().map_or_else(
        || format!("the dead-letter tier of {}", v.subscription),
        |d| d.message.id.topic.clone(),
    )
}
