//! Request ids of one consumer stream, and what waits for the broker's
//! answer to each: a `reconsume_later` or `terminate` (with the message's
//! key and stream generation, to track it again if the broker refuses the
//! move), an ack frame (its ids, and its callers under ack receipts), a
//! nack sent with receipts, a `flush` or the final barrier of `close`, and
//! the check of which acks survived a broken stream. Id 0 is never used: it
//! asks for no answer.
//!
//! Ids increase in the order requests are sent. The broker handles a
//! stream's frames in order and confirms a request only once everything
//! written before it is durable, so a successful answer to request `r` also
//! confirms every ack frame sent before `r` ([`Requests::confirm_before`]):
//! that is how `flush` and `close` know that every ack so far is durable.

use std::collections::BTreeMap;

use super::shared::Reply;
use crate::error::{Error, Result};
use crate::ids::Key;
use crate::message::MessageId;

/// A `reconsume_later` or `terminate` waiting for the broker.
#[derive(Debug)]
pub(super) struct PendingMove {
    /// The caller waiting for the answer; `None` for a queued
    /// `reconsume_later` (its outcome is reported by `flush` and `close`).
    pub(super) reply: Option<Reply>,
    /// The moved message, if it could be keyed.
    pub(super) key: Option<Key>,
    /// The stream generation the request went out on.
    pub(super) epoch: u64,
}

/// What waits for one request's answer.
#[derive(Debug)]
pub(super) enum Pending {
    /// A move; the result is for its caller.
    Move(PendingMove),
    /// An ack frame (its `ids`) or a nack request (no ids): every caller
    /// waiting under ack receipts gets the result.
    Settled {
        waiters: Vec<Reply>,
        ids: Vec<MessageId>,
    },
    /// A `flush`: the caller learns whether every ack so far is confirmed.
    Flush(Reply),
    /// The final barrier of `close`.
    Close,
    /// Which of these acks, sent on a stream that broke, were applied.
    Check { ids: Vec<MessageId> },
}

/// Callers of acks (under ack receipts) whose stream broke before the
/// receipt came: held until the next stream's check says whether the
/// broker applied their acks, rather than told at once that it failed (it
/// may not have). Each caller's own `request_timeout` bounds the wait.
#[derive(Debug, Default)]
pub(super) struct Checking(Vec<(Vec<MessageId>, Vec<Reply>)>);

impl Checking {
    /// Holds `waiters` of the acks `ids` until the check answers.
    pub(super) fn hold(&mut self, ids: Vec<MessageId>, waiters: Vec<Reply>) {
        self.0.push((ids, waiters));
    }

    /// The check answered that `applied` were applied: the waiters whose
    /// acks all were (to answer once those are durable); the others are
    /// answered now with an error naming how many were not.
    pub(super) fn answer(&mut self, applied: &[MessageId]) -> Vec<Reply> {
        let applied: std::collections::HashSet<&MessageId> = applied.iter().collect();
        let mut ok = Vec::new();
        for (ids, waiters) in self.0.drain(..) {
            let missing = ids.iter().filter(|id| !applied.contains(id)).count();
            if missing == 0 {
                ok.extend(waiters);
                continue;
            }
            let e = Error::disconnected(format!(
                "the stream broke before the broker confirmed, and it had not applied {missing} \
                 of these {} acks (their messages are redelivered)",
                ids.len()
            ));
            for w in waiters {
                let _ = w.send(Err(e.clone()));
            }
        }
        ok
    }

    /// No check will answer: every held caller gets `error()`.
    pub(super) fn fail(&mut self, error: impl Fn() -> Error) {
        for (_, waiters) in self.0.drain(..) {
            for w in waiters {
                let _ = w.send(Err(error()));
            }
        }
    }
}

/// The requests of one consumer awaiting an answer, by id (send order).
#[derive(Debug)]
pub(super) struct Requests {
    next: u64,
    waiting: BTreeMap<u64, Pending>,
}

