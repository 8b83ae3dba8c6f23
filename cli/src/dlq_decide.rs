//! The decisions of `ricochet dlq`: `replay` (into the subscription's retry
//! tier by default, or `--to-topic`; optionally fixed first with a new
//! payload, properties or key), `purge`, both with `--dry-run`; `export`
//! and `import` (JSON lines, so a batch can be fixed with ordinary tools and
//! sent back: import is a replay by id with the line's payload, key and
//! properties); `list --group-by`; and the replay jobs a paced replay runs
//! as (`jobs`, `cancel-job`).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Read};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ricochet_proto as pb;
use serde::{Deserialize, Serialize};

use crate::Ctx;
use crate::args::{CountArgs, GroupBy, ReplayEditArgs, SubscriptionArgs};
use crate::confirm::confirm;
use crate::error::{CliError, Result};
use crate::output::{Table, write_json, write_json_line};
use crate::timearg::{fmt_ms, now_ms};
use crate::view::IdView;

use ricochet_client::Admin;
use ricochet_client::admin::ReplayOptions;

/// One exported dead letter (a line of `dlq export`, read by `dlq import`).
#[derive(Debug, Serialize, Deserialize)]
pub struct ExportedLetter {
    /// Its dead-letter entry id (what import replays).
    pub id: u64,
    /// Why it was dead-lettered (informative; not read back).
    #[serde(default)]
    pub reason: String,
    /// Failed attempts before it was dead-lettered (informative).
    #[serde(default)]
    pub attempts: u32,
    /// Its key.
    #[serde(default)]
    pub key: String,
    /// Its properties.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Its payload, base64.
    pub payload: String,
}

#[derive(Debug, Serialize)]
struct Replayed {
    replayed: u64,
    new_ids: Vec<IdView>,
    #[serde(skip_serializing_if = "is_zero")]
    job_id: u64,
    /// A detached replay's jobs: one per partition on a base name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    jobs: Vec<StartedJob>,
}

#[derive(Debug, Serialize)]
struct StartedJob {
    id: u64,
    topic: String,
    total: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Serialize)]
struct DryRun {
    dry_run: bool,
    count: usize,
    ids: Vec<u64>,
}

/// The contents of `path`, or stdin for `-`.
fn read_input(path: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    if path == "-" {
        std::io::stdin().read_to_end(&mut buf)?;
    } else {
        buf =
            std::fs::read(path).map_err(|e| CliError::Other(format!("cannot read {path}: {e}")))?;
    }
    Ok(buf)
}

/// The wire edit of the command line; `None` when it changes nothing.
fn edit_of(e: &ReplayEditArgs) -> Result<Option<pb::ReplayEdit>> {
    let payload = e.payload_file.as_deref().map(read_input).transpose()?;
    let edit = pb::ReplayEdit {
        payload,
        set_properties: e.set_properties.iter().cloned().collect(),
        unset_properties: e.unset_properties.clone(),
        key: e.key.clone(),
    };
    Ok((edit != pb::ReplayEdit::default()).then_some(edit))
}

fn write_dry_run(ctx: &mut Ctx<'_>, verb: &str, ids: Vec<u64>) -> Result<()> {
    let v = DryRun {
        dry_run: true,
        count: ids.len(),
        ids,
    };
    if ctx.json() {
        return write_json(ctx.out, &v);
    }
    let shown: Vec<String> = v.ids.iter().map(u64::to_string).collect();
    writeln!(
        ctx.out,
        "dry run: would {verb} {} dead letter(s){}{}",
        v.count,
        if v.count > 0 { ": " } else { "" },
        shown.join(" ")
    )?;
    writeln!(ctx.out, "nothing was changed")?;
    Ok(())
}

/// How many dead letters `filter` selects now.
async fn count(admin: &Admin, t: &SubscriptionArgs, f: &pb::DeadLetterFilter) -> Result<u64> {
    Ok(admin
        .list_dead_letters(&t.topic, &t.subscription, f, 1, None)
        .await?
        .total)
}

