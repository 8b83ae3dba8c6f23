//! Ack grouping, as plain data the driver steps: [`AckGroup`] holds the
//! acks not yet sent, says when they are due (`ack_group_time` after the
//! first, or at once when `ack_group_max` are held or grouping is off), and
//! builds the `Ack` frames of a flush. [`StaleAcks`] remembers acks of
//! messages whose stream broke, to apply when the broker redelivers them.
//!
//! Nothing here sends or sleeps: the driver passes the time in and sends
//! the frames out. A flush's last frame carries the request id the driver
//! gives it, so an answer from the broker can be matched to that flush.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use ricochet_proto::{Ack, AckType};
use tokio::time::Instant;

use super::ids::Key;
use crate::message::MessageId;

/// The acks of one stream waiting for the next flush.
#[derive(Debug)]
pub(super) struct AckGroup {
    window: Duration,
    max: usize,
    /// Acks of messages this stream delivered and had not settled.
    individual: Vec<MessageId>,
    /// Acks of ids this stream did not deliver (sent in their own frame so
    /// that a rejection cannot take the others with it).
    loose: Vec<MessageId>,
    /// The newest cumulative ack not yet sent.
    cumulative: Option<MessageId>,
    /// The highest main-topic entry id acked cumulatively on this stream,
    /// sent or not.
    mark: Option<u64>,
    /// When the held acks are due, once armed.
    deadline: Option<Instant>,
}

