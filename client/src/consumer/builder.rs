//! [`ConsumerBuilder`], and opening a consumer stream: the `Subscribe`
//! handshake, retried on transient failures, then the driver task started
//! on the open stream. The driver reopens streams with the same handshake.

use std::time::Duration;

#[cfg(doc)]
use ricochet_policy::{DeadLetterPolicy, PolicySpec};
use ricochet_proto::{
    ConsumeRequest, ConsumeResponse, Redeliver, Subscribed, consume_request, consume_response,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use super::driver;
use super::redelivery::set_hold;
use super::{Consumer, ConsumerConfig, ConsumerPolicy, InitialPosition, SubscriptionType};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::reconnect::open_with_retry;

/// Consumers are made from a [`Client`].
impl Client {
    /// Starts building a consumer on `topic`.
    pub fn consumer(&self, topic: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder::new(self.clone(), topic.into())
    }
}

/// Builds a [`Consumer`]; see [`Client::consumer`].
#[derive(Debug)]
pub struct ConsumerBuilder {
    client: Client,
    topic: String,
    config: ConsumerConfig,
}

impl ConsumerBuilder {
    pub(crate) fn new(client: Client, topic: String) -> Self {
        Self {
            client,
            topic,
            config: ConsumerConfig::default(),
        }
    }

    /// The subscription name (required).
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.config.subscription = name.into();
        self
    }

    /// The subscription type (default Exclusive).
    pub fn subscription_type(mut self, t: SubscriptionType) -> Self {
        self.config.subscription_type = t;
        self
    }

    /// Where a new subscription starts (default Latest).
    pub fn initial_position(mut self, p: InitialPosition) -> Self {
        self.config.initial_position = p;
        self
    }

    /// The consumer name (default: generated, stable across reconnects).
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.config.consumer_name = Some(name.into());
        self
    }

    /// Messages prefetched ahead of the application (default 1000, at least 1).
    /// The permits of taken messages go back to the broker each time half
    /// the queue was taken, or once the application waits on an empty
    /// queue having taken at least a quarter of it.
    pub fn receiver_queue_size(mut self, n: u32) -> Self {
        self.config.receiver_queue_size = n.max(1);
        self
    }

    /// Redeliver a message not acked within `d` (disabled by default).
    pub fn ack_timeout(mut self, d: Duration) -> Self {
        self.config.ack_timeout = (!d.is_zero()).then_some(d);
        self
    }

    /// Precision of the ack timeout (default `min(1 s, ack_timeout)`).
    pub fn ack_timeout_tick(mut self, d: Duration) -> Self {
        self.config.ack_timeout_tick = Some(d);
        self
    }

    /// Nack delay used when no policy is in force (default 60 s).
    pub fn negative_ack_delay(mut self, d: Duration) -> Self {
        self.config.negative_ack_delay = d;
        self
    }

    /// The subscription's dead-letter policy, the one setter for it: a
    /// [`PolicySpec`] is sent to the broker in `Subscribe` (it applies
    /// unless an operator set one) and built locally for nack delays; an
    /// `Arc<dyn DeadLetterPolicy>` of your own is consulted locally for
    /// nack delays, and sent to the broker when it has a
    /// [`spec`](DeadLetterPolicy::spec). A later call replaces an earlier one.
    pub fn policy(mut self, policy: impl Into<ConsumerPolicy>) -> Self {
        match policy.into() {
            ConsumerPolicy::Spec(spec) => {
                self.config.policy_spec = Some(spec);
                self.config.policy = None;
            }
            ConsumerPolicy::Custom(p) => {
                self.config.policy = Some(p);
                self.config.policy_spec = None;
            }
        }
        self
    }

    /// Overrides the retry tier topic `<topic>-<subscription>-RETRY` (sent
    /// with the policy, so it needs one). Tiers are chosen when the
    /// subscription is created: the broker refuses a name another
    /// subscription or an ordinary topic already has, and a different name
    /// for an existing subscription (FAILED_PRECONDITION).
    pub fn retry_topic(mut self, topic: impl Into<String>) -> Self {
        self.config.retry_topic = Some(topic.into());
        self
    }

    /// Overrides the dead-letter topic `<topic>-<subscription>-DLQ`, under
    /// the rules of [`retry_topic`](Self::retry_topic).
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.config.dead_letter_topic = Some(topic.into());
        self
    }

    /// Per-key ordered retries ([`KeyOrder`](crate::KeyOrder)): while a
    /// message of a key waits for its redelivery, the broker holds later
    /// messages of that key back, and a key has one message out at a time.
    /// For Key_Shared, Failover and Exclusive subscriptions (the broker
    /// refuses it for Shared with INVALID_ARGUMENT); an operator's policy
    /// takes precedence, as for the dead-letter policy.
    pub fn key_order(mut self, key_order: crate::KeyOrder) -> Self {
        self.config.key_order = Some(key_order);
        self
    }

    /// Whether to receive from the retry tier too.
    pub fn retry_enabled(mut self, on: bool) -> Self {
        self.config.retry_enabled = Some(on);
        self
    }

    /// Declares this consumer a dead-letter reader: required to subscribe to
    /// a dead-letter tier topic (`<topic>-<subscription>-DLQ`), which the
    /// broker otherwise refuses with [`ErrorKind::PermissionDenied`](crate::ErrorKind::PermissionDenied).
    /// Dead letters can also be listed, replayed and purged with
    /// [`Client::admin`].
    pub fn dead_letter_reader(mut self, on: bool) -> Self {
        self.config.dead_letter_reader = on;
        self
    }

    /// Ack grouping window (default 100 ms; zero disables grouping).
    pub fn ack_group_time(mut self, d: Duration) -> Self {
        self.config.ack_group_time = d;
        self
    }

    /// Ack grouping size (default 1000).
    pub fn ack_group_max(mut self, n: usize) -> Self {
        self.config.ack_group_max = n.max(1);
        self
    }

    /// Whether held acks go to the broker as soon as the application waits
    /// on an empty queue (`receive`, or polling the stream) or awaits an
    /// ack's receipt ([`ack_receipts`](Self::ack_receipts): the acks
    /// awaited at that moment share a frame), instead of only at the end
    /// of `ack_group_time` or at `ack_group_max` (default on). Grouping saves frames while messages keep coming; once the
    /// application has caught up, holding acks only delays what the broker
    /// waits for: the next message of a key under
    /// [`key_order`](Self::key_order), a consumer's `max_unacked` room,
    /// the cursor. Off, a consumer that receives one message at a time is
    /// held to one message per `ack_group_time` on those paths.
    pub fn ack_flush_on_idle(mut self, on: bool) -> Self {
        self.config.ack_flush_on_idle = on;
        self
    }

    /// Ack receipts (Pulsar's `isAckReceiptEnabled`): `ack`,
    /// `ack_cumulative` and `nack` complete only once the broker has made
    /// them durable, and fail if it refuses or the stream breaks first.
    /// Acks are still grouped (`ack_group_time`); nacks go to the broker at
    /// once, which holds their delay. Default off.
    pub fn ack_receipts(mut self, on: bool) -> Self {
        self.config.ack_receipts = on;
        self
    }

    /// Nacks delayed at least this long are held by the broker (persisted,
    /// surviving this client) instead of here (default 10 s).
    pub fn broker_nack_threshold(mut self, d: Duration) -> Self {
        self.config.broker_nack_threshold = d;
        self
    }

    /// How long before a nack held here is due it is handed to the broker,
    /// with the rest of its delay for the broker to hold (default zero: at
    /// the due time, and the broker then makes the new delivery count
    /// durable before it redelivers, a flush after the due time). A nack due
    /// sooner than the lead goes at once with its whole delay. With a lead,
    /// the attempt is counted up to the lead earlier, and an ack sent within
    /// the lead no longer cancels the redelivery.
    pub fn nack_lead(mut self, d: Duration) -> Self {
        self.config.nack_lead = d;
        self
    }

    /// Redeliver held nacks from a copy kept here once the broker has
    /// counted them ahead (default: on, except on Shared subscriptions,
    /// where a nacked message would then always come back to the consumer
    /// that nacked it). The delivery count is the broker's, stored before
    /// the copy may be used, so a crash of either side loses no count; the
    /// redelivery skips the broker's storage read and dispatch.
    pub fn local_redelivery(mut self, on: bool) -> Self {
        self.config.local_redelivery = Some(on);
        self
    }

    /// At most this many payload bytes of nacked messages are kept for
    /// [`local_redelivery`](Self::local_redelivery) (default 16 MiB); the
    /// broker redelivers the rest.
    pub fn local_redelivery_budget(mut self, bytes: usize) -> Self {
        self.config.local_redelivery_budget = bytes;
        self
    }

    /// On a partitioned topic: how often the partition count is looked up
    /// again, to subscribe to partitions added later (default 60 s; zero
    /// never).
    pub fn partitions_refresh(mut self, d: Duration) -> Self {
        self.config.partitions_refresh = d;
        self
    }

    /// Every setting of `config` at once, for a partition's consumer.
    pub(super) fn with_config(mut self, config: ConsumerConfig) -> Self {
        self.config = config;
        self
    }

    /// Subscribes. Transient failures are retried until the client's request
    /// timeout; a rejection (bad name, type conflict, invalid policy) is
    /// returned at once.
    ///
    /// The topic's partition count is looked up first: on a partitioned
    /// topic this subscribes to every partition and merges them
    /// (`consumer::partitioned`).
    pub async fn subscribe(self) -> Result<Consumer> {
        let cfg = self.config.resolve()?;
        if let Some((base, n)) = crate::partitions::count(&self.client, &self.topic).await? {
            return super::partitioned::subscribe(self.client, base, cfg, n).await;
        }
        Self {
            config: cfg,
            ..self
        }
        .subscribe_topic()
        .await
    }

    /// Subscribes to this one topic (a partition, or an ordinary topic).
    pub(super) async fn subscribe_topic(self) -> Result<Consumer> {
        let cfg = self.config.resolve()?;
        let client = self.client;
        let topic = self.topic;
        let ((conn, subscribed), reconnect) =
            open_with_retry(client.config(), "subscribe", &topic, || {
                open_stream(&client, &topic, &cfg)
            })
            .await?;
        Ok(driver::spawn(
            client,
            topic,
            cfg,
            conn,
            &subscribed,
            reconnect,
        ))
    }
}

