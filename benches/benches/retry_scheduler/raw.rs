//! A raw gRPC client for the broker, below the client library: a publisher
//! of plain batches and a consumer that sends flow, nack, reconsume-later
//! and ack frames itself and counts the broker's confirmations, so the
//! parts control exactly which frames the broker sees.

use std::time::Duration;

use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use ricochet_testkit::now_ms;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use crate::BoxError;

async fn channel(url: &str) -> Result<Channel, BoxError> {
    Ok(Channel::from_shared(url.to_owned())?.connect().await?)
}

/// Publishes `n` 100-byte messages in batches of 1000, awaiting each receipt.
pub(crate) async fn publish(url: &str, topic: &str, n: usize) -> Result<(), BoxError> {
    let mut client = BrokerClient::new(channel(url).await?);
    let (tx, rx) = mpsc::channel(4);
    tx.send(ProduceRequest {
        request: Some(produce_request::Request::Open(ProducerOpen {
            topic: topic.into(),
            producer_name: "bench".into(),
            resend_in_order: false,
        })),
    })
    .await?;
    let mut inbound = client.produce(ReceiverStream::new(rx)).await?.into_inner();
    // Sequence ids continue from the producer's last stored one (de-duplication).
    let mut seq = match inbound.message().await?.and_then(|r| r.response) {
        Some(produce_response::Response::Opened(o)) => o.last_sequence_id.unwrap_or(0),
        other => return Err(format!("expected ProducerOpened, got {other:?}").into()),
    };
    let mut left = n;
    while left > 0 {
        let k = left.min(1_000);
        left -= k;
        let messages = (0..k)
            .map(|_| {
                seq += 1;
                OutboundMessage {
                    payload: vec![7u8; 100],
                    sequence_id: seq,
                    ..Default::default()
                }
            })
            .collect();
        tx.send(ProduceRequest {
            request: Some(produce_request::Request::Send(SendBatch {
                request_id: seq,
                messages,
            })),
        })
        .await?;
        match inbound.message().await?.and_then(|r| r.response) {
            Some(produce_response::Response::Receipts(_)) => {}
            other => return Err(format!("publish failed: {other:?}").into()),
        }
    }
    Ok(())
}

pub(crate) struct RawConsumer {
    tx: mpsc::Sender<ConsumeRequest>,
    rx: Streaming<ConsumeResponse>,
    /// Requests the broker confirmed (code OK), and when the last one came.
    pub(crate) confirmed: usize,
    pub(crate) last_confirmed_ms: u64,
}