/// The options of `dlq replay`.
pub(crate) struct ReplayArgs {
    pub rate: Option<u32>,
    pub count: CountArgs,
    pub to_topic: bool,
    pub at: Option<u64>,
    pub delay: Option<std::time::Duration>,
    pub edit: ReplayEditArgs,
    pub dry_run: bool,
    pub detach: bool,
    pub yes: bool,
}

/// `dlq replay`.
pub(crate) async fn replay(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    target: SubscriptionArgs,
    f: pb::DeadLetterFilter,
    a: ReplayArgs,
) -> Result<()> {
    let edit = edit_of(&a.edit)?;
    let deliver_at_ms = match (a.at, a.delay) {
        (Some(at), _) => at,
        (None, Some(d)) => now_ms() + d.as_millis() as u64,
        (None, None) => 0,
    };
    let mut options = ReplayOptions::new()
        .filter(f.clone())
        .rate_per_second(a.rate.unwrap_or(0))
        .to_topic(a.to_topic)
        .deliver_at_ms(deliver_at_ms)
        .dry_run(a.dry_run)
        .detach(a.detach);
    if let Some(reset) = a.count.wire() {
        options = options.reset_delivery_count(reset);
    }
    if let Some(e) = &edit {
        options = options.edit(e.clone());
    }
    let (topic, sub) = (&target.topic, &target.subscription);
    if a.dry_run {
        let r = admin.replay_dead_letters(topic, sub, &options).await?;
        return write_dry_run(ctx, "replay", r.dead_letter_ids);
    }
    let total = count(admin, &target, &f).await?;
    if total == 0 {
        eprintln!("no dead letter matches; nothing replayed");
        return finish(
            ctx,
            Replayed {
                replayed: 0,
                new_ids: Vec::new(),
                job_id: 0,
                jobs: Vec::new(),
            },
        );
    }
    let whither = if a.to_topic {
        format!("onto {} (every subscription sees them again)", target.topic)
    } else {
        format!("into its own retry tier{}", when(deliver_at_ms))
    };
    let mut extras = Vec::new();
    if a.count.resets(edit.is_some()) {
        extras.push("their delivery count reset".to_owned());
    }
    if let Some(e) = &edit {
        extras.push(describe(e));
    }
    let with = if extras.is_empty() {
        String::new()
    } else {
        format!(" with {}", extras.join(" and "))
    };
    confirm(
        &format!(
            "replay {total} dead letter(s) of subscription {} {whither}{with}",
            target.subscription
        ),
        a.yes,
    )?;
    let r = admin.replay_dead_letters(topic, sub, &options).await?;
    finish(
        ctx,
        Replayed {
            replayed: r.replayed,
            new_ids: r
                .new_ids
                .iter()
                .map(|id| IdView::from_proto(Some(id)))
                .collect(),
            job_id: r.job_id,
            jobs: r
                .jobs
                .iter()
                .map(|j| StartedJob {
                    id: j.id,
                    topic: j.topic.clone(),
                    total: j.total,
                })
                .collect(),
        },
    )
}

fn when(deliver_at_ms: u64) -> String {
    if deliver_at_ms == 0 {
        String::new()
    } else {
        format!(", due at {}", fmt_ms(deliver_at_ms))
    }
}