/// An open consumer stream: where requests go, and the broker's frames.
pub(super) struct Conn {
    tx: mpsc::UnboundedSender<Outgoing>,
    pub(super) inbound: Streaming<ConsumeResponse>,
}

impl Conn {
    pub(super) fn send(&self, r: consume_request::Request) {
        self.send_made(r, None);
    }

    /// Sends a request the application made at `made`: a `reconsume_later`
    /// tells the broker how long it waited here (see [`stamped`]).
    pub(super) fn send_made(&self, request: consume_request::Request, made: Option<Instant>) {
        // A failure means the stream is gone; the response side reports it.
        let _ = self.tx.send(Outgoing {
            request,
            made,
            due: Vec::new(),
        });
    }

    /// Sends a `Redeliver` request whose `i`-th entry's broker-held hold
    /// ends at `due[i]` (`None`: no hold, or one that is not recomputed).
    pub(super) fn send_redeliver(&self, r: Redeliver, due: Vec<Option<Instant>>) {
        let _ = self.tx.send(Outgoing {
            request: consume_request::Request::Redeliver(r),
            made: Some(Instant::now()),
            due,
        });
    }
}

/// A request on its way to the transport, with when the application made
/// it (for a `reconsume_later`) or the driver queued it (a `Redeliver`).
struct Outgoing {
    request: consume_request::Request,
    made: Option<Instant>,
    /// A `Redeliver`'s holds' ends, entry by entry.
    due: Vec<Option<Instant>>,
}

