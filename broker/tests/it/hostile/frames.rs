//! Arbitrary and truncated frames on every RPC, generated with proptest.
//!
//! * Message bodies that are not valid protobuf (random bytes, valid
//!   requests cut short or with a byte flipped), in correct gRPC framing:
//!   INVALID_ARGUMENT with the decoder's message, as the first frame of
//!   any RPC and after a valid first frame of a stream.
//! * Broken gRPC framing, sent over HTTP/2 directly: a length prefix the
//!   body ends before filling, a header cut short, an invalid or unbacked
//!   compression flag are INTERNAL (as the gRPC specification has them); a
//!   length over the broker's limit is OUT_OF_RANGE (tonic's code).
//!
//! Every case leaves the state as it was and the broker serving.

use super::common::*;
use super::support::*;
use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message as _;
use ricochet_proto::*;
use ricochet_testkit::InProcessBroker;
use ricochet_testkit::wire::{self, methods};
use std::time::Duration;
use tonic::Code;

/// One RPC: its path, a valid request to mutate, and whether a body
/// decodes as its request type.
struct Rpc {
    path: &'static str,
    sample: Vec<u8>,
    decodes: fn(&[u8]) -> bool,
}

fn decodes<M: prost::Message + Default>(b: &[u8]) -> bool {
    M::decode(b).is_ok()
}

fn sub_req() -> SubscriptionRequest {
    SubscriptionRequest {
        topic: "frames".into(),
        subscription: "s".into(),
    }
}

fn filter() -> Option<DeadLetterFilter> {
    Some(DeadLetterFilter {
        entry_ids: vec![1, 2, 300],
        reason_contains: "poison".into(),
        since_ms: 1,
        until_ms: u64::MAX,
    })
}

/// The policy the seeded subscription's consumer sent, and the sample
/// `Subscribe` sends again (so a valid `Subscribe` changes nothing).
fn client_policy() -> DeadLetterPolicyConfig {
    DeadLetterPolicyConfig {
        key_order: None,
        kind: Some(dead_letter_policy_config::Kind::Backoff(
            BackoffPolicyConfig {
                backoff: Some(backoff_policy_config::Backoff::FixedDelayMs(1000)),
                max_redeliver_count: 3,
            },
        )),
        retry_topic: String::new(),
        dead_letter_topic: String::new(),
        breaker: None,
    }
}

