//! Failure events: a notice of each dead-lettering, and of each replay and
//! purge of dead letters, published as a JSON message to the namespace's
//! system topic `persistent://<tenant>/<namespace>/__failure_events`, where
//! the ordinary consumer API (and `ricochet events`) reads them.
//!
//! Events are notices, not the record: the dead-letter tier is. One is
//! published once the change it tells of is durable, by a background task
//! that never holds up or fails the change itself; a crash between the two
//! loses the notice (at most once), as NATS advisories do. Each message
//! carries `kind`, `topic` and `subscription` properties so a reader can
//! filter without parsing the payload.

pub use crate::name::EVENTS_TOPIC;
use crate::name::TopicName;
use serde::Serialize;

/// Bytes of a dead letter's payload an event repeats, at most.
pub const EXCERPT_BYTES: usize = 64;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A message was moved to its subscription's dead-letter tier.
    DeadLettered,
    /// An operator replayed dead letters (into the retry tier or the topic).
    Replayed,
    /// An operator purged dead letters.
    Purged,
    /// Key order: a key is held back behind a failed message.
    KeyBlocked,
    /// Key order: a blocked key resumes (its failed message was acked or
    /// dead-lettered).
    KeyReleased,
    /// Key order: a key blocked past `poison_after`; its held messages went
    /// to the dead-letter tier.
    KeyPoisoned,
    /// A subscription's outage breaker opened (tripped, a probe failed, or
    /// forced): dispatch stopped.
    BreakerOpened,
    /// The breaker sent a probe message.
    BreakerProbing,
    /// The breaker closed (a probe was acked, or forced): dispatch resumed.
    BreakerClosed,
}

impl EventKind {
    /// The name in the event and its `kind` property.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::DeadLettered => "dead_lettered",
            EventKind::Replayed => "replayed",
            EventKind::Purged => "purged",
            EventKind::KeyBlocked => "key_blocked",
            EventKind::KeyReleased => "key_released",
            EventKind::KeyPoisoned => "key_poisoned",
            EventKind::BreakerOpened => "breaker_opened",
            EventKind::BreakerProbing => "breaker_probing",
            EventKind::BreakerClosed => "breaker_closed",
        }
    }
}

/// One failure event, as its JSON payload shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailureEvent {
    /// What happened.
    pub kind: EventKind,
    /// When, ms since the epoch.
    pub time_ms: u64,
    /// The subscription's topic.
    pub topic: String,
    /// The subscription.
    pub subscription: String,
    /// Dead-lettered: the message's id in the dead-letter tier
    /// (`<tier topic>:<entry id>`). Breaker events: the probe, or the
    /// message whose failure tripped it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Dead-lettered: where it came from (`<topic>:<entry id>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin_id: Option<String>,
    /// Dead-lettered: why, as the consumer saw it (the last attempt's
    /// detail, else its kind). Breaker events: why it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Dead-lettered: the policy's verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Dead-lettered: failed attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Dead-lettered: the consumer of the last failed attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// Dead-lettered: the first [`EXCERPT_BYTES`] of the payload (UTF-8,
    /// invalid bytes replaced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_excerpt: Option<String>,
    /// Replayed or purged: the dead-letter entry ids concerned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dead_letter_ids: Vec<u64>,
    /// Replayed or purged: by whom (a role, or `anonymous`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Key events: the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Key released or poisoned: how long it was blocked, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked_ms: Option<u64>,
}

impl FailureEvent {
    /// An event of `kind` on `topic`/`subscription` at `time_ms`, every
    /// optional field empty.
    pub fn new(kind: EventKind, time_ms: u64, topic: &str, subscription: &str) -> Self {
        Self {
            kind,
            time_ms,
            topic: topic.to_owned(),
            subscription: subscription.to_owned(),
            message_id: None,
            origin_id: None,
            cause: None,
            verdict: None,
            attempts: None,
            consumer: None,
            payload_excerpt: None,
            dead_letter_ids: Vec::new(),
            by: None,
            key: None,
            blocked_ms: None,
        }
    }

