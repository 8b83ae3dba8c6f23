//! The consumer stream: subscribe, then parse each frame into a domain
//! request for the subscription actor; the actor's events go back as
//! frames. When the stream ends for any reason the consumer is removed and
//! its in-flight messages are redelivered (reason: consumer lost).

use super::{BoxStream, status_of};
use crate::backpressure::StreamBudget;
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::name::{SubscriptionName, TopicName};
use crate::node::Node;
use crate::storage::TopicKind;
use crate::subscription::{
    ConsumerEvent, ConsumerRequest, ConsumerSpec, ConsumerTx, FailedItem, MessageRef,
};
use crate::tier_owners::TierOverrides;
use futures::StreamExt as _;
use ricochet_policy::{AttemptOverride, FailureReason, PolicySpec};
use ricochet_proto::{
    AckType, AckedIds, CommandResult, ConsumeRequest, ConsumeResponse, InitialPosition, Message,
    MessageBatch, Subscribe, Subscribed, SubscriptionType, consume_request, consume_response,
    reconsume_later,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Response, Status, Streaming};

/// Most messages sent to a consumer in one frame.
const MESSAGES_PER_FRAME: usize = 500;
/// A frame stops growing past this many payload bytes (one message always
/// fits: the gRPC limit is far above the largest allowed message).
const FRAME_SOFT_BYTES: usize = 4 * 1024 * 1024;

pub(super) async fn consume(
    node: Arc<Node>,
    principal: Option<crate::auth::Principal>,
    mut inbound: Streaming<ConsumeRequest>,
) -> Result<Response<BoxStream<ConsumeResponse>>, Status> {
    let core = node.core.clone();
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("consumer stream closed before Subscribe"))?;
    let Some(consume_request::Request::Subscribe(sub)) = first.request else {
        return Err(Status::invalid_argument(
            "the first consumer frame must be Subscribe",
        ));
    };
    let (raw_tx, rx) = mpsc::unbounded_channel();
    let budget = StreamBudget::new(
        core.config.max_pending_requests_per_consumer,
        topic_of(&sub),
        sub.subscription.clone(),
    );
    let tx = ConsumerTx::counted(raw_tx, budget.clone());
    let budget_out = budget.clone();
    let view = super::event_view::EventView::of(&node.auth, principal.as_ref(), &topic_of(&sub));
    let (handle, consumer_id, served) =
        subscribe(&node, principal.as_ref(), sub, tx.clone()).await?;
    let served_in = served.clone();
    let stop = core.shutdown.clone();
    let config = core.config.clone();
    // A frame that does not decode (or is over the size limit) ends the
    // stream with its status, after the events queued before it.
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<Status>();
    tokio::spawn(async move {
        let mut failed_tx = Some(failed_tx);
        while let Some(frame) = super::next_frame(&mut inbound, &stop).await {
            // Holds and delays run from here (the frame's arrival).
            let received = tokio::time::Instant::now();
            let req = match frame {
                Ok(ConsumeRequest { request: Some(r) }) => r,
                Ok(ConsumeRequest { request: None }) => {
                    let empty = BrokerError::InvalidArgument(
                        "empty ConsumeRequest (no request set, or one this broker does not know)"
                            .into(),
                    );
                    let _ = tx.send(ConsumerEvent::End(empty));
                    break;
                }
                Err(status) => {
                    if let Some(f) = failed_tx.take() {
                        let _ = f.send(status);
                    }
                    break;
                }
            };
            match parse(req, &config) {
                Parsed::Request(req) => {
                    // Cluster mode: no ack, nack or reconsume is applied
                    // once the lease deadline has passed.
                    if let Some(Err(e)) = served_in.as_ref().map(super::Served::check) {
                        let _ = tx.send(ConsumerEvent::End(e));
                        break;
                    }
                    // Past the stream's budget the stream is not read
                    // until the actor and the writer catch up (HTTP/2
                    // flow control holds the client back meanwhile).
                    let admitted = match budget.try_admit(req.ids()) {
                        Some(a) => a,
                        None => match admit_later(&budget, req.ids(), &tx, &stop).await {
                            Some(a) => a,
                            None => break,
                        },
                    };
                    if handle
                        .request_at(consumer_id, req, received, admitted)
                        .is_err()
                    {
                        break;
                    }
                }
                Parsed::Refused { request_id, error } => {
                    // Handled here, but its answer counts: a flood of
                    // refused requests is not read past the budget either.
                    if budget.try_admit(1).is_none()
                        && admit_later(&budget, 1, &tx, &stop).await.is_none()
                    {
                        break;
                    }
                    let outcome = Err(Arc::new(error));
                    let _ = tx.send(ConsumerEvent::Done {
                        request_id,
                        outcome,
                    });
                }
                Parsed::End(e) => {
                    let _ = tx.send(ConsumerEvent::End(e));
                    break;
                }
            }
        }
        let _ = handle.remove_consumer(consumer_id);
    });
    let failed =
        futures::stream::once(failed_rx).filter_map(|r| std::future::ready(r.ok().map(Err)));
    let frames = UnboundedReceiverStream::new(rx)
        .map(move |mut event| {
            if event.is_answer() {
                budget_out.answer_taken();
            }
            if let (Some(view), ConsumerEvent::Messages(msgs)) = (&view, &mut event) {
                msgs.iter_mut().for_each(|m| view.apply(m));
            }
            event
        })
        .flat_map(|event| futures::stream::iter(frames_of(event)))
        .chain(failed);
    Ok(Response::new(super::fenced(
        super::until_shutdown(frames, core.shutdown.clone()),
        served,
    )))
}

