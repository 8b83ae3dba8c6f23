//! The consumer stream: subscribe, then forward flow permits, acks and failure
//! reports to the subscription actor; messages flow back on the same stream.
//! When the stream ends for any reason the consumer is removed and its
//! in-flight messages are redelivered (reason: consumer lost).

use super::BoxStream;
use crate::core::BrokerCore;
use crate::name::{SubscriptionName, TopicName};
use crate::storage::TopicKind;
use crate::subscription::{Command, ConsumerSpec};
use ricochet_policy::PolicySpec;
use ricochet_proto::{
    ConsumeRequest, ConsumeResponse, InitialPosition, SubscriptionType, consume_request,
};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Response, Status, Streaming};

pub(super) async fn consume(
    core: Arc<BrokerCore>,
    mut inbound: Streaming<ConsumeRequest>,
) -> Result<Response<BoxStream<ConsumeResponse>>, Status> {
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("consumer stream closed before Subscribe"))?;
    let Some(consume_request::Request::Subscribe(sub)) = first.request else {
        return Err(Status::invalid_argument(
            "the first consumer frame must be Subscribe",
        ));
    };
    let topic = TopicName::parse(&sub.topic)?;
    let name = SubscriptionName::parse(&sub.subscription)?;
    let sub_type = SubscriptionType::try_from(sub.subscription_type).map_err(|_| {
        Status::invalid_argument(format!(
            "unknown subscription type {}",
            sub.subscription_type
        ))
    })?;
    let initial = InitialPosition::try_from(sub.initial_position).map_err(|_| {
        Status::invalid_argument(format!("unknown initial position {}", sub.initial_position))
    })?;
    let policy = match &sub.dead_letter_policy {
        Some(p) => {
            let spec = PolicySpec::try_from(p).map_err(|e| {
                Status::invalid_argument(format!("invalid dead-letter policy: {e}"))
            })?;
            spec.validate().map_err(|e| {
                Status::invalid_argument(format!("invalid dead-letter policy: {e}"))
            })?;
            Some(spec)
        }
        None => None,
    };
    let entry = core.topic_for_use(&topic).await?;
    match entry.topic.kind() {
        TopicKind::Normal => {}
        TopicKind::Retry => {
            return Err(Status::failed_precondition(format!(
                "{topic} is a retry tier: the subscription that owns it receives its messages; subscribe to the original topic"
            )));
        }
        TopicKind::DeadLetter if !sub.dead_letter_reader => {
            return Err(Status::permission_denied(format!(
                "{topic} is a dead-letter tier: read it with an explicit dead-letter reader (Subscribe.dead_letter_reader) or the admin API"
            )));
        }
        TopicKind::DeadLetter => {}
    }
    let handle = core
        .subscription_or_create(&entry, &name, sub_type, initial)
        .await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let consumer_name = if sub.consumer_name.is_empty() {
        format!(
            "consumer-{}",
            core.storage
                .next_id()
                .map_err(crate::error::BrokerError::from)?
        )
    } else {
        sub.consumer_name.clone()
    };
    let spec = ConsumerSpec {
        name: consumer_name,
        sub_type,
        tx: tx.clone(),
        policy,
        retry_enabled: sub.retry_enabled.unwrap_or(true),
    };
    // The actor queues `Subscribed` as the consumer's first frame.
    let (consumer_id, _info) = handle
        .ask(|reply| Command::AddConsumer(spec, reply))
        .await??;
    let stop = core.shutdown.clone();
    tokio::spawn(async move {
        // Dropping `inbound` on shutdown resets the request stream, so the
        // connection can close.
        while let Some(frame) = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            f = inbound.next() => f,
        } {
            let req = match frame {
                Ok(ConsumeRequest { request: Some(r) }) => r,
                Ok(ConsumeRequest { request: None }) => continue,
                Err(_) => break,
            };
            let cmd = match req {
                consume_request::Request::Subscribe(_) => {
                    let _ = tx.send(Err(Status::invalid_argument(
                        "already subscribed on this stream",
                    )));
                    break;
                }
                consume_request::Request::Flow(f) => Command::Flow(consumer_id, f.permits),
                consume_request::Request::Ack(a) => Command::Ack(consumer_id, a),
                consume_request::Request::Redeliver(r) => Command::Redeliver(consumer_id, r),
                consume_request::Request::ReconsumeLater(r) => {
                    Command::ReconsumeLater(consumer_id, r)
                }
                consume_request::Request::Terminate(t) => Command::Terminate(consumer_id, t),
                consume_request::Request::Close(_) => Command::CloseConsumer(consumer_id),
            };
            if handle.send(cmd).is_err() {
                break;
            }
        }
        let _ = handle.send(Command::RemoveConsumer(consumer_id));
    });
    Ok(Response::new(super::until_shutdown(
        UnboundedReceiverStream::new(rx),
        core.shutdown.clone(),
    )))
}
