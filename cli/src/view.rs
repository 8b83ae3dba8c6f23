//! The CLI's JSON schema: serde views of what the broker returns (messages,
//! attempts, dead letters, statistics, policies), built from the protocol
//! types. Field names are snake_case; times are milliseconds since the Unix
//! epoch in `*_ms` fields (0 or absent when unset); payloads are text when
//! they are UTF-8 and hex (`payload_hex`) otherwise.

use std::collections::BTreeMap;
use std::io::Write;

use ricochet_proto as pb;
use serde::Serialize;

use crate::error::Result;
use crate::output::{Block, Table};
use crate::timearg::{Ms, fmt_ms, fmt_relative};

/// The full name of a topic as given on the command line, by the naming
/// rule of Ricochet (and Pulsar): `orders` is
/// `persistent://public/default/orders` and `tenant/ns/orders` is
/// `persistent://tenant/ns/orders`. Anything else is returned unchanged
/// (the broker judges it).
pub fn full_topic_name(topic: &str) -> String {
    if topic.contains("://") {
        return topic.to_owned();
    }
    match topic.split('/').count() {
        1 => format!("persistent://public/default/{topic}"),
        3 => format!("persistent://{topic}"),
        _ => topic.to_owned(),
    }
}

/// Where a message is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdView {
    /// Fully qualified topic (main topic, retry or dead-letter tier).
    pub topic: String,
    /// Per-topic entry id.
    pub entry_id: u64,
}

impl IdView {
    pub(crate) fn from_proto(id: Option<&pb::MessageId>) -> Self {
        id.map_or(
            IdView {
                topic: String::new(),
                entry_id: 0,
            },
            |id| IdView {
                topic: id.topic.clone(),
                entry_id: id.entry_id,
            },
        )
    }
}

impl std::fmt::Display for IdView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.topic, self.entry_id)
    }
}

/// A message with everything the broker stores about it.
#[derive(Debug, Clone, Serialize)]
pub struct MessageView {
    /// Where it is stored.
    pub id: IdView,
    /// Failed attempts before this delivery (for this subscription).
    pub delivery_count: u32,
    /// Routing key, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// User properties plus the tier properties (`REAL_TOPIC`, `ORIGIN_MESSAGE_ID`, …).
    pub properties: BTreeMap<String, String>,
    /// The payload as text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload in hex, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_hex: Option<String>,
    /// Payload size in bytes.
    pub payload_size: usize,
    /// When the broker stored it.
    pub publish_time_ms: u64,
    /// The producer's event time (0: unset).
    pub event_time_ms: u64,
    /// Not deliverable before (0: immediately).
    pub deliver_at_ms: u64,
    /// The producer's name.
    pub producer_name: String,
    /// The producer's sequence id.
    pub sequence_id: u64,
}

impl MessageView {
    /// From a protocol message.
    pub fn from_proto(m: &pb::Message) -> Self {
        let (payload, payload_hex) = payload_text(&m.payload);
        Self {
            id: IdView::from_proto(m.id.as_ref()),
            delivery_count: m.delivery_count,
            key: (!m.key.is_empty()).then(|| m.key.clone()),
            properties: m.properties.clone().into_iter().collect(),
            payload,
            payload_hex,
            payload_size: m.payload.len(),
            publish_time_ms: m.publish_time_ms,
            event_time_ms: m.event_time_ms,
            deliver_at_ms: m.deliver_at_ms,
            producer_name: m.producer_name.clone(),
            sequence_id: m.sequence_id,
        }
    }

    /// From a message a consumer received.
    pub fn from_client(m: &ricochet_client::Message) -> Self {
        let (payload, payload_hex) = payload_text(m.payload());
        let ms = |t: Option<std::time::SystemTime>| t.map_or(0, crate::timearg::time_to_ms);
        Self {
            id: IdView {
                topic: m.id().topic().to_owned(),
                entry_id: m.id().entry_id(),
            },
            delivery_count: m.delivery_count(),
            key: m.key().map(str::to_owned),
            properties: m
                .properties()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            payload,
            payload_hex,
            payload_size: m.payload().len(),
            publish_time_ms: crate::timearg::time_to_ms(m.publish_time()),
            event_time_ms: ms(m.event_time()),
            deliver_at_ms: ms(m.deliver_at()),
            producer_name: m.producer_name().to_owned(),
            sequence_id: m.sequence_id(),
        }
    }

