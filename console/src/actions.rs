//! The console's changes, each in two steps: replay, discard, edit and
//! replay (fix and resend), and cancelling a replay job. The confirmation
//! page (a GET, or for an edit a POST of the edit form, which changes
//! nothing) asks the broker which dead letters the change would touch (the
//! admin API's dry run, so what is shown is what the broker resolves),
//! shows them with the subscription, what will happen to them and, for an
//! edit, exactly what changes, and holds that plan here under a random
//! single-use token. Only a POST with that token carries the plan out, on
//! exactly those ids (one that went in the meantime is skipped, and the
//! result says so); a POST without a token, or with one unknown, used or
//! expired, is refused and changes nothing. A page elsewhere cannot make
//! the browser change anything, since it cannot read the token.
//!
//! A replay goes into the subscription's own retry tier unless the
//! confirmation's explicit "republish to the topic" choice is taken; it
//! can be due later, or paced as a background replay job.

use super::api::ReplayOptions;
use super::format::{fmt_ms, link};
use super::params::{Params, parse_time};
use super::{ConsoleError, ConsoleState, Page, layout};
use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use base64::Engine;
use maud::{Markup, html};
use ricochet_proto::{DeadLetter, ReplayEdit};
use serde::Deserialize;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Most dead letters one confirmation may name (narrow the filter for more).
const MAX_IDS: usize = 10_000;
/// How long a confirmation page's token stays good.
const TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// Most plans held at once; the oldest goes first.
const MAX_PENDING: usize = 256;

/// What a plan does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// The admin API's replay: by default into the subscription's own
    /// retry tier.
    Replay,
    /// A replay with an edit (fix and resend).
    Edit,
    /// The admin API's purge: remove for good.
    Purge,
    /// Cancel a replay job.
    CancelJob,
    /// Force the outage breaker (or hand it back to its rules).
    Breaker(ricochet_proto::BreakerMode),
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "replay" => Some(Self::Replay),
            "purge" => Some(Self::Purge),
            "cancel-job" => Some(Self::CancelJob),
            other => super::breaker::parse(other).map(Self::Breaker),
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Self::Replay => "Replay",
            Self::Edit => "Edit and replay",
            Self::Purge => "Discard",
            Self::CancelJob => "Cancel",
            Self::Breaker(mode) => super::breaker::verb(mode),
        }
    }
}

/// A confirmed page's plan: this action on exactly these ids.
#[derive(Debug, Clone)]
struct Plan {
    action: Action,
    topic: String,
    sub: String,
    ids: Vec<u64>,
    /// [`Action::Edit`]: the changes.
    edit: Option<ReplayEdit>,
    /// [`Action::CancelJob`]: the job.
    job: u64,
    shown_at: Instant,
}

impl Plan {
    fn new(action: Action, topic: &str, sub: &str, ids: Vec<u64>) -> Self {
        Self {
            action,
            topic: topic.to_owned(),
            sub: sub.to_owned(),
            ids,
            edit: None,
            job: 0,
            shown_at: Instant::now(),
        }
    }
}

/// Plans waiting for their POST, by token.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    plans: Mutex<HashMap<String, Plan>>,
}

impl Pending {
    fn hold(&self, plan: Plan) -> String {
        let token = format!("{:032x}", rand::random::<u128>());
        let mut plans = lock(&self.plans);
        plans.retain(|_, p| p.shown_at.elapsed() < TOKEN_TTL);
        while plans.len() >= MAX_PENDING {
            let oldest = plans
                .iter()
                .min_by_key(|(_, p)| p.shown_at)
                .map(|(t, _)| t.clone());
            match oldest {
                Some(t) => plans.remove(&t),
                None => break,
            };
        }
        plans.insert(token.clone(), plan);
        token
    }

    /// Whether `token` names a plan still good (without using it).
    fn holds(&self, token: &str) -> bool {
        lock(&self.plans)
            .get(token)
            .is_some_and(|p| p.shown_at.elapsed() < TOKEN_TTL)
    }

    /// The plan held under `token`, once.
    fn take(&self, token: &str) -> Option<Plan> {
        lock(&self.plans)
            .remove(token)
            .filter(|p| p.shown_at.elapsed() < TOKEN_TTL)
    }
}

