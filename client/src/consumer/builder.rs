//! [`ConsumerBuilder`]: the consumer's settings, then the first consumer
//! stream opened (`conn::open_stream`, retried on transient failures) and
//! the driver task started on it.

use std::time::Duration;

#[cfg(doc)]
use ricochet_policy::{DeadLetterPolicy, PolicySpec};

use super::conn::open_stream;
use super::driver;
use super::{Consumer, ConsumerConfig, ConsumerPolicy, InitialPosition, SubscriptionType};
use crate::client::Client;
use crate::error::Result;
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