impl Requests {
    pub(super) fn new() -> Self {
        Self {
            next: 1,
            waiting: BTreeMap::new(),
        }
    }

    /// The id for a request whose answer goes to `pending`.
    pub(super) fn start(&mut self, pending: Pending) -> u64 {
        let id = self.next;
        self.next += 1;
        self.waiting.insert(id, pending);
        id
    }

    /// Whether the final barrier of `close` is still unanswered.
    pub(super) fn close_pending(&self) -> bool {
        self.waiting.values().any(|p| matches!(p, Pending::Close))
    }

    /// Stops waiting for the final barrier.
    pub(super) fn forget_close(&mut self) {
        self.waiting.retain(|_, p| !matches!(p, Pending::Close));
    }

    /// Matches the broker's answer to its request; `None` when nothing
    /// waits for `request_id`.
    pub(super) fn answer(
        &mut self,
        request_id: u64,
        result: Result<()>,
    ) -> Option<(Pending, Result<()>)> {
        let pending = self.waiting.remove(&request_id)?;
        Some((pending, result))
    }

    /// Request `request_id` succeeded: the ack frames, nacks and moves sent
    /// before it are durable too. Returns their callers, to be told.
    ///
    /// (The broker answers each request once a flush after it completes,
    /// so answers released by one flush may arrive in any order; a refusal
    /// is answered at once, before any later request's success.)
    pub(super) fn confirm_before(&mut self, request_id: u64) -> Vec<Reply> {
        let earlier: Vec<u64> = self
            .waiting
            .range(..request_id)
            .filter(|(_, p)| matches!(p, Pending::Settled { .. } | Pending::Move(_)))
            .map(|(id, _)| *id)
            .collect();
        let mut waiters = Vec::new();
        for id in earlier {
            match self.waiting.remove(&id) {
                Some(Pending::Settled { waiters: w, .. }) => waiters.extend(w),
                Some(Pending::Move(m)) => waiters.extend(m.reply),
                _ => {}
            }
        }
        waiters
    }

    /// Queued moves (no caller waiting) sent and not yet answered.
    pub(super) fn unconfirmed_moves(&self) -> usize {
        self.waiting
            .values()
            .filter(|p| matches!(p, Pending::Move(m) if m.reply.is_none()))
            .count()
    }

    /// Acks sent and not yet confirmed.
    pub(super) fn unconfirmed_acks(&self) -> usize {
        self.waiting
            .values()
            .map(|p| match p {
                Pending::Settled { ids, .. } | Pending::Check { ids } => ids.len(),
                _ => 0,
            })
            .sum()
    }

