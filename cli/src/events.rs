//! `events`: a namespace's failure events (a message dead-lettered, dead
//! letters replayed or purged) from its `__failure_events` topic, through a
//! subscription of the CLI's own (`ricochet-events` unless named), so a
//! second run starts where the first stopped. Filtered by topic,
//! subscription and kind; one line each, or the event's JSON with
//! `--output json`. Without `--follow` it stops once nothing has arrived for
//! `--idle`.

use std::time::Duration;

use ricochet_client::InitialPosition;
use serde_json::Value;

use crate::Ctx;
use crate::args::EventsArgs;
use crate::error::Result;
use crate::output::write_json_line;
use crate::timearg::fmt_ms;

/// The events topic of `namespace` (`tenant/namespace`).
fn events_topic(namespace: &str) -> String {
    format!("persistent://{namespace}/__failure_events")
}

/// Whether `topic` (as an event names it, in full) is the one `wanted` names,
/// in full or bare (`orders`: `persistent://public/default/orders`).
fn same_topic(topic: &str, wanted: &str) -> bool {
    topic == wanted || topic == format!("persistent://public/default/{wanted}")
}

pub(crate) async fn run(ctx: &mut Ctx<'_>, a: EventsArgs) -> Result<()> {
    let client = ctx.client().await?;
    let mut consumer = client
        .consumer(events_topic(&a.namespace))
        .subscription(&a.reader)
        .initial_position(InitialPosition::Earliest)
        .ack_group_time(Duration::ZERO)
        .subscribe()
        .await?;
    loop {
        let msg = if a.follow {
            tokio::select! {
                m = consumer.receive() => m?,
                _ = tokio::signal::ctrl_c() => break,
            }
        } else {
            match tokio::time::timeout(a.idle, consumer.receive()).await {
                Ok(m) => m?,
                Err(_) => break,
            }
        };
        let prop = |k: &str| msg.property(k).unwrap_or_default().to_owned();
        let keep = a
            .topic
            .as_deref()
            .is_none_or(|t| same_topic(&prop("topic"), t))
            && a.subscription
                .as_deref()
                .is_none_or(|s| prop("subscription") == s)
            && a.kind.as_deref().is_none_or(|k| prop("kind") == k);
        if keep {
            let event: Value = serde_json::from_slice(msg.payload()).unwrap_or(Value::Null);
            if ctx.json() {
                write_json_line(ctx.out, &event)?;
            } else {
                writeln!(ctx.out, "{}", line(&event))?;
            }
            ctx.out.flush()?;
        }
        consumer.ack(&msg).await?;
    }
    consumer.close().await?;
    Ok(())
}

/// One event as a line: time, kind, where, then what the kind carries.
fn line(e: &Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or("-").to_owned();
    let head = format!(
        "{}  {}  {} {}",
        fmt_ms(e["time_ms"].as_u64().unwrap_or(0)),
        s("kind"),
        s("topic"),
        s("subscription")
    );
    match e["kind"].as_str() {
        Some("dead_lettered") => format!(
            "{head}  {}  cause={:?}  verdict={:?}  attempts={}  consumer={}",
            s("message_id"),
            s("cause"),
            s("verdict"),
            e["attempts"].as_u64().unwrap_or(0),
            s("consumer"),
        ),
        Some(k) if k.starts_with("breaker_") => match e["message_id"].as_str() {
            Some(m) => format!("{head}  {:?}  message={m}", s("cause")),
            None => format!("{head}  {:?}", s("cause")),
        },
        _ => {
            let ids: Vec<String> = e["dead_letter_ids"]
                .as_array()
                .map(|a| a.iter().map(ToString::to_string).collect())
                .unwrap_or_default();
            format!(
                "{head}  {} dead letter(s) [{}] by {}",
                ids.len(),
                ids.join(" "),
                s("by")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_what_each_kind_carries() {
        let dead = serde_json::json!({
            "kind": "dead_lettered", "time_ms": 0, "topic": "t", "subscription": "s",
            "message_id": "t-s-DLQ:3", "cause": "card declined",
            "verdict": "attempt 2 exceeds max_redeliver_count 1", "attempts": 2, "consumer": "c1"
        });
        let l = line(&dead);
        assert!(
            l.contains("dead_lettered  t s  t-s-DLQ:3  cause=\"card declined\""),
            "{l}"
        );
        assert!(l.ends_with("attempts=2  consumer=c1"), "{l}");
        let purged = serde_json::json!({
            "kind": "purged", "time_ms": 0, "topic": "t", "subscription": "s",
            "dead_letter_ids": [1, 2], "by": "ops"
        });
        assert!(line(&purged).ends_with("2 dead letter(s) [1 2] by ops"));
        let opened = serde_json::json!({
            "kind": "breaker_opened", "time_ms": 0, "topic": "t", "subscription": "s",
            "cause": "10 of the last 10 settles failed", "message_id": "t:7"
        });
        let l = line(&opened);
        assert!(
            l.ends_with("breaker_opened  t s  \"10 of the last 10 settles failed\"  message=t:7"),
            "{l}"
        );
    }

    #[test]
    fn topics_match_bare_or_full() {
        assert!(same_topic("persistent://public/default/orders", "orders"));
        assert!(same_topic("persistent://a/b/c", "persistent://a/b/c"));
        assert!(!same_topic("persistent://a/b/orders", "orders"));
    }
}
