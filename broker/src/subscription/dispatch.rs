//! Which consumer gets which ready message, per subscription type, as a
//! pure function of the consumers' capacity and the dispatcher's own state
//! (the Shared round-robin position, the Key_Shared key holders):
//!
//! * Exclusive and Failover: everything to the active consumer, in order;
//!   dispatch stops as soon as it is full.
//! * Shared: round-robin over consumers with capacity.
//! * Key_Shared: a key (hashed into one of 65 536 buckets) goes to the
//!   consumer that already holds unacked messages of it; a free key goes to
//!   its owner by rendezvous hashing over the consumers' names and ids, so a
//!   key never moves to a second consumer while the first holds some of it.
//!
//! A consumer that does not read the retry tier is never handed a retry.

use super::consumers::ConsumerState;
use super::requests::ConsumerId;
use crate::storage::{TierEntry, TierId};
use crate::util::stable_hash;
use ricochet_proto::SubscriptionType;
use std::collections::HashMap;

/// A ready message offered to dispatch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offer<'a> {
    pub entry: TierEntry,
    /// Its key (Key_Shared routing; empty when it has none).
    pub key: &'a str,
}

/// A message given to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Assignment {
    pub entry: TierEntry,
    pub consumer: ConsumerId,
    /// Key_Shared: the key bucket the consumer now holds one more of.
    pub bucket: Option<u16>,
}

/// Dispatch state that outlives one round.
#[derive(Debug, Default)]
pub(super) struct Dispatcher {
    /// Shared: where the next round-robin search starts.
    rr: usize,
    /// Key_Shared: the consumer holding unacked messages of a bucket, and how many.
    buckets: HashMap<u16, (ConsumerId, u32)>,
}

/// The Key_Shared bucket of a key.
pub(super) fn bucket_of(key: &str) -> u16 {
    (stable_hash(key.as_bytes()) >> 48) as u16
}

impl Dispatcher {
    /// Hands ready messages (in order) to consumers with capacity, taking a
    /// permit and counting one unacked message per assignment.
    pub fn assign<'a>(
        &mut self,
        sub_type: SubscriptionType,
        consumers: &mut [ConsumerState],
        active: Option<ConsumerId>,
        max_unacked: usize,
        ready: impl IntoIterator<Item = Offer<'a>>,
    ) -> Vec<Assignment> {
        let mut out = Vec::new();
        for offer in ready {
            let retry = offer.entry.tier == TierId::Retry;
            let takes = |c: &ConsumerState| c.can_take(max_unacked) && (c.retry || !retry);
            let (target, bucket) = match sub_type {
                SubscriptionType::Exclusive | SubscriptionType::Failover => {
                    let Some(i) = consumers.iter().position(|c| Some(c.id) == active) else {
                        break;
                    };
                    if !consumers[i].can_take(max_unacked) {
                        break;
                    }
                    if !takes(&consumers[i]) {
                        continue;
                    }
                    (i, None)
                }
                SubscriptionType::Shared => {
                    let n = consumers.len();
                    let Some(i) = (0..n)
                        .map(|k| (self.rr + k) % n)
                        .find(|i| takes(&consumers[*i]))
                    else {
                        if retry {
                            continue;
                        }
                        break;
                    };
                    self.rr = (i + 1) % n;
                    (i, None)
                }
                SubscriptionType::KeyShared => {
                    let b = bucket_of(offer.key);
                    let owner = match self.buckets.get(&b) {
                        // Keep a key on the consumer still holding its earlier messages.
                        Some((cid, _)) => consumers.iter().position(|c| c.id == *cid),
                        None => key_owner(consumers, b),
                    };
                    match owner {
                        Some(i) if takes(&consumers[i]) => (i, Some(b)),
                        _ => continue,
                    }
                }
            };
            let c = &mut consumers[target];
            c.permits -= 1;
            c.unacked += 1;
            if let Some(b) = bucket {
                self.buckets.entry(b).or_insert((c.id, 0)).1 += 1;
            }
            out.push(Assignment {
                entry: offer.entry,
                consumer: c.id,
                bucket,
            });
        }
        out
    }

    /// Messages went to a Shared subscription's only consumer without
    /// [`Self::assign`] (staged ones): where it would leave the round-robin.
    pub fn sent_to_only_consumer(&mut self) {
        self.rr = 0;
    }

    /// A message of key bucket `b` was settled (acked, failed or given back).
    pub fn release(&mut self, b: u16) {
        if let Some(entry) = self.buckets.get_mut(&b) {
            entry.1 -= 1;
            if entry.1 == 0 {
                self.buckets.remove(&b);
            }
        }
    }
}

