//! The gRPC protocol spoken directly, for tests of the broker's wire
//! behaviour (the client crate is tested separately): a minimal producer and
//! consumer that show every frame, panic on anything unexpected, and leave
//! request ids, permits and sequence ids to the test.

use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

/// How long tests wait for something that should come.
pub const WAIT: Duration = Duration::from_secs(5);
/// How long tests wait to be sure nothing comes.
pub const QUIET: Duration = Duration::from_millis(300);

/// A connected channel to `url` (panics if it cannot connect).
pub async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// A producer stream: one batch in flight at a time.
#[derive(Debug)]
pub struct RawProducer {
    tx: mpsc::Sender<ProduceRequest>,
    rx: Streaming<ProduceResponse>,
    pub name: String,
    pub next_seq: u64,
    /// The last sequence id the broker had stored for this name at open.
    pub last_sequence_id: Option<u64>,
    next_req: u64,
}

impl RawProducer {
    /// Opens a producer on `topic` (`name` empty: the broker names it);
    /// sequence ids continue from the last one the broker stored for it.
    pub async fn open(url: &str, topic: &str, name: &str) -> Result<Self, Status> {
        Self::open_with(url, topic, name, false).await
    }

    /// Like [`open`](Self::open), with `ProducerOpen.resend_in_order` set
    /// as given (the broker then ends the stream after a batch it could
    /// not store).
    pub async fn open_with(
        url: &str,
        topic: &str,
        name: &str,
        resend_in_order: bool,
    ) -> Result<Self, Status> {
        let mut client = BrokerClient::new(channel(url).await);
        let (tx, rx) = mpsc::channel(64);
        tx.send(ProduceRequest {
            request: Some(produce_request::Request::Open(ProducerOpen {
                topic: topic.into(),
                producer_name: name.into(),
                resend_in_order,
            })),
        })
        .await
        .unwrap();
        let mut rx = client.produce(ReceiverStream::new(rx)).await?.into_inner();
        let opened = match rx.message().await?.and_then(|r| r.response) {
            Some(produce_response::Response::Opened(o)) => o,
            other => panic!("expected ProducerOpened, got {other:?}"),
        };
        let next_seq = opened.last_sequence_id.map_or(0, |s| s.wrapping_add(1));
        Ok(Self {
            tx,
            rx,
            name: opened.producer_name,
            next_seq,
            last_sequence_id: opened.last_sequence_id,
            next_req: 1,
        })
    }

    /// Sends one batch and waits for its outcome.
    pub async fn send_batch(
        &mut self,
        messages: Vec<OutboundMessage>,
    ) -> produce_response::Response {
        self.try_send_batch(messages).await.expect("a response")
    }

    /// Like `send_batch`, but `None` when the stream broke.
    pub async fn try_send_batch(
        &mut self,
        messages: Vec<OutboundMessage>,
    ) -> Option<produce_response::Response> {
        self.send_batch_result(messages).await.ok()
    }

    /// Like `try_send_batch`, with the status that ended the stream
    /// (`Err`) instead of `None`.
    pub async fn send_batch_result(
        &mut self,
        messages: Vec<OutboundMessage>,
    ) -> Result<produce_response::Response, Status> {
        let request_id = self.next_req;
        self.next_req += 1;
        self.tx
            .send(ProduceRequest {
                request: Some(produce_request::Request::Send(SendBatch {
                    request_id,
                    messages,
                })),
            })
            .await
            .map_err(|_| Status::unavailable("the producer stream is closed"))?;
        self.rx
            .message()
            .await?
            .and_then(|r| r.response)
            .ok_or_else(|| Status::unavailable("the producer stream ended"))
    }

    /// A message with the next sequence id.
    pub fn msg(&mut self, payload: impl Into<Vec<u8>>) -> OutboundMessage {
        let m = OutboundMessage {
            payload: payload.into(),
            sequence_id: self.next_seq,
            ..Default::default()
        };
        self.next_seq += 1;
        m
    }

