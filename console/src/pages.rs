//! The console's read-only pages (every one a GET): the topics with their
//! subscriptions' backlog, unacked, retry-queue and dead-letter counts; a
//! topic; a subscription with its pictures; the dead-letter list with its
//! filters and the broker's group-by; one dead letter with every attempt,
//! its edit history and the fix-and-resend form; any stored message with
//! its state in each subscription; the subscription's replay jobs. Also the text formatters they share
//! (reasons, payloads); their query strings are parsed by [`super::params`].

use super::api::{ApiResult, ConsoleApi, DeadLetterQuery, GroupBy};
use super::charts;
use super::format::{fmt_ms, link};
use super::params::{Params, parse_id};
use super::partitioned;
use super::{ConsoleError, ConsoleState, Page, layout};
use axum::extract::Query;
use base64::Engine;
use maud::{Markup, html};
use ricochet_policy::{FailureContext, PolicySpec, ScheduleTable, explain_with};
use ricochet_proto::*;
use std::collections::BTreeSet;

/// Dead letters per page of the list.
const PAGE_SIZE: u32 = 100;
/// Most dead letters the subscription page's inflow picture reads.
const CHART_LIMIT: u32 = 2000;

fn sub_link(path: &str, topic: &str, sub: &str) -> String {
    link(path, &[("topic", topic), ("sub", sub)])
}