/// `m` locked, poisoned or not (a plan map stays consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn entry_id(d: &DeadLetter) -> u64 {
    d.message
        .as_ref()
        .and_then(|m| m.id.as_ref())
        .map_or(0, |i| i.entry_id)
}

fn ids_text(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The dead letters `ids` of `topic`/`sub`, for the confirmation's table.
async fn letters_of(
    st: &ConsoleState,
    topic: &str,
    sub: &str,
    ids: &[u64],
) -> Result<Vec<DeadLetter>, ConsoleError> {
    let query = super::api::DeadLetterQuery {
        ids: ids.to_vec(),
        ..Default::default()
    };
    Ok(st
        .api
        .dead_letters(topic, sub, &query, MAX_IDS as u32, None)
        .await?
        .dead_letters)
}

/// The replay choices of a confirmation form: where (retry tier, said
/// plainly, or the topic as an explicit choice), when, and how fast.
fn replay_choices(topic: &str, sub: &str, others: &[String]) -> Markup {
    html! {
        fieldset #replay-options {
            legend { "Who receives it" }
            label {
                input type="radio" name="mode" value="retry" checked;
                " Only " strong { (sub) } ": into " (sub) "'s own retry tier, in one transaction. "
                "The other subscriptions of " (topic) " do not see it again. (Default.)"
            }
            br;
            label {
                input #mode-topic type="radio" name="mode" value="topic";
                " Republish to the topic: " strong { "every subscription" } " of " (topic) " receives it again"
                @if others.is_empty() { "." } @else { ", " (others.join(", ")) " included." }
            }
            br;
            label {
                "Deliver at "
                input #deliver-at type="text" name="at" placeholder="now, 10m, or 2026-11-30 21:00 (UTC)";
                " (retry tier only; empty: now)"
            }
            br;
            label {
                "Pace at "
                input #rate type="text" name="rate" placeholder="e.g. 50" size="6";
                " per second, as a background replay job (empty: all at once)"
            }
        }
    }
}

/// The confirmation page around a held plan.
fn confirmation(title: &str, what: Markup, plan: Plan, st: &ConsoleState, extra: Markup) -> Page {
    let page = match plan.action {
        Action::Breaker(_) => "/subscription",
        _ => "/dead-letters",
    };
    let back = link(
        page,
        &[("topic", plan.topic.as_str()), ("sub", plan.sub.as_str())],
    );
    let action = plan.action;
    let n = plan.ids.len();
    let token = st.pending.hold(plan);
    Ok(layout(
        title,
        html! {
            h1 { (title) }
            (what)
            form method="post" action="/act" {
                input type="hidden" name="token" value=(token);
                (extra)
                @match action {
                    Action::Replay => button.go #confirm type="submit" { "Replay " (n) " now" },
                    Action::Edit => button.go #confirm type="submit" { "Apply the edit and replay" },
                    Action::Purge => button.danger #confirm type="submit" { "Discard " (n) " now" },
                    Action::CancelJob => button.danger #confirm type="submit" { "Cancel the job" },
                    Action::Breaker(_) => button.danger #confirm type="submit" { (action.verb()) },
                }
                " "
                a #cancel href=(back) { "Back" }
            }
            p { "This confirmation is good for " (humantime::format_duration(TOKEN_TTL)) ", once." }
        },
    ))
}

/// The other subscriptions of `topic` (those a topic republish reaches too).
async fn other_subscriptions(st: &ConsoleState, topic: &str, sub: &str) -> Vec<String> {
    st.api
        .topic_stats(topic)
        .await
        .map(|t| {
            t.subscriptions
                .into_iter()
                .map(|s| s.subscription)
                .filter(|s| s != sub)
                .collect()
        })
        .unwrap_or_default()
}

fn letters_table(letters: &[DeadLetter]) -> Markup {
    html! {
        table {
            tr { th { "Id" } th { "Dead-lettered" } th { "Reason" } th { "Origin" } }
            @for d in letters {
                tr {
                    td.n { (entry_id(d)) }
                    td { (fmt_ms(d.dead_lettered_at_ms)) }
                    td { (d.cause) }
                    td { (d.origin.as_ref().map(|o| format!("{} : {}", o.topic, o.entry_id)).unwrap_or_default()) }
                }
            }
        }
    }
}