    /// The message that carries this event on its events topic: the JSON
    /// payload, keyed by subscription, with kind, topic and subscription as
    /// properties (to filter on without decoding).
    pub fn to_message(&self) -> ricochet_proto::OutboundMessage {
        ricochet_proto::OutboundMessage {
            payload: self.to_json(),
            key: self.subscription.clone(),
            properties: std::collections::HashMap::from([
                ("kind".to_owned(), self.kind.as_str().to_owned()),
                ("topic".to_owned(), self.topic.clone()),
                ("subscription".to_owned(), self.subscription.clone()),
            ]),
            ..Default::default()
        }
    }

    /// The JSON payload.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings and numbers always serialises.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The first [`EXCERPT_BYTES`] of `payload`, as text.
pub fn excerpt(payload: &[u8]) -> String {
    String::from_utf8_lossy(&payload[..payload.len().min(EXCERPT_BYTES)]).into_owned()
}

/// An event's JSON `payload` without its `payload_excerpt`, or `None` when
/// it has none (or is not a JSON object: left as it is).
pub fn without_excerpt(payload: &[u8]) -> Option<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    v.as_object_mut()?.remove("payload_excerpt")?;
    serde_json::to_vec(&v).ok()
}

/// `events` as messages, grouped by the events topic each goes to (events
/// of a topic without a namespace are left out).
pub fn by_events_topic(
    events: Vec<FailureEvent>,
) -> std::collections::HashMap<TopicName, Vec<ricochet_proto::OutboundMessage>> {
    let mut by_topic = std::collections::HashMap::<_, Vec<_>>::new();
    for e in events {
        if let Some(name) = events_topic_of(&e.topic) {
            by_topic.entry(name).or_default().push(e.to_message());
        }
    }
    by_topic
}

/// The events topic of the namespace `topic` is in.
pub fn events_topic_of(topic: &str) -> Option<TopicName> {
    let t = TopicName::parse_stored(topic).ok()?;
    TopicName::parse_stored(&format!("persistent://{}/{EVENTS_TOPIC}", t.namespace())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_topic_is_per_namespace() {
        assert_eq!(
            events_topic_of("persistent://acme/orders/payments")
                .unwrap()
                .as_str(),
            "persistent://acme/orders/__failure_events"
        );
        assert_eq!(
            events_topic_of("orders").unwrap().as_str(),
            "persistent://public/default/__failure_events"
        );
    }

    #[test]
    fn json_omits_what_a_kind_does_not_have() {
        let mut e = FailureEvent::new(EventKind::Purged, 7, "t", "s");
        e.dead_letter_ids = vec![1, 2];
        e.by = Some("ops".into());
        let v: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(v["kind"], "purged");
        assert_eq!(v["dead_letter_ids"], serde_json::json!([1, 2]));
        assert!(v.get("cause").is_none() && v.get("payload_excerpt").is_none());
    }

    #[test]
    fn an_excerpt_is_taken_out_and_nothing_else() {
        let mut e = FailureEvent::new(EventKind::DeadLettered, 7, "persistent://a/b/t", "s");
        e.payload_excerpt = Some("card 4111".into());
        e.cause = Some("declined".into());
        let hidden = without_excerpt(&e.to_json()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&hidden).unwrap();
        assert!(v.get("payload_excerpt").is_none(), "{v}");
        assert_eq!(v["cause"], "declined");
        assert_eq!(v["time_ms"], 7);
        e.payload_excerpt = None;
        assert_eq!(without_excerpt(&e.to_json()), None);
        assert_eq!(without_excerpt(b"not json"), None);
    }

    #[test]
    fn excerpts_are_short_text() {
        assert_eq!(excerpt(b"hi"), "hi");
        assert_eq!(excerpt(&[b'a'; 100]).len(), EXCERPT_BYTES);
        assert_eq!(excerpt(&[0xff, b'x']), "\u{fffd}x");
    }
}