/// A failure reason's short name (`nack`, `ack_timeout`, ...).
pub(crate) fn reason_name(code: i32) -> String {
    FailureReason::try_from(code)
        .map(|r| {
            r.as_str_name()
                .trim_start_matches("FAILURE_REASON_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| format!("unknown ({code})"))
}

/// A payload as text; binary payloads shown lossily, and said so.
fn payload_view(payload: &[u8]) -> Markup {
    match std::str::from_utf8(payload) {
        Ok(text) => html! { pre.payload { (text) } },
        Err(_) => html! {
            p.warn { "Not UTF-8: shown with replacement characters (" (payload.len()) " bytes)." }
            pre.payload { (String::from_utf8_lossy(payload)) }
        },
    }
}

/// The first characters of a payload, for a table cell.
fn preview(payload: &[u8]) -> String {
    let text = String::from_utf8_lossy(payload);
    let mut out: String = text.chars().take(60).collect();
    if text.chars().count() > 60 {
        out.push('…');
    }
    out
}

fn properties_table(m: &Message) -> Markup {
    let mut props: Vec<(&String, &String)> = m.properties.iter().collect();
    props.sort();
    html! {
        @if props.is_empty() {
            p { "No properties." }
        } @else {
            table.properties {
                tr { th { "Property" } th { "Value" } }
                @for (k, v) in props {
                    tr { td { (k) } td { (v) } }
                }
            }
        }
    }
}

fn attempts_table(attempts: &[Attempt]) -> Markup {
    html! {
        @if attempts.is_empty() {
            p { "No failed attempts recorded." }
        } @else {
            table.attempts {
                tr { th { "#" } th { "Time" } th { "Consumer" } th { "Reason" } th { "Detail (nack text)" } }
                @for a in attempts {
                    tr {
                        td.n { (a.delivery_count) }
                        td { (fmt_ms(a.time_ms)) }
                        td { (a.consumer) }
                        td { (reason_name(a.reason)) }
                        td { (a.detail) }
                    }
                }
            }
        }
    }
}

/// The header row and one row per subscription, as on the topics page.
fn subscriptions_table(subs: &[SubscriptionStatsResponse]) -> Markup {
    html! {
        table.subscriptions {
            tr {
                th { "Subscription" } th { "Type" } th { "Backlog" } th { "Unacked" }
                th { "Retry queue" } th { "Dead letters" } th { "Consumers" }
            }
            @for s in subs {
                tr {
                    td { a href=(sub_link("/subscription", &s.topic, &s.subscription)) { (s.subscription) } }
                    td { (s.subscription_type) }
                    td.n { (s.backlog) }
                    td.n { (s.unacked) }
                    td.n { (s.scheduled_retries) }
                    td.n {
                        @if s.dead_lettered > 0 {
                            a href=(sub_link("/dead-letters", &s.topic, &s.subscription)) { (s.dead_lettered) }
                        } @else { "0" }
                    }
                    td.n { (s.consumers.len()) }
                }
            }
        }
    }
}

/// `/`: every topic with its subscriptions; a partitioned topic once, by
/// its base name, its partitions summed; tier topics listed apart.
pub(crate) async fn index(st: ConsoleState) -> Page {
    let listing = st.api.topics().await?;
    let bases: Vec<(String, u32)> = listing
        .partitioned
        .iter()
        .map(|p| (p.topic.clone(), p.partitions))
        .collect();
    let mut topics = Vec::new();
    for name in &listing.topics {
        match st.api.topic_stats(name).await {
            Ok(stats) => topics.push(stats),
            // Deleted between the two calls.
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s.into()),
        }
    }
    let tiers: BTreeSet<String> = topics
        .iter()
        .flat_map(|t| &t.subscriptions)
        .flat_map(|s| [s.retry_topic.clone(), s.dead_letter_topic.clone()])
        .collect();
    let (tier_topics, mut topics): (Vec<_>, Vec<_>) =
        topics.into_iter().partition(|t| tiers.contains(&t.topic));
    topics.retain(|t| !partitioned::is_partition_of(&t.topic, &bases));
    for (base, _) in &bases {
        match st.api.topic_stats(base).await {
            Ok(stats) => topics.push(stats),
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => return Err(s.into()),
        }
    }
    topics.sort_by(|a, b| a.topic.cmp(&b.topic));
    let count = |t: &str| bases.iter().find(|(b, _)| b == t).map(|(_, n)| *n);
    Ok(layout(
        "Topics",
        html! {
            h1 { "Topics" }
            @if topics.is_empty() { p { "No topics yet." } }
            @for t in &topics {
                h2 {
                    a href=(link("/topic", &[("topic", &t.topic)])) { (t.topic) }
                    @if let Some(n) = count(&t.topic) { " " span.partitions { "(" (n) " partitions)" } }
                }
                p { (t.message_count) " stored messages · " (t.messages_in) " published since start · " (t.producers) " producers" }
                @if t.subscriptions.is_empty() {
                    p { "No subscriptions." }
                } @else {
                    (subscriptions_table(&t.subscriptions))
                }
            }
            @if !tier_topics.is_empty() {
                h2 { "Retry and dead-letter tier topics" }
                ul {
                    @for t in &tier_topics {
                        li { a href=(link("/topic", &[("topic", &t.topic)])) { (t.topic) } " — " (t.message_count) " stored" }
                    }
                }
            }
        },
    ))
}

/// `/topic?topic=T`: one topic and its subscriptions.
pub(crate) async fn topic(st: ConsoleState, Query(p): Query<Params>) -> Page {
    let t = st.api.topic_stats(p.topic()?).await?;
    let parts = match st.api.partitions(&t.topic).await? {
        Some(n) => Some((n, partitioned::partitions_section(&st, &t.topic, n).await?)),
        None => None,
    };
    Ok(layout(
        &t.topic,
        html! {
            h1 { @if parts.is_some() { "Partitioned topic " } @else { "Topic " } (t.topic) }
            table {
                @if let Some((n, _)) = &parts { tr { th { "Partitions" } td.n { (n) } } }
                tr { th { "Stored messages" } td.n { (t.message_count) } }
                @if parts.is_none() {
                    tr { th { "Entry ids" } td { (t.first_entry_id) " to " (t.next_entry_id) " (next)" } }
                }
                tr { th { "Published since start" } td.n { (t.messages_in) " (" (t.bytes_in) " bytes)" } }
                tr { th { "Producers" } td.n { (t.producers) } }
            }
            @if let Some((_, section)) = &parts { (section) }
            h2 { "Subscriptions" }
            @if t.subscriptions.is_empty() { p { "No subscriptions." } }
            @else { (subscriptions_table(&t.subscriptions)) }
        },
    ))
}

/// `/subscription?topic=T&sub=S`: counters, policy, consumers, and the
/// pictures: retries by due time, dead letters by reason over time.
pub(crate) async fn subscription(st: ConsoleState, Query(p): Query<Params>) -> Page {
    let (topic, sub) = (p.topic()?, p.sub()?);
    let s = st.api.subscription_stats(topic, sub).await?;
    let policy = st.api.policy(topic, sub).await?;
    let parted = st.api.partitions(topic).await?.is_some();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    // Dead letters need the dead-letters permission, the counters do not:
    // a role without it sees the rest of the page and why this is missing.
    let dead = permitted(
        async {
            let dead = st
                .api
                .dead_letters(topic, sub, &DeadLetterQuery::default(), CHART_LIMIT, None)
                .await?;
            let reasons = st
                .api
                .group_dead_letters(topic, sub, &DeadLetterQuery::default(), GroupBy::Reason)
                .await?
                .groups;
            let jobs = st.api.replay_jobs(topic, sub).await?;
            Ok((dead, reasons, jobs))
        }
        .await,
    )?;
    let title = format!("{sub} on {topic}");
    Ok(layout(
        &title,
        html! {
            h1 { "Subscription " (sub) }
            p { "on " a href=(link("/topic", &[("topic", topic)])) { (topic) } " · " span #sub-type { (type_name(&s.subscription_type)) } }
            table.counters {
                tr { th { "Backlog" } th { "Unacked" } th { "Retry queue" } th { "Dead letters" } th { "Next retry due" } th { "Acked up to" } }
                tr {
                    td.n #backlog { (s.backlog) }
                    td.n #unacked { (s.unacked) }
                    td.n #retries { (s.scheduled_retries) }
                    td.n #dead { (s.dead_lettered) }
                    td { (fmt_ms(s.next_retry_due_ms)) }
                    td.n { (s.mark_delete_position) }
                }
            }
            (super::breaker::section(&s, topic, sub))
            p {
                @if parted {
                    "Each partition has its own retry and dead-letter tier. "
                } @else {
                    "Retry tier " code { (s.retry_topic) } ", dead-letter tier " code { (s.dead_letter_topic) } ". "
                }
                a href=(sub_link("/dead-letters", topic, sub)) { "Dead letters →" }
            }
            div.charts {
                div {
                    h2 { "Retry schedule by due time" }
                    (charts::retry_schedule(&s.scheduled_by_due))
                }
                div {
                    @match &dead {
                        Ok((dead, _, _)) => (inflow_section(dead, now_ms)),
                        Err(why) => {
                            h2 { "Dead letters" }
                            p.warn #dead-letters-refused { "Not shown: " (why) }
                        }
                    }
                }
            }
            @if let Ok((_, reasons, jobs)) = &dead {
                (reasons_and_jobs(topic, sub, reasons, jobs, parted))
            }
            (super::key_order::section(&s, policy.policy.as_ref(), now_ms))
            h2 { "Consumers" }
            @if s.consumers.is_empty() { p { "None connected." } } @else {
                table {
                    tr { th { "Name" } th { "Unacked" } th { "Permits" } th { "Active" } th { "Blocked on unacked" } }
                    @for c in &s.consumers {
                        tr { td { (c.name) } td.n { (c.unacked) } td.n { (c.permits) } td { (c.active) } td { (c.blocked_on_unacked) } }
                    }
                }
            }
            h2 { "Dead-letter policy" }
            p { "Source: " (policy.source) }
            @match policy.policy.as_ref().filter(|p| p.kind.is_some()) {
                Some(pol) => (policy_view(pol)),
                None => {
                    p #no-policy {
                        "None: nacks, ack timeouts and lost consumers are redelivered at once, without a limit; "
                        "a consumer's terminate dead-letters. " code { "reconsume_later" } " follows RocketMQ's default levels:"
                    }
                    (schedule_view(&PolicySpec::delay_levels_default(), ricochet_policy::FailureReason::ReconsumeLater))
                }
            }
        },
    ))
}

/// The call's answer, or (`Err`) the broker's reason when it refused the
/// caller the permission; any other failure fails the page.
fn permitted<T>(r: ApiResult<T>) -> Result<Result<T, String>, ConsoleError> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(s) if s.code() == tonic::Code::PermissionDenied => Ok(Err(s.message().to_owned())),
        Err(s) => Err(s.into()),
    }
}

