//! An open consumer stream ([`Conn`]) and its opening ([`open_stream`]): the
//! `Subscribe` handshake, then requests queued for the transport, each
//! frame stamped as the transport takes it (how long it waited in this
//! client). The builder opens the first stream, the driver every later one.

use ricochet_proto::{
    ConsumeRequest, ConsumeResponse, Redeliver, Subscribed, consume_request, consume_response,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use super::ConsumerConfig;
use super::redelivery::set_hold;
use crate::client::Client;
use crate::error::{Error, Result};

/// An open consumer stream: where requests go, and the broker's frames.
pub(super) struct Conn {
    tx: mpsc::UnboundedSender<Outgoing>,
    pub(super) inbound: Streaming<ConsumeResponse>,
}

impl Conn {
    pub(super) fn send(&self, r: consume_request::Request) {
        self.send_made(r, None);
    }

    /// Sends a request the application made at `made`: a `reconsume_later`
    /// tells the broker how long it waited here (see [`stamped`]).
    pub(super) fn send_made(&self, request: consume_request::Request, made: Option<Instant>) {
        // A failure means the stream is gone; the response side reports it.
        let _ = self.tx.send(Outgoing {
            request,
            made,
            due: Vec::new(),
        });
    }

    /// Sends a `Redeliver` request whose `i`-th entry's broker-held hold
    /// ends at `due[i]` (`None`: no hold, or one that is not recomputed).
    pub(super) fn send_redeliver(&self, r: Redeliver, due: Vec<Option<Instant>>) {
        let _ = self.tx.send(Outgoing {
            request: consume_request::Request::Redeliver(r),
            made: Some(Instant::now()),
            due,
        });
    }
}

/// A request on its way to the transport, with when the application made
/// it (for a `reconsume_later`) or the driver queued it (a `Redeliver`).
struct Outgoing {
    request: consume_request::Request,
    made: Option<Instant>,
    /// A `Redeliver`'s holds' ends, entry by entry.
    due: Vec<Option<Instant>>,
}

/// The frame for `o`, built when the transport takes it from the queue.
/// Delays run from the application's call, and the time a request waits in
/// this client is not served again by the broker:
/// - a `reconsume_later`'s frame says how long it waited in the client
///   until now (`waited_us`; the broker takes it off the delay, never more
///   than the whole delay);
/// - a `Redeliver`'s broker-held holds are what is left of each now
///   (rounded up; zero once over). The broker serves a hold from the
///   frame's arrival, so it never redelivers before that.
///
/// Durations on this machine's monotonic clock: no clock is compared.
fn stamped(o: Outgoing) -> ConsumeRequest {
    let mut request = o.request;
    match (&mut request, o.made) {
        (consume_request::Request::ReconsumeLater(r), Some(made)) => {
            r.waited_us = u64::try_from(made.elapsed().as_micros()).unwrap_or(u64::MAX);
        }
        (consume_request::Request::Redeliver(r), made) => {
            let now = Instant::now();
            for (m, due) in r.messages.iter_mut().zip(&o.due) {
                if let Some(due) = due {
                    set_hold(m, due.saturating_duration_since(now));
                }
            }
            tracing::trace!(
                target: "ricochet::burst",
                n = r.messages.len(),
                queued_us = made.map_or(0, |m| now.saturating_duration_since(m).as_micros() as u64),
                "client: a redeliver frame taken by the transport"
            );
        }
        _ => {}
    }
    ConsumeRequest {
        request: Some(request),
    }
}

/// Opens a consumer stream: `Subscribe`, then the broker's `Subscribed`.
pub(super) async fn open_stream(
    client: &Client,
    topic: &str,
    cfg: &ConsumerConfig,
) -> Result<(Conn, Subscribed)> {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Outgoing {
        request: consume_request::Request::Subscribe(cfg.subscribe_request(topic)),
        made: None,
        due: Vec::new(),
    })
    .map_err(|_| Error::closed())?;
    // On the topic's owner (the client's own connection when standalone).
    let transport = client.route(topic).await?;
    let handshake = async {
        let mut inbound = Client::broker_on(transport)
            .consume(UnboundedReceiverStream::new(rx).map(stamped))
            .await
            .map_err(Error::from_status)?
            .into_inner();
        loop {
            match inbound.message().await.map_err(Error::from_status)? {
                Some(ConsumeResponse {
                    response: Some(consume_response::Response::Subscribed(s)),
                }) => {
                    return Ok((inbound, s));
                }
                Some(ConsumeResponse {
                    response: Some(consume_response::Response::Result(r)),
                }) if r.code != 0 => {
                    return Err(Error::from_frame(r.code, r.message, &r.details));
                }
                // Nothing else may come first; skip rather than fail.
                Some(_) => continue,
                None => {
                    return Err(Error::disconnected(
                        "the broker closed the consumer stream during the handshake",
                    ));
                }
            }
        }
    };
    match tokio::time::timeout(client.config().request_timeout, handshake).await {
        Ok(Ok((inbound, s))) => Ok((Conn { tx, inbound }, s)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::timeout(format!("subscribing to {topic}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::{Flow, ReconsumeLater, reconsume_later};
    use std::time::Duration;

    fn reconsume() -> consume_request::Request {
        consume_request::Request::ReconsumeLater(ReconsumeLater {
            request_id: 1,
            delay: Some(reconsume_later::Delay::DelayMs(200)),
            ..Default::default()
        })
    }

    fn waited_us(r: ConsumeRequest) -> Option<u64> {
        match r.request {
            Some(consume_request::Request::ReconsumeLater(r)) => Some(r.waited_us),
            _ => None,
        }
    }

    /// A `reconsume_later` frame says how long the request waited in the
    /// client from the application's call until the transport took it.
    #[tokio::test(start_paused = true)]
    async fn a_reconsume_frame_carries_its_wait_in_the_client() {
        let made = Instant::now();
        tokio::time::advance(Duration::from_micros(12_300)).await;
        let made = Some(made);
        let frame = stamped(Outgoing {
            request: reconsume(),
            made,
            due: Vec::new(),
        });
        assert_eq!(waited_us(frame), Some(12_300));
        // Nothing known of its call: nothing claimed.
        let frame = stamped(Outgoing {
            request: reconsume(),
            made: None,
            due: Vec::new(),
        });
        assert_eq!(waited_us(frame), Some(0));
        // Other requests go as they were.
        let frame = stamped(Outgoing {
            request: consume_request::Request::Flow(Flow { permits: 5 }),
            made,
            due: Vec::new(),
        });
        assert!(matches!(
            frame.request,
            Some(consume_request::Request::Flow(Flow { permits: 5 }))
        ));
    }

    /// A `Redeliver` frame carries what is left of each broker-held hold
    /// when the transport takes it, not when the driver queued it: the
    /// time it waited in the client is not served again by the broker.
    #[tokio::test(start_paused = true)]
    async fn a_redeliver_frame_carries_what_is_left_of_each_hold_when_taken() {
        let queued = Instant::now();
        let held = |ms: u64| {
            let mut f = ricochet_proto::FailedDelivery::default();
            set_hold(&mut f, Duration::from_millis(ms));
            f
        };
        let request = consume_request::Request::Redeliver(Redeliver {
            request_id: 0,
            // A hold of 1 s, a notice (no hold), a hold of 5 ms.
            messages: vec![held(1_000), held(0), held(5)],
        });
        let due = vec![
            Some(queued + Duration::from_millis(1_000)),
            None,
            Some(queued + Duration::from_millis(5)),
        ];
        tokio::time::advance(Duration::from_micros(12_300)).await;
        let frame = stamped(Outgoing {
            request,
            made: Some(queued),
            due,
        });
        let Some(consume_request::Request::Redeliver(r)) = frame.request else {
            panic!("not a Redeliver frame");
        };
        let holds: Vec<(u64, u64)> = r
            .messages
            .iter()
            .map(|m| (m.delay_us, m.delay_ms))
            .collect();
        // 987.7 ms left (988 rounded up for a broker that reads only ms);
        // nothing for the notice; the 5 ms hold is over: redeliver now.
        assert_eq!(holds, vec![(987_700, 988), (0, 0), (0, 0)]);
    }
}
