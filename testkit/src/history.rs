//! A history checker for runs with faults (crashes, kills, pauses, cut
//! links): clients record what the broker *confirmed* (publish receipts,
//! ack receipts, confirmed failures) and what they were *delivered*, in
//! the order they saw it; after the run an auditor says where every message
//! ended (still deliverable, dead-lettered, acked), and [`History::check`]
//! finds every broken guarantee at once:
//!
//! * a receipted publish that is nowhere at the end (**lost**);
//! * a message in two places at the end, or twice in one (**doubled**):
//!   a receipted message is in exactly one of acked / pending (including
//!   the retry tier) / dead-lettered;
//! * a message delivered again after its ack was confirmed (**delivered
//!   after ack**), or found pending or dead-lettered at the end;
//! * a delivery count lower than one seen before for the same message
//!   (**count went back**).
//!
//! Messages are named by a string the test puts in the payload. A publish
//! that got no receipt (the broker died first) may be anywhere or nowhere,
//! but still never doubled. Ids are whatever the test chooses; the checker
//! keeps a global order of the recorded events (one lock), which is the
//! order the test observed them in.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Mutex;

/// Where a message ended, as the auditor found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Place {
    /// Acked (its ack confirmed, or the auditor acked it).
    Acked,
    /// Still deliverable: in the backlog or the retry tier.
    Pending,
    /// In the dead-letter tier.
    DeadLettered,
}

/// One broken guarantee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A receipted publish is nowhere at the end.
    Lost { id: String },
    /// A message is in more than one place (or twice in one) at the end.
    Doubled { id: String, places: Vec<Place> },
    /// Delivered (or found pending / dead-lettered by the auditor) after its
    /// ack was confirmed.
    DeliveredAfterAck { id: String, delivery_count: u32 },
    /// A delivery count lower than one already seen for the message.
    CountWentBack { id: String, seen: u32, then: u32 },
    /// The auditor found a message no producer ever sent.
    Unknown { id: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Lost { id } => write!(f, "{id}: receipted, then lost"),
            Violation::Doubled { id, places } => write!(f, "{id}: found in {places:?}"),
            Violation::DeliveredAfterAck { id, delivery_count } => write!(
                f,
                "{id}: delivered (count {delivery_count}) after its ack was confirmed"
            ),
            Violation::CountWentBack { id, seen, then } => {
                write!(f, "{id}: delivery count {then} after {seen} was seen")
            }
            Violation::Unknown { id } => write!(f, "{id}: never published"),
        }
    }
}

/// What a run amounted to, when nothing broke.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Publishes with a receipt.
    pub receipted: usize,
    /// Publishes sent without a receipt (found somewhere or not).
    pub unreceipted: usize,
    /// Deliveries recorded.
    pub deliveries: usize,
    /// Acks confirmed.
    pub acks_confirmed: usize,
    /// Failures (nack, `reconsume_later`, terminate) confirmed.
    pub failures_confirmed: usize,
    /// Messages per final place.
    pub places: BTreeMap<Place, usize>,
    /// Receipted publishes found in exactly one place at the end (read
    /// once: acked, or found once by the auditor).
    pub exactly_once: usize,
}

#[derive(Debug, Default)]
struct Message {
    sent: bool,
    receipted: bool,
    /// Event number of the first confirmed ack.
    acked_at: Option<u64>,
    /// An ack was sent (confirmed or not): found nowhere, it is acked.
    ack_sent: bool,
    /// Highest delivery count seen so far.
    max_count: Option<u32>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    messages: HashMap<String, Message>,
    deliveries: usize,
    acks: usize,
    failures: usize,
    violations: Vec<Violation>,
    finals: HashMap<String, Vec<Place>>,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// The recorded history of one run; share it (`Arc`) between the tasks
/// that produce and consume.
#[derive(Debug, Default)]
pub struct History {
    state: Mutex<State>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `id` is about to be published (its receipt may never come).
    pub fn sent(&self, id: &str) {
        self.with(|s| {
            s.tick();
            s.messages.entry(id.to_owned()).or_default().sent = true;
        });
    }

    /// The broker receipted `id`'s publish.
    pub fn receipted(&self, id: &str) {
        self.with(|s| {
            s.tick();
            let m = s.messages.entry(id.to_owned()).or_default();
            m.sent = true;
            m.receipted = true;
        });
    }

