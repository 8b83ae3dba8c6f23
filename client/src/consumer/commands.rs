//! The queue of commands from a consumer's handles to its driver task: one
//! FIFO (so the driver sees every handle's commands in the order they were
//! made), which wakes the driver on each command except a *quiet* one.
//!
//! A plain ack (no receipt awaited) is sent quietly. While the driver holds
//! a group of acks with its flush armed, it allows up to as many quiet
//! commands as the group has room for ([`CmdRx::allow_quiet`]); those wait
//! in the queue without waking it, and it takes them at its next wake:
//! any other command, a frame, a timer, at the latest the group's flush
//! deadline, which it would have sent them at anyway. The command that
//! fills the group's room wakes it, so a full group still goes at once.
//! With nothing armed every command wakes the driver, as before.
//!
//! Why: an application that acks each message as it takes it woke the
//! driver for nearly every ack when both ran at the same pace, and on a
//! busy machine each wake put the application's thread behind the
//! driver's (a context switch per ack; up to 134 in one 1 000 burst).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;

use super::shared::Cmd;

#[derive(Default)]
struct State {
    queue: VecDeque<Cmd>,
    /// Quiet commands queued since the driver last found the queue empty.
    quiet: usize,
    /// How many quiet commands may wait without a wake (0: none).
    quiet_room: usize,
    /// The driver is gone: nothing is queued any more.
    closed: bool,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queue.len())
            .field("quiet", &self.quiet)
            .field("quiet_room", &self.quiet_room)
            .field("closed", &self.closed)
            .finish()
    }
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    waker: AtomicWaker,
    senders: AtomicUsize,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A new command queue.
pub(super) fn channel() -> (CmdTx, CmdRx) {
    let inner = Arc::new(Inner::default());
    inner.senders.store(1, Ordering::Release);
    (CmdTx(inner.clone()), CmdRx(inner))
}

/// The driver is gone: a command was not queued (and is dropped, its
/// caller's reply with it).
#[derive(Debug)]
pub(super) struct Closed;

/// The handles' end (cloned with each handle).
#[derive(Debug)]
pub(super) struct CmdTx(Arc<Inner>);

impl CmdTx {
    /// Queues `cmd` and wakes the driver; [`Closed`] once the driver is gone.
    pub(super) fn send(&self, cmd: Cmd) -> Result<(), Closed> {
        self.push(cmd, false)
    }

    /// Queues `cmd`, waking the driver only if the room it allowed for
    /// quiet commands is used up (see the module docs).
    pub(super) fn send_quiet(&self, cmd: Cmd) -> Result<(), Closed> {
        self.push(cmd, true)
    }

    fn push(&self, cmd: Cmd, quiet: bool) -> Result<(), Closed> {
        let wake = {
            let mut st = self.0.lock();
            if st.closed {
                drop(st);
                drop(cmd);
                return Err(Closed);
            }
            st.queue.push_back(cmd);
            if quiet && st.quiet < st.quiet_room {
                st.quiet += 1;
                st.quiet == st.quiet_room
            } else {
                true
            }
        };
        if wake {
            self.0.waker.wake();
        }
        Ok(())
    }
}

impl Clone for CmdTx {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::AcqRel);
        Self(self.0.clone())
    }
}

impl Drop for CmdTx {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last handle: the driver sees the end.
            self.0.waker.wake();
        }
    }
}

/// The driver's end.
#[derive(Debug)]
pub(super) struct CmdRx(Arc<Inner>);

impl CmdRx {
    /// The next command, or `None` once it is taken and every handle is
    /// gone.
    pub(super) async fn recv(&mut self) -> Option<Cmd> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Cmd>> {
        if let Some(cmd) = self.try_recv() {
            return Poll::Ready(Some(cmd));
        }
        self.0.waker.register(cx.waker());
        // Again, after registering: a command queued in between woke
        // nobody.
        if let Some(cmd) = self.try_recv() {
            return Poll::Ready(Some(cmd));
        }
        if self.0.senders.load(Ordering::Acquire) == 0 {
            // Every push happened before its sender's drop.
            return Poll::Ready(self.try_recv());
        }
        Poll::Pending
    }

    /// A command already queued, if any.
    pub(super) fn try_recv(&mut self) -> Option<Cmd> {
        let mut st = self.0.lock();
        let cmd = st.queue.pop_front();
        if st.queue.is_empty() {
            st.quiet = 0;
        }
        cmd
    }