/// A short description of an edit, for the confirmation.
fn describe(e: &pb::ReplayEdit) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &e.payload {
        parts.push(format!("a new {}-byte payload", p.len()));
    }
    if !e.set_properties.is_empty() {
        let mut keys: Vec<&String> = e.set_properties.keys().collect();
        keys.sort();
        parts.push(format!(
            "propert(ies) {} set",
            keys.iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    if !e.unset_properties.is_empty() {
        parts.push(format!(
            "propert(ies) {} removed",
            e.unset_properties.join(",")
        ));
    }
    if let Some(k) = &e.key {
        parts.push(format!("key {k:?}"));
    }
    parts.join(", ")
}

fn finish(ctx: &mut Ctx<'_>, r: Replayed) -> Result<()> {
    if ctx.json() {
        return write_json(ctx.out, &r);
    }
    for id in &r.new_ids {
        writeln!(ctx.out, "{id}")?;
    }
    if r.job_id != 0 && r.replayed == 0 && r.new_ids.is_empty() {
        if r.jobs.len() > 1 {
            // A base name: each partition runs its own job.
            for j in &r.jobs {
                writeln!(
                    ctx.out,
                    "replay job {} started on {} ({} dead letter(s))",
                    j.id, j.topic, j.total
                )?;
            }
            writeln!(
                ctx.out,
                "{} replay jobs started (see `ricochet dlq jobs`)",
                r.jobs.len()
            )?;
        } else {
            writeln!(
                ctx.out,
                "replay job {} started (see `ricochet dlq jobs`)",
                r.job_id
            )?;
        }
    } else {
        writeln!(ctx.out, "replayed {} dead letter(s)", r.replayed)?;
    }
    Ok(())
}

/// `dlq purge --dry-run`.
pub(crate) async fn purge_dry_run(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    target: SubscriptionArgs,
    f: pb::DeadLetterFilter,
) -> Result<()> {
    let r = admin
        .purge_dead_letters(&target.topic, &target.subscription, &f, true)
        .await?;
    write_dry_run(ctx, "purge", r.dead_letter_ids)
}

/// `dlq list --group-by`.
pub(crate) async fn group(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    target: SubscriptionArgs,
    f: Option<pb::DeadLetterFilter>,
    by: GroupBy,
) -> Result<()> {
    let group_by = match by {
        GroupBy::Reason => pb::DeadLetterGroupBy::Reason,
        GroupBy::Verdict => pb::DeadLetterGroupBy::Verdict,
        GroupBy::Consumer => pb::DeadLetterGroupBy::Consumer,
        GroupBy::Hour => pb::DeadLetterGroupBy::Hour,
    };
    let r = admin
        .group_dead_letters(
            &target.topic,
            &target.subscription,
            &f.unwrap_or_default(),
            group_by,
            5,
        )
        .await?;
    #[derive(Serialize)]
    struct Group<'a> {
        key: &'a str,
        count: u64,
        first_at_ms: u64,
        last_at_ms: u64,
        entry_ids: &'a [u64],
        verdicts: &'a [String],
    }
    #[derive(Serialize)]
    struct Groups<'a> {
        total: u64,
        groups: Vec<Group<'a>>,
    }
    if ctx.json() {
        let v = Groups {
            total: r.total,
            groups: r
                .groups
                .iter()
                .map(|g| Group {
                    key: &g.key,
                    count: g.count,
                    first_at_ms: g.first_at_ms,
                    last_at_ms: g.last_at_ms,
                    entry_ids: &g.entry_ids,
                    verdicts: &g.verdicts,
                })
                .collect(),
        };
        return write_json(ctx.out, &v);
    }
    let head = match by {
        GroupBy::Reason => "cause",
        GroupBy::Verdict => "verdict",
        GroupBy::Consumer => "consumer",
        GroupBy::Hour => "hour (UTC)",
    };
    // Beside a cause, the policy's verdicts; beside a verdict, nothing more.
    let verdicts = by != GroupBy::Verdict;
    let mut head = vec![head, ">count", "first", "last", "ids"];
    if verdicts {
        head.push("verdict");
    }
    let mut t = Table::new(&head);
    for g in &r.groups {
        let mut ids: Vec<String> = g.entry_ids.iter().map(u64::to_string).collect();
        if g.count > g.entry_ids.len() as u64 {
            ids.push("…".into());
        }
        let mut row = vec![
            g.key.clone(),
            g.count.to_string(),
            fmt_ms(g.first_at_ms),
            fmt_ms(g.last_at_ms),
            ids.join(" "),
        ];
        if verdicts {
            row.push(g.verdicts.join("; "));
        }
        t.row(row);
    }
    t.write(ctx.out)?;
    writeln!(
        ctx.out,
        "{} dead letter(s) in {} group(s)",
        r.total,
        r.groups.len()
    )?;
    Ok(())
}

