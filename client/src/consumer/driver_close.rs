//! The consumer driver's clean close: what it hands to the broker before
//! its stream ends, and how every caller of `close` learns the outcome.

use std::sync::atomic::Ordering;

use ricochet_proto::{CloseConsumer, consume_request};
use tokio::time::Instant;

use super::super::requests::Pending;
use super::super::shared::Reply;
use super::{Driver, cumulative_covers};
use crate::error::Result;

impl Driver {
    /// Starts a clean close (or joins one under way): held nacks handed
    /// to the broker, acks flushed, a barrier whose answer ends it.
    pub(super) fn start_close(&mut self, reply: Option<Reply>) {
        if self.closing.is_some() {
            // A close already under way (or done): this caller gets its
            // outcome too, never an `Ok` of its own.
            if let Some(r) = reply {
                match self.shared.outcome.get() {
                    Some(done) => {
                        let _ = r.send(done.clone());
                    }
                    None => self.close_waiters.push(r),
                }
            }
            return;
        }
        self.shared.closed.store(true, Ordering::Release);
        self.closing = Some(Instant::now() + self.shared.request_timeout);
        self.close_waiters.extend(reply);
        if self.conn.is_none() {
            let r = self.confirmed("closed while disconnected");
            self.finish_close(r);
            return;
        }
        // Held nacks are real failures: hand them to the broker with what is
        // left of their delays, rather than let it see them as lost with
        // the consumer.
        let covered = cumulative_covers(&self.ids, &self.acks);
        self.inflight
            .hand_over_nacks(Instant::now(), &self.ids, covered);
        self.send_redeliveries();
        self.flush_acks();
        self.barrier(Pending::Close);
        // A clean close: what this consumer still holds (taken or only
        // prefetched) goes to other consumers without an attempt charged.
        self.send(consume_request::Request::Close(CloseConsumer {}));
    }

    /// The close is over with `r`: every caller waiting gets it, and so
    /// does any later `close` (from [`Shared::outcome`]).
    pub(super) fn finish_close(&mut self, r: Result<()>) {
        self.requests.forget_close();
        for w in self.close_waiters.drain(..) {
            let _ = w.send(r.clone());
        }
        let _ = self.shared.outcome.set(r);
        // Leaving the loop drops the stream; make sure it happens now.
        self.closing = Some(Instant::now());
    }
}