/// Every RPC of both services, each with a valid request.
fn rpcs() -> Vec<Rpc> {
    let topic = || TopicRequest {
        topic: "frames".into(),
    };
    let policy = client_policy();
    let a = methods::ADMIN;
    vec![
        Rpc {
            path: methods::PRODUCE,
            sample: ProduceRequest {
                request: Some(produce_request::Request::Open(ProducerOpen {
                    topic: "frames".into(),
                    producer_name: "p".into(),
                    resend_in_order: false,
                })),
            }
            .encode_to_vec(),
            decodes: decodes::<ProduceRequest>,
        },
        Rpc {
            path: methods::CONSUME,
            sample: ConsumeRequest {
                request: Some(consume_request::Request::Subscribe(Subscribe {
                    topic: "frames".into(),
                    subscription: "s".into(),
                    subscription_type: SubscriptionType::Shared as i32,
                    consumer_name: "c".into(),
                    dead_letter_policy: Some(policy.clone()),
                    retry_enabled: Some(true),
                    ..Default::default()
                })),
            }
            .encode_to_vec(),
            decodes: decodes::<ConsumeRequest>,
        },
        Rpc {
            path: a[0],
            sample: ListTopicsRequest {
                namespace: "public/default".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            decodes: decodes::<ListTopicsRequest>,
        },
        Rpc {
            path: a[1],
            sample: topic().encode_to_vec(),
            decodes: decodes::<TopicRequest>,
        },
        Rpc {
            path: a[2],
            sample: DeleteTopicRequest {
                topic: "frames".into(),
                force: true,
            }
            .encode_to_vec(),
            decodes: decodes::<DeleteTopicRequest>,
        },
        Rpc {
            path: a[3],
            sample: topic().encode_to_vec(),
            decodes: decodes::<TopicRequest>,
        },
        Rpc {
            path: a[4],
            sample: topic().encode_to_vec(),
            decodes: decodes::<TopicRequest>,
        },
        Rpc {
            path: a[5],
            sample: sub_req().encode_to_vec(),
            decodes: decodes::<SubscriptionRequest>,
        },
        Rpc {
            path: a[6],
            sample: sub_req().encode_to_vec(),
            decodes: decodes::<SubscriptionRequest>,
        },
        Rpc {
            path: a[7],
            sample: sub_req().encode_to_vec(),
            decodes: decodes::<SubscriptionRequest>,
        },
        Rpc {
            path: a[8],
            sample: SetPolicyRequest {
                topic: "frames".into(),
                subscription: "s".into(),
                policy: Some(policy),
            }
            .encode_to_vec(),
            decodes: decodes::<SetPolicyRequest>,
        },
        Rpc {
            path: a[9],
            sample: GetMessageRequest {
                id: Some(MessageId {
                    topic: "frames".into(),
                    entry_id: 0,
                }),
            }
            .encode_to_vec(),
            decodes: decodes::<GetMessageRequest>,
        },
        Rpc {
            path: a[10],
            sample: ListDeadLettersRequest {
                topic: "frames".into(),
                subscription: "s".into(),
                filter: filter(),
                limit: 10,
                after_entry_id: Some(0),
            }
            .encode_to_vec(),
            decodes: decodes::<ListDeadLettersRequest>,
        },
        Rpc {
            path: a[11],
            sample: ReplayDeadLettersRequest {
                topic: "frames".into(),
                subscription: "s".into(),
                filter: filter(),
                reset_delivery_count: Some(true),
                rate_per_second: 5,
                ..Default::default()
            }
            .encode_to_vec(),
            decodes: decodes::<ReplayDeadLettersRequest>,
        },
        Rpc {
            path: a[12],
            sample: PurgeDeadLettersRequest {
                topic: "frames".into(),
                subscription: "s".into(),
                filter: filter(),
                ..Default::default()
            }
            .encode_to_vec(),
            decodes: decodes::<PurgeDeadLettersRequest>,
        },
        Rpc {
            path: a[13],
            sample: GroupDeadLettersRequest {
                topic: "frames".into(),
                subscription: "s".into(),
                filter: filter(),
                group_by: DeadLetterGroupBy::Hour as i32,
                ids_per_group: 3,
            }
            .encode_to_vec(),
            decodes: decodes::<GroupDeadLettersRequest>,
        },
        Rpc {
            path: a[14],
            sample: ListReplayJobsRequest {
                topic: "frames".into(),
                subscription: "s".into(),
                local_only: false,
            }
            .encode_to_vec(),
            decodes: decodes::<ListReplayJobsRequest>,
        },
        Rpc {
            path: a[15],
            sample: CancelReplayJobRequest {
                id: 12_345,
                topic: String::new(),
            }
            .encode_to_vec(),
            decodes: decodes::<CancelReplayJobRequest>,
        },
    ]
}

/// A body that may or may not decode: random bytes, a valid request cut
/// short, or one with a byte replaced.
fn body(sample: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = sample.len();
    let cut = sample.clone();
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 1..64),
        (1..len).prop_map(move |n| cut[..n].to_vec()),
        (0..len, any::<u8>()).prop_map(move |(i, b)| {
            let mut v = sample.clone();
            v[i] = b;
            v
        }),
    ]
}

/// A broker with a topic `frames` holding one message and a subscription
/// `s` holding it in its dead-letter tier, for the cases to leave alone.
async fn seeded() -> InProcessBroker {
    let b = InProcessBroker::start().await;
    let mut p = RawProducer::open(&b.url(), "frames", "seed").await.unwrap();
    p.send(&["poison"]).await;
    let opts = SubOpts {
        sub_type: SubscriptionType::Shared,
        policy: Some(client_policy()),
        ..Default::default()
    };
    let mut c = RawConsumer::subscribe(&b.url(), "frames", "s", opts)
        .await
        .unwrap();
    c.flow(1).await;
    let m = c.next(WAIT).await.unwrap();
    c.terminate(m.id.unwrap(), "poison", 1).await;
    assert_eq!(c.result(WAIT).await.unwrap().code, 0);
    b
}

