//! Message types: [`MessageId`] (where a message is stored), [`Message`]
//! (what a consumer receives) and [`OutgoingMessage`] with its
//! [`MessageBuilder`] (what a producer sends).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ricochet_proto::props;

/// Identifies one stored message: its topic (a main topic, or a
/// subscription's retry or dead-letter tier) and its per-topic entry id.
///
/// Cheap to clone (the topic name is shared). Displays as `topic:entry_id`,
/// the form used in the `ORIGIN_MESSAGE_ID` property.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    topic: Arc<str>,
    entry_id: u64,
}

impl MessageId {
    /// The entry id a producer receipt carries when the broker recognised a
    /// resend as a duplicate of a message it had already stored but did not
    /// say which one (Pulsar answers `-1:-1` in that case).
    pub const UNKNOWN_ENTRY: u64 = u64::MAX;

    /// An id in `topic` (fully qualified, as the broker names it).
    pub fn new(topic: impl Into<Arc<str>>, entry_id: u64) -> Self {
        Self {
            topic: topic.into(),
            entry_id,
        }
    }

    /// The topic the message is stored in.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The per-topic entry id.
    pub fn entry_id(&self) -> u64 {
        self.entry_id
    }

    /// True for the id of a send the broker de-duplicated without naming
    /// the original (see [`MessageId::UNKNOWN_ENTRY`]): the message is
    /// stored, its id is not known.
    pub fn is_unknown(&self) -> bool {
        self.entry_id == Self::UNKNOWN_ENTRY
    }

    pub(crate) fn topic_arc(&self) -> &Arc<str> {
        &self.topic
    }

    pub(crate) fn to_proto(&self) -> ricochet_proto::MessageId {
        ricochet_proto::MessageId {
            topic: self.topic.to_string(),
            entry_id: self.entry_id,
        }
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.topic, self.entry_id)
    }
}

pub(crate) fn ms_to_time(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

pub(crate) fn time_to_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A message as a consumer receives it.
///
/// Messages redelivered through the subscription's retry tier have an id in
/// the retry topic (`<topic>-<subscription>-RETRY`) and carry Pulsar's
/// properties: [`real_topic`](Self::real_topic),
/// [`origin_message_id`](Self::origin_message_id) and
/// [`reconsume_times`](Self::reconsume_times). Ack them like any other.
#[derive(Debug, Clone)]
pub struct Message {
    pub(crate) id: MessageId,
    payload: Bytes,
    key: String,
    properties: HashMap<String, String>,
    publish_time_ms: u64,
    event_time_ms: u64,
    delivery_count: u32,
    producer_name: String,
    sequence_id: u64,
    deliver_at_ms: u64,
    /// The consumer stream this message arrived on (bumped on reconnect).
    pub(crate) epoch: u64,
}

impl Message {
    /// Builds a message from a frame, its topic name shared through
    /// `intern`; `None` when the broker sent no id.
    pub(crate) fn from_proto(
        m: ricochet_proto::Message,
        epoch: u64,
        intern: impl FnOnce(&str) -> Arc<str>,
    ) -> Option<Self> {
        let id = m.id.as_ref()?;
        let id = MessageId::new(intern(&id.topic), id.entry_id);
        Some(Self {
            id,
            payload: Bytes::from(m.payload),
            key: m.key,
            properties: m.properties,
            publish_time_ms: m.publish_time_ms,
            event_time_ms: m.event_time_ms,
            delivery_count: m.delivery_count,
            producer_name: m.producer_name,
            sequence_id: m.sequence_id,
            deliver_at_ms: m.deliver_at_ms,
            epoch,
        })
    }

    /// The same message delivered again by the client itself (a nack
    /// counted ahead by the broker), at `delivery_count`.
    pub(crate) fn redelivered(mut self, delivery_count: u32) -> Self {
        self.delivery_count = delivery_count;
        self
    }

    /// Where the message is stored; pass it to [`Acker::ack_id`](crate::Acker::ack_id).
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The topic this delivery came from (the main topic or the retry tier).
    pub fn topic(&self) -> &str {
        self.id.topic()
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The payload as UTF-8, if it is.
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// Consumes the message, returning its payload.
    pub fn into_payload(self) -> Bytes {
        self.payload
    }

    /// The routing key, if the producer set one.
    pub fn key(&self) -> Option<&str> {
        (!self.key.is_empty()).then_some(self.key.as_str())
    }

    /// User properties, plus the ones the broker adds on tier moves.
    pub fn properties(&self) -> &HashMap<String, String> {
        &self.properties
    }

    /// One property.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// When the broker stored the message.
    pub fn publish_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.publish_time_ms)
    }

    /// The producer's event time, if set.
    pub fn event_time(&self) -> Option<SystemTime> {
        ms_to_time(self.event_time_ms)
    }

    /// The time before which the message was not deliverable, if it was delayed.
    pub fn deliver_at(&self) -> Option<SystemTime> {
        ms_to_time(self.deliver_at_ms)
    }

    /// How many delivery attempts of this message failed for this
    /// subscription before this one (0 on the first delivery). Persisted by
    /// the broker, so it survives restarts and reconnects.
    pub fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    /// Name of the producer that sent it.
    pub fn producer_name(&self) -> &str {
        &self.producer_name
    }

    /// The producer's sequence id.
    pub fn sequence_id(&self) -> u64 {
        self.sequence_id
    }

    /// `REAL_TOPIC`: the topic the message was first published to (set on
    /// retry-tier and dead-letter copies).
    pub fn real_topic(&self) -> Option<&str> {
        self.property(props::REAL_TOPIC)
    }

    /// `ORIGIN_MESSAGE_ID`: `topic:entry_id` of the original message (set on
    /// retry-tier and dead-letter copies).
    pub fn origin_message_id(&self) -> Option<&str> {
        self.property(props::ORIGIN_MESSAGE_ID)
    }

    /// `RECONSUMETIMES`: how many times the message went through the retry
    /// tier's bookkeeping (its failed attempts when moved).
    pub fn reconsume_times(&self) -> Option<u32> {
        self.property(props::RECONSUME_TIMES)
            .and_then(|v| v.parse().ok())
    }

    /// `DELAY_TIME`: the delay applied before this retry-tier delivery.
    pub fn delay_time(&self) -> Option<Duration> {
        self.property(props::DELAY_TIME)
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis)
    }

    /// Whether this delivery came from a retry tier (its `REAL_TOPIC`
    /// differs from the topic it was delivered from).
    pub fn is_retry(&self) -> bool {
        self.real_topic().is_some_and(|t| t != self.topic())
    }
}