impl RawConsumer {
    pub(crate) async fn subscribe(
        url: &str,
        topic: &str,
        policy: Option<DeadLetterPolicyConfig>,
    ) -> Result<Self, BoxError> {
        let mut client = BrokerClient::new(channel(url).await?);
        let (tx, rx) = mpsc::channel(8_192);
        tx.send(ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(Subscribe {
                topic: topic.into(),
                subscription: "s".into(),
                subscription_type: SubscriptionType::Shared as i32,
                initial_position: InitialPosition::Earliest as i32,
                consumer_name: "bench".into(),
                dead_letter_policy: policy,
                retry_enabled: None,
                dead_letter_reader: false,
            })),
        })
        .await?;
        let mut rx = client.consume(ReceiverStream::new(rx)).await?.into_inner();
        match rx.message().await?.and_then(|r| r.response) {
            Some(consume_response::Response::Subscribed(_)) => Ok(Self {
                tx,
                rx,
                confirmed: 0,
                last_confirmed_ms: 0,
            }),
            other => Err(format!("expected Subscribed, got {other:?}").into()),
        }
    }

    pub(crate) async fn send(&self, r: consume_request::Request) -> Result<(), BoxError> {
        self.tx
            .send(ConsumeRequest { request: Some(r) })
            .await
            .map_err(|_| "consumer stream closed".into())
    }

    pub(crate) async fn flow(&self, permits: usize) -> Result<(), BoxError> {
        self.send(consume_request::Request::Flow(Flow {
            permits: permits as u32,
        }))
        .await
    }

    /// Nacks `ids` in one frame; a non-zero `request_id` asks for a confirmation.
    pub(crate) async fn nack(&self, ids: Vec<MessageId>, request_id: u64) -> Result<(), BoxError> {
        let messages = ids
            .into_iter()
            .map(|id| FailedDelivery {
                id: Some(id),
                reason: FailureReason::Nack as i32,
                detail: String::new(),
                delay_ms: 0,
                ahead: false,
                local: false,
                delay_us: 0,
            })
            .collect();
        self.send(consume_request::Request::Redeliver(Redeliver {
            request_id,
            messages,
        }))
        .await
    }

    pub(crate) async fn reconsume_now(&self, id: MessageId) -> Result<(), BoxError> {
        self.send(consume_request::Request::ReconsumeLater(ReconsumeLater {
            request_id: 0,
            id: Some(id),
            delay: Some(reconsume_later::Delay::DelayMs(0)),
            properties: Default::default(),
            detail: String::new(),
            waited_us: 0,
        }))
        .await
    }

    /// Acks `ids` individually; a non-zero `request_id` asks for a confirmation.
    pub(crate) async fn ack(&self, ids: Vec<MessageId>, request_id: u64) -> Result<(), BoxError> {
        self.send(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Individual as i32,
            ids,
        }))
        .await
    }

    /// Reads frames until `n` requests in all have been confirmed.
    pub(crate) async fn confirmed(&mut self, n: usize, wait: Duration) -> Result<(), BoxError> {
        let deadline = tokio::time::Instant::now() + wait;
        while self.confirmed < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || self.frame(left).await?.is_none() {
                return Err(format!("{} of {n} requests confirmed", self.confirmed).into());
            }
        }
        Ok(())
    }

    /// The next frame of messages (skipping results and other frames).
    pub(crate) async fn messages(
        &mut self,
        wait: Duration,
    ) -> Result<Option<Vec<Message>>, BoxError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.frame(left).await? {
                None => return Ok(None),
                Some(Some(batch)) => return Ok(Some(batch)),
                Some(None) => {}
            }
        }
    }

    /// Reads one frame within `wait` (`None`: none came): its messages, or
    /// `Some(None)` for any other frame (a confirmation is counted). A
    /// confirmation returns at once, so waiting for confirmations never
    /// waits for messages that are not coming (nacks held for an hour).
    async fn frame(&mut self, wait: Duration) -> Result<Option<Option<Vec<Message>>>, BoxError> {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Err(_) => Ok(None),
            Ok(r) => match r?.and_then(|r| r.response) {
                Some(consume_response::Response::Messages(b)) => Ok(Some(Some(b.messages))),
                Some(consume_response::Response::Result(r)) if r.code != 0 => {
                    Err(format!("request failed: {r:?}").into())
                }
                Some(consume_response::Response::Result(_)) => {
                    self.confirmed += 1;
                    self.last_confirmed_ms = now_ms();
                    Ok(Some(None))
                }
                Some(_) => Ok(Some(None)),
                None => Err("consumer stream ended".into()),
            },
        }
    }
}

/// A consumer on a one-level delay policy, with `n` freshly published
/// messages delivered to it once (their ids returned, ready to fail).
pub(crate) async fn failing_consumer(
    url: &str,
    topic: &str,
    delay_ms: u64,
    n: usize,
) -> Result<(RawConsumer, Vec<MessageId>), BoxError> {
    let mut c = RawConsumer::subscribe(url, topic, Some(delay_levels(vec![delay_ms], 16))).await?;
    c.flow(2 * n).await?;
    publish(url, topic, n).await?;
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let Some(msgs) = c.messages(Duration::from_secs(30)).await? else {
            return Err(format!("only {} of {n} first deliveries", ids.len()).into());
        };
        ids.extend(msgs.into_iter().filter_map(|m| m.id));
    }
    Ok((c, ids))
}

pub(crate) fn delay_levels(
    levels_ms: Vec<u64>,
    max_reconsume_times: u32,
) -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        kind: Some(dead_letter_policy_config::Kind::DelayLevels(
            DelayLevelPolicyConfig {
                levels_ms,
                start_level: 1,
                max_reconsume_times,
            },
        )),
        ..Default::default()
    }
}