/// The subscription page's picture of dead letters by reason over time.
fn inflow_section(dead: &ListDeadLettersResponse, now_ms: u64) -> Markup {
    let points: Vec<(u64, &str)> = dead
        .dead_letters
        .iter()
        .map(|d| (d.dead_lettered_at_ms, d.cause.as_str()))
        .collect();
    let inflow = charts::Inflow::from_points(&points, now_ms);
    html! {
        h2 { "Dead letters by reason over time" }
        @match &inflow {
            Some(f) => {
                (charts::inflow_chart(f))
                @if dead.total > dead.dead_letters.len() as u64 {
                    p.warn { "Drawn from the first " (dead.dead_letters.len()) " of " (dead.total) " dead letters." }
                }
            }
            None => p { "No dead letters." },
        }
    }
}

/// The subscription page's table of reasons and its replay jobs (on a
/// partitioned topic's base name, each job's partition: ids are per
/// partition, and a job is cancelled on its own).
fn reasons_and_jobs(
    topic: &str,
    sub: &str,
    reasons: &[DeadLetterGroup],
    jobs: &[ReplayJob],
    parted: bool,
) -> Markup {
    html! {
        @if !reasons.is_empty() {
            h2 { "Why messages died" }
            table.reasons {
                tr { th { "Reason" } th { "Dead letters" } th { "First" } th { "Last" } th { "Policy's verdict" } }
                @for g in reasons {
                    tr {
                        td { a href=(link("/dead-letters", &[("topic", topic), ("sub", sub), ("reason", &g.key)])) { (g.key) } }
                        td.n { (g.count) }
                        td { (fmt_ms(g.first_at_ms)) }
                        td { (fmt_ms(g.last_at_ms)) }
                        td.verdict { (g.verdicts.join("; ")) }
                    }
                }
            }
        }
        h2 { "Replay jobs" }
        @if jobs.is_empty() { p #no-jobs { "No replay job running." } } @else {
            table #jobs {
                tr { @if parted { th { "Partition" } } th { "Job" } th { "Started" } th { "By" } th { "Into" } th { "Done" } th { "Replayed" } th { "Per second" } th {} }
                @for j in jobs {
                    @let job = j.id.to_string();
                    @let job_topic = if parted { j.topic.as_str() } else { topic };
                    tr id=(format!("job-{job}")) {
                        @if parted { td.partition { (partitioned::job_partition(j)) } }
                        td.n { (j.id) }
                        td { (fmt_ms(j.created_ms)) }
                        td { (j.by) }
                        td { @if j.mode == ReplayMode::Topic as i32 { "the topic (every subscription)" } @else { (sub) "'s retry tier" } }
                        td.n { (j.done) " of " (j.total) }
                        td.n { (j.replayed) }
                        td.n { (j.rate_per_second) }
                        td { a.cancel-job href=(link("/confirm/cancel-job", &[("topic", job_topic), ("sub", sub), ("job", &job)])) { "cancel…" } }
                    }
                }
            }
        }
    }
}

