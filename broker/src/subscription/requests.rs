//! What crosses the boundary between a consumer's gRPC stream and the
//! subscription actor, as domain values: the requests a consumer makes
//! ([`ConsumerRequest`], parsed from protobuf in `service/consume.rs`) and
//! the events sent back to it ([`ConsumerEvent`], turned into frames there).
//!
//! Messages themselves travel as [`ricochet_proto::Message`]: topic logs
//! store each message in that encoding, so a delivery is the stored entry
//! with its id and delivery count filled in, never re-encoded.

use crate::backpressure::StreamBudget;
use crate::error::BrokerError;
use crate::storage::{FailureRecord, PolicySource};
use ricochet_policy::{AttemptOverride, FailureReason, PolicySpec};
use ricochet_proto::{Message, SubscriptionType};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A consumer within its subscription (unique per subscription actor).
pub type ConsumerId = u64;

/// A message as a consumer names it: the topic it was delivered from (the
/// subscription's topic or its retry tier) and its entry id there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MessageRef {
    /// Full topic name.
    pub topic: String,
    /// Entry id in that topic.
    pub entry_id: u64,
}

/// `topic:entry_id`; a topic a client made longer than [`ECHO_CHARS`]
/// characters is cut short (the id may be anything a client sent).
///
/// [`ECHO_CHARS`]: crate::util::ECHO_CHARS
impl std::fmt::Display for MessageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let topic = crate::util::truncate(&self.topic, crate::util::ECHO_CHARS);
        write!(f, "{topic}:{}", self.entry_id)
    }
}

/// One failed delivery in a redelivery request.
#[derive(Debug, Clone)]
pub struct FailedItem {
    /// The message.
    pub id: MessageRef,
    /// Why it failed.
    pub reason: FailureReason,
    /// The consumer's reason text.
    pub detail: String,
    /// Hold it this long before redelivering it in place (zero: at once).
    pub hold: std::time::Duration,
    /// A nack the client holds, sent when made: count it now, keep it in
    /// flight, and redeliver it without a recount when the client asks.
    pub ahead: bool,
    /// A nack counted ahead that the client redelivered itself when due
    /// (after [`ConsumerEvent::CountedAhead`]): kept in flight as a fresh
    /// delivery at its counted attempt, nothing read or sent.
    pub local: bool,
}

/// A consumer's request. `request_id` 0 asks for no reply; any other value
/// is answered by one [`ConsumerEvent::Done`].
#[derive(Debug, Clone)]
pub enum ConsumerRequest {
    /// More permits.
    Flow(u32),
    /// Acknowledgements.
    Ack {
        /// Correlation id.
        request_id: u64,
        /// The messages.
        ids: Vec<MessageRef>,
        /// Acknowledge every main-topic message up to and including the id.
        cumulative: bool,
    },
    /// Redeliver now (a nack after the client-held delay, or an ack
    /// timeout); empty `items` means everything this consumer holds.
    Redeliver {
        /// Correlation id.
        request_id: u64,
        /// The failed deliveries.
        items: Vec<FailedItem>,
    },
    /// Move to the retry tier.
    ReconsumeLater {
        /// Correlation id.
        request_id: u64,
        /// The message.
        id: MessageRef,
        /// The delay asked for (explicit, a level, or the policy's).
        delay: AttemptOverride,
        /// Properties added to the retried message.
        properties: HashMap<String, String>,
        /// The consumer's reason text.
        detail: String,
        /// How long the request waited in the client before it was sent
        /// (the client says; zero from older clients): the delay runs from
        /// that much before the frame's arrival, at most the whole delay.
        waited: std::time::Duration,
    },
    /// Move to the dead-letter tier.
    Terminate {
        /// Correlation id.
        request_id: u64,
        /// The message.
        id: MessageRef,
        /// The consumer's reason text.
        detail: String,
    },
    /// A clean close: what the consumer holds goes back uncounted.
    Close,
    /// Which of these messages are acked (answered at once by
    /// [`ConsumerEvent::Acked`]).
    CheckAcks {
        /// Correlation id.
        request_id: u64,
        /// The messages asked about.
        ids: Vec<MessageRef>,
    },
}

/// The outcome of a consumer's request; an error may answer several
/// requests at once (a batch of moves that failed together).
pub type Outcome = Result<(), Arc<BrokerError>>;

/// The policy in force for a subscription, and where it came from.
#[derive(Debug, Clone)]
pub struct PolicyInfo {
    /// The spec in force, if any.
    pub spec: Option<PolicySpec>,
    /// Who chose it.
    pub source: PolicySource,
    /// Retry tier topic.
    pub retry_topic: String,
    /// Dead-letter tier topic.
    pub dead_letter_topic: String,
    /// Key order, when on.
    pub key_order: Option<ricochet_policy::KeyOrder>,
    /// The outage breaker in force, if any.
    pub breaker: Option<ricochet_policy::BreakerSpec>,
}

