//! The consumer driver's stream life: a fresh stream set up (per-stream
//! state reset, permits granted, unconfirmed acks asked about), a broken
//! one's waiting callers answered, and the resubscribe with backoff.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ricochet_policy::{DeadLetterPolicy, PolicySpec};
use ricochet_proto::{CheckAcks, Flow, Subscribed, consume_request};
use tokio::time::Instant;

use super::super::conn::{Conn, open_stream};
use super::super::requests::Pending;
use super::super::shared::Delivery;
use super::Driver;
use crate::error::Error;
use crate::message::MessageId;
use crate::reconnect::Reopen;

impl Driver {
    /// A fresh stream is up: reset per-stream state, grant permits.
    pub(super) fn connected(&mut self, conn: Conn, s: &Subscribed) {
        self.policy = self.effective_policy(s);
        self.inflight.set_counts_ahead(s.counts_ahead);
        if !s.retry_topic.is_empty() {
            self.ids.intern(&s.retry_topic);
        }
        self.shared.consumed.store(0, Ordering::Release);
        conn.send(consume_request::Request::Flow(Flow {
            permits: self.cfg.receiver_queue_size,
        }));
        self.conn = Some(conn);
        self.reconnect.connected();
        if !self.to_check.is_empty() {
            let ids = std::mem::take(&mut self.to_check);
            let proto = ids.iter().map(MessageId::to_proto).collect();
            let request_id = self.requests.start(Pending::Check { ids });
            self.send(consume_request::Request::CheckAcks(CheckAcks {
                request_id,
                ids: proto,
            }));
        }
    }

    /// The policy used for nack delays: the application's own object, else
    /// the one the broker says is in force (when it can be built here), else
    /// the application's spec.
    fn effective_policy(&self, s: &Subscribed) -> Option<Arc<dyn DeadLetterPolicy>> {
        if let Some(p) = &self.cfg.policy {
            return Some(p.clone());
        }
        if let Some(p) = s
            .dead_letter_policy
            .as_ref()
            .and_then(|c| PolicySpec::try_from(c).ok())
            .and_then(|spec| spec.build().ok())
        {
            return Some(p);
        }
        self.cfg.policy_spec.as_ref().and_then(|s| s.build().ok())
    }

    pub(super) fn lost(&mut self, why: String) {
        if self.conn.take().is_none() {
            return;
        }
        let broke = format!("the stream broke before the broker confirmed: {why}");
        let hold = self.closing.is_none();
        let unconfirmed = self.fail_waiting(|| Error::disconnected(broke.clone()), hold);
        if self.closing.is_some() {
            self.checking.fail(|| Error::disconnected(broke.clone()));
            // No next stream to ask on: every unconfirmed ack counts.
            self.acks_lost += unconfirmed.len() as u64;
            let r = self.confirmed(&format!("the stream broke: {why}"));
            self.finish_close(r);
            return;
        }
        tracing::warn!(topic = %self.shared.topic, sub = %self.shared.subscription, reason = %why, unconfirmed_acks = unconfirmed.len(), "consumer stream lost; reconnecting");
        // Asked about on the next stream.
        self.to_check.extend(unconfirmed);
        // A new generation: the broker redelivers what was in flight.
        self.epoch += 1;
        self.shared.epoch.store(self.epoch, Ordering::Release);
        self.reconnect.lost(Instant::now());
    }

    pub(super) async fn reconnect(&mut self) {
        let open = open_stream(&self.client, &self.topic, &self.cfg);
        // The broker may still hold the old stream's Exclusive slot.
        let retry =
            |e: &Error| e.is_retryable() || e.kind() == crate::ErrorKind::FailedPrecondition;
        match self.reconnect.attempt(open, retry, "consumer").await {
            Reopen::Open((conn, s)) => {
                tracing::info!(topic = %self.shared.topic, sub = %self.shared.subscription, "consumer reconnected");
                self.connected(conn, &s);
            }
            Reopen::Later(_) => {}
            Reopen::Failed(e) => {
                tracing::error!(error = %e, topic = %self.shared.topic, "consumer cannot resubscribe; closing");
                let _ = self.out.send(Delivery {
                    epoch: self.epoch,
                    item: Err(e),
                    local: false,
                });
                self.closing = Some(Instant::now());
            }
        }
    }
}