/// The frame for `o`, built when the transport takes it from the queue.
/// Delays run from the application's call, and the time a request waits in
/// this client is not served again by the broker:
/// - a `reconsume_later`'s frame says how long it waited in the client
///   until now (`waited_us`; the broker takes it off the delay, never more
///   than the whole delay);
/// - a `Redeliver`'s broker-held holds are what is left of each now
///   (rounded up; zero once over). The broker serves a hold from the
///   frame's arrival, so it never redelivers before that.
///
/// Durations on this machine's monotonic clock: no clock is compared.
fn stamped(o: Outgoing) -> ConsumeRequest {
    let mut request = o.request;
    match (&mut request, o.made) {
        (consume_request::Request::ReconsumeLater(r), Some(made)) => {
            r.waited_us = u64::try_from(made.elapsed().as_micros()).unwrap_or(u64::MAX);
        }
        (consume_request::Request::Redeliver(r), made) => {
            let now = Instant::now();
            for (m, due) in r.messages.iter_mut().zip(&o.due) {
                if let Some(due) = due {
                    set_hold(m, due.saturating_duration_since(now));
                }
            }
            tracing::trace!(
                target: "ricochet::burst",
                n = r.messages.len(),
                queued_us = made.map_or(0, |m| now.saturating_duration_since(m).as_micros() as u64),
                "client: a redeliver frame taken by the transport"
            );
        }
        _ => {}
    }
    ConsumeRequest {
        request: Some(request),
    }
}

