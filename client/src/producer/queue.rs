//! The producer's bounded queue: how many messages (and bytes) may be sent
//! and not yet answered by the broker (receipted or failed), shared by all
//! clones of a producer and, on a partitioned topic, by all its partitions
//! (Pulsar's `maxPendingMessages`/`blockIfQueueFull`). Room is taken before
//! a message is queued and given back when its receipt (or error) is
//! answered, so a producer against a slow or unreachable broker holds at
//! most the limit in memory.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::error::{Error, ErrorKind, Result};
use crate::message::MessageId;

/// The limits and the room left.
#[derive(Debug)]
pub(crate) struct Queue {
    messages: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_messages: u32,
    max_bytes: u32,
    block: bool,
}

/// The room one message holds until its receipt is answered.
#[derive(Debug)]
pub(crate) struct Room {
    _message: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

impl Queue {
    /// A queue of at most `max_messages` messages and `max_bytes` bytes
    /// (each at least 1); `block`: wait for room rather than fail.
    pub(crate) fn new(max_messages: usize, max_bytes: usize, block: bool) -> Self {
        let max_messages = clamp_u32(max_messages);
        let max_bytes = clamp_u32(max_bytes);
        Self {
            messages: Arc::new(Semaphore::new(max_messages as usize)),
            bytes: Arc::new(Semaphore::new(max_bytes as usize)),
            max_messages,
            max_bytes,
            block,
        }
    }

    /// Room for a message of `size` bytes (a message larger than the byte
    /// limit takes all of it, so it goes alone). Waits for it, in the order
    /// of the calls, or fails with [`ErrorKind::QueueFull`] when the queue
    /// does not block.
    pub(crate) async fn room(&self, size: usize) -> Result<Room> {
        let bytes = clamp_u32(size).min(self.max_bytes);
        if !self.block {
            let full = || {
                Error::new(
                    ErrorKind::QueueFull,
                    format!(
                        "{} message(s) and {} byte(s) pending; the limits are {} and {}",
                        self.pending_messages(),
                        self.pending_bytes(),
                        self.max_messages,
                        self.max_bytes
                    ),
                )
            };
            let message = self
                .messages
                .clone()
                .try_acquire_owned()
                .map_err(|_| full())?;
            let bytes = self
                .bytes
                .clone()
                .try_acquire_many_owned(bytes)
                .map_err(|_| full())?;
            return Ok(Room {
                _message: message,
                _bytes: bytes,
            });
        }
        // Never closed: an error cannot happen, but is not a panic.
        let closed = |_| Error::closed();
        let message = self
            .messages
            .clone()
            .acquire_owned()
            .await
            .map_err(closed)?;
        let bytes = self
            .bytes
            .clone()
            .acquire_many_owned(bytes)
            .await
            .map_err(closed)?;
        Ok(Room {
            _message: message,
            _bytes: bytes,
        })
    }

    /// Messages sent and not yet answered.
    pub(crate) fn pending_messages(&self) -> u64 {
        u64::from(self.max_messages) - self.messages.available_permits() as u64
    }

    /// Their bytes (payload, key and properties).
    pub(crate) fn pending_bytes(&self) -> u64 {
        u64::from(self.max_bytes) - self.bytes.available_permits() as u64
    }
}

fn clamp_u32(n: usize) -> u32 {
    // A semaphore holds at most `Semaphore::MAX_PERMITS`; u32 fits.
    u32::try_from(n)
        .unwrap_or(u32::MAX >> 3)
        .clamp(1, u32::MAX >> 3)
}

/// Where a message's receipt goes, holding its room in the queue until
/// it is answered (or dropped unanswered).
#[derive(Debug)]
pub(crate) struct Reply {
    tx: oneshot::Sender<Result<MessageId>>,
    _room: Room,
}

impl Reply {
    pub(crate) fn new(tx: oneshot::Sender<Result<MessageId>>, room: Room) -> Self {
        Self { tx, _room: room }
    }

    /// Answers, giving the room back.
    pub(crate) fn send(self, r: Result<MessageId>) -> Result<(), Result<MessageId>> {
        self.tx.send(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_fails_fast_or_waits_for_an_answer() {
        let q = Queue::new(2, 1000, false);
        let a = q.room(10).await.unwrap();
        let _b = q.room(10).await.unwrap();
        assert_eq!((q.pending_messages(), q.pending_bytes()), (2, 20));
        let e = q.room(10).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::QueueFull, "{e}");
        drop(a);
        assert_eq!(q.pending_messages(), 1);
        q.room(10).await.expect("room again once one is answered");

        let q = Arc::new(Queue::new(10, 100, true));
        let big = q
            .room(5000)
            .await
            .expect("larger than the limit: goes alone");
        assert_eq!(q.pending_bytes(), 100);
        let waiting = tokio::spawn({
            let q = q.clone();
            async move { q.room(1).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits while the bytes are taken");
        drop(big);
        waiting.await.unwrap().unwrap();
        assert_eq!((q.pending_messages(), q.pending_bytes()), (0, 0));
    }
}
