//! Ack grouping, as plain data the driver steps: [`AckGroup`] holds the
//! acks not yet sent (with, under ack receipts, who waits for each), says
//! when they are due (`ack_group_time` after the first, or at once when
//! `ack_group_max` are held or grouping is off), and builds the `Ack`
//! frames of a flush.
//!
//! Nothing here sends or sleeps: the driver passes the time in, gives each
//! frame that has waiters a request id, and sends the frames out.

use std::time::Duration;

use ricochet_proto::{Ack, AckType};
use tokio::time::Instant;

use super::shared::Reply;
use crate::message::MessageId;

/// Acks of one kind held for the next flush, and who waits for them.
#[derive(Debug, Default)]
struct Held {
    ids: Vec<MessageId>,
    waiters: Vec<Reply>,
}

impl Held {
    fn add(&mut self, id: MessageId, reply: Option<Reply>) {
        self.ids.push(id);
        self.waiters.extend(reply);
    }

    fn take(&mut self) -> Held {
        std::mem::take(self)
    }
}

/// The acks of one stream waiting for the next flush.
#[derive(Debug)]
pub(super) struct AckGroup {
    window: Duration,
    max: usize,
    /// Acks of messages this stream delivered and had not settled.
    individual: Held,
    /// Acks of ids this stream did not deliver (sent in their own frame so
    /// that a rejection cannot take the others with it).
    loose: Held,
    /// The newest cumulative ack not yet sent (its waiters include those of
    /// older ones it covers).
    cumulative: Held,
    /// The highest main-topic entry id acked cumulatively on this stream,
    /// sent or not.
    mark: Option<u64>,
    /// When the held acks are due, once armed.
    deadline: Option<Instant>,
}

/// One frame of a flush.
#[derive(Debug)]
pub(super) struct AckFrame {
    /// The frame, with request id 0 (the driver gives it one).
    pub(super) ack: Ack,
    /// The acked ids (what the frame carries, as the client names them).
    pub(super) ids: Vec<MessageId>,
    /// Who waits for the broker's answer to it.
    pub(super) waiters: Vec<Reply>,
}

/// What one flush sends.
#[derive(Debug)]
pub(super) struct AckFlush {
    /// The frames, in order: loose acks, the cumulative ack, then the
    /// individual acks.
    pub(super) frames: Vec<AckFrame>,
    /// The main-topic entry id the flushed cumulative ack covers through.
    pub(super) cumulative_through: Option<u64>,
}

impl AckGroup {
    /// A group sent `window` after its first ack, or once `max` acks are
    /// held; a zero window sends every ack at once.
    pub(super) fn new(window: Duration, max: usize) -> Self {
        Self {
            window,
            max,
            individual: Held::default(),
            loose: Held::default(),
            cumulative: Held::default(),
            mark: None,
            deadline: None,
        }
    }

    /// Holds the ack of a message this stream delivered.
    pub(super) fn add(&mut self, id: MessageId, reply: Option<Reply>) {
        self.individual.add(id, reply);
    }

    /// Holds the ack of an id this stream did not deliver.
    pub(super) fn add_loose(&mut self, id: MessageId, reply: Option<Reply>) {
        self.loose.add(id, reply);
    }

    /// Holds a cumulative ack through `id` (a main-topic id), unless a
    /// later one is already held (which then answers `reply` too).
    pub(super) fn add_cumulative(&mut self, id: MessageId, reply: Option<Reply>) {
        self.cumulative.waiters.extend(reply);
        if self
            .cumulative
            .ids
            .first()
            .is_none_or(|c| c.entry_id() < id.entry_id())
        {
            self.mark = Some(id.entry_id());
            self.cumulative.ids = vec![id];
        }
    }

    /// After adding: whether to flush now (grouping is off, or the group is
    /// full). Otherwise the flush is armed for `window` from `now`, unless
    /// it already was.
    pub(super) fn due_now(&mut self, now: Instant) -> bool {
        if self.window.is_zero() || self.unsent() >= self.max {
            return true;
        }
        if self.deadline.is_none() {
            self.deadline = Some(now + self.window);
        }
        false
    }

    /// Whether an application task waits for a held ack (ack receipts).
    pub(super) fn awaited(&self) -> bool {
        [&self.individual, &self.loose, &self.cumulative]
            .iter()
            .any(|h| !h.waiters.is_empty())
    }

    /// When the held acks are due, if armed.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Stops the flush timer, keeping the acks (nothing can be sent now).
    pub(super) fn disarm(&mut self) {
        self.deadline = None;
    }

    /// Takes every held ack into the frames of one flush.
    pub(super) fn take(&mut self) -> AckFlush {
        self.deadline = None;
        let frame = |ack_type: AckType, held: Held| AckFrame {
            ack: Ack {
                request_id: 0,
                ack_type: ack_type as i32,
                ids: held.ids.iter().map(MessageId::to_proto).collect(),
            },
            ids: held.ids,
            waiters: held.waiters,
        };
        let mut frames = Vec::new();
        let cumulative_through = self.cumulative.ids.first().map(MessageId::entry_id);
        for (kind, held) in [
            (AckType::Individual, self.loose.take()),
            (AckType::Cumulative, self.cumulative.take()),
            (AckType::Individual, self.individual.take()),
        ] {
            if !held.ids.is_empty() {
                frames.push(frame(kind, held));
            }
        }
        AckFlush {
            frames,
            cumulative_through,
        }
    }

    /// Whether a cumulative ack on this stream covers main-topic entry
    /// `entry_id`.
    pub(super) fn covers(&self, entry_id: u64) -> bool {
        self.mark.is_some_and(|m| entry_id <= m)
    }