    /// The payload for a table: the text, or `0x…` hex, cut to `max` chars.
    pub fn payload_preview(&self, max: usize) -> String {
        let s = match (&self.payload, &self.payload_hex) {
            (Some(t), _) => t.replace(['\n', '\r', '\t'], " "),
            (None, Some(h)) => format!("0x{h}"),
            (None, None) => String::new(),
        };
        if s.chars().count() > max {
            let mut cut: String = s.chars().take(max.saturating_sub(1)).collect();
            cut.push('…');
            cut
        } else {
            s
        }
    }

    /// `k=v, k=v` in name order.
    pub fn properties_line(&self) -> String {
        if self.properties.is_empty() {
            return "-".to_owned();
        }
        self.properties
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The message as a key/value block (for `message get`, `dlq peek`).
    pub fn block(&self) -> Block {
        let mut b = Block::new();
        b.kv("id", &self.id)
            .kv("key", self.key.as_deref().unwrap_or("-"))
            .kv("published", Ms(self.publish_time_ms));
        if self.event_time_ms != 0 {
            b.kv("event time", Ms(self.event_time_ms));
        }
        if self.deliver_at_ms != 0 {
            b.kv("deliver at", Ms(self.deliver_at_ms));
        }
        b.kv(
            "producer",
            format!("{} (sequence {})", self.producer_name, self.sequence_id),
        )
        .kv("properties", self.properties_line())
        .kv(
            "payload",
            format!(
                "{} ({} bytes)",
                self.payload_preview(200),
                self.payload_size
            ),
        );
        b
    }
}

/// Text for valid UTF-8, hex otherwise.
fn payload_text(p: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(p) {
        Ok(s) => (Some(s.to_owned()), None),
        Err(_) => {
            let mut hex = String::with_capacity(p.len() * 2);
            for b in p {
                hex.push_str(&format!("{b:02x}"));
            }
            (None, Some(hex))
        }
    }
}

/// One failed delivery attempt.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptView {
    /// When it failed.
    pub time_ms: u64,
    /// The delivery count after this failure.
    pub delivery_count: u32,
    /// The consumer that failed it (empty if unknown).
    pub consumer: String,
    /// `nack`, `ack_timeout`, `consumer_lost`, `reconsume_later`, `terminate`.
    pub reason: String,
    /// The consumer's text (nack reason…).
    pub detail: String,
}

impl AttemptView {
    /// From a protocol attempt.
    pub fn from_proto(a: &pb::Attempt) -> Self {
        Self {
            time_ms: a.time_ms,
            delivery_count: a.delivery_count,
            consumer: a.consumer.clone(),
            reason: reason_name(a.reason),
            detail: a.detail.clone(),
        }
    }
}

/// The snake_case name of a protocol failure reason.
pub fn reason_name(raw: i32) -> String {
    ricochet_proto::convert::failure_reason_from_i32(raw)
        .map_or_else(|_| format!("unknown({raw})"), |r| r.as_str().to_owned())
}

/// Writes an attempt history as a table, indented.
pub fn write_attempts(out: &mut dyn Write, attempts: &[AttemptView], indent: usize) -> Result<()> {
    if attempts.is_empty() {
        writeln!(out, "{:indent$}(no failed attempt recorded)", "")?;
        return Ok(());
    }
    let mut t = Table::new(&[">#", "time", "reason", "consumer", "detail"]);
    for a in attempts {
        t.row(vec![
            a.delivery_count.to_string(),
            fmt_ms(a.time_ms),
            a.reason.clone(),
            if a.consumer.is_empty() {
                "-".into()
            } else {
                a.consumer.clone()
            },
            a.detail.clone(),
        ]);
    }
    let mut buf = Vec::new();
    t.write(&mut buf)?;
    for line in String::from_utf8_lossy(&buf).lines() {
        writeln!(out, "{:indent$}{line}", "")?;
    }
    Ok(())
}

