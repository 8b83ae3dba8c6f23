//! Tests of the held layout and the heads scan ([`super`]).

use super::*;

fn held(count: u32, until: u64) -> FailureRecord {
    let mut r = crate::records::sample_history(count);
    r.hold_until_ms = until;
    r
}

fn main(sub: u64, id: u64) -> SubMessage {
    TierEntry::main(id).of(sub)
}

#[test]
fn gathered_heads_keep_the_own_record_else_the_highest_scheduled_one_by_entry() {
    let h = |count, hold_until_ms| FailureHead {
        count,
        hold_until_ms,
    };
    let mut g = Gathered::default();
    // As the schedule gives them: by due time, not by entry.
    g.scheduled(9, h(1, 100));
    g.scheduled(3, h(2, 200));
    g.scheduled(9, h(3, 300));
    g.scheduled(5, h(1, 400));
    let mut other = Gathered::default();
    other.own(5, h(7, 0));
    other.own(1, h(4, 0));
    other.own(5, h(8, 0));
    g.absorb(other);
    let got: Vec<(u64, FailureHead)> = g.finish().near;
    assert_eq!(
        got,
        vec![(1, h(4, 0)), (3, h(2, 200)), (5, h(8, 0)), (9, h(3, 300))]
    );
}

#[test]
fn held_nacks_alone_are_handed_on_in_the_vector_the_scan_filled() {
    let h = |count, hold_until_ms| FailureHead {
        count,
        hold_until_ms,
    };
    let mut g = Gathered::default();
    for e in (0..1_000u64).rev() {
        g.scheduled(e, h(1, 5_000 + e));
    }
    // One entry twice (a store restored from elsewhere): the higher
    // count and hold is kept, in place.
    g.scheduled(500, h(2, 9_000));
    let filled = g.scheduled.as_ptr();
    let got = g.finish().near;
    assert_eq!(got.as_ptr(), filled, "no second list of the heads");
    assert_eq!(got.len(), 1_000);
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "sorted by entry");
    assert_eq!(got[500], (500, h(2, 9_000)));
    assert_eq!(got[7], (7, h(1, 5_007)));
    // Another reader's larger share is taken as it is, not copied.
    let mut small = Gathered::default();
    small.scheduled(3, h(1, 1));
    let mut big = Gathered::default();
    for e in 10..100 {
        big.scheduled(e, h(1, e));
    }
    let big_ptr = big.scheduled.as_ptr();
    small.absorb(big);
    assert_eq!(small.scheduled.as_ptr(), big_ptr);
    assert_eq!(small.finish().near.len(), 91);
}

#[test]
fn holds_past_the_cut_go_into_the_far_set_by_runs_of_ids() {
    let far = FailureHead {
        count: 1,
        hold_until_ms: 9_000,
    };
    let near = FailureHead {
        count: 2,
        hold_until_ms: 4_000,
    };
    let mut g = Gathered::cut_at(5_000);
    // As a scan of the schedule gives them: chunks of 64 consecutive ids,
    // not in id order across chunks, one near hold inside a run, lone ids.
    for chunk in (0..100u64).rev() {
        for e in chunk * 64..chunk * 64 + 64 {
            g.scheduled(e, if e == 130 { near } else { far });
        }
    }
    g.scheduled(10_000, far);
    g.scheduled(u64::MAX - 1, far);
    g.scheduled(u64::MAX, far);
    let mut other = Gathered::cut_at(5_000);
    for e in 20_000..30_000 {
        other.scheduled(e, far);
    }
    g.absorb(other);
    // 99 whole chunks, the one split by the near hold (2), 10 000, the
    // top two ids (u64::MAX has no successor: alone), the other's run.
    assert_eq!(
        g.far_inserts,
        99 + 2 + 1 + 2 + 1,
        "one insert per run of ids"
    );
    let got = g.finish();
    assert_eq!(got.near, vec![(130, near)]);
    let mut want = roaring::RoaringTreemap::new();
    for e in (0..6_400)
        .chain([10_000, u64::MAX - 1, u64::MAX])
        .chain(20_000..30_000)
    {
        if e != 130 {
            want.insert(e);
        }
    }
    assert_eq!(got.far, want);
}

