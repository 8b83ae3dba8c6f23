//! The subscription page's key order section: whether per-key ordered
//! retries are on, the keys blocked now (how many, the oldest, messages
//! held) and the longest-blocked few, each with the failed message it waits
//! for. Read from the subscription stats; nothing here acts.

use super::format::fmt_ms;
use maud::{Markup, html};
use ricochet_proto::{DeadLetterPolicyConfig, SubscriptionStatsResponse};

/// `3 h 2 min` style, whole seconds.
fn blocked_for(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(ms / 1000)).to_string()
}

/// The section, or nothing when key order is off.
pub(crate) fn section(
    s: &SubscriptionStatsResponse,
    policy: Option<&DeadLetterPolicyConfig>,
    now_ms: u64,
) -> Markup {
    if !s.key_order {
        return html! {};
    }
    let poison = policy
        .and_then(|p| p.key_order.as_ref())
        .map(|k| k.poison_after_ms)
        .filter(|ms| *ms > 0);
    html! {
        h2 { "Key order" }
        p #key-order {
            "On: while a message of a key waits for its redelivery, later messages of that key are held back; "
            "the key resumes when the failed message is acked or dead-lettered. "
            @match poison {
                Some(ms) => { "A key blocked longer than " (blocked_for(ms)) " is a poison key: it and its held messages are dead-lettered." }
                None => { "No poison limit: a key waits as long as its failed message does." }
            }
        }
        table.counters {
            tr { th { "Blocked keys" } th { "Oldest blocked for" } th { "Held messages" } }
            tr {
                td.n #blocked-keys { (s.blocked_keys) }
                td { @if s.blocked_keys > 0 { (blocked_for(s.oldest_blocked_ms)) } @else { "-" } }
                td.n #held-messages { (s.held_messages) }
            }
        }
        @if !s.top_blocked_keys.is_empty() {
            table #blocked {
                tr { th { "Key" } th { "Blocked since" } th { "For" } th { "Waiting for" } th { "Held" } }
                @for k in &s.top_blocked_keys {
                    tr {
                        td { code { (k.key) } }
                        td { (fmt_ms(k.blocked_since_ms)) }
                        td { (blocked_for(now_ms.saturating_sub(k.blocked_since_ms))) }
                        td { code { (k.failed_id) } }
                        td.n { (k.held) }
                    }
                }
            }
        }
    }
}
