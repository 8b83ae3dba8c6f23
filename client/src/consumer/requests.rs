//! Request ids of one consumer, and what waits for the broker's answer to
//! each (a `CommandResult` carrying the id): the caller of a
//! `reconsume_later` or `terminate` (with the message's key and stream
//! generation, to track it again if the broker refuses the move), and the
//! final ack flush of `close`. Id 0 is never used: it asks for no answer.

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::ids::Key;
use crate::error::{Error, Result};

/// A `reconsume_later` or `terminate` waiting for the broker.
#[derive(Debug)]
pub(super) struct PendingMove {
    pub(super) reply: oneshot::Sender<Result<()>>,
    /// The moved message, if it could be keyed.
    pub(super) key: Option<Key>,
    /// The stream generation the request went out on.
    pub(super) epoch: u64,
}

/// What a broker answer completes.
#[derive(Debug)]
pub(super) enum Answer {
    /// The final ack flush of `close`.
    Close(Result<()>),
    /// A move; the result is for its caller.
    Move(PendingMove, Result<()>),
}

/// The requests of one consumer awaiting an answer.
#[derive(Debug)]
pub(super) struct Requests {
    next: u64,
    moves: HashMap<u64, PendingMove>,
    close: Option<u64>,
}

impl Requests {
    pub(super) fn new() -> Self {
        Self {
            next: 1,
            moves: HashMap::new(),
            close: None,
        }
    }

    fn next_id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// The id for a move request; its answer goes to `pending`.
    pub(super) fn start_move(&mut self, pending: PendingMove) -> u64 {
        let id = self.next_id();
        self.moves.insert(id, pending);
        id
    }

    /// The id for the final ack flush of `close`.
    pub(super) fn start_close(&mut self) -> u64 {
        let id = self.next_id();
        self.close = Some(id);
        id
    }

    /// Whether the final ack flush is still unanswered.
    pub(super) fn close_pending(&self) -> bool {
        self.close.is_some()
    }

    /// Stops waiting for the final ack flush.
    pub(super) fn forget_close(&mut self) {
        self.close = None;
    }

    /// Matches the broker's answer (`code` 0 for success) to its request;
    /// `None` when nothing waits for `request_id`.
    pub(super) fn answer(&mut self, request_id: u64, code: i32, message: String) -> Option<Answer> {
        let result = || {
            if code == 0 {
                Ok(())
            } else {
                Err(Error::from_code(code, message))
            }
        };
        if self.close == Some(request_id) {
            self.close = None;
            return Some(Answer::Close(result()));
        }
        let pending = self.moves.remove(&request_id)?;
        Some(Answer::Move(pending, result()))
    }

    /// Fails every move still waiting with `error()`.
    pub(super) fn fail_moves(&mut self, error: impl Fn() -> Error) {
        for (_, m) in self.moves.drain() {
            let _ = m.reply.send(Err(error()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(key: Option<Key>) -> (PendingMove, oneshot::Receiver<Result<()>>) {
        let (reply, rx) = oneshot::channel();
        (
            PendingMove {
                reply,
                key,
                epoch: 3,
            },
            rx,
        )
    }

    #[test]
    fn answers_go_to_their_request_once() {
        let mut r = Requests::new();
        let (a, _rx_a) = pending(Some((0, 1)));
        let (b, _rx_b) = pending(None);
        let ia = r.start_move(a);
        let ic = r.start_close();
        let ib = r.start_move(b);
        assert_eq!((ia, ic, ib), (1, 2, 3), "increasing, never 0");
        assert!(r.close_pending());

        match r.answer(ib, 3, "bad id".into()) {
            Some(Answer::Move(m, Err(e))) => {
                assert_eq!(m.key, None);
                assert_eq!(m.epoch, 3);
                assert_eq!(e.code(), Some(tonic::Code::InvalidArgument));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            r.answer(ic, 0, String::new()),
            Some(Answer::Close(Ok(())))
        ));
        assert!(!r.close_pending());
        assert!(
            matches!(r.answer(ia, 0, String::new()), Some(Answer::Move(m, Ok(()))) if m.key == Some((0, 1)))
        );
        assert!(r.answer(ia, 0, String::new()).is_none(), "answered once");
        assert!(r.answer(ic, 0, String::new()).is_none());
        assert!(r.answer(99, 0, String::new()).is_none());
    }

    #[test]
    fn a_failed_close_and_a_forgotten_one() {
        let mut r = Requests::new();
        let id = r.start_close();
        match r.answer(id, 14, "busy".into()) {
            Some(Answer::Close(Err(e))) => assert_eq!(e.code(), Some(tonic::Code::Unavailable)),
            other => panic!("{other:?}"),
        }
        let id = r.start_close();
        r.forget_close();
        assert!(!r.close_pending());
        assert!(r.answer(id, 0, String::new()).is_none());
    }

    #[test]
    fn failing_moves_answers_every_caller() {
        let mut r = Requests::new();
        let (a, mut rx_a) = pending(None);
        let (b, mut rx_b) = pending(None);
        let id = r.start_move(a);
        r.start_move(b);
        let close = r.start_close();
        r.fail_moves(|| Error::Closed);
        assert!(matches!(rx_a.try_recv(), Ok(Err(Error::Closed))));
        assert!(matches!(rx_b.try_recv(), Ok(Err(Error::Closed))));
        assert!(r.answer(id, 0, String::new()).is_none());
        assert!(r.close_pending(), "the close is not a move");
        assert!(matches!(
            r.answer(close, 0, String::new()),
            Some(Answer::Close(Ok(())))
        ));
    }
}
