//! gRPC calls carrying whatever bytes a test chooses: any method path, any
//! request bodies — undecodable ones included — inside correct gRPC framing.
//! For tests of what the broker does with input no well-behaved client
//! sends. Responses come back as bytes too, with the call's final status.

use bytes::{Buf, BufMut, Bytes};
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The methods of Ricochet's services, as gRPC paths.
pub mod methods {
    /// The producer stream.
    pub const PRODUCE: &str = "/ricochet.v1.Broker/Produce";
    /// The consumer stream.
    pub const CONSUME: &str = "/ricochet.v1.Broker/Consume";
    /// Every admin RPC (all unary).
    pub const ADMIN: [&str; 17] = [
        "/ricochet.v1.Admin/ListTopics",
        "/ricochet.v1.Admin/CreateTopic",
        "/ricochet.v1.Admin/DeleteTopic",
        "/ricochet.v1.Admin/TopicStats",
        "/ricochet.v1.Admin/ListSubscriptions",
        "/ricochet.v1.Admin/SubscriptionStats",
        "/ricochet.v1.Admin/DeleteSubscription",
        "/ricochet.v1.Admin/GetPolicy",
        "/ricochet.v1.Admin/SetPolicy",
        "/ricochet.v1.Admin/GetMessage",
        "/ricochet.v1.Admin/ListDeadLetters",
        "/ricochet.v1.Admin/ReplayDeadLetters",
        "/ricochet.v1.Admin/PurgeDeadLetters",
        "/ricochet.v1.Admin/GroupDeadLetters",
        "/ricochet.v1.Admin/ListReplayJobs",
        "/ricochet.v1.Admin/CancelReplayJob",
        "/ricochet.v1.Admin/SetBreaker",
    ];
}

/// Message bodies passed through as they are, both ways.
#[derive(Debug, Clone, Copy, Default)]
pub struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;

    fn encoder(&mut self) -> Self::Encoder {
        *self
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Encoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// What a call came to: the response messages received, and how it ended.
#[derive(Debug)]
pub struct Reply {
    /// Response messages, undecoded, in order.
    pub messages: Vec<Bytes>,
    /// The final status; `Ok` when the call succeeded, `DeadlineExceeded`
    /// (set here, not by the broker) when the stream was still open after
    /// the wait.
    pub status: Status,
}

impl Reply {
    /// The final status's code.
    pub fn code(&self) -> Code {
        self.status.code()
    }
}

/// A unary call of `method` with `body` as the request message.
pub async fn unary(channel: &Channel, method: &str, body: impl Into<Bytes>) -> Reply {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let path = PathAndQuery::try_from(method).expect("a method path");
    match grpc
        .unary(tonic::Request::new(body.into()), path, BytesCodec)
        .await
    {
        Ok(r) => Reply {
            messages: vec![r.into_inner()],
            status: Status::ok(""),
        },
        Err(status) => Reply {
            messages: Vec::new(),
            status,
        },
    }
}

/// A streaming call of `method`: sends `frames`, then half-closes (unless
/// `keep_open`), and reads responses until the call ends or `wait` passes.
pub async fn streaming(
    channel: &Channel,
    method: &str,
    frames: Vec<Bytes>,
    keep_open: bool,
    wait: Duration,
) -> Reply {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let path = PathAndQuery::try_from(method).expect("a method path");
    let sent = request_stream(frames, keep_open);
    let deadline = tokio::time::Instant::now() + wait;
    let mut messages = Vec::new();
    let call = grpc.streaming(tonic::Request::new(sent), path, BytesCodec);
    let mut inbound = match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => return Reply { messages, status },
        Err(_) => {
            return Reply {
                messages,
                status: Status::deadline_exceeded("still open"),
            };
        }
    };
    loop {
        match tokio::time::timeout_at(deadline, inbound.message()).await {
            Ok(Ok(Some(m))) => messages.push(m),
            Ok(Ok(None)) => {
                return Reply {
                    messages,
                    status: Status::ok(""),
                };
            }
            Ok(Err(status)) => return Reply { messages, status },
            Err(_) => {
                return Reply {
                    messages,
                    status: Status::deadline_exceeded("still open"),
                };
            }
        }
    }
}

/// `frames` as a request stream that ends after the last one, or stays open
/// (pending) when `keep_open`.
fn request_stream(
    frames: Vec<Bytes>,
    keep_open: bool,
) -> impl tokio_stream::Stream<Item = Bytes> + Send + 'static {
    use tokio_stream::StreamExt;
    let tail = tokio_stream::pending::<Bytes>().take(usize::from(keep_open));
    tokio_stream::iter(frames).chain(tail)
}