#[test]
fn holds_past_the_cut_are_gathered_as_entry_ids_only_on_every_path_of_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    let cut = 50_000;
    // Subscription 1: 3 000 holds, a third ending by the cut; one far
    // entry also has a record under its own key (it wins: not far), and
    // one record is not held at all. Subscription 2: far holds only.
    let keys: Vec<ScheduleKey> = (0..3_000u64)
        .map(|i| ScheduleKey {
            due_ms: if i % 3 == 0 { 40_000 + i } else { 60_000 + i },
            message: main(1, i),
        })
        .collect();
    let want_near = |s: &SledStorage| -> (Vec<(u64, FailureHead)>, roaring::RoaringTreemap) {
        let all = s.scan_heads(Some(1)).unwrap().remove(&1).unwrap();
        assert!(all.far.is_empty(), "not cut");
        let mut far = roaring::RoaringTreemap::new();
        let near = all
            .near
            .into_iter()
            .filter(|(e, h)| {
                (h.hold_until_ms <= cut) || {
                    far.insert(*e);
                    false
                }
            })
            .collect();
        (near, far)
    };
    let expect = {
        let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
        let records: Vec<_> = keys
            .iter()
            .map(|k| (*k, held(1 + (k.message.entry_id % 4) as u32, k.due_ms)))
            .collect();
        s.put_held(&records, &[]).unwrap();
        s.put_held(
            &[(
                ScheduleKey {
                    due_ms: 70_000,
                    message: main(2, 7),
                },
                held(2, 70_000),
            )],
            &[],
        )
        .unwrap();
        s.put_failures(&[
            (main(1, 1), Some(held(9, 0))),
            (main(1, 5_000), Some(held(1, 0))),
        ])
        .unwrap();
        s.flush_blocking();
        want_near(&s)
    };
    assert_eq!(expect.0.len(), 1_002);
    assert_eq!(expect.1.len(), 1_999);
    assert!(expect.0.contains(&(
        1,
        FailureHead {
            count: 9,
            hold_until_ms: 0
        }
    )));
    let check = |got: MainHeads| {
        assert_eq!(got.cut_ms, cut);
        assert_eq!(got.near, expect.0, "heads by the cut, by entry");
        assert_eq!(got.far, expect.1, "the later ones' ids only");
    };
    // The counted inventory's scan (a start verifying in the
    // background), then a clean verify pass (verifying before serving),
    // then the first share asked for (verifying off).
    for path in 0..3 {
        let s = super::super::reopen_waiting(dir.path(), 64);
        s.gather_heads_by(cut);
        match path {
            0 => {
                s.counts_by_subscription().unwrap();
            }
            1 => assert_eq!(s.verify().problem_count, 0),
            _ => {}
        }
        if path < 2 {
            let c = crate::util::lock(&s.heads);
            let c = c.as_ref().expect("heads gathered by the pass");
            assert!(c.by_sub[&1].near.len() < 1_100, "no list of every head");
        }
        check(s.main_failure_heads_by(1, cut + 1_000).unwrap());
        let two = s.main_failure_heads_by(2, u64::MAX - 1).unwrap();
        assert!(two.near.is_empty() && two.far.contains(7) && two.far.len() == 1);
        // Asked again (taken once), or for every head: read again, cut
        // where the caller asks, or not at all.
        check(s.main_failure_heads_by(1, cut).unwrap());
        let whole = s.main_failure_heads(1).unwrap();
        assert_eq!(whole.len(), 3_001);
        assert!(whole.contains(&(
            7,
            FailureHead {
                count: 4,
                hold_until_ms: 60_007
            }
        )));
    }
}

#[test]
fn a_held_message_is_one_stored_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
    let keys: Vec<ScheduleKey> = (0..10)
        .map(|i| ScheduleKey {
            due_ms: 5_000 + i,
            message: main(1, i),
        })
        .collect();
    // Records under their own keys before (a first, hold-less failure).
    let before: Vec<_> = keys.iter().map(|k| (k.message, Some(held(1, 0)))).collect();
    s.put_failures(&before).unwrap();
    let records: Vec<_> = keys.iter().map(|k| (*k, held(2, k.due_ms))).collect();
    s.put_held(&records, &[]).unwrap();
    assert_eq!(s.failures.len(), 0, "no key of their own");
    assert_eq!(s.sched.len(), 1, "ten schedule entries in one chunk");
    assert_eq!(s.schedule.len(), 0, "none in the per-key layout");
    for (k, r) in &records {
        assert_eq!(
            s.failure(k.message, Some(k.due_ms)).unwrap().as_ref(),
            Some(r)
        );
    }
}

