//! Raw gRPC helpers for broker tests: a minimal producer and consumer speaking
//! the wire protocol directly (the client crate is tested separately).
#![allow(dead_code)]

use ricochet_broker::{BrokerConfig, TestBroker};
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::*;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

pub async fn start(dir: &std::path::Path) -> TestBroker {
    TestBroker::start(BrokerConfig::for_dir(dir))
        .await
        .expect("broker starts")
}

pub async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

pub struct RawProducer {
    tx: mpsc::Sender<ProduceRequest>,
    rx: Streaming<ProduceResponse>,
    pub name: String,
    pub next_seq: u64,
    next_req: u64,
}

impl RawProducer {
    pub async fn open(url: &str, topic: &str, name: &str) -> Result<Self, Status> {
        let mut client = BrokerClient::new(channel(url).await);
        let (tx, rx) = mpsc::channel(64);
        tx.send(ProduceRequest {
            request: Some(produce_request::Request::Open(ProducerOpen {
                topic: topic.into(),
                producer_name: name.into(),
            })),
        })
        .await
        .unwrap();
        let mut rx = client.produce(ReceiverStream::new(rx)).await?.into_inner();
        let opened = match rx.message().await?.and_then(|r| r.response) {
            Some(produce_response::Response::Opened(o)) => o,
            other => panic!("expected ProducerOpened, got {other:?}"),
        };
        let next_seq = opened.last_sequence_id.map_or(0, |s| s + 1);
        Ok(Self {
            tx,
            rx,
            name: opened.producer_name,
            next_seq,
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
            .ok()?;
        self.rx
            .message()
            .await
            .ok()
            .flatten()
            .and_then(|r| r.response)
    }

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

pub struct RawConsumer {
    tx: mpsc::Sender<ConsumeRequest>,
    rx: Streaming<ConsumeResponse>,
    pub buffered: VecDeque<Message>,
    pub results: VecDeque<CommandResult>,
    pub active_changes: Vec<bool>,
    pub subscribed: Subscribed,
}

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

    pub async fn request(&self, r: consume_request::Request) {
        self.tx
            .send(ConsumeRequest { request: Some(r) })
            .await
            .expect("stream open");
    }

    pub async fn flow(&self, permits: u32) {
        self.request(consume_request::Request::Flow(Flow { permits }))
            .await;
    }

    async fn pump(&mut self, wait: Duration) -> bool {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Ok(Ok(Some(ConsumeResponse { response: Some(r) }))) => {
                match r {
                    consume_response::Response::Messages(b) => self.buffered.extend(b.messages),
                    consume_response::Response::Result(r) => self.results.push_back(r),
                    consume_response::Response::ActiveChange(a) => {
                        self.active_changes.push(a.active)
                    }
                    consume_response::Response::Subscribed(_) => {}
                }
                true
            }
            _ => false,
        }
    }

    /// The next message, or None after `wait` without one.
    pub async fn next(&mut self, wait: Duration) -> Option<Message> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(m) = self.buffered.pop_front() {
                return Some(m);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.pump(left).await {
                return None;
            }
        }
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

    pub async fn result(&mut self, wait: Duration) -> Option<CommandResult> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(r) = self.results.pop_front() {
                return Some(r);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.pump(left).await {
                return None;
            }
        }
    }

    pub async fn ack(&self, ids: Vec<MessageId>, request_id: u64) {
        self.request(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Individual as i32,
            ids,
        }))
        .await;
    }

    pub async fn ack_cumulative(&self, id: MessageId, request_id: u64) {
        self.request(consume_request::Request::Ack(Ack {
            request_id,
            ack_type: AckType::Cumulative as i32,
            ids: vec![id],
        }))
        .await;
    }

    pub async fn nack(&self, id: MessageId, detail: &str, request_id: u64) {
        self.request(consume_request::Request::Redeliver(Redeliver {
            request_id,
            messages: vec![FailedDelivery {
                id: Some(id),
                reason: FailureReason::Nack as i32,
                detail: detail.into(),
            }],
        }))
        .await;
    }

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
        }))
        .await;
    }

    pub async fn terminate(&self, id: MessageId, detail: &str, request_id: u64) {
        self.request(consume_request::Request::Terminate(Terminate {
            request_id,
            id: Some(id),
            detail: detail.into(),
        }))
        .await;
    }
}

pub fn text(m: &Message) -> String {
    String::from_utf8_lossy(&m.payload).into_owned()
}

pub const WAIT: Duration = Duration::from_secs(5);
pub const QUIET: Duration = Duration::from_millis(300);

// Child-process brokers for crash tests: killed with SIGKILL, no clean shutdown.

/// A free loopback port, never the same one twice in this process (the OS
/// may hand a just-released port out again, and a broker needs two).
pub fn free_addr() -> SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&addr.port()) {
            given.push(addr.port());
            return addr;
        }
    }
}

pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the broker binary on a port of its own choosing (so no other
/// process can take it between choosing and binding) with data in `dir`;
/// returns it with its URL once it listens.
pub async fn spawn_broker(dir: &std::path::Path) -> (Proc, String) {
    spawn_broker_with(dir, free_addr()).await
}

/// Like [`spawn_broker`], serving metrics on `metrics`.
pub async fn spawn_broker_with(dir: &std::path::Path, metrics: SocketAddr) -> (Proc, String) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ricochet-broker"))
        .args([
            "--data-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--metrics-listen", &metrics.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn broker");
    let stdout = child.stdout.take().expect("piped stdout");
    // Owned by the guard from here on, so it is killed and reaped on any panic.
    let proc = Proc(child);
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .unwrap()
    .expect("broker stdout");
    let addr = line
        .trim()
        .strip_prefix("ricochet-broker listening on ")
        .unwrap_or_else(|| panic!("broker did not start: {line:?}"));
    (proc, format!("http://{addr}"))
}

pub fn kill9(mut p: Proc) {
    // SIGKILL: no signal handler runs, nothing is flushed on the way out.
    p.0.kill().expect("kill");
    p.0.wait().expect("wait");
}
