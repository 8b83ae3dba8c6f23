//! Local redelivery of nacks the broker counted ahead. A nack whose delay
//! the client holds is announced to the broker when it is made
//! (`FailedDelivery.ahead`); once the broker has stored the new delivery
//! count durably it says so (`CountedAhead`, with that count). From then on
//! the message's next delivery is already accounted for, so when its delay
//! is over the client hands its own copy back to the application and only
//! tells the broker afterwards (`FailedDelivery.local`): no storage read,
//! no dispatch, no round trip on the redelivery's path.
//!
//! [`LocalCopies`] keeps those copies under a payload budget. A copy is
//! used only once the broker confirmed its count; every other case (no
//! confirmation yet, over budget, the stream replaced) falls back to the
//! broker's redelivery, which is always correct.

use std::collections::HashMap;

use crate::ids::Key;
use crate::message::Message;
use crate::tracker::IdBuildHasher;

/// A nacked message kept for local redelivery.
#[derive(Debug)]
struct Copy {
    message: Message,
    /// The delivery count the broker confirmed for the next delivery.
    confirmed: Option<u32>,
}

/// The copies kept by one consumer stream.
#[derive(Debug)]
pub(super) struct LocalCopies {
    copies: HashMap<Key, Copy, IdBuildHasher>,
    /// Payload bytes held (the sum over `copies`).
    bytes: usize,
    /// At most this many payload bytes held; zero keeps none.
    budget: usize,
}

impl LocalCopies {
    /// Copies whose payloads total at most `budget` bytes (zero: none).
    pub(super) fn new(budget: usize) -> Self {
        Self {
            copies: HashMap::default(),
            bytes: 0,
            budget,
        }
    }

    /// Keeps `message` (nacked as `key`) if its payload fits the budget.
    pub(super) fn keep(&mut self, key: Key, message: Message) {
        self.remove(&key);
        let len = message.payload().len();
        if self.budget == 0 || self.bytes + len > self.budget {
            return;
        }
        self.bytes += len;
        self.copies.insert(
            key,
            Copy {
                message,
                confirmed: None,
            },
        );
    }

    /// The broker stored the nack of `key` durably: its next delivery
    /// goes out at `delivery_count`.
    pub(super) fn confirm(&mut self, key: Key, delivery_count: u32) {
        if let Some(c) = self.copies.get_mut(&key) {
            c.confirmed = Some(delivery_count);
        }
    }

    /// Takes the copy of `key` for its redelivery: the message at its
    /// confirmed count, or `None` (none kept, or never confirmed) for the
    /// broker to redeliver it.
    pub(super) fn take(&mut self, key: &Key) -> Option<Message> {
        let c = self.remove(key)?;
        c.confirmed.map(|n| c.message.redelivered(n))
    }

    /// Drops the copy of `key` (settled, or sent to the broker).
    pub(super) fn forget(&mut self, key: &Key) {
        // Called for every delivery and settle; most consumers keep no
        // copies, so skip hashing the key then.
        if !self.copies.is_empty() {
            self.remove(key);
        }
    }

    /// Drops every copy (the stream ended: the broker redelivers).
    pub(super) fn clear(&mut self) {
        self.copies = HashMap::default();
        self.bytes = 0;
    }

    fn remove(&mut self, key: &Key) -> Option<Copy> {
        let c = self.copies.remove(key)?;
        self.bytes -= c.message.payload().len();
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn message(entry_id: u64, payload: &[u8], delivery_count: u32) -> Message {
        let m = ricochet_proto::Message {
            id: Some(ricochet_proto::MessageId {
                topic: "t".into(),
                entry_id,
            }),
            payload: payload.to_vec(),
            delivery_count,
            ..Default::default()
        };
        Message::from_proto(m, 1, |t: &str| Arc::from(t)).unwrap()
    }

    #[test]
    fn a_copy_is_redelivered_only_once_confirmed_and_at_the_confirmed_count() {
        let mut l = LocalCopies::new(1024);
        l.keep((0, 1), message(1, b"a", 0));
        assert!(l.take(&(0, 1)).is_none(), "never confirmed: the broker's");
        assert!(l.take(&(0, 1)).is_none(), "and gone");

        l.keep((0, 2), message(2, b"b", 3));
        l.confirm((0, 2), 4);
        let m = l.take(&(0, 2)).expect("confirmed");
        assert_eq!((m.id().entry_id(), m.delivery_count()), (2, 4));
        assert_eq!(m.payload().as_ref(), b"b");
        assert!(l.take(&(0, 2)).is_none(), "taken once");
        assert_eq!(l.bytes, 0);
    }

    #[test]
    fn the_budget_bounds_the_payload_bytes_kept() {
        let mut l = LocalCopies::new(10);
        l.keep((0, 1), message(1, &[1; 6], 0));
        l.keep((0, 2), message(2, &[2; 6], 0));
        l.confirm((0, 1), 1);
        l.confirm((0, 2), 1);
        assert!(l.take(&(0, 2)).is_none(), "over budget: not kept");
        assert!(l.take(&(0, 1)).is_some());
        // Taking it freed its bytes.
        l.keep((0, 3), message(3, &[3; 10], 0));
        l.confirm((0, 3), 1);
        assert!(l.take(&(0, 3)).is_some());

        let mut none = LocalCopies::new(0);
        none.keep((0, 1), message(1, b"", 0));
        none.keep((0, 2), message(2, b"x", 0));
        none.confirm((0, 2), 1);
        assert!(none.take(&(0, 2)).is_none(), "a zero budget keeps nothing");
    }

    #[test]
    fn forgetting_and_clearing_drop_copies_and_their_bytes() {
        let mut l = LocalCopies::new(100);
        l.keep((0, 1), message(1, &[0; 40], 0));
        l.keep((0, 2), message(2, &[0; 40], 0));
        // Kept again (a later nack of the same id): replaced, not doubled.
        l.keep((0, 2), message(2, &[0; 40], 1));
        assert_eq!(l.bytes, 80);
        l.forget(&(0, 1));
        assert_eq!(l.bytes, 40);
        l.confirm((0, 1), 1);
        assert!(l.take(&(0, 1)).is_none());
        l.clear();
        assert_eq!(l.bytes, 0);
        l.confirm((0, 2), 2);
        assert!(l.take(&(0, 2)).is_none());
    }
}