/// Opens a consumer stream: `Subscribe`, then the broker's `Subscribed`.
pub(super) async fn open_stream(
    client: &Client,
    topic: &str,
    cfg: &ConsumerConfig,
) -> Result<(Conn, Subscribed)> {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Outgoing {
        request: consume_request::Request::Subscribe(cfg.subscribe_request(topic)),
        made: None,
        due: Vec::new(),
    })
    .map_err(|_| Error::closed())?;
    // On the topic's owner (the client's own connection when standalone).
    let transport = client.route(topic).await?;
    let handshake = async {
        let mut inbound = Client::broker_on(transport)
            .consume(UnboundedReceiverStream::new(rx).map(stamped))
            .await
            .map_err(Error::from_status)?
            .into_inner();
        loop {
            match inbound.message().await.map_err(Error::from_status)? {
                Some(ConsumeResponse {
                    response: Some(consume_response::Response::Subscribed(s)),
                }) => {
                    return Ok((inbound, s));
                }
                Some(ConsumeResponse {
                    response: Some(consume_response::Response::Result(r)),
                }) if r.code != 0 => {
                    return Err(Error::from_frame(r.code, r.message, &r.details));
                }
                // Nothing else may come first; skip rather than fail.
                Some(_) => continue,
                None => {
                    return Err(Error::disconnected(
                        "the broker closed the consumer stream during the handshake",
                    ));
                }
            }
        }
    };
    match tokio::time::timeout(client.config().request_timeout, handshake).await {
        Ok(Ok((inbound, s))) => Ok((Conn { tx, inbound }, s)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::timeout(format!("subscribing to {topic}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::{Flow, ReconsumeLater, reconsume_later};

    fn reconsume() -> consume_request::Request {
        consume_request::Request::ReconsumeLater(ReconsumeLater {
            request_id: 1,
            delay: Some(reconsume_later::Delay::DelayMs(200)),
            ..Default::default()
        })
    }

    fn waited_us(r: ConsumeRequest) -> Option<u64> {
        match r.request {
            Some(consume_request::Request::ReconsumeLater(r)) => Some(r.waited_us),
            _ => None,
        }
    }

    /// A `reconsume_later` frame says how long the request waited in the
    /// client from the application's call until the transport took it.
    #[tokio::test(start_paused = true)]
    async fn a_reconsume_frame_carries_its_wait_in_the_client() {
        let made = Instant::now();
        tokio::time::advance(Duration::from_micros(12_300)).await;
        let made = Some(made);
        let frame = stamped(Outgoing {
            request: reconsume(),
            made,
            due: Vec::new(),
        });
        assert_eq!(waited_us(frame), Some(12_300));
        // Nothing known of its call: nothing claimed.
        let frame = stamped(Outgoing {
            request: reconsume(),
            made: None,
            due: Vec::new(),
        });
        assert_eq!(waited_us(frame), Some(0));
        // Other requests go as they were.
        let frame = stamped(Outgoing {
            request: consume_request::Request::Flow(Flow { permits: 5 }),
            made,
            due: Vec::new(),
        });
        assert!(matches!(
            frame.request,
            Some(consume_request::Request::Flow(Flow { permits: 5 }))
        ));
    }

    /// A `Redeliver` frame carries what is left of each broker-held hold
    /// when the transport takes it, not when the driver queued it: the
    /// time it waited in the client is not served again by the broker.
    #[tokio::test(start_paused = true)]
    async fn a_redeliver_frame_carries_what_is_left_of_each_hold_when_taken() {
        let queued = Instant::now();
        let held = |ms: u64| {
            let mut f = ricochet_proto::FailedDelivery::default();
            set_hold(&mut f, Duration::from_millis(ms));
            f
        };
        let request = consume_request::Request::Redeliver(Redeliver {
            request_id: 0,
            // A hold of 1 s, a notice (no hold), a hold of 5 ms.
            messages: vec![held(1_000), held(0), held(5)],
        });
        let due = vec![
            Some(queued + Duration::from_millis(1_000)),
            None,
            Some(queued + Duration::from_millis(5)),
        ];
        tokio::time::advance(Duration::from_micros(12_300)).await;
        let frame = stamped(Outgoing {
            request,
            made: Some(queued),
            due,
        });
        let Some(consume_request::Request::Redeliver(r)) = frame.request else {
            panic!("not a Redeliver frame");
        };
        let holds: Vec<(u64, u64)> = r
            .messages
            .iter()
            .map(|m| (m.delay_us, m.delay_ms))
            .collect();
        // 987.7 ms left (988 rounded up for a broker that reads only ms);
        // nothing for the notice; the 5 ms hold is over: redeliver now.
        assert_eq!(holds, vec![(987_700, 988), (0, 0), (0, 0)]);
    }
}
