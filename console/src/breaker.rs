//! The outage breaker on the console: its state on the subscription page
//! (state, since when, failure ratio, trips, next probe, settings) with
//! links to force it open, force it closed or hand it back to its rules,
//! each behind the confirmation page and single-use token of
//! [`super::actions`]; and what the confirmation says and the POST does.

use super::api::ApiResult;
use super::format::{fmt_ms, link};
use super::{ConsoleError, ConsoleState};
use maud::{Markup, html};
use ricochet_policy::BreakerSpec;
use ricochet_proto::{BreakerMode, BreakerStatus, SubscriptionStatsResponse};

/// The three changes, as the `/confirm/{action}` path names them.
pub(super) const ACTIONS: [(&str, BreakerMode); 3] = [
    ("breaker-open", BreakerMode::ForcedOpen),
    ("breaker-close", BreakerMode::ForcedClosed),
    ("breaker-auto", BreakerMode::Auto),
];

/// The action named `s`, if it is a breaker's.
pub(super) fn parse(s: &str) -> Option<BreakerMode> {
    ACTIONS.iter().find(|(n, _)| *n == s).map(|(_, m)| *m)
}

/// What an operator's choice does, in a verb.
pub(super) fn verb(mode: BreakerMode) -> &'static str {
    match mode {
        BreakerMode::ForcedOpen => "Force the breaker open",
        BreakerMode::ForcedClosed => "Force the breaker closed",
        _ => "Hand the breaker back to its rules",
    }
}

fn mode_name(mode: i32) -> String {
    BreakerMode::try_from(mode)
        .unwrap_or(BreakerMode::Unspecified)
        .as_str_name()
        .trim_start_matches("BREAKER_MODE_")
        .to_ascii_lowercase()
        .replace('_', " ")
}

fn settings(b: &BreakerStatus) -> String {
    b.config
        .as_ref()
        .and_then(|c| BreakerSpec::try_from(c).ok())
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// The subscription page's breaker section (nothing without a breaker).
pub(super) fn section(s: &SubscriptionStatsResponse, topic: &str, sub: &str) -> Markup {
    let Some(b) = &s.breaker else {
        return html! {};
    };
    let ratio = if b.window_settles == 0 {
        0.0
    } else {
        f64::from(b.window_failures) * 100.0 / f64::from(b.window_settles)
    };
    html! {
        h2 { "Outage breaker" }
        table #breaker {
            tr { th { "State" } th { "Since" } th { "Mode" } th { "Failures in window" } th { "Trips" } th { "Next probe" } }
            tr {
                td #breaker-state { (b.state) }
                td { (fmt_ms(b.since_ms)) }
                td #breaker-mode { (mode_name(b.mode)) }
                td { (format!("{ratio:.0}%")) " of " (b.window_settles) }
                td.n { (b.trips) }
                td { (fmt_ms(b.next_probe_ms)) }
            }
        }
        p { "Settings " code { (settings(b)) } ". "
            @for (action, mode) in ACTIONS {
                a.action href=(link(&format!("/confirm/{action}"), &[("topic", topic), ("sub", sub)])) { (verb(mode)) }
                " "
            }
        }
    }
}

/// The confirmation page's text for `mode` on `topic`/`sub`.
pub(super) async fn confirm_text(
    st: &ConsoleState,
    topic: &str,
    sub: &str,
    mode: BreakerMode,
) -> Result<Markup, ConsoleError> {
    let s = st.api.subscription_stats(topic, sub).await?;
    let Some(b) = &s.breaker else {
        return Err(ConsoleError::bad_request(format!(
            "subscription {sub} on {topic} has no breaker; set one with `ricochet policy set TOPIC SUB SPEC --breaker breaker:...`"
        )));
    };
    let effect = match mode {
        BreakerMode::ForcedOpen => {
            "Nothing will be dispatched to its consumers, not even probes, until an operator closes it or hands it back; failures of messages already out spend no attempt."
        }
        BreakerMode::ForcedClosed => {
            "Dispatch resumes at once and the breaker never trips until an operator hands it back to its rules."
        }
        _ => "Its trip rules decide again: an open breaker probes after its first probe interval.",
    };
    Ok(html! {
        p #plan {
            "Subscription " strong { (sub) } " on topic " strong { (topic) } ": the breaker is "
            strong { (b.state) } " (" (mode_name(b.mode)) ")."
        }
        p.warn { (effect) }
    })
}

/// Carries the choice out; the result page's body.
pub(super) async fn perform(
    st: &ConsoleState,
    topic: &str,
    sub: &str,
    mode: BreakerMode,
) -> ApiResult<Markup> {
    let b = st.api.set_breaker(topic, sub, mode).await?;
    tracing::info!(
        topic,
        subscription = sub,
        mode = mode.as_str_name(),
        "breaker forced from the console"
    );
    Ok(html! {
        h1 #done { "The breaker is " (b.state) " (" (mode_name(b.mode)) ")" }
        p { a href=(link("/subscription", &[("topic", topic), ("sub", sub)])) { "Back to the subscription" } }
    })
}