/// A consumer attached to a subscription.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerView {
    /// Its name.
    pub name: String,
    /// Messages delivered to it and not acked.
    pub unacked: u64,
    /// Flow permits it has granted.
    pub permits: u64,
    /// Whether it receives (Exclusive/Failover: the active one).
    pub active: bool,
    /// Whether it holds the broker's `max_unacked_per_consumer` unacked
    /// messages and is sent nothing until it acks.
    pub blocked_on_unacked: bool,
}

/// `subscription stats`: the progress of one subscription.
#[derive(Debug, Clone, Serialize)]
pub struct SubscriptionStatsView {
    /// Topic.
    pub topic: String,
    /// Subscription.
    pub subscription: String,
    /// `exclusive`, `shared`, `failover`, `key_shared`.
    #[serde(rename = "type")]
    pub sub_type: String,
    /// Messages not yet acked, in flight and scheduled retries included.
    pub backlog: u64,
    /// Delivered and not acked.
    pub unacked: u64,
    /// Messages waiting in the retry tier for their due time.
    pub scheduled_retries: u64,
    /// Due time of the next scheduled retry (0: none).
    pub next_retry_due_ms: u64,
    /// Scheduled messages by due time, buckets `overdue`, `1m`, `10m`, `1h`,
    /// `2h` (due within that much from now) and `later`.
    pub scheduled_by_due: Vec<DueBucketView>,
    /// Messages in the dead-letter tier.
    pub dead_lettered: u64,
    /// Every entry before this one is acked.
    pub mark_delete_position: u64,
    /// The retry tier topic.
    pub retry_topic: String,
    /// The dead-letter tier topic.
    pub dead_letter_topic: String,
    /// Connected consumers.
    pub consumers: Vec<ConsumerView>,
    /// The outage breaker, if the subscription has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<crate::breaker::BreakerView>,
    /// Key order's blocked keys, when key order is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_order: Option<KeyOrderView>,
}

/// Key order in the stats: keys held back behind a failed message.
#[derive(Debug, Clone, Serialize)]
pub struct KeyOrderView {
    /// Keys blocked now.
    pub blocked_keys: u64,
    /// How long the oldest has been blocked, ms.
    pub oldest_blocked_ms: u64,
    /// Messages held behind them.
    pub held_messages: u64,
    /// The longest-blocked keys: key, since (ms since epoch), the failed
    /// message they wait for, messages held.
    pub top: Vec<(String, u64, String, u64)>,
}

/// One due-time bucket of scheduled messages.
#[derive(Debug, Clone, Serialize)]
pub struct DueBucketView {
    /// `overdue`, `1m`, `10m`, `1h`, `2h` or `later`.
    pub due: String,
    /// Messages in it.
    pub count: u64,
}

impl SubscriptionStatsView {
    /// From the protocol response.
    pub fn from_proto(s: &pb::SubscriptionStatsResponse) -> Self {
        Self {
            topic: s.topic.clone(),
            subscription: s.subscription.clone(),
            sub_type: s
                .subscription_type
                .trim_start_matches("SUBSCRIPTION_TYPE_")
                .to_ascii_lowercase(),
            backlog: s.backlog,
            unacked: s.unacked,
            scheduled_retries: s.scheduled_retries,
            next_retry_due_ms: s.next_retry_due_ms,
            scheduled_by_due: s
                .scheduled_by_due
                .iter()
                .map(|b| DueBucketView {
                    due: b.label.clone(),
                    count: b.count,
                })
                .collect(),
            dead_lettered: s.dead_lettered,
            mark_delete_position: s.mark_delete_position,
            retry_topic: s.retry_topic.clone(),
            dead_letter_topic: s.dead_letter_topic.clone(),
            consumers: s
                .consumers
                .iter()
                .map(|c| ConsumerView {
                    name: c.name.clone(),
                    unacked: c.unacked,
                    permits: c.permits,
                    active: c.active,
                    blocked_on_unacked: c.blocked_on_unacked,
                })
                .collect(),
            key_order: s.key_order.then(|| KeyOrderView {
                blocked_keys: s.blocked_keys,
                oldest_blocked_ms: s.oldest_blocked_ms,
                held_messages: s.held_messages,
                top: s
                    .top_blocked_keys
                    .iter()
                    .map(|k| {
                        (
                            k.key.clone(),
                            k.blocked_since_ms,
                            k.failed_id.clone(),
                            k.held,
                        )
                    })
                    .collect(),
            }),
            breaker: s
                .breaker
                .as_ref()
                .map(crate::breaker::BreakerView::from_proto),
        }
    }