/// `GET /confirm/{replay|purge}?topic=T&sub=S&<filter>`, or
/// `GET /confirm/cancel-job?topic=T&sub=S&job=N`: what will happen.
pub(crate) async fn confirm(
    st: ConsoleState,
    Path(action): Path<String>,
    Query(p): Query<Params>,
) -> Page {
    let action = Action::parse(&action).ok_or_else(|| {
        ConsoleError::not_found(
            "no such action: use replay, purge, cancel-job or breaker-open|close|auto",
        )
    })?;
    let (topic, sub) = (p.topic()?, p.sub()?);
    if let Action::Breaker(mode) = action {
        let what = super::breaker::confirm_text(&st, topic, sub, mode).await?;
        let title = format!("{}?", action.verb());
        return confirmation(
            &title,
            what,
            Plan::new(action, topic, sub, Vec::new()),
            &st,
            html! {},
        );
    }
    if action == Action::CancelJob {
        return confirm_cancel(&st, topic, sub, &p.job).await;
    }
    let query = p.query()?;
    super::partitioned::refuse_base_name(&st, topic).await?;
    // The broker's own answer to the filter: exactly what it would touch.
    let ids = if action == Action::Purge {
        st.api.purge_dry_run(topic, sub, &query).await?
    } else {
        st.api.replay_dry_run(topic, sub, &query).await?
    };
    if ids.len() > MAX_IDS {
        return Err(ConsoleError::bad_request(format!(
            "{} dead letters match; one action takes at most {MAX_IDS}: narrow the filter",
            ids.len()
        )));
    }
    let verb = action.verb();
    let back = link("/dead-letters", &[("topic", topic), ("sub", sub)]);
    if ids.is_empty() {
        let title = format!("{verb} dead letters?");
        return Ok(layout(
            &title,
            html! {
                h1 { (title) }
                p #nothing { "No dead letter of " (sub) " on " (topic) " matches: nothing to do." }
                p { a href=(back) { "Back to the dead letters" } }
            },
        ));
    }
    let letters = letters_of(&st, topic, sub, &ids).await?;
    let n = ids.len();
    let title = format!("{verb} {n} dead letter{}?", if n == 1 { "" } else { "s" });
    let what = html! {
        p #plan {
            "Subscription " strong { (sub) } " on topic " strong { (topic) } ", dead-letter ids "
            strong #plan-ids { (ids_text(&ids)) } "."
        }
        p.note { "These ids are the broker's own answer to the filter (a dry run): exactly what it will touch." }
        @if action == Action::Purge {
            p.warn { "Each is removed from " (sub) "'s dead-letter tier for good. This cannot be undone." }
        } @else {
            p { "Each keeps its payload, key and properties and its failure count." }
        }
        (letters_table(&letters))
    };
    let extra = if action == Action::Replay {
        replay_choices(topic, sub, &other_subscriptions(&st, topic, sub).await)
    } else {
        html! {}
    };
    confirmation(&title, what, Plan::new(action, topic, sub, ids), &st, extra)
}

/// The confirmation of cancelling replay job `job` of `topic`/`sub`.
async fn confirm_cancel(st: &ConsoleState, topic: &str, sub: &str, job: &str) -> Page {
    let id: u64 = job.trim().parse().map_err(|_| {
        ConsoleError::bad_request(format!(
            "`job` must be a replay job id (a number), not {}",
            crate::echo(job)
        ))
    })?;
    let j = st
        .api
        .replay_jobs(topic, sub)
        .await?
        .into_iter()
        .find(|j| j.id == id)
        .ok_or_else(|| {
            ConsoleError::not_found(format!(
                "no replay job {id} running for {sub} on {topic} (it may have finished)"
            ))
        })?;
    let title = format!("Cancel replay job {id}?");
    let what = html! {
        p #plan {
            "Replay job " strong #plan-job { (id) } " of subscription " strong { (sub) } " on topic " strong { (topic) }
            ": " (j.done) " of " (j.total) " done, " (j.replayed) " replayed, started "
            (fmt_ms(j.created_ms)) " by " (j.by) "."
        }
        p.warn {
            "Cancelling stops it: what it has replayed stays replayed; the dead letters it has not reached stay dead letters."
        }
    };
    let mut plan = Plan::new(Action::CancelJob, topic, sub, Vec::new());
    plan.job = id;
    confirmation(&title, what, plan, st, html! {})
}