    /// Sends payloads as one batch, returns their ids.
    pub async fn send(&mut self, payloads: &[&str]) -> Vec<MessageId> {
        let msgs = payloads
            .iter()
            .map(|p| self.msg(p.as_bytes().to_vec()))
            .collect();
        self.send_messages(msgs).await
    }

    /// Sends `msgs` as one batch, returns their ids (panics unless receipted).
    pub async fn send_messages(&mut self, msgs: Vec<OutboundMessage>) -> Vec<MessageId> {
        match self.send_batch(msgs).await {
            produce_response::Response::Receipts(r) => r
                .receipts
                .into_iter()
                .map(|r| r.message_id.unwrap())
                .collect(),
            other => panic!("send failed: {other:?}"),
        }
    }
}

/// A consumer stream: messages, command results and active-consumer
/// changes are buffered separately as they arrive.
#[derive(Debug)]
pub struct RawConsumer {
    tx: mpsc::Sender<ConsumeRequest>,
    rx: Streaming<ConsumeResponse>,
    pub buffered: VecDeque<Message>,
    pub results: VecDeque<CommandResult>,
    pub active_changes: Vec<bool>,
    pub subscribed: Subscribed,
}

/// What [`RawConsumer::subscribe`] asks for.
#[derive(Debug)]
pub struct SubOpts {
    pub sub_type: SubscriptionType,
    pub initial: InitialPosition,
    pub name: String,
    pub policy: Option<DeadLetterPolicyConfig>,
    pub dead_letter_reader: bool,
}

impl Default for SubOpts {
    fn default() -> Self {
        Self {
            sub_type: SubscriptionType::Exclusive,
            initial: InitialPosition::Earliest,
            name: String::new(),
            policy: None,
            dead_letter_reader: false,
        }
    }
}

impl RawConsumer {
    /// Subscribes; `Err` is the broker's refusal.
    pub async fn subscribe(
        url: &str,
        topic: &str,
        sub: &str,
        opts: SubOpts,
    ) -> Result<Self, Status> {
        let mut client = BrokerClient::new(channel(url).await);
        let (tx, rx) = mpsc::channel(64);
        tx.send(ConsumeRequest {
            request: Some(consume_request::Request::Subscribe(Subscribe {
                topic: topic.into(),
                subscription: sub.into(),
                subscription_type: opts.sub_type as i32,
                initial_position: opts.initial as i32,
                consumer_name: opts.name,
                dead_letter_policy: opts.policy,
                retry_enabled: None,
                dead_letter_reader: opts.dead_letter_reader,
            })),
        })
        .await
        .unwrap();
        let mut rx = client.consume(ReceiverStream::new(rx)).await?.into_inner();
        let subscribed = match rx.message().await?.and_then(|r| r.response) {
            Some(consume_response::Response::Subscribed(s)) => s,
            other => panic!("expected Subscribed, got {other:?}"),
        };
        Ok(Self {
            tx,
            rx,
            buffered: VecDeque::new(),
            results: VecDeque::new(),
            active_changes: vec![],
            subscribed,
        })
    }

    /// Subscribes with `sub_type` and otherwise the defaults (panics if refused).
    pub async fn simple(url: &str, topic: &str, sub: &str, sub_type: SubscriptionType) -> Self {
        Self::subscribe(
            url,
            topic,
            sub,
            SubOpts {
                sub_type,
                ..Default::default()
            },
        )
        .await
        .expect("subscribe")
    }

    /// Sends one request on the stream.
    pub async fn request(&self, r: consume_request::Request) {
        self.tx
            .send(ConsumeRequest { request: Some(r) })
            .await
            .expect("stream open");
    }

    /// Sends one frame as it is (its request may be unset).
    pub async fn send_frame(&self, frame: ConsumeRequest) {
        self.tx.send(frame).await.expect("stream open");
    }

