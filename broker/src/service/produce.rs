//! The producer stream: open, then pipelined batches answered by receipts in
//! order. Batches are written as they arrive; receipts wait for the group
//! commit, so many batches share one flush.

use super::BoxStream;
use crate::core::BrokerCore;
use crate::error::BrokerError;
use crate::name::TopicName;
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
    core: Arc<BrokerCore>,
    mut inbound: Streaming<ProduceRequest>,
) -> Result<Response<BoxStream<ProduceResponse>>, Status> {
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
    let entry = core.topic_for_use(&name).await?;
    if entry.topic.kind() != TopicKind::Normal {
        return Err(BrokerError::Conflict(format!(
            "{name} is a {:?} tier topic; only the broker writes to it",
            entry.topic.kind()
        ))
        .into());
    }
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

    // Receipts are sent in batch order by one task awaiting each batch's write.
    let (pending_tx, mut pending_rx) =
        mpsc::channel::<tokio::task::JoinHandle<ProduceResponse>>(PIPELINE_DEPTH);
    let out = tx.clone();
    tokio::spawn(async move {
        while let Some(h) = pending_rx.recv().await {
            let resp = match h.await {
                Ok(r) => Ok(r),
                Err(e) => Err(Status::internal(format!("publish task failed: {e}"))),
            };
            if out.send(resp).await.is_err() {
                break;
            }
        }
    });
    let stop = core.shutdown.clone();
    tokio::spawn(async move {
        while let Some(frame) = super::next_frame(&mut inbound, &stop).await {
            let batch = match frame {
                Ok(ProduceRequest {
                    request: Some(produce_request::Request::Send(b)),
                }) => b,
                Ok(_) => {
                    let _ = tx
                        .send(Err(Status::invalid_argument(
                            "expected SendBatch after ProducerOpen",
                        )))
                        .await;
                    break;
                }
                Err(_) => break,
            };
            let topic = topic.clone();
            let name = producer_name.clone();
            // Spawned so the next batch is written while this one awaits its flush;
            // ids are assigned in arrival order because the next batch is read
            // only once this one is written (a write may wait for an id
            // reservation).
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let handle = tokio::spawn(async move {
                let request_id = batch.request_id;
                let result = match validate(&batch, max_size) {
                    Ok(()) => {
                        let written = topic.write(&name, batch.messages).await;
                        let _ = ready_tx.send(());
                        match written {
                            Ok(w) => topic.settle(w).await,
                            Err(e) => Err(e),
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(());
                        Err(e)
                    }
                };
                match result {
                    Ok(receipts) => ProduceResponse {
                        response: Some(produce_response::Response::Receipts(SendReceipts {
                            request_id,
                            receipts,
                        })),
                    },
                    Err(e) => ProduceResponse {
                        response: Some(produce_response::Response::Error(SendError {
                            request_id,
                            code: super::code_of(&e) as i32,
                            message: e.to_string(),
                        })),
                    },
                }
            });
            let _ = ready_rx.await;
            if pending_tx.send(handle).await.is_err() {
                break;
            }
        }
        topic.counters.producers.fetch_sub(1, Ordering::Relaxed);
    });
    Ok(Response::new(super::until_shutdown(
        ReceiverStream::new(rx),
        core.shutdown.clone(),
    )))
}

fn validate(batch: &SendBatch, max_size: usize) -> Result<(), BrokerError> {
    if batch.messages.is_empty() {
        return Err(BrokerError::InvalidArgument("empty SendBatch".into()));
    }
    for (i, m) in batch.messages.iter().enumerate() {
        if m.payload.len() > max_size {
            return Err(BrokerError::InvalidArgument(format!(
                "message {i} (sequence id {}) is {} bytes; the limit is {max_size}",
                m.sequence_id,
                m.payload.len()
            )));
        }
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