    /// The next retry's due time, absolute and relative.
    pub fn next_retry_text(&self) -> String {
        if self.next_retry_due_ms == 0 {
            "-".to_owned()
        } else {
            format!(
                "{} ({})",
                fmt_ms(self.next_retry_due_ms),
                fmt_relative(self.next_retry_due_ms)
            )
        }
    }

    /// `overdue 0, 1m 3, 10m 0, ...` for the buckets that hold anything.
    pub fn due_text(&self) -> String {
        let parts: Vec<String> = self
            .scheduled_by_due
            .iter()
            .filter(|b| b.count > 0)
            .map(|b| match b.due.as_str() {
                "overdue" | "later" => format!("{}: {}", b.due, b.count),
                within => format!("within {within}: {}", b.count),
            })
            .collect();
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// Human form: a block, then the consumers.
    pub fn write_table(&self, out: &mut dyn Write) -> Result<()> {
        let mut b = Block::new();
        b.kv("topic", &self.topic)
            .kv("subscription", &self.subscription)
            .kv("type", &self.sub_type)
            .kv("backlog", self.backlog)
            .kv("unacked", self.unacked)
            .kv("scheduled retries", self.scheduled_retries)
            .kv("next retry due", self.next_retry_text())
            .kv("scheduled by due", self.due_text())
            .kv("dead-lettered", self.dead_lettered)
            .kv("mark-delete position", self.mark_delete_position)
            .kv("retry topic", &self.retry_topic)
            .kv("dead-letter topic", &self.dead_letter_topic)
            .kv("consumers", self.consumers.len());
        if let Some(k) = &self.key_order {
            b.kv(
                "blocked keys (key order)",
                format!(
                    "{} (oldest {} s), {} messages held",
                    k.blocked_keys,
                    k.oldest_blocked_ms / 1000,
                    k.held_messages
                ),
            );
            for (key, since, failed, held) in &k.top {
                b.kv(
                    "  blocked key",
                    format!(
                        "{key:?} since {} ({}), waiting for {failed}, {held} held",
                        fmt_ms(*since),
                        fmt_relative(*since)
                    ),
                );
            }
        }
        if let Some(br) = &self.breaker {
            b.kv("breaker", br.summary());
        }
        b.write(out, 0)?;
        if !self.consumers.is_empty() {
            writeln!(out)?;
            let mut t = Table::new(&["consumer", ">unacked", ">permits", "active", "blocked"]);
            for c in &self.consumers {
                t.row(vec![
                    c.name.clone(),
                    c.unacked.to_string(),
                    c.permits.to_string(),
                    if c.active { "yes" } else { "no" }.to_owned(),
                    if c.blocked_on_unacked {
                        "yes (unacked cap)"
                    } else {
                        "no"
                    }
                    .to_owned(),
                ]);
            }
            t.write(out)?;
        }
        Ok(())
    }
}

/// A dead letter: the message in the dead-letter tier and its history.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterView {
    /// Its entry id in the dead-letter tier (what `--id` selects).
    pub entry_id: u64,
    /// Where it was when it was dead-lettered.
    pub origin: IdView,
    /// The policy's verdict (why the broker dead-lettered it).
    pub reason: String,
    /// Why it died as the consumer saw it: the last failed attempt's detail
    /// (a nack's text), else that attempt's kind, else the verdict.
    pub cause: String,
    /// When it was dead-lettered.
    pub dead_lettered_at_ms: u64,
    /// Failed attempts before it was dead-lettered.
    pub delivery_count: u32,
    /// The stored message (with `REAL_TOPIC`, `ORIGIN_MESSAGE_ID`, `RECONSUMETIMES`).
    pub message: MessageView,
    /// Every failed attempt.
    pub attempts: Vec<AttemptView>,
    /// Edits made by earlier replays (fix and resend), oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<EditView>,
}

/// An operator's edit of a dead letter, made when it was replayed.
#[derive(Debug, Clone, Serialize)]
pub struct EditView {
    /// When.
    pub time_ms: u64,
    /// Who (a role, or `anonymous`).
    pub by: String,
    /// Payload size before, bytes.
    pub payload_size_before: u64,
    /// Payload size after, bytes.
    pub payload_size_after: u64,
    /// Properties set.
    pub properties_set: Vec<String>,
    /// Properties removed.
    pub properties_removed: Vec<String>,
    /// Whether the key changed.
    pub key_changed: bool,
}