    /// A consumer was delivered `id` with `delivery_count`.
    pub fn delivered(&self, id: &str, delivery_count: u32) {
        self.with(|s| {
            s.tick();
            s.deliveries += 1;
            let m = s.messages.entry(id.to_owned()).or_default();
            let mut found = Vec::new();
            if m.acked_at.is_some() {
                found.push(Violation::DeliveredAfterAck {
                    id: id.to_owned(),
                    delivery_count,
                });
            }
            if let Some(seen) = m.max_count
                && delivery_count < seen
            {
                found.push(Violation::CountWentBack {
                    id: id.to_owned(),
                    seen,
                    then: delivery_count,
                });
            }
            m.max_count = Some(
                m.max_count
                    .map_or(delivery_count, |c| c.max(delivery_count)),
            );
            s.violations.extend(found);
        });
    }

    /// An ack of `id` was sent; its confirmation may never come (the
    /// broker died first), so the message may end acked or still pending.
    pub fn ack_sent(&self, id: &str) {
        self.with(|s| {
            s.tick();
            s.messages.entry(id.to_owned()).or_default().ack_sent = true;
        });
    }

    /// The broker confirmed `id`'s ack (an ack receipt).
    pub fn ack_confirmed(&self, id: &str) {
        self.with(|s| {
            let at = s.tick();
            s.acks += 1;
            let m = s.messages.entry(id.to_owned()).or_default();
            m.acked_at.get_or_insert(at);
            m.ack_sent = true;
        });
    }

    /// The broker confirmed a failure of `id` (a nack, `reconsume_later` or
    /// terminate with a receipt).
    pub fn failure_confirmed(&self, _id: &str) {
        self.with(|s| {
            s.tick();
            s.failures += 1;
        });
    }

    /// The auditor found `id` in `place` at the end of the run (call once
    /// per finding: finding it twice is a violation).
    pub fn found(&self, id: &str, place: Place) {
        self.with(|s| {
            s.tick();
            s.finals.entry(id.to_owned()).or_default().push(place);
        });
    }

    /// Every violation in the history with the auditor's findings, or what
    /// the run amounted to.
    pub fn check(&self) -> Result<Summary, Vec<Violation>> {
        let (summary, violations) = self.report();
        if violations.is_empty() {
            Ok(summary)
        } else {
            Err(violations)
        }
    }

    /// What the run amounted to and every violation in it (a bench prints
    /// both, violations or not).
    pub fn report(&self) -> (Summary, Vec<Violation>) {
        self.with(|s| {
            let mut violations = s.violations.clone();
            let mut summary = Summary {
                deliveries: s.deliveries,
                acks_confirmed: s.acks,
                failures_confirmed: s.failures,
                ..Summary::default()
            };
            let mut ids: Vec<&String> = s.messages.keys().chain(s.finals.keys()).collect();
            ids.sort();
            ids.dedup();
            for id in ids {
                let m = s.messages.get(id);
                let mut places = s.finals.get(id).cloned().unwrap_or_default();
                let acked = m.is_some_and(|m| m.acked_at.is_some());
                if acked {
                    // Found deliverable or dead-lettered after the ack
                    // was confirmed (the count is unknown: `u32::MAX`).
                    if places.iter().any(|p| *p != Place::Acked) {
                        violations.push(Violation::DeliveredAfterAck {
                            id: id.clone(),
                            delivery_count: u32::MAX,
                        });
                    }
                    if !places.contains(&Place::Acked) {
                        places.push(Place::Acked);
                    }
                }
                match m {
                    Some(m) if m.sent => {
                        if m.receipted {
                            summary.receipted += 1;
                        } else {
                            summary.unreceipted += 1;
                        }
                        if places.is_empty() && m.ack_sent {
                            // Its unconfirmed ack landed.
                            places.push(Place::Acked);
                        }
                        if places.is_empty() && m.receipted {
                            violations.push(Violation::Lost { id: id.clone() });
                        }
                    }
                    _ => violations.push(Violation::Unknown { id: id.clone() }),
                }
                places.sort();
                if places.len() == 1 && m.is_some_and(|m| m.receipted) {
                    summary.exactly_once += 1;
                }
                if places.len() > 1 {
                    violations.push(Violation::Doubled {
                        id: id.clone(),
                        places: places.clone(),
                    });
                }
                if let Some(p) = places.first() {
                    *summary.places.entry(*p).or_default() += 1;
                }
            }
            (summary, violations)
        })
    }

