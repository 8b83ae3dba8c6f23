//! A subscription's acknowledgement state on one topic: everything below the
//! mark-delete position is acked, plus individually acked ranges above it
//! (Pulsar's `markDeletePosition` + `individuallyDeletedMessages`).

use rangemap::RangeSet;
use serde::{Deserialize, Serialize};

/// Ack state of one subscription on one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Every entry id `< mark_delete` is acknowledged.
    pub mark_delete: u64,
    /// Acknowledged ids `>= mark_delete`, as half-open ranges.
    pub acked: RangeSet<u64>,
}

impl Cursor {
    /// A cursor with nothing acked at or after `start`.
    pub fn starting_at(start: u64) -> Self {
        Self {
            mark_delete: start,
            acked: RangeSet::new(),
        }
    }

    /// Whether `id` is acknowledged.
    pub fn is_acked(&self, id: u64) -> bool {
        id < self.mark_delete || self.acked.contains(&id)
    }

    /// Acknowledges one id; returns false if it already was.
    pub fn ack(&mut self, id: u64) -> bool {
        if self.is_acked(id) {
            return false;
        }
        self.acked.insert(id..id + 1);
        self.compact();
        true
    }

    /// Acknowledges every id in `ids` (ids that will never hold an entry);
    /// returns whether anything changed.
    pub fn ack_range(&mut self, ids: std::ops::Range<u64>) -> bool {
        let from = ids.start.max(self.mark_delete);
        if from >= ids.end || self.acked_between(from, ids.end) == ids.end - from {
            return false;
        }
        self.acked.insert(from..ids.end);
        self.compact();
        true
    }

    /// Acknowledges every id `<= id`.
    pub fn ack_through(&mut self, id: u64) {
        if id >= self.mark_delete {
            self.mark_delete = id + 1;
            self.acked.remove(0..id + 1);
            self.compact();
        }
    }

    /// Number of individually acked ranges above the mark-delete position.
    pub fn ranges(&self) -> usize {
        self.acked.len()
    }

    /// Number of acknowledged ids in `[from, to)`.
    pub fn acked_between(&self, from: u64, to: u64) -> u64 {
        let below = self.mark_delete.clamp(from, to) - from;
        let above: u64 = self
            .acked
            .overlapping(&(from..to))
            .map(|r| r.end.min(to) - r.start.max(from))
            .sum();
        below + above
    }

    fn compact(&mut self) {
        if let Some(first) = self.acked.iter().next().cloned()
            && first.start <= self.mark_delete
        {
            self.mark_delete = self.mark_delete.max(first.end);
            self.acked.remove(first);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_acks_advance_mark_delete_when_contiguous() {
        let mut c = Cursor::starting_at(0);
        assert!(c.ack(2));
        assert!(c.ack(1));
        assert_eq!(c.mark_delete, 0);
        assert_eq!(c.ranges(), 1);
        assert!(c.ack(0));
        assert_eq!(c.mark_delete, 3);
        assert_eq!(c.ranges(), 0);
        assert!(!c.ack(1), "re-ack is a no-op");
        assert!(c.is_acked(2) && !c.is_acked(3));
    }

    #[test]
    fn cumulative_ack_swallows_ranges() {
        let mut c = Cursor::starting_at(5);
        c.ack(9);
        c.ack(12);
        c.ack_through(9);
        assert_eq!(c.mark_delete, 10);
        assert_eq!(c.ranges(), 1);
        c.ack(10);
        c.ack(11);
        assert_eq!(c.mark_delete, 13);
        assert_eq!(c.acked_between(0, 20), 13);
    }

    #[test]
    fn a_range_of_lost_ids_is_acked_whole() {
        let mut c = Cursor::starting_at(10);
        c.ack(12);
        assert!(c.ack_range(20..30));
        assert_eq!((c.mark_delete, c.ranges()), (10, 2));
        assert!(!c.ack_range(22..25), "already acked");
        assert!(!c.ack_range(0..5), "below the mark");
        assert!(c.ack_range(10..12));
        assert_eq!((c.mark_delete, c.ranges()), (13, 1));
        assert!(c.ack_range(13..20));
        assert_eq!((c.mark_delete, c.ranges()), (30, 0));
    }

    #[test]
    fn acked_between_counts_ranges() {
        let mut c = Cursor::starting_at(10);
        c.ack(15);
        c.ack(16);
        c.ack(20);
        assert_eq!(c.acked_between(10, 30), 3);
        assert_eq!(c.acked_between(0, 30), 13);
        assert_eq!(c.acked_between(16, 17), 1);
    }
}