/// `SUBSCRIPTION_TYPE_KEY_SHARED` (the stats' wire name) as `key_shared`.
fn type_name(wire: &str) -> String {
    wire.trim_start_matches("SUBSCRIPTION_TYPE_")
        .to_ascii_lowercase()
}

/// Attempts the policy section explains at most (for policies that retry
/// without end).
const EXPLAIN_ROWS: usize = 40;

/// A policy as its compact spec (what `ricochet policy set` takes) and its
/// schedule for nacks.
fn policy_view(pol: &DeadLetterPolicyConfig) -> Markup {
    match PolicySpec::try_from(pol) {
        Ok(spec) => html! {
            p { "Policy " code #policy-spec { (spec) } }
            (schedule_view(&spec, ricochet_policy::FailureReason::Nack))
        },
        Err(e) => html! { p.warn { "Unreadable policy: " (e) } },
    }
}

/// The schedule `spec` gives failures of `reason`, as `ricochet policy
/// explain` prints it.
fn schedule_view(spec: &PolicySpec, reason: ricochet_policy::FailureReason) -> Markup {
    match spec.build() {
        Ok(p) => {
            let rows = explain_with(&*p, &FailureContext::new(1, reason), EXPLAIN_ROWS);
            html! { pre #policy-schedule { (ScheduleTable::new(&*p, reason, rows)) } }
        }
        Err(_) => {
            html! { p { "A policy the broker cannot build here, so its schedule is not shown." } }
        }
    }
}

/// `/dead-letters?topic=T&sub=S[&reason=&since=&until=&ids=&after=]`.
pub(crate) async fn dead_letters(st: ConsoleState, Query(p): Query<Params>) -> Page {
    let (topic, sub) = (p.topic()?, p.sub()?);
    let query = p.query()?;
    let after = match p.after.trim() {
        "" => None,
        a => Some(parse_id(a)?),
    };
    let group_by = GroupBy::parse(p.group.trim()).ok_or_else(|| {
        ConsoleError::bad_request(format!(
            "`group` must be reason, verdict, consumer or hour, not {}",
            crate::echo(&p.group)
        ))
    })?;
    let page = st
        .api
        .dead_letters(topic, sub, &query, PAGE_SIZE, after)
        .await?;
    let parts = st.api.partitions(topic).await?;
    let grouped = match group_by {
        Some(by) => Some((
            by,
            st.api
                .group_dead_letters(topic, sub, &query, by)
                .await?
                .groups,
        )),
        None => None,
    };
    let mut keep: Vec<(&str, &str)> = vec![("topic", topic), ("sub", sub)];
    keep.extend(p.filter_pairs());
    let last_id = page
        .dead_letters
        .last()
        .and_then(|d| d.message.as_ref()?.id.as_ref())
        .map(|id| id.entry_id);
    let next = match last_id {
        Some(id) if parts.is_none() && page.dead_letters.len() as u32 == PAGE_SIZE => {
            let id = id.to_string();
            let mut pairs = keep.clone();
            pairs.push(("after", &id));
            Some(link("/dead-letters", &pairs))
        }
        _ => None,
    };
    let by_partition = match parts {
        Some(n) => Some(
            partitioned::letters_by_partition(&st, topic, sub, n, &query, &p.filter_pairs())
                .await?,
        ),
        None => None,
    };
    Ok(layout(
        &format!("Dead letters of {sub}"),
        html! {
            h1 { "Dead letters of " a href=(sub_link("/subscription", topic, sub)) { (sub) } }
            p { "on " (topic) }
            form.filters method="get" action="/dead-letters" {
                input type="hidden" name="topic" value=(topic);
                input type="hidden" name="sub" value=(sub);
                label { "Reason contains " input type="text" name="reason" value=(p.reason); }
                " "
                label { "Since " input type="text" name="since" value=(p.since) placeholder="2026-11-30 20:15 or 2h"; }
                " "
                label { "Until " input type="text" name="until" value=(p.until) placeholder="UTC time, or ms"; }
                " "
                label { "Ids " input type="text" name="ids" value=(p.ids) placeholder="12, 15"; }
                " "
                label { "Group by "
                    select name="group" {
                        option value="" { "—" }
                        @for g in ["reason", "verdict", "consumer", "hour"] {
                            option value=(g) selected[p.group.trim() == g] { (g) }
                        }
                    }
                }
                " "
                button type="submit" { "Filter" }
                " "
                a href=(sub_link("/dead-letters", topic, sub)) { "clear" }
            }
            p #matching { (page.total) " dead letters match." }
            @if let Some((by, groups)) = &grouped {
                (groups_table(topic, sub, *by, groups))
            }
            @if let Some(section) = &by_partition { (section) }
            @if page.total > 0 {
                @if by_partition.is_none() { p {
                    a.bulk #replay-all href=(link("/confirm/replay", &keep)) { "Replay all " (page.total) " matching…" }
                    " · "
                    a.bulk #purge-all href=(link("/confirm/purge", &keep)) { "Discard all " (page.total) " matching…" }
                } }
                table.dead-letters {
                    tr {
                        @if by_partition.is_some() { th { "Partition" } }
                        th { "Id" } th { "Dead-lettered" } th { "Reason" } th { "Policy's verdict" } th { "Attempts" }
                        th { "Last consumer" } th { "Key" } th { "Payload" } th { "Actions" }
                    }
                    @for d in &page.dead_letters {
                        @let id = d.message.as_ref().and_then(|m| m.id.as_ref()).map_or(0, |i| i.entry_id);
                        @let ids = id.to_string();
                        // On a base name, each row's own partition.
                        @let part = by_partition.as_ref().and_then(|_| partitioned::letter_partition(d, topic));
                        @let at = part.as_ref().map_or(topic, |(_, name)| name.as_str());
                        @let one = [("topic", at), ("sub", sub), ("ids", ids.as_str())];
                        tr id=(format!("dl-{id}")) {
                            @if by_partition.is_some() { (partitioned::partition_cell(d, topic)) }
                            td.n { a href=(link("/dead-letter", &[("topic", at), ("sub", sub), ("id", &ids)])) { (id) } }
                            td { (fmt_ms(d.dead_lettered_at_ms)) }
                            td.cause { (d.cause) }
                            td.verdict { (d.reason) }
                            td.n { (d.attempts.len()) }
                            td { (d.attempts.last().map(|a| a.consumer.as_str()).unwrap_or("")) }
                            td { (d.message.as_ref().map(|m| m.key.as_str()).unwrap_or("")) }
                            td { (preview(d.message.as_ref().map(|m| m.payload.as_slice()).unwrap_or_default())) }
                            td {
                                a.replay href=(link("/confirm/replay", &one)) { "replay…" }
                                " "
                                a.purge href=(link("/confirm/purge", &one)) { "discard…" }
                            }
                        }
                    }
                }
                @if let Some(next) = next { p { a href=(next) { "Next page →" } } }
            }
        },
    ))
}

/// The group-by table (the broker's `GroupDeadLetters`): each group's
/// count and first and last time, with a link to its dead letters where a
/// filter can express it (a reason, an hour).
fn groups_table(topic: &str, sub: &str, by: GroupBy, groups: &[DeadLetterGroup]) -> Markup {
    let title = match by {
        GroupBy::Reason => "Reason",
        GroupBy::Verdict => "Policy's verdict",
        GroupBy::Consumer => "Last consumer",
        GroupBy::Hour => "Hour (UTC)",
    };
    html! {
        table #groups {
            tr {
                th { (title) } th { "Dead letters" } th { "First" } th { "Last" }
                @if by == GroupBy::Reason { th { "Policy's verdict" } }
            }
            @for g in groups {
                tr {
                    td {
                        @match (by, hour_start_ms(&g.key)) {
                            (GroupBy::Reason, _) => a href=(link("/dead-letters", &[("topic", topic), ("sub", sub), ("reason", &g.key)])) { (g.key) },
                            (GroupBy::Hour, Some(h)) => {
                                @let (since, until) = (h.to_string(), (h + 3_600_000).to_string());
                                a href=(link("/dead-letters", &[("topic", topic), ("sub", sub), ("since", &since), ("until", &until)])) { (fmt_ms(h)) }
                            }
                            _ => { (g.key) },
                        }
                    }
                    td.n { (g.count) }
                    td { (fmt_ms(g.first_at_ms)) }
                    td { (fmt_ms(g.last_at_ms)) }
                    @if by == GroupBy::Reason { td.verdict { (g.verdicts.join("; ")) } }
                }
            }
        }
    }
}

/// An hour group's key (`2026-11-30T20:00:00Z`) as ms since the epoch.
fn hour_start_ms(key: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339(key).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// A message's edit history (fix and resend), newest last.
fn edits_table(edits: &[DeadLetterEdit]) -> Markup {
    html! {
        @if edits.is_empty() {
            p.no-edits { "Never edited." }
        } @else {
            table.edits {
                tr { th { "Time" } th { "By" } th { "Payload" } th { "Properties set" } th { "Properties removed" } th { "Key" } }
                @for e in edits {
                    tr {
                        td { (fmt_ms(e.time_ms)) }
                        td { (e.by) }
                        td { (e.payload_size_before) " → " (e.payload_size_after) " bytes" }
                        td { (e.properties_set.join(", ")) }
                        td { (e.properties_removed.join(", ")) }
                        td { @if e.key_changed { "changed" } @else { "unchanged" } }
                    }
                }
            }
        }
    }
}

/// A dead letter's edit form: posts to the edit confirmation, which
/// changes nothing.
fn edit_form(topic: &str, sub: &str, id: u64, m: &Message) -> Markup {
    let text = std::str::from_utf8(&m.payload).ok();
    html! {
        form.edit #edit method="post" action="/confirm/edit" {
            input type="hidden" name="topic" value=(topic);
            input type="hidden" name="sub" value=(sub);
            input type="hidden" name="id" value=(id);
            @if let Some(text) = text {
                label { "Payload (UTF-8 text)" br; textarea #edit-payload name="payload" rows="6" { (text) } }
            } @else {
                p.warn { "The payload is not UTF-8 text: give a new one in base64 below, or leave it empty to keep it." }
            }
            label {
                "Or a new payload in base64 (replaces the text above when given)" br;
                textarea #edit-payload-b64 name="payload_b64" rows="2" placeholder=(base64::engine::general_purpose::STANDARD.encode(b"{\"fixed\":true}")) {}
            }
            label { "Set properties, one name=value a line" br; textarea #edit-set name="set" rows="3" placeholder="schema=v2" {} }
            label { "Remove properties (names, separated by commas)" br; input #edit-unset type="text" name="unset" size="40"; }
            label { "Key " input #edit-key type="text" name="key" value=(m.key) size="40"; }
            button.go #edit-submit type="submit" { "Review the edit…" }
            " Nothing changes until you confirm on the next page."
        }
    }
}

/// `/dead-letter?topic=T&sub=S&id=N`: one dead letter, every attempt, its
/// properties and payload.
pub(crate) async fn dead_letter(st: ConsoleState, Query(p): Query<Params>) -> Page {
    let (topic, sub) = (p.topic()?, p.sub()?);
    let id = parse_id(&p.id)?;
    let d = one_dead_letter(&st.api, topic, sub, id).await?;
    let m = d.message.clone().unwrap_or_default();
    let ids = id.to_string();
    let one = [("topic", topic), ("sub", sub), ("ids", ids.as_str())];
    Ok(layout(
        &format!("Dead letter {id}"),
        html! {
            h1 { "Dead letter " (id) " of " a href=(sub_link("/subscription", topic, sub)) { (sub) } }
            table {
                tr { th { "Reason" } td #cause { (d.cause) } }
                tr { th { "Policy's verdict" } td #reason { (d.reason) } }
                tr { th { "Dead-lettered" } td { (fmt_ms(d.dead_lettered_at_ms)) } }
                @if let Some(o) = &d.origin {
                    tr { th { "Origin" } td {
                        a href=(link("/message", &[("topic", &o.topic), ("id", &o.entry_id.to_string())])) { (o.topic) " : " (o.entry_id) }
                    } }
                }
                tr { th { "Failures" } td.n { (m.delivery_count) } }
                tr { th { "Key" } td { (m.key) } }
                tr { th { "Published" } td { (fmt_ms(m.publish_time_ms)) " by " (m.producer_name) } }
                tr { th { "Payload size" } td.n { (m.payload.len()) " bytes" } }
            }
            p {
                a.replay href=(link("/confirm/replay", &one)) { "Replay this message…" }
                " · "
                a.purge href=(link("/confirm/purge", &one)) { "Discard this message…" }
            }
            h2 { "Attempts" }
            (attempts_table(&d.attempts))
            h2 { "Edit history" }
            (edits_table(&d.edits))
            h2 { "Properties" }
            (properties_table(&m))
            h2 { "Payload" }
            (payload_view(&m.payload))
            h2 { "Fix and resend" }
            p { "Change the payload, properties or key, then replay it (the next page shows exactly what changes and who receives it)." }
            (edit_form(topic, sub, id, &m))
        },
    ))
}

/// Dead letter `id` of `topic`/`sub`, or 404.
pub(crate) async fn one_dead_letter(
    api: &ConsoleApi,
    topic: &str,
    sub: &str,
    id: u64,
) -> Result<DeadLetter, ConsoleError> {
    let query = DeadLetterQuery {
        ids: vec![id],
        ..Default::default()
    };
    api.dead_letters(topic, sub, &query, 1, None)
        .await?
        .dead_letters
        .into_iter()
        .next()
        .ok_or_else(|| ConsoleError::not_found(format!("no dead letter {id} in {sub} on {topic}")))
}

/// `/message?topic=T&id=N`: a stored message and its state in every
/// subscription of its topic, with each one's attempts.
pub(crate) async fn message(st: ConsoleState, Query(p): Query<Params>) -> Page {
    let topic = p.topic()?;
    let id = parse_id(&p.id)?;
    let r = st.api.message(topic, id).await?;
    let m = r.message.unwrap_or_default();
    Ok(layout(
        &format!("Message {id}"),
        html! {
            h1 { "Message " (id) " of " a href=(link("/topic", &[("topic", topic)])) { (topic) } }
            table {
                tr { th { "Key" } td { (m.key) } }
                tr { th { "Published" } td { (fmt_ms(m.publish_time_ms)) " by " (m.producer_name) " (sequence " (m.sequence_id) ")" } }
                tr { th { "Event time" } td { (fmt_ms(m.event_time_ms)) } }
                tr { th { "Payload size" } td.n { (m.payload.len()) " bytes" } }
            }
            h2 { "In each subscription" }
            @if r.subscriptions.is_empty() { p { "No subscriptions." } }
            @for s in &r.subscriptions {
                h3 { a href=(sub_link("/subscription", topic, &s.subscription)) { (s.subscription) } ": " (s.state) }
                p { (s.delivery_count) " failed deliveries." }
                (attempts_table(&s.attempts))
                @if !s.edits.is_empty() {
                    h4 { "Edits" }
                    (edits_table(&s.edits))
                }
            }
            h2 { "Properties" }
            (properties_table(&m))
            h2 { "Payload" }
            (payload_view(&m.payload))
        },
    ))
}
