//! The producer stream: open, then pipelined batches answered by receipts in
//! order. Batches are written as they arrive; receipts wait for the group
//! commit, so many batches share one flush. A batch refused for its content
//! fails alone; one that could not be stored ends the stream after its error
//! when the producer resends in order (`ProducerOpen.resend_in_order`), so
//! no later batch is stored ahead of it.

use super::BoxStream;
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::name::TopicName;
use crate::node::Node;
use crate::storage::TopicKind;
use ricochet_proto::{
    ProduceRequest, ProduceResponse, ProducerOpened, SendBatch, SendError, SendReceipts,
    produce_request, produce_response,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status, Streaming};

/// Batches in flight (written, awaiting their flush) per producer.
const PIPELINE_DEPTH: usize = 64;

pub(super) async fn produce(
    node: Arc<Node>,
    principal: Option<crate::auth::Principal>,
    mut inbound: Streaming<ProduceRequest>,
) -> Result<Response<BoxStream<ProduceResponse>>, Status> {
    let core = node.core.clone();
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("producer stream closed before ProducerOpen"))?;
    let Some(produce_request::Request::Open(open)) = first.request else {
        return Err(Status::invalid_argument(
            "the first producer frame must be ProducerOpen",
        ));
    };
    let name = TopicName::parse(&open.topic)?;
    // Once per stream: the batches that follow are not checked again.
    node.auth
        .check(principal.as_ref(), &name, crate::auth::Permission::Produce)?;
    super::input::check_label("producer name", &open.producer_name)?;
    // Cluster mode: served only by the topic's owner (standalone: `None`).
    let served = super::Served::route(&node, &name).await?;
    let entry = core
        .topic_for_use(&name, |kind| match kind {
            TopicKind::Normal => Ok(()),
            tier => Err(BrokerError::Conflict(format!(
                "{name} is a {tier:?} tier topic; only the broker writes to it"
            ))),
        })
        .await?;
    // The client resends a batch that could not be stored: write nothing
    // after it on this stream (see `ProducerOpen.resend_in_order`).
    let in_order = open.resend_in_order;
    let producer_name = if open.producer_name.is_empty() {
        format!(
            "producer-{}",
            core.storage.next_id().map_err(BrokerError::from)?
        )
    } else {
        open.producer_name.clone()
    };
    let topic = entry.topic.clone();
    let max_size = core.config.max_message_size;
    let config = core.config.clone();
    let max_delay_ms = u64::try_from(core.config.max_delay.as_millis()).unwrap_or(u64::MAX);
    let clock = core.clock.clone();
    let (tx, rx) = mpsc::channel::<Result<ProduceResponse, Status>>(PIPELINE_DEPTH * 2);
    let opened = ProduceResponse {
        response: Some(produce_response::Response::Opened(ProducerOpened {
            topic: name.to_string(),
            producer_name: producer_name.clone(),
            last_sequence_id: topic.last_sequence(&producer_name),
            max_message_size: max_size as u64,
        })),
    };
    tx.send(Ok(opened))
        .await
        .map_err(|_| Status::cancelled("producer went away"))?;
    topic.counters.producers.fetch_add(1, Ordering::Relaxed);

    // Receipts are sent in batch order by one task awaiting each batch's
    // write; a status that ends the stream (a frame that is not a batch)
    // takes its place in that order, so every batch before it gets its receipt.
    let (pending_tx, mut pending_rx) =
        mpsc::channel::<tokio::task::JoinHandle<Result<ProduceResponse, Status>>>(PIPELINE_DEPTH);
    tokio::spawn(async move {
        while let Some(h) = pending_rx.recv().await {
            let resp = match h.await {
                Ok(r) => r,
                Err(e) => Err(Status::internal(format!("publish task failed: {e}"))),
            };
            let end = resp.is_err();
            if tx.send(resp).await.is_err() || end {
                break;
            }
        }
    });
    let topic_name = name.to_string();
    let stop = core.shutdown.clone();
    let served_out = served.clone();
    tokio::spawn(async move {
        while let Some(frame) = super::next_frame(&mut inbound, &stop).await {
            let batch = match frame {
                Ok(ProduceRequest {
                    request: Some(produce_request::Request::Send(b)),
                }) => b,
                Ok(other) => {
                    let what = match other.request {
                        Some(produce_request::Request::Open(_)) => "a second ProducerOpen",
                        _ => "an empty ProduceRequest",
                    };
                    let end = Status::invalid_argument(format!(
                        "expected SendBatch after ProducerOpen, got {what}"
                    ));
                    let _ = pending_tx.send(tokio::spawn(async { Err(end) })).await;
                    break;
                }
                // A frame that does not decode, or one over the size limit:
                // the client is told why the stream ends.
                Err(status) => {
                    let _ = pending_tx.send(tokio::spawn(async { Err(status) })).await;
                    break;
                }
            };
            let topic = topic.clone();
            let name = producer_name.clone();
            let served = served.clone();
            let latest_deliver_at = clock.now_ms().saturating_add(max_delay_ms);
            let checked = validate(&batch, &config)
                .and_then(|()| check_deliver_at(&batch, latest_deliver_at));
            // Spawned so the next batch is written while this one awaits its flush;
            // ids are assigned in arrival order because the next batch is read
            // only once this one is written (a write may wait for an id
            // reservation).
            // `ready` says whether the batch could not be stored (its write
            // failed, not its validation).
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<bool>();
            let handle = tokio::spawn(async move {
                let request_id = batch.request_id;
                let result = match checked {
                    Ok(()) => {
                        let written = topic.write(&name, batch.messages).await;
                        // A deleted topic refuses every later batch the same
                        // way: the stream goes on (a new one would create
                        // the topic again).
                        let _ = ready_tx.send(matches!(
                            &written,
                            Err(e) if !matches!(e, BrokerError::TopicNotFound(_))
                        ));
                        match written {
                            Ok(w) => topic.settle(w).await,
                            Err(e) => Err(e),
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(false);
                        Err(e)
                    }
                };
                // Durable now; in a cluster, acknowledged only while the
                // lease deadline holds (else the stream ends UNAVAILABLE).
                let epoch = match &served {
                    None => 0,
                    Some(s) => {
                        s.check()?;
                        s.epoch()
                    }
                };
                Ok(match result {
                    Ok(receipts) => ProduceResponse {
                        response: Some(produce_response::Response::Receipts(SendReceipts {
                            request_id,
                            receipts,
                            epoch,
                        })),
                    },
                    Err(e) => {
                        let status = super::status_of(&e);
                        ProduceResponse {
                            response: Some(produce_response::Response::Error(SendError {
                                request_id,
                                code: status.code() as i32,
                                message: status.message().to_owned(),
                                details: status.details().to_vec(),
                            })),
                        }
                    }
                })
            });
            let unstored = ready_rx.await.unwrap_or(false);
            if pending_tx.send(handle).await.is_err() {
                break;
            }
            if in_order && unstored {
                // Its error is answered, then the stream ends: a later batch
                // already sent must not be stored ahead of the resent one.
                tracing::debug!(topic = %topic_name, producer = %producer_name, "a batch could not be stored; ending the producer stream for its resend");
                break;
            }
        }
        topic.counters.producers.fetch_sub(1, Ordering::Relaxed);
    });
    Ok(Response::new(super::fenced(
        super::until_shutdown(ReceiverStream::new(rx), core.shutdown.clone()),
        served_out,
    )))
}

