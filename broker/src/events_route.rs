//! Failure events in cluster mode: where a namespace's events topic lives.
//!
//! The events topic (`<tenant>/<namespace>/__failure_events`) is placed and
//! owned like any topic, so in a cluster it is usually on another broker
//! than the subscription whose events it tells of. `BrokerCore::emit_events`
//! asks its placement hook (the node's, over the cluster's routing) for the
//! owner: owned here (or placed here now), the events are written locally;
//! owned elsewhere, the hook sends them to the owner over an ordinary
//! `Produce` stream ([`forward_to_owner`]; the
//! owner's own route check answers, so a move in between is refused there,
//! not written in two places). Events stay
//! notices: a failure is a WARN line, never an error of the change itself.
//! With `[auth]` on, the forwarded stream carries the token of
//! `[cluster] events_token_file` (a role that may produce to the events
//! topics).

use crate::error::{BrokerError, Result};
use crate::name::TopicName;
use ricochet_proto::broker_client::BrokerClient;
use ricochet_proto::{
    OutboundMessage, ProduceRequest, ProducerOpen, SendBatch, produce_request, produce_response,
};
use std::time::Duration;
use tonic::metadata::AsciiMetadataValue;

/// How long a forward may take (connect, open, write).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// The credential forwarded events carry in a cluster with `[auth]`
/// on: the token in `[cluster] events_token_file`, read when needed (so
/// a renewed token is picked up).
pub(crate) fn events_token(file: Option<&std::path::Path>) -> Option<AsciiMetadataValue> {
    let path = file?;
    let read = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            format!("Bearer {}", t.trim_end())
                .parse()
                .map_err(|_| "not a valid header value".to_owned())
        });
    match read {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the events token");
            None
        }
    }
}

/// Writes `messages` to the events topic `name` on its owner `owner` at
/// `url` (the cluster's routing named it; reached through `endpoint`,
/// `BrokerConfig::peer_endpoint`), within [`FORWARD_TIMEOUT`].
pub(crate) async fn forward_to_owner(
    (owner, url): (&str, &str),
    endpoint: tonic::transport::Endpoint,
    name: &TopicName,
    messages: Vec<OutboundMessage>,
    token: Option<&AsciiMetadataValue>,
) -> Result<()> {
    tokio::time::timeout(
        FORWARD_TIMEOUT,
        forward((url, endpoint), name, messages, token),
    )
    .await
    .map_err(|_| BrokerError::Peer(format!("broker {owner} at {url} did not answer in time")))?
}

/// Produces `messages` to `name` on the broker at `url` and waits for the
/// receipts (the owner answers once they are durable, as for any producer).
async fn forward(
    (url, endpoint): (&str, tonic::transport::Endpoint),
    name: &TopicName,
    messages: Vec<OutboundMessage>,
    token: Option<&AsciiMetadataValue>,
) -> Result<()> {
    let peer = |e: &dyn std::fmt::Display| BrokerError::Peer(format!("{url}: {e}"));
    let channel = endpoint.connect().await.map_err(|e| peer(&e))?;
    let n = messages.len();
    // A producer of its own (the broker names it): sequence ids from 1.
    let messages = messages
        .into_iter()
        .zip(1..)
        .map(|(m, seq)| OutboundMessage {
            sequence_id: seq,
            ..m
        })
        .collect();
    let frames = [
        produce_request::Request::Open(ProducerOpen {
            topic: name.to_string(),
            producer_name: String::new(),
            resend_in_order: false,
        }),
        produce_request::Request::Send(SendBatch {
            request_id: 1,
            messages,
        }),
    ]
    .map(|r| ProduceRequest { request: Some(r) });
    // The stream stays open until the receipts are in.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for f in frames {
        let _ = tx.send(f);
    }
    let mut request = tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
    if let Some(t) = token {
        request.metadata_mut().insert("authorization", t.clone());
    }
    let mut answers = BrokerClient::new(channel)
        .produce(request)
        .await
        .map_err(|s| peer(&s.message()))?
        .into_inner();
    loop {
        let answer = answers
            .message()
            .await
            .map_err(|s| peer(&s.message()))?
            .ok_or_else(|| peer(&"the stream ended before the receipts"))?;
        match answer.response {
            Some(produce_response::Response::Receipts(r)) if r.receipts.len() == n => {
                drop(tx);
                return Ok(());
            }
            Some(produce_response::Response::Error(e)) => return Err(peer(&e.message)),
            _ => {}
        }
    }
}