/// The edit form of a dead letter's page, as posted.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EditForm {
    topic: String,
    sub: String,
    id: String,
    /// The payload as UTF-8 text (absent when the form offered none).
    payload: Option<String>,
    /// A new payload in base64 (wins over `payload` when given).
    payload_b64: String,
    /// `name=value` lines.
    set: String,
    /// Property names, separated by commas or lines.
    unset: String,
    key: Option<String>,
}

/// The changes `f` makes to `m`; `None` when it changes nothing.
fn edit_of(f: &EditForm, m: &ricochet_proto::Message) -> Result<Option<ReplayEdit>, ConsoleError> {
    let b64 = f.payload_b64.split_whitespace().collect::<String>();
    let payload = if !b64.is_empty() {
        Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64.as_bytes())
                .map_err(|e| {
                    ConsoleError::bad_request(format!("`payload_b64` is not base64: {e}"))
                })?,
        )
    } else {
        // Browsers send a textarea's line ends as CRLF: back to LF unless
        // the payload had CRLF itself.
        f.payload.as_ref().map(|text| {
            if m.payload.windows(2).any(|w| w == b"\r\n") {
                text.clone().into_bytes()
            } else {
                text.replace("\r\n", "\n").into_bytes()
            }
        })
    }
    .filter(|p| *p != m.payload);
    let mut set_properties = HashMap::new();
    for line in f.set.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once('=').ok_or_else(|| {
            ConsoleError::bad_request(format!(
                "`set`: each line is name=value; {} is not",
                crate::echo(line)
            ))
        })?;
        let name = name.trim();
        if name.is_empty() {
            return Err(ConsoleError::bad_request(format!(
                "`set`: a property needs a name: {}",
                crate::echo(line)
            )));
        }
        set_properties.insert(name.to_owned(), value.trim().to_owned());
    }
    let unset: BTreeSet<String> = f
        .unset
        .split([',', '\n'])
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(both) = unset.iter().find(|n| set_properties.contains_key(*n)) {
        return Err(ConsoleError::bad_request(format!(
            "property {} is both set and removed: choose one",
            crate::echo(both)
        )));
    }
    let key = f.key.clone().filter(|k| *k != m.key);
    let edit = ReplayEdit {
        payload,
        set_properties,
        unset_properties: unset.into_iter().collect(),
        key,
    };
    Ok((edit != ReplayEdit::default()).then_some(edit))
}

/// What an edit changes, shown before it is made.
fn edit_diff(m: &ricochet_proto::Message, e: &ReplayEdit) -> Markup {
    let mut set: Vec<(&String, &String)> = e.set_properties.iter().collect();
    set.sort();
    html! {
        table #edit-diff {
            tr {
                th { "Payload" }
                td #diff-payload {
                    @match &e.payload {
                        Some(p) => { "changed: " (m.payload.len()) " bytes → " (p.len()) " bytes" },
                        None => { "unchanged (" (m.payload.len()) " bytes)" },
                    }
                }
            }
            tr {
                th { "Properties set" }
                td #diff-set {
                    @if set.is_empty() { "none" }
                    @for (k, v) in &set {
                        div {
                            code { (k) } " = " code { (v) }
                            @match m.properties.get(*k) {
                                Some(old) => { " (was " code { (old) } ")" },
                                None => { " (new)" },
                            }
                        }
                    }
                }
            }
            tr {
                th { "Properties removed" }
                td #diff-unset {
                    @if e.unset_properties.is_empty() { "none" }
                    @for k in &e.unset_properties {
                        div {
                            code { (k) }
                            @match m.properties.get(k) {
                                Some(old) => { " (was " code { (old) } ")" },
                                None => { " (not present: nothing to remove)" },
                            }
                        }
                    }
                }
            }
            tr {
                th { "Key" }
                td #diff-key {
                    @match &e.key {
                        Some(k) => { "changed: " code { (m.key) } " → " code { (k) } },
                        None => { "unchanged (" code { (m.key) } ")" },
                    }
                }
            }
        }
        @if let Some(p) = &e.payload {
            h2 { "New payload" }
            @match std::str::from_utf8(p) {
                Ok(text) => pre #new-payload { (text) },
                Err(_) => {
                    p.warn { "Not UTF-8: shown with replacement characters." }
                    pre #new-payload { (String::from_utf8_lossy(p)) }
                }
            }
        }
    }
}