/// A `deliver_at` beyond the broker's `max_delay` from now is refused.
fn check_deliver_at(batch: &SendBatch, latest_ms: u64) -> Result<(), BrokerError> {
    match batch
        .messages
        .iter()
        .enumerate()
        .find(|(_, m)| m.deliver_at_ms > latest_ms)
    {
        Some((i, m)) => Err(BrokerError::InvalidArgument(format!(
            "message {i} (sequence id {}) asks for delivery at {} ms, past the broker's max_delay from now (latest {latest_ms} ms)",
            m.sequence_id, m.deliver_at_ms
        ))),
        None => Ok(()),
    }
}

/// A batch is stored whole or not at all: one message over a limit refuses
/// all of it.
fn validate(batch: &SendBatch, config: &BrokerConfig) -> Result<(), BrokerError> {
    if batch.messages.is_empty() {
        return Err(BrokerError::InvalidArgument("empty SendBatch".into()));
    }
    for (i, m) in batch.messages.iter().enumerate() {
        super::input::check_message(i, m, config)?;
    }
    for w in batch.messages.windows(2) {
        if w[1].sequence_id <= w[0].sequence_id {
            return Err(BrokerError::InvalidArgument(format!(
                "sequence ids must increase within a batch ({} then {})",
                w[0].sequence_id, w[1].sequence_id
            )));
        }
    }
    Ok(())
}