fn cases(n: u32) -> Config {
    Config {
        cases: n,
        failure_persistence: None,
        max_global_rejects: n * 64,
        ..Config::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A body that is not valid protobuf, as the first (for a unary RPC, the
/// only) frame of every RPC: INVALID_ARGUMENT, with the decoder's message.
#[test]
fn undecodable_first_frames_on_every_rpc() {
    let rt = runtime();
    let b = rt.block_on(seeded());
    let ch = rt.block_on(channel(&b.url()));
    let all = rpcs();
    let strategy = (0..all.len()).prop_flat_map(|i| {
        let decodes = rpcs()[i].decodes;
        body(rpcs()[i].sample.clone())
            .prop_filter("decodes", move |b| !decodes(b))
            .prop_map(move |b| (i, b))
    });
    let mut runner = TestRunner::new(cases(384));
    runner
        .run(&strategy, |(i, bytes)| {
            let rpc = &all[i];
            rt.block_on(unchanged(&b.url(), rpc.path, async {
                let reply = if rpc.path.contains("/Broker/") {
                    let frames = vec![Bytes::from(bytes.clone())];
                    wire::streaming(&ch, rpc.path, frames, false, WAIT).await
                } else {
                    wire::unary(&ch, rpc.path, bytes.clone()).await
                };
                assert_eq!(
                    reply.code(),
                    Code::InvalidArgument,
                    "{}: {:?}",
                    rpc.path,
                    reply
                );
                assert!(
                    reply
                        .status
                        .message()
                        .starts_with("malformed request: failed to decode"),
                    "{}: {:?}",
                    rpc.path,
                    reply.status
                );
                assert!(reply.messages.is_empty());
            }));
            Ok(())
        })
        .unwrap();
}

/// After a valid first frame, a frame that does not decode ends the stream
/// with INVALID_ARGUMENT; what came before it was answered.
#[test]
fn undecodable_frames_mid_stream() {
    let rt = runtime();
    let b = rt.block_on(seeded());
    let ch = rt.block_on(channel(&b.url()));
    let produce = rpcs().swap_remove(0);
    let consume = rpcs().swap_remove(1);
    let strategy = (
        any::<bool>(),
        body(produce.sample.clone()).prop_filter("decodes", |b| !decodes::<ProduceRequest>(b)),
        body(consume.sample.clone()).prop_filter("decodes", |b| !decodes::<ConsumeRequest>(b)),
    );
    let mut runner = TestRunner::new(cases(160));
    runner
        .run(&strategy, |(on_produce, bad_produce, bad_consume)| {
            rt.block_on(unchanged(&b.url(), "mid-stream", async {
                let (rpc, bad) = if on_produce {
                    (&produce, bad_produce)
                } else {
                    (&consume, bad_consume)
                };
                let frames = vec![Bytes::from(rpc.sample.clone()), Bytes::from(bad)];
                let reply = wire::streaming(&ch, rpc.path, frames, true, WAIT).await;
                assert_eq!(
                    reply.code(),
                    Code::InvalidArgument,
                    "{}: {:?}",
                    rpc.path,
                    reply
                );
                assert!(reply.status.message().starts_with("malformed request"));
                // ProducerOpened, or Subscribed, came first.
                assert_eq!(reply.messages.len(), 1, "{reply:?}");
            }));
            Ok(())
        })
        .unwrap();
}

/// What is wrong with a gRPC frame's envelope.
#[derive(Debug, Clone)]
enum Framing {
    /// Fewer than the 5 header bytes, then the end of the stream.
    ShortHeader(Vec<u8>),
    /// A length prefix the body (at least one byte of it) ends before
    /// filling.
    Truncated { declared: u32, body: Vec<u8> },
    /// A compression flag other than 0 and 1.
    BadFlag(u8, Vec<u8>),
    /// Flag 1 (compressed) with no `grpc-encoding` header.
    CompressedWithoutEncoding(Vec<u8>),
    /// A length over the broker's 64 MiB limit (only the header is sent).
    TooLarge(u32),
}

impl Framing {
    fn bytes(&self) -> Bytes {
        let mut b = BytesMut::new();
        let header = |b: &mut BytesMut, flag: u8, len: u32| {
            b.put_u8(flag);
            b.put_u32(len);
        };
        match self {
            Framing::ShortHeader(h) => b.put_slice(h),
            Framing::Truncated { declared, body } => {
                header(&mut b, 0, *declared);
                b.put_slice(body);
            }
            Framing::BadFlag(flag, body) => {
                header(&mut b, *flag, body.len() as u32);
                b.put_slice(body);
            }
            Framing::CompressedWithoutEncoding(body) => {
                header(&mut b, 1, body.len() as u32);
                b.put_slice(body);
            }
            Framing::TooLarge(len) => header(&mut b, 0, *len),
        }
        b.freeze()
    }

    fn expected(&self) -> Code {
        match self {
            Framing::TooLarge(_) => Code::OutOfRange,
            _ => Code::Internal,
        }
    }
}

fn framing() -> impl Strategy<Value = Framing> {
    let bytes = |n| proptest::collection::vec(any::<u8>(), 0..n);
    let limit = ricochet_proto::MAX_GRPC_MESSAGE_BYTES as u32;
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 1..5).prop_map(Framing::ShortHeader),
        // At least one byte of the body: a header alone before the end of
        // the stream may read (in tonic) as a clean end, depending on how
        // the bytes arrive.
        proptest::collection::vec(any::<u8>(), 1..32).prop_flat_map(|body| {
            let n = body.len() as u32;
            ((n + 1)..=(n + 1000)).prop_map(move |declared| Framing::Truncated {
                declared,
                body: body.clone(),
            })
        }),
        (2u8..=255, bytes(16)).prop_map(|(f, b)| Framing::BadFlag(f, b)),
        bytes(16).prop_map(Framing::CompressedWithoutEncoding),
        ((limit + 1)..=u32::MAX).prop_map(Framing::TooLarge),
    ]
}

/// One HTTP/2 request on a fresh connection, with `body` as it is; the
/// `grpc-status` the broker answered (from the headers of a trailers-only
/// answer, or from the trailers).
async fn h2_call(addr: std::net::SocketAddr, path: &str, body: Bytes) -> (Code, String) {
    tokio::time::timeout(WAIT, h2_call_inner(addr, path, body))
        .await
        .expect("the call ends")
}

async fn h2_call_inner(addr: std::net::SocketAddr, path: &str, body: Bytes) -> (Code, String) {
    use tonic::codegen::http;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    let conn = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut stream) = send.send_request(req, false).unwrap();
    stream.send_data(body, true).unwrap();
    let response = response.await.unwrap();
    let (parts, mut body) = response.into_parts();
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|v| {
            let code = Code::from_i32(v.to_str().unwrap().parse().unwrap());
            let msg = h
                .get("grpc-message")
                .map(|m| m.to_str().unwrap().to_owned())
                .unwrap_or_default();
            (code, msg)
        })
    };
    let found = match status(&parts.headers) {
        Some(s) => s,
        None => {
            while let Some(chunk) = body.data().await {
                let n = chunk.unwrap().len();
                let _ = body.flow_control().release_capacity(n);
            }
            let trailers = body.trailers().await.unwrap().expect("trailers");
            status(&trailers).expect("grpc-status")
        }
    };
    conn.abort();
    found
}

