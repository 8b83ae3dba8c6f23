//! `Message` (a delivery, with its payload, key, properties, delivery count
//! and the retry-tier properties) and `MessageId` (topic + entry id), as
//! read-only Python objects over the client's types. A `Message` keeps the
//! client's message, so settling it settles exactly that delivery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use ricochet_client::{Message, MessageId};

/// Where a message is stored: its topic and per-topic entry id.
#[pyclass(name = "MessageId", module = "ricochet", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PyMessageId(pub(crate) MessageId);

#[pymethods]
impl PyMessageId {
    /// The topic (fully qualified; a retry tier's for retried messages).
    #[getter]
    fn topic(&self) -> &str {
        self.0.topic()
    }

    /// The per-topic entry id.
    #[getter]
    fn entry_id(&self) -> u64 {
        self.0.entry_id()
    }

    /// True for the receipt of a resend the broker de-duplicated without
    /// naming the original: stored, id unknown.
    #[getter]
    fn is_unknown(&self) -> bool {
        self.0.is_unknown()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("MessageId('{}', {})", self.0.topic(), self.0.entry_id())
    }
}

/// One delivery of a message to a consumer.
#[pyclass(name = "Message", module = "ricochet", frozen)]
#[derive(Debug, Clone)]
pub(crate) struct PyMessage(pub(crate) Arc<Message>);

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[pymethods]
impl PyMessage {
    #[getter]
    fn id(&self) -> PyMessageId {
        PyMessageId(self.0.id().clone())
    }

    /// The topic it was delivered from (the main topic or the retry tier).
    #[getter]
    fn topic(&self) -> &str {
        self.0.topic()
    }

    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.0.payload())
    }

    /// The payload decoded as UTF-8 (`UnicodeDecodeError` if it is not).
    fn text(&self) -> PyResult<String> {
        String::from_utf8(self.0.payload().to_vec()).map_err(|e| {
            pyo3::exceptions::PyUnicodeDecodeError::new_err(format!(
                "the payload is not UTF-8: {e}"
            ))
        })
    }

    #[getter]
    fn key(&self) -> Option<&str> {
        self.0.key()
    }

    /// User properties, plus those the broker adds on tier moves.
    #[getter]
    fn properties(&self) -> HashMap<String, String> {
        self.0.properties().clone()
    }

    /// Failed delivery attempts before this one (0 on the first delivery);
    /// kept by the broker across restarts.
    #[getter]
    fn delivery_count(&self) -> u32 {
        self.0.delivery_count()
    }

    /// `REAL_TOPIC`: where the message was first published (retry and
    /// dead-letter copies).
    #[getter]
    fn real_topic(&self) -> Option<&str> {
        self.0.real_topic()
    }

    /// `ORIGIN_MESSAGE_ID`: `topic:entry_id` of the original message.
    #[getter]
    fn origin_message_id(&self) -> Option<&str> {
        self.0.origin_message_id()
    }

    /// `RECONSUMETIMES`: attempts counted when it was moved to the retry tier.
    #[getter]
    fn reconsume_times(&self) -> Option<u32> {
        self.0.reconsume_times()
    }

    /// `DELAY_TIME` in seconds: the delay applied before this retry.
    #[getter]
    fn delay_time(&self) -> Option<f64> {
        self.0.delay_time().map(|d| d.as_secs_f64())
    }

    /// Whether this delivery came from the retry tier.
    #[getter]
    fn is_retry(&self) -> bool {
        self.0.is_retry()
    }

    /// When the broker stored it (seconds since the epoch).
    #[getter]
    fn publish_time(&self) -> f64 {
        seconds(self.0.publish_time())
    }

    /// The producer's event time (seconds since the epoch), if set.
    #[getter]
    fn event_time(&self) -> Option<f64> {
        self.0.event_time().map(seconds)
    }

    #[getter]
    fn producer_name(&self) -> &str {
        self.0.producer_name()
    }

    #[getter]
    fn sequence_id(&self) -> u64 {
        self.0.sequence_id()
    }

    fn __repr__(&self) -> String {
        format!(
            "Message(id='{}', {} bytes, delivery_count={})",
            self.0.id(),
            self.0.payload().len(),
            self.0.delivery_count()
        )
    }
}