    /// How many quiet commands may wait for the driver's next wake (0:
    /// every command wakes it). The driver sets this after each event.
    pub(super) fn allow_quiet(&self, room: usize) {
        let mut st = self.0.lock();
        st.quiet_room = room;
        if st.quiet >= room && !st.queue.is_empty() {
            drop(st);
            self.0.waker.wake();
        }
    }
}

impl Drop for CmdRx {
    fn drop(&mut self) {
        // What is still queued is dropped here (its callers' replies with
        // it, so they see the consumer closed), and nothing more is taken.
        let queued = {
            let mut st = self.0.lock();
            st.closed = true;
            std::mem::take(&mut st.queue)
        };
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn flow(n: u32) -> Cmd {
        Cmd::Flow(n)
    }

    fn n(c: Option<Cmd>) -> Option<u32> {
        match c {
            Some(Cmd::Flow(n)) => Some(n),
            _ => None,
        }
    }

    /// Polls once (registering the counting waker); returns the wakes so far.
    fn park(rx: &mut CmdRx, w: &Arc<Count>) -> usize {
        let waker = std::task::Waker::from(w.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending(), "nothing queued");
        w.0.load(Ordering::SeqCst)
    }

    #[test]
    fn quiet_commands_wait_within_the_room_and_the_last_one_wakes() {
        let (tx, mut rx) = channel();
        let w = Arc::new(Count(AtomicUsize::new(0)));
        rx.allow_quiet(3);
        assert_eq!(park(&mut rx, &w), 0);
        assert!(tx.send_quiet(flow(1)).is_ok());
        assert!(tx.send_quiet(flow(2)).is_ok());
        assert_eq!(w.0.load(Ordering::SeqCst), 0, "within the room: no wake");
        assert!(tx.send_quiet(flow(3)).is_ok());
        assert_eq!(w.0.load(Ordering::SeqCst), 1, "the room is used up");
        assert_eq!(
            [n(rx.try_recv()), n(rx.try_recv()), n(rx.try_recv())],
            [Some(1), Some(2), Some(3)]
        );
        assert!(rx.try_recv().is_none());
        // Emptied: the room is whole again.
        assert_eq!(park(&mut rx, &w), 1);
        assert!(tx.send_quiet(flow(4)).is_ok());
        assert_eq!(w.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_plain_command_wakes_and_keeps_the_order() {
        let (tx, mut rx) = channel();
        let w = Arc::new(Count(AtomicUsize::new(0)));
        rx.allow_quiet(100);
        park(&mut rx, &w);
        assert!(tx.send_quiet(flow(1)).is_ok());
        assert!(tx.send(flow(2)).is_ok());
        assert_eq!(w.0.load(Ordering::SeqCst), 1);
        assert_eq!([n(rx.try_recv()), n(rx.try_recv())], [Some(1), Some(2)]);
    }

    #[test]
    fn without_room_every_command_wakes() {
        let (tx, mut rx) = channel();
        let w = Arc::new(Count(AtomicUsize::new(0)));
        for i in 1..=3 {
            park(&mut rx, &w);
            assert!(tx.send_quiet(flow(i)).is_ok());
            assert_eq!(w.0.load(Ordering::SeqCst), i as usize);
            assert_eq!(n(rx.try_recv()), Some(i));
        }
    }

    #[test]
    fn taking_the_room_away_wakes_for_what_waits() {
        let (tx, mut rx) = channel();
        let w = Arc::new(Count(AtomicUsize::new(0)));
        rx.allow_quiet(10);
        park(&mut rx, &w);
        assert!(tx.send_quiet(flow(1)).is_ok());
        assert_eq!(w.0.load(Ordering::SeqCst), 0);
        rx.allow_quiet(0);
        assert_eq!(w.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_end_comes_after_what_was_queued_and_a_closed_queue_refuses() {
        let (tx, mut rx) = channel();
        let tx2 = tx.clone();
        assert!(tx.send(flow(1)).is_ok());
        drop(tx);
        assert!(tx2.send_quiet(flow(2)).is_ok());
        drop(tx2);
        assert_eq!(n(rx.recv().await), Some(1));
        assert_eq!(n(rx.recv().await), Some(2));
        assert!(rx.recv().await.is_none());

        let (tx, rx) = channel();
        drop(rx);
        assert!(tx.send(flow(3)).is_err());
    }
}