/// Broken gRPC envelopes on every RPC: INTERNAL, or OUT_OF_RANGE for a
/// length over the limit.
#[test]
fn broken_framing_on_every_rpc() {
    let rt = runtime();
    let b = rt.block_on(seeded());
    let all = rpcs();
    let strategy = (0..all.len(), framing());
    let mut runner = TestRunner::new(cases(384));
    runner
        .run(&strategy, |(i, f)| {
            let rpc = &all[i];
            rt.block_on(unchanged(&b.url(), rpc.path, async {
                let (code, msg) = h2_call(b.addr, rpc.path, f.bytes()).await;
                assert_eq!(code, f.expected(), "{} {f:?}: {msg}", rpc.path);
            }));
            Ok(())
        })
        .unwrap();
}

/// The same broken envelope after a valid first frame of a stream.
#[test]
fn broken_framing_mid_stream() {
    let rt = runtime();
    let b = rt.block_on(seeded());
    let all = rpcs();
    let strategy = (0..2usize, framing());
    let mut runner = TestRunner::new(cases(128));
    runner
        .run(&strategy, |(i, f)| {
            let rpc = &all[i];
            rt.block_on(unchanged(&b.url(), rpc.path, async {
                let mut body = BytesMut::new();
                body.put_u8(0);
                body.put_u32(rpc.sample.len() as u32);
                body.put_slice(&rpc.sample);
                body.put_slice(&f.bytes());
                let (code, msg) = h2_call(b.addr, rpc.path, body.freeze()).await;
                assert_eq!(code, f.expected(), "{} {f:?}: {msg}", rpc.path);
            }));
            Ok(())
        })
        .unwrap();
    // Nothing lingers: the stream's consumer is gone.
    rt.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_serving(&b.url()).await;
    });
}