    /// [`check`](Self::check), panicking with every violation (at most the
    /// first 20 listed) when any guarantee broke.
    pub fn assert_ok(&self) -> Summary {
        match self.check() {
            Ok(s) => s,
            Err(v) => {
                let shown: Vec<String> = v.iter().take(20).map(ToString::to_string).collect();
                panic!(
                    "{} violation(s) in the history:\n  {}",
                    v.len(),
                    shown.join("\n  ")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_run() -> History {
        let h = History::new();
        for id in ["a", "b", "c"] {
            h.sent(id);
            h.receipted(id);
        }
        h.sent("d"); // no receipt: may be nowhere
        h.delivered("a", 0);
        h.ack_confirmed("a");
        h.delivered("b", 0);
        h.failure_confirmed("b");
        h.delivered("b", 1);
        h.found("b", Place::DeadLettered);
        h.found("c", Place::Pending);
        h
    }

    #[test]
    fn a_clean_run_passes_and_counts() {
        let s = ok_run().check().unwrap();
        assert_eq!((s.receipted, s.unreceipted), (3, 1));
        assert_eq!(
            (s.deliveries, s.acks_confirmed, s.failures_confirmed),
            (3, 1, 1)
        );
        assert_eq!(s.places.get(&Place::Acked), Some(&1));
        assert_eq!(s.places.get(&Place::DeadLettered), Some(&1));
        assert_eq!(s.places.get(&Place::Pending), Some(&1));
    }

    #[test]
    fn a_receipted_message_found_nowhere_is_lost() {
        let h = ok_run();
        h.sent("e");
        h.receipted("e");
        assert_eq!(
            h.check().unwrap_err(),
            vec![Violation::Lost { id: "e".into() }]
        );
    }

    #[test]
    fn a_message_in_two_places_or_twice_in_one_is_doubled() {
        let h = ok_run();
        h.found("b", Place::Pending);
        h.found("c", Place::Pending);
        let v = h.check().unwrap_err();
        assert!(v.contains(&Violation::Doubled {
            id: "b".into(),
            places: vec![Place::Pending, Place::DeadLettered]
        }));
        assert!(v.contains(&Violation::Doubled {
            id: "c".into(),
            places: vec![Place::Pending, Place::Pending]
        }));
        // Even a message without a receipt is never doubled.
        let h = ok_run();
        h.found("d", Place::Pending);
        h.found("d", Place::Pending);
        assert!(
            matches!(&h.check().unwrap_err()[..], [Violation::Doubled { id, .. }] if id == "d")
        );
    }

    #[test]
    fn a_delivery_after_a_confirmed_ack_is_caught_live_and_at_the_end() {
        let h = ok_run();
        h.delivered("a", 1);
        assert_eq!(
            h.check().unwrap_err(),
            vec![Violation::DeliveredAfterAck {
                id: "a".into(),
                delivery_count: 1
            }]
        );
        let h = ok_run();
        h.found("a", Place::Pending);
        let v = h.check().unwrap_err();
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::DeliveredAfterAck { id, .. } if id == "a"))
        );
    }

    #[test]
    fn a_delivery_count_lower_than_one_seen_is_caught() {
        let h = ok_run();
        h.delivered("c", 2);
        h.delivered("c", 1);
        assert_eq!(
            h.check().unwrap_err(),
            vec![Violation::CountWentBack {
                id: "c".into(),
                seen: 2,
                then: 1
            }]
        );
    }

    #[test]
    fn an_unconfirmed_ack_may_have_landed_or_not() {
        let h = ok_run();
        h.delivered("c", 0);
        h.ack_sent("c");
        // Found pending (the ack was lost with the broker): fine.
        assert!(h.check().is_ok());
        let h = ok_run();
        h.sent("e");
        h.receipted("e");
        h.delivered("e", 0);
        h.ack_sent("e");
        // Found nowhere: its ack landed, it is not lost.
        assert_eq!(h.check().unwrap().places.get(&Place::Acked), Some(&2));
    }

    #[test]
    fn a_message_nobody_sent_is_reported() {
        let h = ok_run();
        h.found("zz", Place::Pending);
        assert_eq!(
            h.check().unwrap_err(),
            vec![Violation::Unknown { id: "zz".into() }]
        );
    }
}