/// The units of a request naming `ids` message ids once the stream's
/// budget has room for them; `None` if the stream or the broker stops first.
async fn admit_later(
    budget: &StreamBudget,
    ids: usize,
    tx: &ConsumerTx,
    stop: &tokio_util::sync::CancellationToken,
) -> Option<crate::backpressure::Admitted> {
    tokio::select! {
        biased;
        () = stop.cancelled() => None,
        () = tx.closed() => None,
        a = budget.admit(ids) => a,
    }
}

/// The full name of the topic `sub` is for (empty if it does not parse:
/// `subscribe` refuses it).
fn topic_of(sub: &Subscribe) -> String {
    TopicName::parse(&sub.topic)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Checks a `Subscribe`, finds or creates the subscription and joins it.
async fn subscribe(
    node: &Node,
    principal: Option<&crate::auth::Principal>,
    sub: Subscribe,
    tx: ConsumerTx,
) -> Result<
    (
        crate::subscription::SubscriptionHandle,
        u64,
        Option<super::Served>,
    ),
    Status,
> {
    let core = &node.core;
    let topic = TopicName::parse(&sub.topic)?;
    let name = SubscriptionName::parse(&sub.subscription)?;
    // Once per stream: acks and permits that follow are not checked again.
    let needed = if sub.dead_letter_reader {
        crate::auth::Permission::DeadLetters
    } else {
        crate::auth::Permission::Consume
    };
    node.auth.check(principal, &topic, needed)?;
    super::input::check_label("consumer name", &sub.consumer_name)?;
    // Cluster mode: served only by the topic's owner.
    let served = super::Served::route(node, &topic).await?;
    let sub_type = SubscriptionType::try_from(sub.subscription_type).map_err(|_| {
        Status::invalid_argument(format!(
            "unknown subscription type {}",
            sub.subscription_type
        ))
    })?;
    let initial = InitialPosition::try_from(sub.initial_position).map_err(|_| {
        Status::invalid_argument(format!("unknown initial position {}", sub.initial_position))
    })?;
    let key_order = super::key_order_of(sub.dead_letter_policy.as_ref())?;
    let (policy, tiers) = match &sub.dead_letter_policy {
        // Key order alone.
        Some(p) if p.kind.is_none() && p.key_order.is_some() => (None, super::tier_overrides(p)?),
        Some(p) => {
            let spec = PolicySpec::try_from(p).map_err(|e| {
                Status::invalid_argument(format!("invalid dead-letter policy: {e}"))
            })?;
            spec.validate().map_err(|e| {
                Status::invalid_argument(format!("invalid dead-letter policy: {e}"))
            })?;
            (Some(spec), super::tier_overrides(p)?)
        }
        None => (None, TierOverrides::default()),
    };
    // Tier topics named by the policy are written by the broker on this
    // role's behalf: it must be allowed to produce there (no writing into
    // another tenant's namespace through a policy).
    for tier in [&tiers.retry, &tiers.dead_letter].into_iter().flatten() {
        node.auth
            .check(principal, tier, crate::auth::Permission::Produce)?;
    }
    core.check_subscription(&topic, &name, &tiers).await?;
    let entry = core
        .topic_for_use(&topic, |kind| match kind {
            TopicKind::Normal => Ok(()),
            TopicKind::Retry => Err(BrokerError::Conflict(format!(
                "{topic} is a retry tier: the subscription that owns it receives its messages; subscribe to the original topic"
            ))),
            TopicKind::DeadLetter if !sub.dead_letter_reader => Err(BrokerError::PermissionDenied(format!(
                "{topic} is a dead-letter tier: read it with an explicit dead-letter reader (Subscribe.dead_letter_reader) or the admin API"
            ))),
            TopicKind::DeadLetter => Ok(()),
        })
        .await?;
    let handle = core
        .subscription_or_create(&entry, &name, sub_type, initial, &tiers)
        .await?;
    let consumer_name = if sub.consumer_name.is_empty() {
        format!(
            "consumer-{}",
            core.storage.next_id().map_err(BrokerError::from)?
        )
    } else {
        sub.consumer_name
    };
    let spec = ConsumerSpec {
        name: consumer_name,
        sub_type,
        tx,
        policy,
        retry_enabled: sub.retry_enabled.unwrap_or(true),
        key_order,
    };
    // The actor queues `Subscribed` as the consumer's first event.
    let (consumer_id, _info) = handle.add_consumer(spec).await?;
    Ok((handle, consumer_id, served))
}

fn message_ref(id: ricochet_proto::MessageId) -> MessageRef {
    MessageRef {
        topic: id.topic,
        entry_id: id.entry_id,
    }
}

/// What a consumer frame comes to.
enum Parsed {
    /// A request for the subscription.
    Request(ConsumerRequest),
    /// A request refused before it reached the subscription: its reply.
    Refused { request_id: u64, error: BrokerError },
    /// A protocol violation (a second `Subscribe`): the stream ends.
    End(BrokerError),
}

/// A consumer frame as a domain request, after the checks on its free-text
/// and property fields.
fn parse(req: consume_request::Request, config: &BrokerConfig) -> Parsed {
    use super::input::{check_detail, check_extra_properties};
    use consume_request::Request as R;
    let refused = |request_id, error| Parsed::Refused { request_id, error };
    Parsed::Request(match req {
        R::Subscribe(_) => {
            return Parsed::End(BrokerError::InvalidArgument(
                "already subscribed on this stream".into(),
            ));
        }
        R::Flow(f) => ConsumerRequest::Flow(f.permits),
        R::Ack(a) => {
            let cumulative = match AckType::try_from(a.ack_type) {
                Ok(t) => t == AckType::Cumulative,
                Err(_) => {
                    let e = format!("unknown ack type {}", a.ack_type);
                    return refused(a.request_id, BrokerError::InvalidArgument(e));
                }
            };
            ConsumerRequest::Ack {
                request_id: a.request_id,
                cumulative,
                ids: a.ids.into_iter().map(message_ref).collect(),
            }
        }
        R::Redeliver(r) => {
            let mut items = Vec::with_capacity(r.messages.len());
            for m in r.messages {
                if let Err(e) = check_detail(&m.detail) {
                    return refused(r.request_id, e);
                }
                // An unspecified reason reads as a nack; an unknown one is refused.
                let reason = match m.reason {
                    0 => FailureReason::Nack,
                    n => match ricochet_proto::convert::failure_reason_from_i32(n) {
                        Ok(reason) => reason,
                        Err(_) => {
                            let e = format!("unknown failure reason {n}");
                            return refused(r.request_id, BrokerError::InvalidArgument(e));
                        }
                    },
                };
                // The hold in µs when the client sent it (old clients: ms).
                let hold = match m.delay_us {
                    0 => checked_delay(m.delay_ms, config.max_delay, "a nack delay"),
                    us => checked_delay_us(us, config.max_delay, "a nack delay"),
                };
                let hold = match hold {
                    Ok(d) => d,
                    Err(e) => return refused(r.request_id, e),
                };
                items.push(FailedItem {
                    id: message_ref(m.id.unwrap_or_default()),
                    reason,
                    detail: m.detail,
                    hold,
                    ahead: m.ahead,
                    local: m.local,
                });
            }
            ConsumerRequest::Redeliver {
                request_id: r.request_id,
                items,
            }
        }
        R::ReconsumeLater(r) => {
            if let Err(e) =
                check_detail(&r.detail).and_then(|()| check_extra_properties(&r.properties, config))
            {
                return refused(r.request_id, e);
            }
            let delay = match r.delay {
                Some(reconsume_later::Delay::DelayMs(ms)) => {
                    match checked_delay(ms, config.max_delay, "a reconsume_later delay") {
                        Ok(d) => AttemptOverride::Delay(d),
                        Err(e) => return refused(r.request_id, e),
                    }
                }
                Some(d) => match AttemptOverride::try_from(d) {
                    Ok(o) => o,
                    Err(e) => {
                        return refused(r.request_id, BrokerError::InvalidArgument(e.to_string()));
                    }
                },
                None => AttemptOverride::Policy,
            };
            ConsumerRequest::ReconsumeLater {
                request_id: r.request_id,
                id: message_ref(r.id.unwrap_or_default()),
                delay,
                properties: r.properties,
                detail: r.detail,
                waited: Duration::from_micros(r.waited_us),
            }
        }
        R::Terminate(t) => {
            if let Err(e) = check_detail(&t.detail) {
                return refused(t.request_id, e);
            }
            ConsumerRequest::Terminate {
                request_id: t.request_id,
                id: message_ref(t.id.unwrap_or_default()),
                detail: t.detail,
            }
        }
        R::Close(_) => ConsumerRequest::Close,
        R::CheckAcks(c) => ConsumerRequest::CheckAcks {
            request_id: c.request_id,
            ids: c.ids.into_iter().map(message_ref).collect(),
        },
    })
}

/// A delay asked for in milliseconds, checked against the broker's limit.
fn checked_delay(ms: u64, max: Duration, what: &str) -> Result<Duration, BrokerError> {
    let d = Duration::from_millis(ms);
    if d > max {
        return Err(BrokerError::InvalidArgument(format!(
            "{what} of {ms} ms exceeds the broker's max_delay of {} ms",
            max.as_millis()
        )));
    }
    Ok(d)
}

/// [`checked_delay`] for a delay in microseconds.
fn checked_delay_us(us: u64, max: Duration, what: &str) -> Result<Duration, BrokerError> {
    let d = Duration::from_micros(us);
    if d > max {
        return Err(BrokerError::InvalidArgument(format!(
            "{what} of {} ms exceeds the broker's max_delay of {} ms",
            us.div_ceil(1000),
            max.as_millis()
        )));
    }
    Ok(d)
}

fn response(r: consume_response::Response) -> Result<ConsumeResponse, Status> {
    Ok(ConsumeResponse { response: Some(r) })
}

/// The frames an event becomes: messages are split into frames bounded by
/// count and bytes.
fn frames_of(event: ConsumerEvent) -> Vec<Result<ConsumeResponse, Status>> {
    use consume_response::Response as R;
    match event {
        ConsumerEvent::Subscribed {
            topic,
            subscription,
            consumer_name,
            policy,
        } => vec![response(R::Subscribed(Subscribed {
            topic,
            subscription,
            consumer_name,
            dead_letter_policy: super::wire::policy_config(&policy),
            retry_topic: policy.retry_topic,
            dead_letter_topic: policy.dead_letter_topic,
            counts_ahead: true,
        }))],
        ConsumerEvent::Messages(msgs) => message_frames(msgs)
            .into_iter()
            .inspect(|m| tracing::trace!(target: "ricochet::burst", n = m.len(), "stream: a frame of messages out"))
            .map(|messages| response(R::Messages(MessageBatch { messages })))
            .collect(),
        ConsumerEvent::Done {
            request_id,
            outcome,
        } => {
            let (code, message, details) = match outcome {
                Ok(()) => (tonic::Code::Ok, String::new(), Vec::new()),
                Err(e) => {
                    let s = status_of(&e);
                    (s.code(), s.message().to_owned(), s.details().to_vec())
                }
            };
            vec![response(R::Result(CommandResult {
                request_id,
                code: code as i32,
                message,
                details,
            }))]
        }
        ConsumerEvent::Active(active) => {
            vec![response(R::ActiveChange(ricochet_proto::ActiveChange {
                active,
            }))]
        }
        ConsumerEvent::End(e) => vec![Err(status_of(&e))],
        ConsumerEvent::Acked { request_id, ids } => vec![response(R::AckedIds(AckedIds {
            request_id,
            ids: ids.into_iter().map(wire_ref).collect(),
        }))],
        ConsumerEvent::CountedAhead(counted) => {
            vec![response(R::CountedAhead(ricochet_proto::CountedAhead {
                messages: counted
                    .into_iter()
                    .map(|(id, delivery_count)| ricochet_proto::CountedMessage {
                        id: Some(wire_ref(id)),
                        delivery_count,
                    })
                    .collect(),
            }))]
        }
    }
}

fn message_frames(msgs: Vec<Message>) -> Vec<Vec<Message>> {
    // Frames of small messages sized up front (a frame's count, or what is
    // left): a burst's messages are moved once into their frame, not again
    // as each frame's vector doubles. After a frame cut by bytes the next
    // one grows as it goes (large messages: few to a frame).
    let mut left = msgs.len();
    let mut frames = Vec::with_capacity(left.div_ceil(MESSAGES_PER_FRAME));
    let mut frame = Vec::with_capacity(left.min(MESSAGES_PER_FRAME));
    let mut bytes = 0;
    for m in msgs {
        let size = m.payload.len();
        if !frame.is_empty()
            && (frame.len() >= MESSAGES_PER_FRAME || bytes + size > FRAME_SOFT_BYTES)
        {
            let next = if frame.len() >= MESSAGES_PER_FRAME {
                left.min(MESSAGES_PER_FRAME)
            } else {
                0
            };
            frames.push(std::mem::replace(&mut frame, Vec::with_capacity(next)));
            bytes = 0;
        }
        left -= 1;
        bytes += size;
        frame.push(m);
    }
    if !frame.is_empty() {
        frames.push(frame);
    }
    frames
}

fn wire_ref(id: MessageRef) -> ricochet_proto::MessageId {
    ricochet_proto::MessageId {
        topic: id.topic,
        entry_id: id.entry_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_by_count_and_bytes() {
        let small = |n: usize| {
            vec![
                Message {
                    payload: vec![0; 10],
                    ..Default::default()
                };
                n
            ]
        };
        let sizes: Vec<usize> = message_frames(small(1201)).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![500, 500, 201]);
        let big = vec![
            Message {
                payload: vec![0; 3 << 20],
                ..Default::default()
            };
            3
        ];
        let sizes: Vec<usize> = message_frames(big).iter().map(Vec::len).collect();
        assert_eq!(
            sizes,
            vec![1, 1, 1],
            "a frame holds one message past the soft byte bound"
        );
        assert!(message_frames(Vec::new()).is_empty());
    }

    #[test]
    fn a_burst_is_moved_once_into_frames_sized_up_front() {
        let small = vec![
            Message {
                payload: vec![0; 10],
                ..Default::default()
            };
            1201
        ];
        let frames = message_frames(small);
        // Each frame's vector was made for its messages: none grew by
        // doubling (512, 512, 256 slots), moving the messages again.
        let caps: Vec<usize> = frames.iter().map(Vec::capacity).collect();
        assert_eq!(caps, vec![500, 500, 201]);
        assert_eq!(frames.len(), frames.capacity());
    }

    /// A `reconsume_later` frame from an older client (no field 7) reads as
    /// nothing waited: its delay runs from the arrival, as before; a newer
    /// client's `waited_us` reaches the subscription.
    #[test]
    fn a_reconsume_frame_without_waited_us_waited_nothing() {
        use prost::Message as _;
        let waited = |frame: Vec<u8>| {
            let req = ricochet_proto::ReconsumeLater::decode(frame.as_slice()).unwrap();
            let parsed = parse(
                consume_request::Request::ReconsumeLater(req),
                &BrokerConfig::default(),
            );
            match parsed {
                Parsed::Request(ConsumerRequest::ReconsumeLater { waited, .. }) => waited,
                _ => panic!("not a reconsume_later request"),
            }
        };
        let mut new = ricochet_proto::ReconsumeLater {
            request_id: 1,
            id: Some(ricochet_proto::MessageId {
                topic: "t".into(),
                entry_id: 3,
            }),
            delay: Some(reconsume_later::Delay::DelayMs(200)),
            waited_us: 12_300,
            ..Default::default()
        };
        assert_eq!(waited(new.encode_to_vec()), Duration::from_micros(12_300));
        // What an older client sends: the same message without field 7.
        new.waited_us = 0;
        let old = new.encode_to_vec();
        assert!(!old.contains(&(7 << 3)), "field 7 is absent");
        assert_eq!(waited(old), Duration::ZERO);
    }
}