#[test]
fn a_store_in_the_previous_layout_is_converted_once_in_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let n = 2 * UPGRADE_CHUNK as u64 + 5;
    let keys: Vec<ScheduleKey> = (0..n)
        .map(|i| ScheduleKey {
            due_ms: 1_000_000 + i % 7,
            message: main(1 + i % 3, i),
        })
        .collect();
    let heads_of = |s: &SledStorage| -> Vec<_> {
        (1..=3)
            .flat_map(|sub| s.failure_heads(sub, TierId::Main).unwrap())
            .collect()
    };
    let before = {
        let s = SledStorage::open(dir.path(), 64, 8 << 20).unwrap();
        // What the previous release wrote for a held nack: the record
        // under its own key, then an empty schedule entry.
        for k in &keys {
            s.put_failures(&[(k.message, Some(held(3, k.due_ms)))])
                .unwrap();
            s.put_schedule(&[(*k, true)]).unwrap();
        }
        // Records that stay under their own keys: not held, held with
        // no schedule entry of that time, and a retry-tier one.
        s.put_failures(&[
            (main(1, n), Some(held(1, 0))),
            (main(1, n + 1), Some(held(1, 77))),
            (TierEntry::retry(0).of(1), Some(held(1, 1_000_000))),
        ])
        .unwrap();
        s.put_schedule(&[(
            ScheduleKey {
                due_ms: 1_000_000,
                message: TierEntry::retry(0).of(1),
            },
            true,
        )])
        .unwrap();
        assert_eq!(s.held_under_own_keys(), n as usize + 1);
        s.flush_blocking();
        heads_of(&s)
    };
    let s = super::super::reopen_waiting(dir.path(), 64);
    assert_eq!(s.upgrade_held().unwrap(), n);
    assert_eq!(s.failures.len(), 3, "the others stay where they were");
    assert_eq!(s.held_under_own_keys(), 1);
    assert_eq!(heads_of(&s), before, "every count and hold as before");
    for k in &keys {
        assert_eq!(
            s.failure(k.message, Some(k.due_ms)).unwrap(),
            Some(held(3, k.due_ms))
        );
    }
    let report = s.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
    assert_eq!(report.scheduled, n + 1);
    // Once: nothing is left to move.
    assert_eq!(s.upgrade_held().unwrap(), 0);
    s.flush_blocking();
    drop(s);
    let s = super::super::reopen_waiting(dir.path(), 64);
    assert_eq!(s.upgrade_held().unwrap(), 0);
    assert_eq!(heads_of(&s), before);
}

/// A schedule chunk (one sled value) is written once by each write that
/// changes it: 64 held nacks of one chunk parked one write each rewrite it
/// 64 times, in one write once; a write that changes nothing in a chunk (an
/// entry already there, the removal of one that is not) writes none.
#[test]
fn a_chunk_is_written_once_by_each_write_that_changes_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = SledStorage::open(dir.path(), 16_384, 8 << 20).unwrap();
    let at = |due_ms, id| ScheduleKey {
        due_ms,
        message: main(1, id),
    };
    let together: Vec<_> = (0..64).map(|i| (at(5_000, i), held(1, 5_000))).collect();
    s.put_held(&together, &[]).unwrap();
    assert_eq!(s.schedule_chunk_writes(), 1);
    for i in 0..64 {
        s.put_held(&[(at(9_000, i), held(1, 9_000))], &[]).unwrap();
    }
    assert_eq!(s.schedule_chunk_writes(), 65);
    s.put_schedule(&[(at(5_000, 3), true), (at(5_000, 70), false)])
        .unwrap();
    assert_eq!(s.schedule_chunk_writes(), 65, "nothing changed");
    s.put_schedule(&[(at(5_000, 3), false)]).unwrap();
    assert_eq!(s.schedule_chunk_writes(), 66);
    assert_eq!(s.scheduled(None, u64::MAX, 1_000).unwrap().len(), 127);
}
