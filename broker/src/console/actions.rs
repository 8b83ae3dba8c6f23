//! The console's two changes, replay and discard, each in two steps. The
//! confirmation page (a GET) resolves the filter to the exact dead-letter
//! ids, shows them with the subscription and what will happen to them, and
//! holds that plan here under a random single-use token. Only a POST with
//! that token carries the plan out, on exactly those ids (one that went in
//! the meantime is skipped, and the result says so); a POST without a
//! token, or with one unknown, used or expired, is refused and changes
//! nothing. A page elsewhere cannot make the browser replay or discard
//! anything, since it cannot read the token.
//!
//! Edit-and-replay is a third [`Action`] once the admin API carries it.

use super::pages::{Params, fmt_ms, link};
use super::{ConsoleError, ConsoleState, Page, layout};
use crate::util::lock;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use maud::html;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most dead letters one confirmation may name (narrow the filter for more).
const MAX_IDS: u32 = 10_000;
/// How long a confirmation page's token stays good.
const TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// Most plans held at once; the oldest goes first.
const MAX_PENDING: usize = 256;

/// What a plan does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// The admin API's replay: into the subscription's own retry tier.
    Replay,
    /// The admin API's purge: remove for good.
    Purge,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "replay" => Some(Self::Replay),
            "purge" => Some(Self::Purge),
            _ => None,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Self::Replay => "Replay",
            Self::Purge => "Discard",
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
    shown_at: Instant,
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

    /// The plan held under `token`, once.
    fn take(&self, token: &str) -> Option<Plan> {
        lock(&self.plans)
            .remove(token)
            .filter(|p| p.shown_at.elapsed() < TOKEN_TTL)
    }
}

/// `GET /confirm/{replay|purge}?topic=T&sub=S&<filter>`: what will happen.
pub(crate) async fn confirm(
    State(st): State<ConsoleState>,
    Path(action): Path<String>,
    Query(p): Query<Params>,
) -> Page {
    let action = Action::parse(&action)
        .ok_or_else(|| ConsoleError::not_found("no such action: use replay or purge"))?;
    let (topic, sub) = (p.topic()?, p.sub()?);
    let query = p.query()?;
    let found = st
        .api
        .dead_letters(topic, sub, &query, MAX_IDS, None)
        .await?;
    if found.total > u64::from(MAX_IDS) {
        return Err(ConsoleError::bad_request(format!(
            "{} dead letters match; one action takes at most {MAX_IDS}: narrow the filter",
            found.total
        )));
    }
    let letters = found.dead_letters;
    let ids: Vec<u64> = letters
        .iter()
        .filter_map(|d| Some(d.message.as_ref()?.id.as_ref()?.entry_id))
        .collect();
    let back = link("/dead-letters", &[("topic", topic), ("sub", sub)]);
    let verb = action.verb();
    let title = format!("{verb} dead letters?");
    if ids.is_empty() {
        return Ok(layout(
            &title,
            html! {
                h1 { (title) }
                p #nothing { "No dead letter of " (sub) " on " (topic) " matches: nothing to do." }
                p { a href=(back) { "Back to the dead letters" } }
            },
        ));
    }
    let token = st.pending.hold(Plan {
        action,
        topic: topic.to_owned(),
        sub: sub.to_owned(),
        ids: ids.clone(),
        shown_at: Instant::now(),
    });
    let n = ids.len();
    Ok(layout(
        &title,
        html! {
            h1 { (verb) " " (n) " dead letter" @if n != 1 { "s" } "?" }
            p #plan {
                "Subscription " strong { (sub) } " on topic " strong { (topic) } ", dead-letter ids "
                strong #plan-ids { (ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")) } "."
            }
            @match action {
                Action::Replay => p.warn {
                    "Each moves from " (sub) "'s dead-letter tier into " (sub) "'s own retry tier, due now, "
                    "in one transaction: only " (sub) " receives it again, not the other subscriptions of "
                    strong { (topic) } ". It keeps its payload, key and properties and its failure count."
                },
                Action::Purge => p.warn {
                    "Each is removed from " (sub) "'s dead-letter tier for good. This cannot be undone."
                },
            }
            table {
                tr { th { "Id" } th { "Dead-lettered" } th { "Reason" } th { "Origin" } }
                @for d in &letters {
                    tr {
                        td.n { (d.message.as_ref().and_then(|m| m.id.as_ref()).map_or(0, |i| i.entry_id)) }
                        td { (fmt_ms(d.dead_lettered_at_ms)) }
                        td { (d.reason) }
                        td { (d.origin.as_ref().map(|o| format!("{} : {}", o.topic, o.entry_id)).unwrap_or_default()) }
                    }
                }
            }
            form method="post" action="/act" {
                input type="hidden" name="token" value=(token);
                @match action {
                    Action::Replay => button.go #confirm type="submit" { "Replay " (n) " now" },
                    Action::Purge => button.danger #confirm type="submit" { "Discard " (n) " now" },
                }
                " "
                a #cancel href=(back) { "Cancel" }
            }
            p { "This confirmation is good for " (humantime::format_duration(TOKEN_TTL)) ", once." }
        },
    ))
}

/// The POST body of `/act`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ActForm {
    token: String,
}

/// `POST /act` with `token`: carries out the plan the confirmation page
/// showed.
pub(crate) async fn perform(State(st): State<ConsoleState>, body: Bytes) -> Page {
    let form: ActForm = serde_urlencoded::from_bytes(&body)
        .map_err(|e| ConsoleError::bad_request(format!("malformed form: {e}")))?;
    if form.token.is_empty() {
        return Err(ConsoleError::bad_request(
            "no confirmation token: open the confirmation page and confirm there",
        ));
    }
    let plan = st.pending.take(&form.token).ok_or_else(|| {
        ConsoleError::new(
            StatusCode::FORBIDDEN,
            "this confirmation is unknown, already used or expired: nothing was done; open the confirmation page again",
        )
    })?;
    let (topic, sub) = (plan.topic.as_str(), plan.sub.as_str());
    let planned = plan.ids.len();
    let back = link("/dead-letters", &[("topic", topic), ("sub", sub)]);
    let body = match plan.action {
        Action::Replay => {
            let r = st.api.replay(topic, sub, &plan.ids).await?;
            tracing::info!(
                topic,
                subscription = sub,
                replayed = r.replayed,
                "dead letters replayed from the console"
            );
            html! {
                h1 #done { "Replayed " (r.replayed) " of " (planned) }
                @if (r.replayed as usize) < planned {
                    p.warn { "The others were no longer dead letters of " (sub) "." }
                }
                p { "New messages on " (topic) ":" }
                ul {
                    @for id in &r.new_ids {
                        li { a href=(link("/message", &[("topic", &id.topic), ("id", &id.entry_id.to_string())])) { (id.topic) " : " (id.entry_id) } }
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
    };
    Ok(layout(
        "Done",
        html! {
            (body)
            p { a href=(back) { "Back to the dead letters of " (sub) } }
        },
    ))
}