    /// Reads (buffering what comes) until the broker ends the stream, and
    /// returns how it ended (`Ok` for a clean end). Panics if the stream is
    /// still open after `wait`.
    pub async fn end(&mut self, wait: Duration) -> Status {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.rx.message()).await {
                Err(_) => panic!("the consumer stream is still open after {wait:?}"),
                Ok(Err(status)) => return status,
                Ok(Ok(None)) => return Status::ok(""),
                Ok(Ok(Some(ConsumeResponse { response: Some(r) }))) => self.absorb(r),
                Ok(Ok(Some(_))) => {}
            }
        }
    }

    /// Keeps a frame from the broker where the test can look at it.
    fn absorb(&mut self, r: consume_response::Response) {
        match r {
            consume_response::Response::Messages(b) => self.buffered.extend(b.messages),
            consume_response::Response::Result(r) => self.results.push_back(r),
            consume_response::Response::ActiveChange(a) => self.active_changes.push(a.active),
            consume_response::Response::Subscribed(_)
            | consume_response::Response::AckedIds(_)
            | consume_response::Response::CountedAhead(_) => {}
        }
    }

    /// Grants `permits` more messages.
    pub async fn flow(&self, permits: u32) {
        self.request(consume_request::Request::Flow(Flow { permits }))
            .await;
    }

    async fn pump(&mut self, wait: Duration) -> bool {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Ok(Ok(Some(ConsumeResponse { response: Some(r) }))) => {
                self.absorb(r);
                true
            }
            _ => false,
        }
    }

    /// The next message, or None after `wait` without one.
    pub async fn next(&mut self, wait: Duration) -> Option<Message> {
        self.first(wait, |c| c.buffered.pop_front()).await
    }

    /// Exactly `n` messages (panics on timeout).
    pub async fn take(&mut self, n: usize, wait: Duration) -> Vec<Message> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next(wait).await {
                Some(m) => out.push(m),
                None => panic!("only {} of {n} messages arrived", out.len()),
            }
        }
        out
    }

    /// The next command result, or None after `wait` without one.
    pub async fn result(&mut self, wait: Duration) -> Option<CommandResult> {
        self.first(wait, |c| c.results.pop_front()).await
    }

    /// What `pop` takes from the buffers, reading frames until it takes
    /// something or `wait` has passed.
    async fn first<T>(
        &mut self,
        wait: Duration,
        mut pop: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(t) = pop(self) {
                return Some(t);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.pump(left).await {
                return None;
            }
        }
    }

    /// Acks `ids` individually; the result carries `request_id`.
    pub async fn ack(&self, ids: Vec<MessageId>, request_id: u64) {
        self.request(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Individual as i32,
            ids,
        }))
        .await;
    }

    /// Acks everything up to `id`.
    pub async fn ack_cumulative(&self, id: MessageId, request_id: u64) {
        self.request(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Cumulative as i32,
            ids: vec![id],
        }))
        .await;
    }

    /// Fails one delivery with a negative ack (redelivered at once).
    pub async fn nack(&self, id: MessageId, detail: &str, request_id: u64) {
        self.nack_after(id, detail, 0, request_id).await;
    }

    /// Fails one delivery with a negative ack whose delay the broker holds.
    pub async fn nack_after(&self, id: MessageId, detail: &str, delay_ms: u64, request_id: u64) {
        self.request(consume_request::Request::Redeliver(Redeliver {
            request_id,
            messages: vec![FailedDelivery {
                id: Some(id),
                reason: FailureReason::Nack as i32,
                detail: detail.into(),
                delay_ms,
                ..FailedDelivery::default()
            }],
        }))
        .await;
    }

    /// Sends one message to the retry tier after `delay`.
    pub async fn reconsume_later(
        &self,
        id: MessageId,
        delay: reconsume_later::Delay,
        request_id: u64,
    ) {
        self.request(consume_request::Request::ReconsumeLater(ReconsumeLater {
            request_id,
            id: Some(id),
            delay: Some(delay),
            properties: Default::default(),
            detail: "retry please".into(),
            waited_us: 0,
        }))
        .await;
    }

    /// Dead-letters one message at once.
    pub async fn terminate(&self, id: MessageId, detail: &str, request_id: u64) {
        self.request(consume_request::Request::Terminate(Terminate {
            request_id,
            id: Some(id),
            detail: detail.into(),
        }))
        .await;
    }
}

/// A message's payload as text.
pub fn text(m: &Message) -> String {
    String::from_utf8_lossy(&m.payload).into_owned()
}
