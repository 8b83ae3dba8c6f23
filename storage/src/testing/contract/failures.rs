//! Contract check of failure records read together
//! ([`SubscriptionStore::failures_many`]): the same answers as
//! [`SubscriptionStore::failure`] one at a time, in the order asked,
//! whatever chunk, bucket or slot the engine keeps them in.

use super::{RETRY, sub};
use crate::records::sample_history as record;
use crate::*;

pub fn check_failure_records_read_together_answer_as_one_by_one(s: &dyn Storage) {
    // 150 retries over three due times in two buckets (and, in sled, over
    // several chunks per bucket), one with a record too large to be kept
    // inline, a few overridden by a record under their own key.
    let items: Vec<MoveItem> = (0..150u64)
        .map(|i| MoveItem {
            from: TierEntry::main(i).of(7),
            from_schedule: None,
            payload: b"m".to_vec(),
            target_entry_id: i,
            failures: record(if i == 70 { 40 } else { 1 + (i % 3) as u32 }),
            arrival: Arrival::Retry { due_ms: due_of(i) },
            source: None,
        })
        .collect();
    s.move_messages(&TierMove {
        target_topic: RETRY.into(),
        subscription: sub(),
        items,
    })
    .unwrap();
    let retry = |i: u64| TierEntry::retry(i).of(7);
    s.put_failures(&[(retry(3), Some(record(9))), (retry(140), Some(record(8)))])
        .unwrap();

    // Shuffled, with repeats, wrong due times, none, and unknown entries.
    let mut asked: Vec<(SubMessage, Option<u64>)> = (0..150u64)
        .rev()
        .map(|i| (retry((i * 37) % 150), Some(due_of((i * 37) % 150))))
        .collect();
    asked.extend([
        (retry(5), Some(due_of(5) + 1)),
        (retry(5), None),
        (retry(3), None),
        (retry(500), Some(due_of(0))),
        (TierEntry::main(1).of(7), None),
        (retry(70), Some(due_of(70))),
    ]);
    let one_by_one: Vec<Option<FailureRecord>> = asked
        .iter()
        .map(|&(m, due)| s.failure(m, due).unwrap())
        .collect();
    assert_eq!(s.failures_many(&asked).unwrap(), one_by_one);
    // What the answers are (so that the one-by-one reads are checked too).
    let found = one_by_one.iter().filter(|r| r.is_some()).count();
    assert_eq!(
        found,
        150 + 2,
        "every retry, retry 3 without due, retry 70 again"
    );
    assert_eq!(
        s.failure(retry(70), Some(due_of(70))).unwrap(),
        Some(record(40))
    );
    assert_eq!(s.failure(retry(3), None).unwrap(), Some(record(9)));
    assert_eq!(s.failures_many(&[]).unwrap(), Vec::new());
}

/// The due time of retry `i` in the check above.
fn due_of(i: u64) -> u64 {
    [5_000, 5_400, 6_200][(i % 3) as usize]
}