/// The consumer owning a free key bucket: rendezvous hashing, so adding or
/// removing a consumer moves only the buckets it gains or loses.
fn key_owner(consumers: &[ConsumerState], bucket: u16) -> Option<usize> {
    consumers
        .iter()
        .enumerate()
        .max_by_key(|(_, c)| {
            stable_hash(
                &[
                    &bucket.to_be_bytes()[..],
                    c.name.as_bytes(),
                    &c.id.to_be_bytes(),
                ]
                .concat(),
            )
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn consumer(id: u64, permits: u32, retry: bool) -> ConsumerState {
        let (tx, _rx) = mpsc::unbounded_channel();
        ConsumerState {
            id,
            name: format!("c{id}"),
            tx: tx.into(),
            permits,
            unacked: 0,
            retry,
            blocked: false,
        }
    }

    fn offers(entries: &[(TierEntry, &'static str)]) -> Vec<Offer<'static>> {
        entries
            .iter()
            .map(|(entry, key)| Offer { entry: *entry, key })
            .collect()
    }

    fn run(
        d: &mut Dispatcher,
        t: SubscriptionType,
        cs: &mut [ConsumerState],
        active: Option<u64>,
        ready: &[(TierEntry, &'static str)],
    ) -> Vec<(u64, u64)> {
        d.assign(t, cs, active, 100, offers(ready))
            .into_iter()
            .map(|a| (a.entry.entry_id, a.consumer))
            .collect()
    }

    fn main(ids: &[u64]) -> Vec<(TierEntry, &'static str)> {
        ids.iter().map(|i| (TierEntry::main(*i), "")).collect()
    }

    /// One row of a table: the type, consumers as (permits, reads retries),
    /// the active consumer, the ready messages, and who gets what.
    struct Case {
        name: &'static str,
        sub_type: SubscriptionType,
        consumers: Vec<(u32, bool)>,
        active: Option<u64>,
        ready: Vec<(TierEntry, &'static str)>,
        expect: Vec<(u64, u64)>,
    }

    #[test]
    fn dispatch_table() {
        use SubscriptionType::*;
        let cases = vec![
            Case {
                name: "exclusive: all to the active consumer, in order",
                sub_type: Exclusive,
                consumers: vec![(10, true)],
                active: Some(1),
                ready: main(&[0, 1, 2]),
                expect: vec![(0, 1), (1, 1), (2, 1)],
            },
            Case {
                name: "exclusive: stops when the consumer runs out of permits",
                sub_type: Exclusive,
                consumers: vec![(2, true)],
                active: Some(1),
                ready: main(&[0, 1, 2]),
                expect: vec![(0, 1), (1, 1)],
            },
            Case {
                name: "failover: standbys get nothing",
                sub_type: Failover,
                consumers: vec![(10, true), (10, true)],
                active: Some(2),
                ready: main(&[5, 6]),
                expect: vec![(5, 2), (6, 2)],
            },
            Case {
                name: "failover without an active consumer dispatches nothing",
                sub_type: Failover,
                consumers: vec![(10, true)],
                active: None,
                ready: main(&[5]),
                expect: vec![],
            },
            Case {
                name: "exclusive: retries skipped (not stopped at) for a consumer without retry",
                sub_type: Exclusive,
                consumers: vec![(10, false)],
                active: Some(1),
                ready: vec![
                    (TierEntry::main(0), ""),
                    (TierEntry::retry(0), ""),
                    (TierEntry::main(1), ""),
                ],
                expect: vec![(0, 1), (1, 1)],
            },
            Case {
                name: "shared: round robin",
                sub_type: Shared,
                consumers: vec![(10, true), (10, true), (10, true)],
                active: Some(1),
                ready: main(&[0, 1, 2, 3]),
                expect: vec![(0, 1), (1, 2), (2, 3), (3, 1)],
            },
            Case {
                name: "shared: a full consumer is passed over",
                sub_type: Shared,
                consumers: vec![(1, true), (10, true)],
                active: Some(1),
                ready: main(&[0, 1, 2]),
                expect: vec![(0, 1), (1, 2), (2, 2)],
            },
            Case {
                name: "shared: retries go only to consumers reading the retry tier",
                sub_type: Shared,
                consumers: vec![(10, false), (10, true)],
                active: Some(1),
                ready: vec![(TierEntry::retry(7), ""), (TierEntry::retry(8), "")],
                expect: vec![(7, 2), (8, 2)],
            },
            Case {
                name: "shared: all full",
                sub_type: Shared,
                consumers: vec![(0, true), (0, true)],
                active: Some(1),
                ready: main(&[0]),
                expect: vec![],
            },
        ];
        for case in cases {
            let mut cs: Vec<_> = case
                .consumers
                .iter()
                .enumerate()
                .map(|(i, (p, r))| consumer(i as u64 + 1, *p, *r))
                .collect();
            let got = run(
                &mut Dispatcher::default(),
                case.sub_type,
                &mut cs,
                case.active,
                &case.ready,
            );
            assert_eq!(got, case.expect, "{}", case.name);
            let handed: usize = cs.iter().map(|c| c.unacked).sum();
            assert_eq!(handed, case.expect.len(), "{}: unacked counts", case.name);
        }
    }

    #[test]
    fn key_shared_keeps_a_key_on_its_holder_until_released() {
        let mut d = Dispatcher::default();
        let mut cs = vec![consumer(1, 100, true), consumer(2, 100, true)];
        let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
        let ready: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (TierEntry::main(i as u64), *k))
            .collect();
        let first = d.assign(
            SubscriptionType::KeyShared,
            &mut cs,
            None,
            100,
            offers(&ready),
        );
        assert_eq!(first.len(), keys.len());
        let owners: HashMap<&str, u64> = keys
            .iter()
            .zip(&first)
            .map(|(k, a)| (*k, a.consumer))
            .collect();
        assert!(
            owners.values().any(|c| *c == 1) && owners.values().any(|c| *c == 2),
            "keys spread: {owners:?}"
        );

        // A third consumer joins: keys already held stay where they are.
        cs.push(consumer(3, 100, true));
        let again: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (TierEntry::main(100 + i as u64), *k))
            .collect();
        for a in d.assign(
            SubscriptionType::KeyShared,
            &mut cs,
            None,
            100,
            offers(&again),
        ) {
            let key = keys[(a.entry.entry_id - 100) as usize];
            assert_eq!(a.consumer, owners[key], "{key} moved while held");
        }

        // Once every message of a key is released, it may go to its hash owner.
        for a in &first {
            d.release(a.bucket.unwrap());
            d.release(a.bucket.unwrap());
        }
        assert!(d.buckets.is_empty());
    }

    #[test]
    fn key_shared_waits_for_a_full_holder_rather_than_moving_the_key() {
        let mut d = Dispatcher::default();
        let mut cs = vec![consumer(1, 1, true), consumer(2, 100, true)];
        // Find a key owned by consumer 1.
        let key = (0..100)
            .map(|i| format!("key-{i}"))
            .find(|k| key_owner(&cs, bucket_of(k)) == Some(0))
            .unwrap();
        let key: &'static str = Box::leak(key.into_boxed_str());
        let got = d.assign(
            SubscriptionType::KeyShared,
            &mut cs,
            None,
            100,
            offers(&[(TierEntry::main(0), key), (TierEntry::main(1), key)]),
        );
        assert_eq!(got.len(), 1, "the second waits for consumer 1's permit");
        assert_eq!(got[0].consumer, 1);
        assert_eq!(cs[1].unacked, 0);
    }
}