    /// How many acks are held unsent (a cumulative ack counts one).
    pub(super) fn unsent(&self) -> usize {
        self.individual.ids.len() + self.loose.ids.len() + self.cumulative.ids.len()
    }

    /// The stream broke: forgets everything, returning the held acks and
    /// who waits for them.
    pub(super) fn reset(&mut self) -> (Vec<MessageId>, Vec<Reply>) {
        let mut ids = Vec::new();
        let mut waiters = Vec::new();
        for h in [&mut self.individual, &mut self.loose, &mut self.cumulative] {
            let mut held = h.take();
            ids.append(&mut held.ids);
            waiters.append(&mut held.waiters);
        }
        self.mark = None;
        self.deadline = None;
        (ids, waiters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn id(entry: u64) -> MessageId {
        MessageId::new("main", entry)
    }

    fn entries(frame: &AckFrame) -> Vec<u64> {
        frame.ack.ids.iter().map(|i| i.entry_id).collect()
    }

    fn waiter() -> (Reply, oneshot::Receiver<crate::Result<()>>) {
        oneshot::channel()
    }

    #[test]
    fn a_group_is_due_after_its_window_or_when_full() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut g = AckGroup::new(ms(100), 3);
        g.add(id(1), None);
        assert!(!g.due_now(now));
        assert_eq!(g.deadline(), Some(now + ms(100)));
        g.add_loose(id(2), None);
        assert!(!g.due_now(now + ms(40)));
        assert_eq!(g.deadline(), Some(now + ms(100)), "armed once");
        g.add(id(3), None);
        assert!(g.due_now(now + ms(50)), "full: loose acks count");
        g.take();
        assert_eq!(g.deadline(), None);

        // Grouping off: every ack is due at once.
        let mut g = AckGroup::new(Duration::ZERO, 1000);
        g.add(id(1), None);
        assert!(g.due_now(now));
        assert_eq!(g.deadline(), None);

        // Disarming keeps the acks.
        let mut g = AckGroup::new(ms(100), 10);
        g.add_cumulative(id(5), None);
        assert!(!g.due_now(now));
        g.disarm();
        assert_eq!(g.deadline(), None);
        assert_eq!(g.unsent(), 1);
    }

    #[test]
    fn a_flush_sends_loose_then_cumulative_then_individual_with_their_waiters() {
        let mut g = AckGroup::new(Duration::from_millis(100), 1000);
        let (w1, _r1) = waiter();
        let (w2, _r2) = waiter();
        g.add(id(1), Some(w1));
        g.add_loose(MessageId::new("other", 9), None);
        g.add_cumulative(id(4), Some(w2));
        g.add(id(2), None);
        assert_eq!(g.unsent(), 4);
        let flush = g.take();
        assert_eq!(flush.cumulative_through, Some(4));
        let kinds: Vec<i32> = flush.frames.iter().map(|f| f.ack.ack_type).collect();
        assert_eq!(
            kinds,
            vec![
                AckType::Individual as i32,
                AckType::Cumulative as i32,
                AckType::Individual as i32
            ]
        );
        assert_eq!(flush.frames[0].ack.ids[0].topic, "other");
        assert_eq!(entries(&flush.frames[1]), vec![4]);
        assert_eq!(entries(&flush.frames[2]), vec![1, 2]);
        let waiting: Vec<usize> = flush.frames.iter().map(|f| f.waiters.len()).collect();
        assert_eq!(waiting, vec![0, 1, 1]);
        assert!(flush.frames.iter().all(|f| f.ack.request_id == 0));
        assert_eq!(g.unsent(), 0);
        assert!(g.take().frames.is_empty(), "nothing held: no frame");
    }

    #[test]
    fn the_newest_held_cumulative_ack_wins_and_answers_the_older_ones_waiters() {
        let mut g = AckGroup::new(Duration::from_millis(100), 1000);
        assert!(!g.covers(0));
        let (w1, _r1) = waiter();
        let (w2, _r2) = waiter();
        g.add_cumulative(id(10), Some(w1));
        g.add_cumulative(id(5), Some(w2));
        assert!(g.covers(10));
        assert!(!g.covers(11));
        let flush = g.take();
        assert_eq!(flush.cumulative_through, Some(10));
        assert_eq!(flush.frames[0].waiters.len(), 2);
        assert!(g.covers(10), "still covered after the flush");
        // Once sent, an older cumulative ack is held (and sent) again, and
        // the mark follows it (the behaviour this module was cut from).
        g.add_cumulative(id(3), None);
        assert_eq!(g.take().cumulative_through, Some(3));
        assert!(g.covers(3));
        assert!(!g.covers(4));
    }

    #[test]
    fn reset_counts_the_held_acks_and_returns_their_waiters() {
        let now = Instant::now();
        let mut g = AckGroup::new(Duration::from_millis(100), 1000);
        let (w, _r) = waiter();
        g.add(id(1), Some(w));
        g.add_loose(id(2), None);
        g.add(id(3), None);
        g.add_cumulative(id(9), None);
        assert!(!g.due_now(now));
        let (held, waiters) = g.reset();
        let entries: Vec<u64> = held.iter().map(MessageId::entry_id).collect();
        assert_eq!((entries, waiters.len()), (vec![1, 3, 2, 9], 1));
        assert_eq!(g.deadline(), None);
        assert!(!g.covers(1));
        assert_eq!(g.unsent(), 0);
        assert!(g.take().frames.is_empty());
    }
}