/// A message to send. Build one with [`OutgoingMessage::builder`], or
/// convert a payload directly (`Vec<u8>`, `&[u8]`, `&str`, `String`, `Bytes`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutgoingMessage {
    pub(crate) payload: Vec<u8>,
    pub(crate) key: String,
    pub(crate) properties: HashMap<String, String>,
    pub(crate) event_time_ms: u64,
    pub(crate) deliver_at_ms: u64,
}

impl OutgoingMessage {
    /// A message with this payload and nothing else.
    pub fn new(payload: impl Into<Vec<u8>>) -> Self {
        Self {
            payload: payload.into(),
            ..Self::default()
        }
    }

    /// Starts building a message.
    pub fn builder(payload: impl Into<Vec<u8>>) -> MessageBuilder {
        MessageBuilder {
            msg: Self::new(payload),
        }
    }

    /// Its size as the broker's message size limit counts it: payload,
    /// key, and every property name and value.
    pub fn counted_size(&self) -> usize {
        ricochet_proto::counted_size(&self.payload, &self.key, &self.properties)
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Bytes this message adds to a batch (payload, key and properties).
    pub(crate) fn size(&self) -> usize {
        self.payload.len()
            + self.key.len()
            + self
                .properties
                .iter()
                .map(|(k, v)| k.len() + v.len() + 4)
                .sum::<usize>()
            + 24
    }

    pub(crate) fn into_proto(self, sequence_id: u64) -> ricochet_proto::OutboundMessage {
        ricochet_proto::OutboundMessage {
            payload: self.payload,
            key: self.key,
            properties: self.properties,
            event_time_ms: self.event_time_ms,
            deliver_at_ms: self.deliver_at_ms,
            sequence_id,
        }
    }
}

impl From<Vec<u8>> for OutgoingMessage {
    fn from(p: Vec<u8>) -> Self {
        Self::new(p)
    }
}

impl From<&[u8]> for OutgoingMessage {
    fn from(p: &[u8]) -> Self {
        Self::new(p)
    }
}

impl From<&str> for OutgoingMessage {
    fn from(p: &str) -> Self {
        Self::new(p)
    }
}

impl From<String> for OutgoingMessage {
    fn from(p: String) -> Self {
        Self::new(p)
    }
}

impl From<Bytes> for OutgoingMessage {
    fn from(p: Bytes) -> Self {
        Self::new(p)
    }
}

impl From<MessageBuilder> for OutgoingMessage {
    fn from(b: MessageBuilder) -> Self {
        b.build()
    }
}

/// Builds an [`OutgoingMessage`].
///
/// ```
/// use std::time::Duration;
/// use ricochet_client::OutgoingMessage;
/// let msg = OutgoingMessage::builder("hello")
///     .key("user-42")
///     .property("source", "docs")
///     .deliver_after(Duration::from_secs(5))
///     .build();
/// assert_eq!(msg.payload(), b"hello");
/// ```
#[derive(Debug, Clone)]
pub struct MessageBuilder {
    msg: OutgoingMessage,
}

impl MessageBuilder {
    /// Routing key (Key_Shared) and user key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.msg.key = key.into();
        self
    }

    /// Adds one property.
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.msg.properties.insert(name.into(), value.into());
        self
    }

    /// Adds properties.
    pub fn properties<K: Into<String>, V: Into<String>>(
        mut self,
        props: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.msg
            .properties
            .extend(props.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The application's event time.
    pub fn event_time(mut self, t: SystemTime) -> Self {
        self.msg.event_time_ms = time_to_ms(t);
        self
    }

    /// Deliver no earlier than `delay` from now (broker-side scheduling,
    /// measured from when the message is built).
    pub fn deliver_after(self, delay: Duration) -> Self {
        self.deliver_at(SystemTime::now() + delay)
    }

    /// Deliver no earlier than `at` (wall-clock).
    pub fn deliver_at(mut self, at: SystemTime) -> Self {
        self.msg.deliver_at_ms = time_to_ms(at);
        self
    }

    /// The message.
    pub fn build(self) -> OutgoingMessage {
        self.msg
    }
}