/// `dlq export`.
pub(crate) async fn export(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    target: SubscriptionArgs,
    f: Option<pb::DeadLetterFilter>,
) -> Result<()> {
    let f = f.unwrap_or_default();
    let mut after = None;
    loop {
        let page = admin
            .list_dead_letters(&target.topic, &target.subscription, &f, 500, after)
            .await?;
        let Some(last) = page.dead_letters.last() else {
            return Ok(());
        };
        after = last
            .message
            .as_ref()
            .and_then(|m| m.id.as_ref())
            .map(|id| id.entry_id);
        for d in &page.dead_letters {
            let m = d.message.clone().unwrap_or_default();
            let line = ExportedLetter {
                id: m.id.as_ref().map_or(0, |id| id.entry_id),
                reason: d.reason.clone(),
                attempts: m.delivery_count,
                key: m.key,
                properties: m.properties.into_iter().collect(),
                payload: B64.encode(&m.payload),
            };
            write_json_line(ctx.out, &line)?;
        }
        if after.is_none() {
            return Ok(());
        }
    }
}

/// One import line's wire edit against the dead letter as it is now:
/// only what differs (`None` when nothing does).
fn edit_against(
    line: &ExportedLetter,
    payload: Vec<u8>,
    now: &pb::Message,
) -> Option<pb::ReplayEdit> {
    let set: HashMap<String, String> = line
        .properties
        .iter()
        .filter(|(k, v)| now.properties.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut unset: Vec<String> = now
        .properties
        .keys()
        .filter(|k| !line.properties.contains_key(*k))
        .cloned()
        .collect();
    unset.sort();
    let edit = pb::ReplayEdit {
        payload: (payload != now.payload).then_some(payload),
        set_properties: set,
        unset_properties: unset,
        key: (line.key != now.key).then(|| line.key.clone()),
    };
    (edit != pb::ReplayEdit::default()).then_some(edit)
}

/// The options of `dlq import`.
pub(crate) struct ImportArgs {
    pub file: String,
    pub count: CountArgs,
    pub to_topic: bool,
    pub dry_run: bool,
    pub yes: bool,
}

/// `dlq import`.
pub(crate) async fn import(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    target: SubscriptionArgs,
    a: ImportArgs,
) -> Result<()> {
    let bytes = read_input(&a.file)?;
    let mut lines = Vec::new();
    for (n, line) in bytes.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let l: ExportedLetter = serde_json::from_str(&line)
            .map_err(|e| CliError::Usage(format!("{} line {}: {e}", a.file, n + 1)))?;
        let payload = B64.decode(l.payload.trim()).map_err(|e| {
            CliError::Usage(format!(
                "{} line {}: payload is not base64: {e}",
                a.file,
                n + 1
            ))
        })?;
        lines.push((l, payload));
    }
    // The dead letters as they are now, to send only what changed.
    let ids: Vec<u64> = lines.iter().map(|(l, _)| l.id).collect();
    let mut now: HashMap<u64, pb::Message> = HashMap::new();
    for chunk in ids.chunks(500) {
        let only = pb::DeadLetterFilter {
            entry_ids: chunk.to_vec(),
            ..Default::default()
        };
        let r = admin
            .list_dead_letters(
                &target.topic,
                &target.subscription,
                &only,
                chunk.len() as u32,
                None,
            )
            .await?;
        for d in r.dead_letters {
            if let Some(m) = d.message
                && let Some(id) = m.id.as_ref().map(|i| i.entry_id)
            {
                now.insert(id, m);
            }
        }
    }
    let missing: Vec<u64> = ids
        .iter()
        .filter(|id| !now.contains_key(id))
        .copied()
        .collect();
    let plan: Vec<(u64, Option<pb::ReplayEdit>)> = lines
        .into_iter()
        .filter_map(|(l, p)| {
            let m = now.get(&l.id)?;
            Some((l.id, edit_against(&l, p, m)))
        })
        .collect();
    let edited = plan.iter().filter(|(_, e)| e.is_some()).count();
    if a.dry_run {
        #[derive(Serialize)]
        struct ImportDryRun {
            dry_run: bool,
            count: usize,
            edited: usize,
            ids: Vec<u64>,
            not_dead_letters: Vec<u64>,
        }
        let v = ImportDryRun {
            dry_run: true,
            count: plan.len(),
            edited,
            ids: plan.iter().map(|(id, _)| *id).collect(),
            not_dead_letters: missing,
        };
        if ctx.json() {
            return write_json(ctx.out, &v);
        }
        writeln!(
            ctx.out,
            "dry run: would replay {} dead letter(s), {} of them edited; {} line(s) name no dead letter",
            v.count,
            v.edited,
            v.not_dead_letters.len()
        )?;
        writeln!(ctx.out, "nothing was changed")?;
        return Ok(());
    }
    if !missing.is_empty() {
        eprintln!(
            "{} line(s) name no dead letter of {} (replayed or purged already?): {:?}",
            missing.len(),
            target.subscription,
            missing
        );
    }
    if plan.is_empty() {
        eprintln!("nothing to replay");
        return finish(
            ctx,
            Replayed {
                replayed: 0,
                new_ids: Vec::new(),
                job_id: 0,
                jobs: Vec::new(),
            },
        );
    }
    let counts = match a.count.wire() {
        Some(true) => ", every delivery count reset",
        Some(false) => ", delivery counts kept",
        None if edited > 0 => " (their delivery count reset)",
        None => "",
    };
    confirm(
        &format!(
            "replay {} dead letter(s) of subscription {} {} from {}, {edited} of them edited{counts}",
            plan.len(),
            target.subscription,
            if a.to_topic {
                format!("onto {}", target.topic)
            } else {
                "into its own retry tier".to_owned()
            },
            a.file
        ),
        a.yes,
    )?;
    let mut out = Replayed {
        replayed: 0,
        new_ids: Vec::new(),
        job_id: 0,
        jobs: Vec::new(),
    };
    for (id, edit) in plan {
        let mut options = ReplayOptions::new()
            .filter(pb::DeadLetterFilter {
                entry_ids: vec![id],
                ..Default::default()
            })
            .to_topic(a.to_topic);
        if let Some(reset) = a.count.wire() {
            options = options.reset_delivery_count(reset);
        }
        if let Some(e) = edit {
            options = options.edit(e);
        }
        let r = admin
            .replay_dead_letters(&target.topic, &target.subscription, &options)
            .await?;
        out.replayed += r.replayed;
        out.new_ids
            .extend(r.new_ids.iter().map(|i| IdView::from_proto(Some(i))));
    }
    finish(ctx, out)
}