    /// The stream broke: every request still waiting, to be answered by
    /// the caller (the close barrier included; it is forgotten).
    pub(super) fn drain(&mut self) -> Vec<Pending> {
        std::mem::take(&mut self.waiting).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use tokio::sync::oneshot;

    fn pending_move(key: Option<Key>) -> (PendingMove, oneshot::Receiver<Result<()>>) {
        let (reply, rx) = oneshot::channel();
        (
            PendingMove {
                reply: Some(reply),
                key,
                epoch: 3,
            },
            rx,
        )
    }

    fn acks(n: u64) -> Pending {
        Pending::Settled {
            waiters: Vec::new(),
            ids: (0..n).map(|e| MessageId::new("t", e)).collect(),
        }
    }

    #[test]
    fn answers_go_to_their_request_once() {
        let mut r = Requests::new();
        let (a, _rx_a) = pending_move(Some((0, 1)));
        let (b, _rx_b) = pending_move(None);
        let ia = r.start(Pending::Move(a));
        let ic = r.start(Pending::Close);
        let ib = r.start(Pending::Move(b));
        assert_eq!((ia, ic, ib), (1, 2, 3), "increasing, never 0");
        assert!(r.close_pending());

        match r.answer(ib, Err(Error::invalid_argument("bad id"))) {
            Some((Pending::Move(m), Err(e))) => {
                assert_eq!(m.key, None);
                assert_eq!(m.epoch, 3);
                assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            r.answer(ic, Ok(())),
            Some((Pending::Close, Ok(())))
        ));
        assert!(!r.close_pending());
        assert!(matches!(
            r.answer(ia, Ok(())),
            Some((Pending::Move(m), Ok(()))) if m.key == Some((0, 1))
        ));
        assert!(r.answer(ia, Ok(())).is_none(), "answered once");
        assert!(r.answer(99, Ok(())).is_none());
    }

    #[test]
    fn a_confirmed_request_confirms_the_ack_frames_sent_before_it() {
        let mut r = Requests::new();
        let (w, mut wrx) = oneshot::channel();
        let first = r.start(Pending::Settled {
            waiters: vec![w],
            ids: vec![MessageId::new("t", 1)],
        });
        r.start(acks(2));
        let barrier = r.start(Pending::Flush(oneshot::channel().0));
        let after = r.start(acks(4));
        assert_eq!(r.unconfirmed_acks(), 7);
        let (pending, result) = r.answer(barrier, Ok(())).unwrap();
        assert!(matches!(pending, Pending::Flush(_)) && result.is_ok());
        let confirmed = r.confirm_before(barrier);
        assert_eq!(confirmed.len(), 1, "the waiting caller of the first frame");
        for c in confirmed {
            c.send(Ok(())).unwrap();
        }
        assert!(matches!(wrx.try_recv(), Ok(Ok(()))));
        assert_eq!(r.unconfirmed_acks(), 4, "only the frame sent after it");
        assert!(r.answer(first, Ok(())).is_none(), "already settled");
        assert!(r.answer(after, Ok(())).is_some());
    }

    #[test]
    fn queued_moves_count_as_unconfirmed_until_answered() {
        let mut r = Requests::new();
        let (waited, _rx) = pending_move(Some((0, 1)));
        r.start(Pending::Move(waited));
        let queued = r.start(Pending::Move(PendingMove {
            reply: None,
            key: Some((0, 2)),
            epoch: 3,
        }));
        r.start(acks(2));
        assert_eq!(
            r.unconfirmed_moves(),
            1,
            "only the queued one: a caller waits for the other"
        );
        assert_eq!(r.unconfirmed_acks(), 2, "moves are not acks");
        assert!(r.answer(queued, Ok(())).is_some());
        assert_eq!(r.unconfirmed_moves(), 0);
    }

    #[test]
    fn a_confirmed_request_confirms_the_moves_sent_before_it() {
        let mut r = Requests::new();
        let (waited, mut rx) = pending_move(Some((0, 1)));
        let first = r.start(Pending::Move(waited));
        r.start(Pending::Move(PendingMove {
            reply: None,
            key: Some((0, 2)),
            epoch: 3,
        }));
        let barrier = r.start(Pending::Flush(oneshot::channel().0));
        let after = r.start(Pending::Move(PendingMove {
            reply: None,
            key: Some((0, 3)),
            epoch: 3,
        }));
        assert!(r.answer(barrier, Ok(())).is_some());
        for w in r.confirm_before(barrier) {
            w.send(Ok(())).unwrap();
        }
        assert!(matches!(rx.try_recv(), Ok(Ok(()))), "its caller is told");
        assert_eq!(r.unconfirmed_moves(), 1, "only the move sent after it");
        assert!(r.answer(first, Ok(())).is_none(), "late answer ignored");
        assert!(r.answer(after, Ok(())).is_some());
    }

    #[test]
    fn a_broken_stream_drains_everything_waiting() {
        let mut r = Requests::new();
        let (a, _rx) = pending_move(None);
        let id = r.start(Pending::Move(a));
        r.start(acks(3));
        r.start(Pending::Close);
        r.start(Pending::Check {
            ids: vec![MessageId::new(std::sync::Arc::from("t"), 1)],
        });
        let drained = r.drain();
        assert_eq!(drained.len(), 4);
        assert!(!r.close_pending());
        assert_eq!(r.unconfirmed_acks(), 0);
        assert!(r.answer(id, Ok(())).is_none());
    }
}