/// Sent to a consumer.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// The first event: the subscription it joined and its policy.
    Subscribed {
        /// Full topic name.
        topic: String,
        /// Subscription name.
        subscription: String,
        /// The consumer's name.
        consumer_name: String,
        /// The policy in force (boxed: it is the largest variant by far,
        /// and sent once per consumer).
        policy: Box<PolicyInfo>,
    },
    /// Messages, in dispatch order.
    Messages(Vec<Message>),
    /// The outcome of a request that carried a request id.
    Done {
        /// The request's correlation id.
        request_id: u64,
        /// Its outcome.
        outcome: Outcome,
    },
    /// Failover: whether this consumer is now the active one.
    Active(bool),
    /// The answer to a `CheckAcks`: the ids asked about that are acked.
    Acked {
        /// The request's correlation id.
        request_id: u64,
        /// The acked ones.
        ids: Vec<MessageRef>,
    },
    /// Nacks counted ahead whose records are durable: the client may
    /// redeliver them itself when due, with these delivery counts.
    CountedAhead(Vec<(MessageRef, u32)>),
    /// The stream ends with this error (a protocol violation).
    End(BrokerError),
}

/// Where a consumer's events go: the stream's queue, and (for a stream with
/// a [`StreamBudget`]) the count of answers queued and not yet written, by
/// which the stream's reader stops reading a client that does not read.
#[derive(Debug, Clone)]
pub struct ConsumerTx {
    tx: mpsc::UnboundedSender<ConsumerEvent>,
    budget: Option<Arc<StreamBudget>>,
}

impl ConsumerTx {
    /// Events into `tx`, answers counted in `budget`: every event but
    /// messages (which flow permits bound); the stream's writer calls
    /// [`StreamBudget::answer_taken`] for each one it takes.
    pub(crate) fn counted(
        tx: mpsc::UnboundedSender<ConsumerEvent>,
        budget: Arc<StreamBudget>,
    ) -> Self {
        Self {
            tx,
            budget: Some(budget),
        }
    }

    /// Queues `event` for the consumer; an error hands it back when the
    /// stream is gone.
    pub fn send(&self, event: ConsumerEvent) -> Result<(), mpsc::error::SendError<ConsumerEvent>> {
        match &self.budget {
            Some(b) if event.is_answer() => {
                b.answer_queued();
                self.tx.send(event).inspect_err(|_| b.answer_taken())
            }
            _ => self.tx.send(event),
        }
    }

    /// Resolves once the consumer's stream is gone (its queue's receiver
    /// dropped).
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

impl From<mpsc::UnboundedSender<ConsumerEvent>> for ConsumerTx {
    /// Events into `tx`, uncounted (tests, in-process consumers).
    fn from(tx: mpsc::UnboundedSender<ConsumerEvent>) -> Self {
        Self { tx, budget: None }
    }
}

impl ConsumerEvent {
    /// Whether the event counts as an answer in a stream's budget: all but
    /// messages.
    pub fn is_answer(&self) -> bool {
        !matches!(self, ConsumerEvent::Messages(_))
    }
}

/// A consumer asking to join.
#[derive(Debug)]
pub struct ConsumerSpec {
    /// Consumer name (not required to be unique).
    pub name: String,
    /// Requested subscription type.
    pub sub_type: SubscriptionType,
    /// The consumer's events.
    pub tx: ConsumerTx,
    /// The consumer's dead-letter policy, if it sent one.
    pub policy: Option<PolicySpec>,
    /// Whether it receives messages from the retry tier (Pulsar's `enableRetry`).
    pub retry_enabled: bool,
    /// Key order, if it asked for it.
    pub key_order: Option<ricochet_policy::KeyOrder>,
}

impl ConsumerRequest {
    /// The message ids the request names (what it weighs in its stream's
    /// budget).
    pub fn ids(&self) -> usize {
        match self {
            ConsumerRequest::Ack { ids, .. } | ConsumerRequest::CheckAcks { ids, .. } => ids.len(),
            ConsumerRequest::Redeliver { items, .. } => items.len(),
            _ => 1,
        }
    }
}

/// Where a message of the main topic stands in one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Not yet delivered, or waiting for its redelivery.
    Pending,
    /// Delivered and not yet settled.
    InFlight,
    /// Acknowledged.
    Acked,
    /// Waiting for a due time (a delayed message, or a retry).
    Scheduled,
    /// Moved to the dead-letter tier.
    DeadLettered,
}

impl MessageState {
    /// `pending`, `in_flight`, `acked`, `scheduled` or `dead_lettered`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Pending => "pending",
            MessageState::InFlight => "in_flight",
            MessageState::Acked => "acked",
            MessageState::Scheduled => "scheduled",
            MessageState::DeadLettered => "dead_lettered",
        }
    }
}

/// A message's state in one subscription, with its failure history.
#[derive(Debug, Clone)]
pub struct MessageStatus {
    /// Where it stands.
    pub state: MessageState,
    /// Its persisted failure record, if it failed before.
    pub failures: Option<FailureRecord>,
}