/// `POST /confirm/edit` (the dead letter's edit form): what the edit
/// changes and who receives the result. Changes nothing.
pub(crate) async fn confirm_edit(st: ConsoleState, body: Bytes) -> Page {
    let form: EditForm = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ConsoleError::bad_request(format!("malformed form: {e}")))?;
    let p = Params {
        topic: form.topic.clone(),
        sub: form.sub.clone(),
        id: form.id.clone(),
        ..Default::default()
    };
    let (topic, sub) = (p.topic()?, p.sub()?);
    let id: u64 = form.id.trim().parse().map_err(|_| {
        ConsoleError::bad_request(format!(
            "`id` must be an entry id (a number), not {}",
            crate::echo(&form.id)
        ))
    })?;
    let d = super::pages::one_dead_letter(&st.api, topic, sub, id).await?;
    let m = d.message.clone().unwrap_or_default();
    let edit = edit_of(&form, &m)?.ok_or_else(|| {
        ConsoleError::bad_request(
            "the edit changes nothing: change the payload, a property or the key (or use Replay to send it unchanged)",
        )
    })?;
    let query = super::api::DeadLetterQuery {
        ids: vec![id],
        ..Default::default()
    };
    let ids = st.api.replay_dry_run(topic, sub, &query).await?;
    if ids != [id] {
        return Err(ConsoleError::not_found(format!(
            "dead letter {id} of {sub} on {topic} is gone"
        )));
    }
    let title = format!("Edit and replay dead letter {id}?");
    let what = html! {
        p #plan {
            "Subscription " strong { (sub) } " on topic " strong { (topic) } ", dead-letter id "
            strong #plan-ids { (id) } " (" (d.cause) ")."
        }
        p { "What changes (recorded in the message's edit history):" }
        (edit_diff(&m, &edit))
    };
    let extra = html! {
        (replay_choices(topic, sub, &other_subscriptions(&st, topic, sub).await))
        p {
            label {
                input #keep-count type="checkbox" name="keep_count" value="on";
                " Keep its delivery count (" (m.delivery_count) "). By default an edited message "
                "starts again from 0: the edit is a new attempt, which its first failure must not "
                "dead-letter again."
            }
        }
    };
    let mut plan = Plan::new(Action::Edit, topic, sub, ids);
    plan.edit = Some(edit);
    confirmation(&title, what, plan, &st, extra)
}

/// The POST body of `/act`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ActForm {
    token: String,
    /// `retry` (default) or `topic`.
    mode: String,
    /// When to deliver (retry tier only): empty or `now`, a duration from
    /// now, or a UTC time.
    at: String,
    /// Per second, as a background job; empty: all at once.
    rate: String,
    /// `on`: an edited dead letter keeps its delivery count.
    keep_count: String,
}

impl ActForm {
    fn options(&self) -> Result<ReplayOptions, ConsoleError> {
        let to_topic = match self.mode.trim() {
            "" | "retry" => false,
            "topic" => true,
            other => {
                return Err(ConsoleError::bad_request(format!(
                    "`mode` must be retry or topic, not {}",
                    crate::echo(other)
                )));
            }
        };
        let deliver_at_ms = parse_at(&self.at)?;
        if to_topic && deliver_at_ms != 0 {
            return Err(ConsoleError::bad_request(
                "a delivery time applies to the retry tier only: clear it to republish to the topic",
            ));
        }
        let rate_per_second = match self.rate.trim() {
            "" => 0,
            r => r.parse::<u32>().ok().filter(|r| *r > 0).ok_or_else(|| {
                ConsoleError::bad_request(format!(
                    "`rate` must be a whole number of messages per second, not {}",
                    crate::echo(r)
                ))
            })?,
        };
        Ok(ReplayOptions {
            to_topic,
            deliver_at_ms,
            edit: None,
            rate_per_second,
            keep_count: !self.keep_count.is_empty(),
        })
    }
}