/// `dlq jobs`.
pub(crate) async fn jobs(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    topic: Option<String>,
    subscription: Option<String>,
) -> Result<()> {
    let jobs = admin
        .list_replay_jobs(topic.as_deref(), subscription.as_deref())
        .await?;
    #[derive(Serialize)]
    struct Job<'a> {
        id: u64,
        topic: &'a str,
        subscription: &'a str,
        total: u64,
        done: u64,
        replayed: u64,
        rate_per_second: u32,
        to_topic: bool,
        created_ms: u64,
        by: &'a str,
    }
    let jobs: Vec<Job<'_>> = jobs
        .iter()
        .map(|j| Job {
            id: j.id,
            topic: &j.topic,
            subscription: &j.subscription,
            total: j.total,
            done: j.done,
            replayed: j.replayed,
            rate_per_second: j.rate_per_second,
            to_topic: j.mode == pb::ReplayMode::Topic as i32,
            created_ms: j.created_ms,
            by: &j.by,
        })
        .collect();
    if ctx.json() {
        return write_json(ctx.out, &jobs);
    }
    let mut t = Table::new(&[
        ">id",
        "topic",
        "subscription",
        ">done",
        ">of",
        ">rate/s",
        "to",
        "started",
        "by",
    ]);
    for j in &jobs {
        t.row(vec![
            j.id.to_string(),
            j.topic.to_owned(),
            j.subscription.to_owned(),
            j.done.to_string(),
            j.total.to_string(),
            j.rate_per_second.to_string(),
            if j.to_topic { "topic" } else { "retry tier" }.to_owned(),
            fmt_ms(j.created_ms),
            j.by.to_owned(),
        ]);
    }
    t.write(ctx.out)?;
    writeln!(ctx.out, "{} replay job(s)", jobs.len())?;
    Ok(())
}

/// `dlq cancel-job`.
pub(crate) async fn cancel_job(
    ctx: &mut Ctx<'_>,
    admin: &Admin,
    id: u64,
    topic: Option<String>,
) -> Result<()> {
    admin.cancel_replay_job(id, topic.as_deref()).await?;
    writeln!(ctx.out, "replay job {id} cancelled")?;
    Ok(())
}