impl EditView {
    /// One line: `TIME by WHO: payload A → B bytes, set k, removed j, key`.
    pub fn line(&self) -> String {
        let mut what = vec![format!(
            "payload {} → {} bytes",
            self.payload_size_before, self.payload_size_after
        )];
        if !self.properties_set.is_empty() {
            what.push(format!("set {}", self.properties_set.join(",")));
        }
        if !self.properties_removed.is_empty() {
            what.push(format!("removed {}", self.properties_removed.join(",")));
        }
        if self.key_changed {
            what.push("new key".to_owned());
        }
        format!(
            "{} by {}: {}",
            crate::timearg::fmt_ms(self.time_ms),
            self.by,
            what.join(", ")
        )
    }
}

impl DeadLetterView {
    /// From the protocol type.
    pub fn from_proto(d: &pb::DeadLetter) -> Self {
        let message = d
            .message
            .as_ref()
            .map(MessageView::from_proto)
            .unwrap_or_else(|| MessageView::from_proto(&pb::Message::default()));
        Self {
            entry_id: message.id.entry_id,
            origin: IdView::from_proto(d.origin.as_ref()),
            reason: d.reason.clone(),
            cause: d.cause.clone(),
            dead_lettered_at_ms: d.dead_lettered_at_ms,
            delivery_count: message.delivery_count,
            attempts: d.attempts.iter().map(AttemptView::from_proto).collect(),
            edits: d
                .edits
                .iter()
                .map(|e| EditView {
                    time_ms: e.time_ms,
                    by: e.by.clone(),
                    payload_size_before: e.payload_size_before,
                    payload_size_after: e.payload_size_after,
                    properties_set: e.properties_set.clone(),
                    properties_removed: e.properties_removed.clone(),
                    key_changed: e.key_changed,
                })
                .collect(),
            message,
        }
    }
}

/// A message's state in one subscription (`message get`).
#[derive(Debug, Clone, Serialize)]
pub struct MessageStateView {
    /// Subscription.
    pub subscription: String,
    /// `pending`, `in_flight`, `acked`, `scheduled`, `dead_lettered`.
    pub state: String,
    /// Failed attempts so far.
    pub delivery_count: u32,
    /// Every failed attempt.
    pub attempts: Vec<AttemptView>,
}

/// `message get`.
#[derive(Debug, Clone, Serialize)]
pub struct MessageInfoView {
    /// The message.
    pub message: MessageView,
    /// Its state per subscription of its topic.
    pub subscriptions: Vec<MessageStateView>,
}

impl MessageInfoView {
    /// From the protocol response.
    pub fn from_proto(r: &pb::GetMessageResponse) -> Self {
        Self {
            message: MessageView::from_proto(&r.message.clone().unwrap_or_default()),
            subscriptions: r
                .subscriptions
                .iter()
                .map(|s| MessageStateView {
                    subscription: s.subscription.clone(),
                    state: s.state.clone(),
                    delivery_count: s.delivery_count,
                    attempts: s.attempts.iter().map(AttemptView::from_proto).collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert_eq!(
            full_topic_name("orders"),
            "persistent://public/default/orders"
        );
        assert_eq!(full_topic_name("a/b/c"), "persistent://a/b/c");
        assert_eq!(full_topic_name("persistent://a/b/c"), "persistent://a/b/c");
        assert_eq!(full_topic_name("a/b"), "a/b");
    }

    #[test]
    fn payloads() {
        assert_eq!(payload_text(b"hi"), (Some("hi".into()), None));
        assert_eq!(payload_text(&[0xff, 0x01]), (None, Some("ff01".into())));
    }

    #[test]
    fn subscription_type_names() {
        let s = SubscriptionStatsView::from_proto(&pb::SubscriptionStatsResponse {
            subscription_type: "SUBSCRIPTION_TYPE_KEY_SHARED".into(),
            ..Default::default()
        });
        assert_eq!(s.sub_type, "key_shared");
        assert_eq!(s.next_retry_text(), "-");
    }
}