/// A delivery time: empty or `now` (0), a duration from now (`10m`), or a
/// UTC time / ms since the epoch as the filters take them.
fn parse_at(s: &str) -> Result<u64, ConsoleError> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("now") {
        return Ok(0);
    }
    if let Ok(d) = humantime::parse_duration(s) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        return Ok(now.saturating_add(d.as_millis() as u64));
    }
    parse_time("at", s)
}

/// `POST /act` with `token` (and the replay choices): carries out the plan
/// the confirmation page showed.
pub(crate) async fn perform(st: ConsoleState, body: Bytes) -> Page {
    let form: ActForm = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ConsoleError::bad_request(format!("malformed form: {e}")))?;
    if form.token.is_empty() {
        return Err(ConsoleError::bad_request(
            "no confirmation token: open the confirmation page and confirm there",
        ));
    }
    let refused = || {
        ConsoleError::new(
            StatusCode::FORBIDDEN,
            "this confirmation is unknown, already used or expired: nothing was done; open the confirmation page again",
        )
    };
    if !st.pending.holds(&form.token) {
        return Err(refused());
    }
    // Bad choices are refused before the token is used, so the same
    // confirmation can be sent again corrected.
    let mut options = form.options()?;
    let plan = st.pending.take(&form.token).ok_or_else(refused)?;
    let (topic, sub) = (plan.topic.as_str(), plan.sub.as_str());
    let planned = plan.ids.len();
    let back = link("/dead-letters", &[("topic", topic), ("sub", sub)]);
    let body = match plan.action {
        Action::Replay | Action::Edit => {
            options.edit = plan.edit.clone();
            let r = st.api.replay(topic, sub, &plan.ids, &options).await?;
            tracing::info!(
                topic,
                subscription = sub,
                replayed = r.replayed,
                job = r.job_id,
                edited = options.edit.is_some(),
                to_topic = options.to_topic,
                "dead letters replayed from the console"
            );
            let whom = if options.to_topic {
                html! { "republished to " (topic) ": every subscription receives it" }
            } else if options.deliver_at_ms != 0 {
                html! { "into " (sub) "'s retry tier, due " (fmt_ms(options.deliver_at_ms)) ": only " (sub) " receives it" }
            } else {
                html! { "into " (sub) "'s retry tier, due now: only " (sub) " receives it" }
            };
            if options.rate_per_second > 0 {
                html! {
                    h1 #done { "Replay job " (r.job_id) " started for " (planned) }
                    p { "At most " (options.rate_per_second) " per second, " (whom) ". "
                        "Its progress is on " a href=(link("/subscription", &[("topic", topic), ("sub", sub)])) { "the subscription's page" } "." }
                }
            } else {
                html! {
                    h1 #done { @if plan.action == Action::Edit { "Edited and replayed " } @else { "Replayed " } (r.replayed) " of " (planned) }
                    p #where { "Replayed " (whom) "." }
                    @if (r.replayed as usize) < planned {
                        p.warn { "The others were no longer dead letters of " (sub) "." }
                    }
                    p { "New messages:" }
                    ul {
                        @for id in &r.new_ids {
                            li { a href=(link("/message", &[("topic", &id.topic), ("id", &id.entry_id.to_string())])) { (id.topic) " : " (id.entry_id) } }
                        }
                    }
                }
            }
        }
        Action::Purge => {
            let purged = st.api.purge(topic, sub, &plan.ids).await?;
            tracing::info!(
                topic,
                subscription = sub,
                purged,
                "dead letters discarded from the console"
            );
            html! {
                h1 #done { "Discarded " (purged) " of " (planned) }
                @if (purged as usize) < planned {
                    p.warn { "The others were no longer dead letters of " (sub) "." }
                }
            }
        }
        Action::Breaker(mode) => super::breaker::perform(&st, topic, sub, mode).await?,
        Action::CancelJob => {
            st.api.cancel_replay_job(&plan.topic, plan.job).await?;
            tracing::info!(
                topic,
                subscription = sub,
                job = plan.job,
                "replay job cancelled from the console"
            );
            html! {
                h1 #done { "Cancelled replay job " (plan.job) }
            }
        }
    };
    Ok(layout(
        "Done",
        html! {
            (body)
            p { a href=(back) { "Back to the dead letters of " (sub) } }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::Message;

    fn message(payload: &[u8], key: &str) -> Message {
        Message {
            payload: payload.to_vec(),
            key: key.to_owned(),
            properties: [("schema".to_owned(), "v1".to_owned())].into(),
            ..Default::default()
        }
    }

    fn form(fields: &[(&str, &str)]) -> EditForm {
        serde_urlencoded::from_str(&serde_urlencoded::to_string(fields).unwrap()).unwrap()
    }

    #[test]
    fn an_unchanged_form_is_no_edit_and_browser_line_ends_are_not_a_change() {
        let m = message(b"a\nb", "k");
        assert_eq!(
            edit_of(&form(&[("payload", "a\r\nb"), ("key", "k")]), &m).unwrap(),
            None
        );
        // A payload that had CRLF keeps it.
        let crlf = message(b"a\r\nb", "k");
        assert_eq!(
            edit_of(&form(&[("payload", "a\r\nb")]), &crlf).unwrap(),
            None
        );
        let e = edit_of(&form(&[("payload", "a\r\nc")]), &m)
            .unwrap()
            .unwrap();
        assert_eq!(e.payload.as_deref(), Some(&b"a\nc"[..]));
        assert_eq!((e.key, e.set_properties.len()), (None, 0));
    }

    #[test]
    fn base64_wins_over_text_and_bad_base64_is_refused() {
        let m = message(b"old", "k");
        let e = edit_of(&form(&[("payload", "text"), ("payload_b64", "AAH/\n")]), &m)
            .unwrap()
            .unwrap();
        assert_eq!(e.payload.as_deref(), Some(&[0u8, 1, 255][..]));
        assert!(edit_of(&form(&[("payload_b64", "not base64!")]), &m).is_err());
    }

    #[test]
    fn properties_and_key_parse_and_contradictions_are_refused() {
        let m = message(b"p", "k");
        let e = edit_of(
            &form(&[
                ("set", " schema = v2 \r\n\r\nurl=a=b"),
                ("unset", "junk,\n other ,"),
                ("key", ""),
            ]),
            &m,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            e.set_properties.get("schema").map(String::as_str),
            Some("v2")
        );
        assert_eq!(e.set_properties.get("url").map(String::as_str), Some("a=b"));
        assert_eq!(e.unset_properties, ["junk", "other"]);
        assert_eq!(e.key.as_deref(), Some(""), "an emptied key is a change");
        assert!(edit_of(&form(&[("set", "no-equals")]), &m).is_err());
        assert!(edit_of(&form(&[("set", "=v")]), &m).is_err());
        assert!(edit_of(&form(&[("set", "a=1"), ("unset", "a")]), &m).is_err());
    }

    #[test]
    fn replay_choices_parse_and_a_time_with_the_topic_is_refused() {
        let act = |fields: &[(&str, &str)]| -> Result<ReplayOptions, ConsoleError> {
            serde_urlencoded::from_str::<ActForm>(&serde_urlencoded::to_string(fields).unwrap())
                .unwrap()
                .options()
        };
        let o = act(&[]).unwrap();
        assert_eq!(o, ReplayOptions::default(), "retry tier, now, at once");
        assert!(act(&[("mode", "topic")]).unwrap().to_topic);
        let later = act(&[("at", "10m")]).unwrap().deliver_at_ms;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(later > now + 9 * 60_000 && later <= now + 11 * 60_000);
        assert_eq!(act(&[("at", "now")]).unwrap().deliver_at_ms, 0);
        assert_eq!(act(&[("rate", "25")]).unwrap().rate_per_second, 25);
        assert!(act(&[("mode", "topic"), ("at", "10m")]).is_err());
        assert!(act(&[("mode", "elsewhere")]).is_err());
        assert!(act(&[("rate", "0")]).is_err());
        assert!(act(&[("rate", "fast")]).is_err());
        assert!(act(&[("at", "whenever")]).is_err());
    }
}