/// What one flush sends.
#[derive(Debug, PartialEq)]
pub(super) struct AckFlush {
    /// The frames, in order: loose acks, the cumulative ack, then the
    /// individual acks; the last carries the flush's request id.
    pub(super) frames: Vec<Ack>,
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
            individual: Vec::new(),
            loose: Vec::new(),
            cumulative: None,
            mark: None,
            deadline: None,
        }
    }

    /// Holds the ack of a message this stream delivered.
    pub(super) fn add(&mut self, id: MessageId) {
        self.individual.push(id);
    }

    /// Holds the ack of an id this stream did not deliver.
    pub(super) fn add_loose(&mut self, id: MessageId) {
        self.loose.push(id);
    }

    /// Holds a cumulative ack through `id` (a main-topic id), unless a
    /// later one is already held.
    pub(super) fn add_cumulative(&mut self, id: MessageId) {
        if self
            .cumulative
            .as_ref()
            .is_none_or(|c| c.entry_id() < id.entry_id())
        {
            self.mark = Some(id.entry_id());
            self.cumulative = Some(id);
        }
    }

    /// After adding: whether to flush now (grouping is off, or the group is
    /// full). Otherwise the flush is armed for `window` from `now`, unless
    /// it already was.
    pub(super) fn due_now(&mut self, now: Instant) -> bool {
        if self.window.is_zero() || self.individual.len() + self.loose.len() >= self.max {
            return true;
        }
        if self.deadline.is_none() {
            self.deadline = Some(now + self.window);
        }
        false
    }

    /// When the held acks are due, if armed.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Stops the flush timer, keeping the acks (nothing can be sent now).
    pub(super) fn disarm(&mut self) {
        self.deadline = None;
    }

    /// Takes every held ack into the frames of one flush. The last frame
    /// carries `request_id`; with a non-zero one there is always a frame
    /// (an empty individual one if nothing is held), so the broker answers.
    pub(super) fn take(&mut self, request_id: u64) -> AckFlush {
        self.deadline = None;
        let frame = |ack_type: AckType, ids: Vec<MessageId>| Ack {
            request_id: 0,
            ack_type: ack_type as i32,
            ids: ids.iter().map(MessageId::to_proto).collect(),
        };
        let mut frames = Vec::new();
        let loose = std::mem::take(&mut self.loose);
        if !loose.is_empty() {
            frames.push(frame(AckType::Individual, loose));
        }
        let cumulative = self.cumulative.take();
        let cumulative_through = cumulative.as_ref().map(MessageId::entry_id);
        if let Some(c) = cumulative {
            frames.push(frame(AckType::Cumulative, vec![c]));
        }
        let individual = std::mem::take(&mut self.individual);
        if !individual.is_empty() || request_id != 0 {
            frames.push(frame(AckType::Individual, individual));
        }
        if let Some(last) = frames.last_mut() {
            last.request_id = request_id;
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

    /// Whether acks of delivered messages (individual or cumulative) are
    /// held unsent.
    pub(super) fn holds_delivered(&self) -> bool {
        !self.individual.is_empty() || self.cumulative.is_some()
    }

    /// How many individual and loose acks are held unsent.
    pub(super) fn unsent(&self) -> usize {
        self.individual.len() + self.loose.len()
    }

    /// The stream broke: forgets everything, returning the held individual
    /// and loose acks (for [`StaleAcks`]).
    pub(super) fn reset(&mut self) -> Vec<MessageId> {
        let mut held = std::mem::take(&mut self.individual);
        held.append(&mut self.loose);
        self.cumulative = None;
        self.mark = None;
        self.deadline = None;
        held
    }
}

/// Ids acked after the stream they came on broke, applied when the broker
/// redelivers them. Bounded (oldest forgotten first).
#[derive(Debug, Default)]
pub(super) struct StaleAcks {
    set: HashSet<Key>,
    order: VecDeque<Key>,
}

impl StaleAcks {
    const CAP: usize = 100_000;

    pub(super) fn insert(&mut self, k: Key) {
        if self.set.insert(k) {
            self.order.push_back(k);
            while self.order.len() > Self::CAP {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    /// Whether `k` was acked before the break (it is forgotten now).
    pub(super) fn take(&mut self, k: &Key) -> bool {
        // The order queue keeps the key until it ages out; harmless.
        self.set.remove(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(entry: u64) -> MessageId {
        MessageId::new("main", entry)
    }

    fn entries(frame: &Ack) -> Vec<u64> {
        frame.ids.iter().map(|i| i.entry_id).collect()
    }

    #[test]
    fn a_group_is_due_after_its_window_or_when_full() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let mut g = AckGroup::new(ms(100), 3);
        g.add(id(1));
        assert!(!g.due_now(now));
        assert_eq!(g.deadline(), Some(now + ms(100)));
        g.add_loose(id(2));
        assert!(!g.due_now(now + ms(40)));
        assert_eq!(g.deadline(), Some(now + ms(100)), "armed once");
        g.add(id(3));
        assert!(g.due_now(now + ms(50)), "full: loose acks count");
        g.take(0);
        assert_eq!(g.deadline(), None);

        // Grouping off: every ack is due at once.
        let mut g = AckGroup::new(Duration::ZERO, 1000);
        g.add(id(1));
        assert!(g.due_now(now));
        assert_eq!(g.deadline(), None);

        // A cumulative ack arms the timer but does not count towards max.
        let mut g = AckGroup::new(ms(100), 1);
        g.add_cumulative(id(5));
        assert!(!g.due_now(now));
        g.disarm();
        assert_eq!(g.deadline(), None);
        assert!(g.holds_delivered(), "disarming keeps the acks");
    }

    #[test]
    fn a_flush_sends_loose_then_cumulative_then_individual() {
        let mut g = AckGroup::new(Duration::from_millis(100), 1000);
        g.add(id(1));
        g.add_loose(MessageId::new("other", 9));
        g.add_cumulative(id(4));
        g.add(id(2));
        assert_eq!(g.unsent(), 3);
        let flush = g.take(7);
        assert_eq!(flush.cumulative_through, Some(4));
        let kinds: Vec<i32> = flush.frames.iter().map(|f| f.ack_type).collect();
        assert_eq!(
            kinds,
            vec![
                AckType::Individual as i32,
                AckType::Cumulative as i32,
                AckType::Individual as i32
            ]
        );
        assert_eq!(flush.frames[0].ids[0].topic, "other");
        assert_eq!(entries(&flush.frames[1]), vec![4]);
        assert_eq!(entries(&flush.frames[2]), vec![1, 2]);
        let rids: Vec<u64> = flush.frames.iter().map(|f| f.request_id).collect();
        assert_eq!(rids, vec![0, 0, 7], "the last frame carries the request id");
        assert_eq!(g.unsent(), 0);
        assert!(!g.holds_delivered());

        // Nothing held: no frame, unless a request id needs an answer.
        assert_eq!(g.take(0).frames, vec![]);
        let flush = g.take(8);
        assert_eq!(flush.frames.len(), 1);
        assert!(flush.frames[0].ids.is_empty());
        assert_eq!(flush.frames[0].request_id, 8);
        assert_eq!(flush.cumulative_through, None);

        // Only loose acks: their frame carries the request id.
        g.add_loose(id(3));
        let flush = g.take(0);
        assert_eq!(flush.frames.len(), 1);
        assert_eq!(entries(&flush.frames[0]), vec![3]);
    }

    #[test]
    fn the_newest_held_cumulative_ack_wins_and_its_mark_outlives_the_flush() {
        let mut g = AckGroup::new(Duration::from_millis(100), 1000);
        assert!(!g.covers(0));
        g.add_cumulative(id(10));
        g.add_cumulative(id(5));
        assert!(g.covers(10));
        assert!(!g.covers(11));
        assert_eq!(g.take(0).cumulative_through, Some(10));
        assert!(g.covers(10), "still covered after the flush");
        // Once sent, an older cumulative ack is held (and sent) again, and
        // the mark follows it (the behaviour this module was cut from).
        g.add_cumulative(id(3));
        assert_eq!(g.take(0).cumulative_through, Some(3));
        assert!(g.covers(3));
        assert!(!g.covers(4));
    }

    #[test]
    fn reset_returns_the_held_acks_and_forgets_the_rest() {
        let now = Instant::now();
        let mut g = AckGroup::new(Duration::from_millis(100), 1000);
        g.add(id(1));
        g.add_loose(id(2));
        g.add(id(3));
        g.add_cumulative(id(9));
        assert!(!g.due_now(now));
        let held: Vec<u64> = g.reset().iter().map(MessageId::entry_id).collect();
        assert_eq!(held, vec![1, 3, 2]);
        assert_eq!(g.deadline(), None);
        assert!(!g.covers(1));
        assert!(!g.holds_delivered());
        assert_eq!(g.take(0).frames, vec![]);
    }

    #[test]
    fn stale_acks_are_taken_once_and_bounded() {
        let mut s = StaleAcks::default();
        s.insert((0, 1));
        s.insert((0, 1));
        assert!(s.take(&(0, 1)));
        assert!(!s.take(&(0, 1)), "taken once");
        for e in 0..=StaleAcks::CAP as u64 {
            s.insert((1, e));
        }
        assert!(!s.take(&(1, 0)), "the oldest was forgotten");
        assert!(s.take(&(1, 1)));
        assert!(s.take(&(1, StaleAcks::CAP as u64)));
    }
}
