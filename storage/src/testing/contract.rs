//! The [`Storage`] contract as an exported suite (feature `testing`): what
//! dispatch relies on, checked against any engine — sled, memory and the
//! segment-file log here, and an engine of another crate the same way.
//!
//! Each check is a `pub fn check_*` over a fresh, empty store of the engine
//! (the `&dyn Storage` ones) or over the [`Engine`] itself (the ones that
//! reopen a store or need a second one). [`storage_contract!`](crate::storage_contract)
//! expands to one `#[test]` per check for an engine:
//!
//! ```ignore
//! mod my_engine_contract {
//!     ricochet_storage::storage_contract!(my_crate::MyEngine::default());
//! }
//! ```

use std::future::Future;
use std::path::Path;

use crate::records::sample_history as record;
use crate::*;

/// The ordinary topic the checks write; an engine that keeps ordinary
/// topics apart (the segment-file log) must route it there without a topic
/// record, in segments of at most 16 entries (the checks' trims count on it).
pub const TOPIC: &str = "persistent://public/default/t";
const T: &str = TOPIC;
const RETRY: &str = "persistent://public/default/t-s-RETRY";
const DLQ: &str = "persistent://public/default/t-s-DLQ";

pub use super::engines::{Engine, MemoryEngine, REOPEN_WAIT, SegmentsEngine, SledEngine};

mod failures;
mod metadata;
pub use failures::*;
pub use metadata::*;

/// Runs `check` on a fresh store of `engine` (in a temporary directory).
pub fn run(engine: &dyn Engine, check: fn(&dyn Storage)) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let s = engine.open(dir.path());
    check(s.as_ref());
}

/// Runs a check that opens its own stores of `engine`.
pub fn run_engine(engine: &dyn Engine, check: fn(&dyn Engine)) {
    check(engine);
}

/// Drives an async storage call to its end (on a runtime of its own, so
/// the checks run in plain `#[test]`s).
fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

/// Entries `tag<from>..tag<from + n>`.
fn entries_from(from: u64, n: u64, tag: &str) -> Vec<Vec<u8>> {
    (from..from + n)
        .map(|i| format!("{tag}{i}").into_bytes())
        .collect()
}

fn sub() -> SubscriptionRecord {
    SubscriptionRecord::new(7, T, "s", ricochet_proto::SubscriptionType::Shared, 0)
}

fn entries(n: usize, tag: &str) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{tag}{i}").into_bytes()).collect()
}

pub fn check_read_many_answers_as_read_one_does_in_the_order_asked(s: &dyn Storage) {
    // Frames of 10 and 30 entries over segments of 16, a removed
    // entry, a trimmed segment, a gap and a missing id.
    s.append(T, 0, &entries(10, "a"), None).unwrap();
    s.append(T, 10, &entries(30, "b"), None).unwrap();
    s.append(T, 50, &entries(5, "c"), None).unwrap();
    // An engine that keeps an ordinary topic in sled or memory removes its
    // entries one by one (the dead-letter purge); segment files are
    // immutable and refuse it, keeping the entry whole.
    let removable = s.remove_entries(T, &[12]).is_ok();
    s.trim(T, 16).unwrap();
    let ids = [39, 3, 3, 12, 100, 17, 38, 0, 25, 45, 52, 16, 10];
    let want: Vec<_> = ids.iter().map(|&i| s.read_one(T, i).unwrap()).collect();
    assert_eq!(s.read_many(T, &ids).unwrap(), want);
    assert_eq!(want[0].as_deref(), Some(&b"b29"[..]));
    if removable {
        assert_eq!(want[3], None, "removed");
    } else {
        assert_eq!(want[3].as_deref(), Some(&b"b2"[..]), "kept");
    }
    assert_eq!(want[9], None, "a gap");
    assert_eq!(want[10].as_deref(), Some(&b"c2"[..]));
    assert!(s.read_many(T, &[]).unwrap().is_empty());
    assert_eq!(s.read_many("nope", &[1]).unwrap(), vec![None]);
}

pub fn check_logs_append_read_trim_and_never_reuse_ids(s: &dyn Storage) {
    assert_eq!(s.entry_range(T).unwrap(), (0, 0));
    // Batches of 8: a batch is stored whole, in one segment.
    for first in (0..40).step_by(8) {
        let producer = (first == 32).then_some(("p", 39));
        s.append(T, first, &entries_from(first, 8, "a"), producer)
            .unwrap();
    }
    assert_eq!(s.entry_range(T).unwrap(), (0, 40));
    let got = s.read(T, 10, 5, usize::MAX).unwrap();
    assert_eq!(
        got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![10, 11, 12, 13, 14]
    );
    assert_eq!(got[0].1, b"a10");
    assert_eq!(s.read(T, 0, 100, 10).unwrap().len(), 5, "byte bound");
    assert_eq!(s.read_one(T, 39).unwrap().as_deref(), Some(&b"a39"[..]));
    assert_eq!(s.read_one(T, 40).unwrap(), None);
    assert_eq!(s.producer_sequences(T).unwrap(), vec![("p".to_owned(), 39)]);

    s.trim(T, 35).unwrap();
    let (first, next) = s.entry_range(T).unwrap();
    assert!(first <= 35 && first > 0, "trimmed to {first}");
    assert_eq!(next, 40);
    assert_eq!(s.read_one(T, 36).unwrap().as_deref(), Some(&b"a36"[..]));

    if s.remove_entries(T, &[38, 39]).is_err() {
        // Refused (immutable segment files): nothing is gone.
        let ids: Vec<u64> = s
            .read(T, 36, 100, usize::MAX)
            .unwrap()
            .iter()
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(
            ids,
            vec![36, 37, 38, 39],
            "a refused removal removes nothing"
        );
        return;
    }
    // Removing the newest entries must not let their ids be handed out again.
    s.remove_entries(T, &[38, 39]).unwrap();
    assert_eq!(s.read_one(T, 39).unwrap(), None);
    assert_eq!(s.entry_range(T).unwrap().1, 40);
    let ids: Vec<u64> = s
        .read(T, 36, 100, usize::MAX)
        .unwrap()
        .iter()
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(ids, vec![36, 37]);
}

/// A move into the retry tier writes no failure key of its own: the record
/// rides in the schedule entry, found with the due time; a later
/// `put_failures` overrides it; leaving the tier removes both.
pub fn check_retry_moves_keep_the_failure_record_in_the_schedule_entry(s: &dyn Storage) {
    let from = TierEntry::main(3).of(7);
    s.put_failures(&[(from, Some(record(1)))]).unwrap();
    let mv = |from: SubMessage, from_schedule, target_entry_id, due_ms, count| TierMove {
        target_topic: RETRY.into(),
        subscription: sub(),
        items: vec![MoveItem {
            from,
            from_schedule,
            payload: b"m".to_vec(),
            target_entry_id,
            failures: record(count),
            arrival: Arrival::Retry { due_ms },
            source: None,
        }],
    };
    s.move_messages(&mv(from, None, 0, 5_000, 2)).unwrap();
    let first = TierEntry::retry(0).of(7);
    assert_eq!(
        s.failure(from, None).unwrap(),
        None,
        "the source's record is gone"
    );
    assert_eq!(
        s.failure(first, None).unwrap(),
        None,
        "not in the failures tree"
    );
    assert_eq!(
        s.failure(first, Some(4_999)).unwrap(),
        None,
        "wrong due time"
    );
    assert_eq!(s.failure(first, Some(5_000)).unwrap(), Some(record(2)));
    assert!(s.failures_of(7, TierId::Retry).unwrap().is_empty());
    assert_eq!(s.read_one(RETRY, 0).unwrap().as_deref(), Some(&b"m"[..]));
    let due = s.scheduled(None, u64::MAX, 10).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].due_ms, due[0].message), (5_000, first));

    // An in-place redelivery writes the record the ordinary way: it wins.
    s.put_failures(&[(first, Some(record(3)))]).unwrap();
    assert_eq!(s.failure(first, Some(5_000)).unwrap(), Some(record(3)));

    // Moving on to a second retry entry drops the first's entry and record.
    s.move_messages(&mv(first, Some(due[0]), 1, 9_000, 4))
        .unwrap();
    let second = TierEntry::retry(1).of(7);
    assert_eq!(s.failure(first, Some(5_000)).unwrap(), None);
    assert_eq!(s.failure(second, Some(9_000)).unwrap(), Some(record(4)));
    let due = s.scheduled(None, u64::MAX, 10).unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].message, second);
    // The subscription record travels with the move.
    let subs = s.list_subscriptions(T).unwrap();
    assert_eq!(subs.len(), 1);
}

/// A message held in place ([`Storage::put_held`]): its record is found
/// with its hold's end, listed by the heads and `failures_of`, moves with a
/// new hold (the old schedule entry going in the same write), survives a
/// schedule entry added again, yields to a record written later the
/// ordinary way, travels with the subscription's state, and goes with its
/// schedule entry.
pub fn check_held_messages_keep_their_records_with_their_schedule_entries(s: &dyn Storage) {
    let m = TierEntry::main(4).of(7);
    let held = |count: u32, until: u64| {
        let mut r = record(count);
        r.hold_until_ms = until;
        r
    };
    // An earlier record under the message's own key is replaced.
    s.put_failures(&[(m, Some(record(0)))]).unwrap();
    let first = ScheduleKey {
        due_ms: 5_000,
        message: m,
    };
    s.put_held(&[(first, held(1, 5_000))], &[]).unwrap();
    assert_eq!(s.failure(m, Some(5_000)).unwrap(), Some(held(1, 5_000)));
    assert_eq!(s.scheduled(None, u64::MAX, 10).unwrap(), vec![first]);
    assert_eq!(
        s.failure_heads(7, TierId::Main).unwrap(),
        vec![(m, FailureHead::of(&held(1, 5_000)))]
    );
    assert_eq!(
        s.failures_of(7, TierId::Main).unwrap(),
        vec![(m, held(1, 5_000))]
    );
    // Held again: the old entry goes with the same write.
    let second = ScheduleKey {
        due_ms: 9_000,
        message: m,
    };
    s.put_held(&[(second, held(2, 9_000))], &[first]).unwrap();
    assert_eq!(s.scheduled(None, u64::MAX, 10).unwrap(), vec![second]);
    assert_eq!(s.failure(m, Some(9_000)).unwrap(), Some(held(2, 9_000)));
    // Adding the schedule entry again (a delayed message read again)
    // keeps the record.
    s.put_schedule(&[(second, true)]).unwrap();
    assert_eq!(s.failure(m, Some(9_000)).unwrap(), Some(held(2, 9_000)));
    assert_eq!(
        s.failure_heads(7, TierId::Main).unwrap(),
        vec![(m, FailureHead::of(&held(2, 9_000)))]
    );
    // The subscription's state carries it to another id.
    let state = s.subscription_state(7).unwrap();
    s.restore_subscription_state(99, &state).unwrap();
    let moved = TierEntry::main(4).of(99);
    assert_eq!(s.failure(moved, Some(9_000)).unwrap(), Some(held(2, 9_000)));
    assert_eq!(
        s.failure_heads(99, TierId::Main).unwrap(),
        vec![(moved, FailureHead::of(&held(2, 9_000)))]
    );
    // A record written later the ordinary way wins.
    s.put_failures(&[(m, Some(record(3)))]).unwrap();
    assert_eq!(s.failure(m, Some(9_000)).unwrap(), Some(record(3)));
    assert_eq!(
        s.failure_heads(7, TierId::Main).unwrap(),
        vec![(m, FailureHead::of(&record(3)))]
    );
    // Acked: the record and the entry go.
    s.put_failures(&[(m, None)]).unwrap();
    s.put_schedule(&[(second, false)]).unwrap();
    assert_eq!(s.failure(m, Some(9_000)).unwrap(), None);
    assert!(s.failure_heads(7, TierId::Main).unwrap().is_empty());
    assert!(s.failures_of(7, TierId::Main).unwrap().is_empty());
}

/// A failure record's head is its count and hold, for every record of the
/// tier asked (and only those), histories or not.
pub fn check_failure_heads_are_the_records_counts_and_holds(s: &dyn Storage) {
    let mut held = record(3);
    held.hold_until_ms = 1_764_000_000_000;
    let records = [
        (TierEntry::main(1).of(7), record(0)),
        (TierEntry::main(2).of(7), held),
        (TierEntry::main(3).of(7), record(64)),
    ];
    let mut writes: Vec<_> = records.iter().map(|(m, r)| (*m, Some(r.clone()))).collect();
    // Another tier and another subscription are not listed.
    writes.push((TierEntry::retry(1).of(7), Some(record(5))));
    writes.push((TierEntry::main(1).of(8), Some(record(6))));
    s.put_failures(&writes).unwrap();
    let mut heads = s.failure_heads(7, TierId::Main).unwrap();
    heads.sort_by_key(|(m, _)| m.entry_id);
    let want: Vec<_> = records
        .iter()
        .map(|(m, r)| (*m, FailureHead::of(r)))
        .collect();
    assert_eq!(heads, want);
    // The same by entry id, as a subscription's start takes them.
    let mut by_entry = s.main_failure_heads(7).unwrap();
    by_entry.sort_by_key(|(e, _)| *e);
    let want_by_entry: Vec<_> = want.iter().map(|(m, h)| (m.entry_id, *h)).collect();
    assert_eq!(by_entry, want_by_entry);
    assert_eq!(want[1].1.hold_until_ms, 1_764_000_000_000);
    assert_eq!(want[2].1.count, 64);
    // Split at a horizon before the hold: each entry once, near with its
    // head, far only when held past where the engine cut (at most where
    // asked, or nowhere).
    let horizon = want[1].1.hold_until_ms - 1;
    let split = s.main_failure_heads_by(7, horizon).unwrap();
    assert!(split.cut_ms <= horizon || split.cut_ms == u64::MAX);
    let mut ids: Vec<u64> = split.near.iter().map(|(e, _)| *e).collect();
    ids.extend(split.far.iter());
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3], "every entry once, near or far");
    for near in &split.near {
        assert!(want_by_entry.contains(near), "{near:?}");
    }
    for far in split.far.iter() {
        let (_, h) = want_by_entry.iter().find(|(e, _)| *e == far).unwrap();
        assert!(
            h.hold_until_ms > split.cut_ms,
            "entry {far} is not held past the cut"
        );
    }
    assert_eq!(split.len(), 3);
}

/// The heads of the holds ending in a time range, as a subscription loads
/// them when they come into its retry window.
pub fn check_held_heads_due_are_the_holds_ending_in_range(s: &dyn Storage) {
    let base = 1_764_000_000_000u64;
    let held = |count: u32, until: u64| FailureRecord {
        hold_until_ms: until,
        ..record(count)
    };
    let head = |count: u32, until: u64| FailureHead {
        count,
        hold_until_ms: until,
    };
    let key = |due_ms: u64, message| ScheduleKey { due_ms, message };
    // Subscription 7: holds ending on both sides of bucket edges; one of
    // subscription 8 and a retry of 7 in the same range are not listed.
    let holds: Vec<_> = [(1, 500), (2, 1_500), (3, 2_000), (4, 9_000)]
        .into_iter()
        .map(|(e, at)| {
            (
                key(base + at, TierEntry::main(e).of(7)),
                held(e as u32, base + at),
            )
        })
        .chain([(
            key(base + 1_000, TierEntry::main(5).of(8)),
            held(5, base + 1_000),
        )])
        .collect();
    s.put_held(&holds, &[]).unwrap();
    s.put_schedule(&[(key(base + 1_200, TierEntry::retry(6).of(7)), true)])
        .unwrap();
    let due = |after: u64, to: u64| {
        let mut v = s.held_heads_due(7, after, to).unwrap();
        v.sort_by_key(|(e, _)| *e);
        v
    };
    // After is excluded, to included.
    assert_eq!(
        due(base + 500, base + 2_000),
        vec![(2, head(2, base + 1_500)), (3, head(3, base + 2_000))]
    );
    assert_eq!(due(base, base + 499), vec![]);
    assert_eq!(due(base + 9_000, u64::MAX - 1), vec![]);
    let all: Vec<u64> = due(0, u64::MAX - 1).iter().map(|(e, _)| *e).collect();
    assert_eq!(all, vec![1, 2, 3, 4]);
    // A record written later under its own key takes precedence.
    s.put_failures(&[(TierEntry::main(3).of(7), Some(held(7, base + 2_000)))])
        .unwrap();
    assert_eq!(
        due(base + 1_999, base + 2_000),
        vec![(3, head(7, base + 2_000))]
    );
}

pub fn check_dead_letter_moves_list_page_and_remove(s: &dyn Storage) {
    three_dead_letters(s);
    assert_eq!(s.count_dead_letters(7).unwrap(), 3);
    assert_eq!(s.count_dead_letters(8).unwrap(), 0);
    let after_first: Vec<u64> = s
        .dead_letters(7, Some(0))
        .unwrap()
        .iter()
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(after_first, vec![1, 2]);
    assert_eq!(s.dead_letters(7, None).unwrap()[2].1.failures, record(2));
    s.remove_dead_letters(7, &[1]).unwrap();
    s.remove_entries(DLQ, &[1]).unwrap();
    assert_eq!(s.count_dead_letters(7).unwrap(), 2);
    assert_eq!(s.read_one(DLQ, 1).unwrap(), None);
    assert_eq!(s.read_one(DLQ, 2).unwrap().as_deref(), Some(&b"d2"[..]));
    // Deleting the subscription takes its dead letters with it.
    s.delete_subscription(&sub()).unwrap();
    assert_eq!(s.count_dead_letters(7).unwrap(), 0);
}

pub fn check_the_schedule_is_a_time_index_paged_in_key_order(s: &dyn Storage) {
    let key = |due_ms, entry| ScheduleKey {
        due_ms,
        message: TierEntry::retry(entry).of(7),
    };
    let keys = [key(30, 1), key(10, 2), key(20, 3), key(20, 4)];
    s.put_schedule(&keys.iter().map(|k| (*k, true)).collect::<Vec<_>>())
        .unwrap();
    let page = s.scheduled(None, 25, 2).unwrap();
    assert_eq!(page, vec![key(10, 2), key(20, 3)]);
    let rest = s.scheduled(Some(page[1]), 25, 10).unwrap();
    assert_eq!(rest, vec![key(20, 4)], "up to the window's end only");
    s.put_schedule(&[(key(10, 2), false)]).unwrap();
    assert_eq!(s.scheduled(None, u64::MAX, 10).unwrap().len(), 3);
}

/// What the manifest needs from an engine: an identity written into the
/// store, an inventory of what it holds, and the manifest kept beside it.
pub fn check_the_inventory_describes_the_store_and_the_manifest_reads_back(engine: &dyn Engine) {
    {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let s = engine.open(dir.path());
        let empty = s.inventory(true).unwrap();
        assert_eq!(empty.store_id, None);
        assert!(!empty.has_data && empty.topics.is_empty());
        assert_eq!((empty.dead_letters, empty.scheduled), (Some(0), Some(0)));
        s.set_store_id("abc").unwrap();
        let id_only = s.inventory(false).unwrap();
        assert_eq!(id_only.store_id.as_deref(), Some("abc"));
        assert!(!id_only.has_data, "the id alone is no data");
        assert_eq!((id_only.dead_letters, id_only.scheduled), (None, None));

        s.put_topic(&TopicRecord {
            name: T.into(),
            created_ms: 1,
            kind: TopicKind::Normal,
            replicas: 1,
            trimmed_below: 0,
        })
        .unwrap();
        s.append(T, 0, &entries(40, "a"), None).unwrap();
        s.put_subscription(&sub()).unwrap();
        let key = ScheduleKey {
            due_ms: 5,
            message: TierEntry::retry(0).of(7),
        };
        s.put_schedule(&[(key, true)]).unwrap();
        let inv = s.inventory(true).unwrap();
        assert!(inv.has_data);
        let t = &inv.topics[T];
        assert_eq!((t.kind, t.first, t.next), (TopicKind::Normal, 0, 40),);
        assert_eq!(t.subscriptions.iter().collect::<Vec<_>>(), vec!["s"],);
        assert!(
            t.segments.windows(2).all(|w| w[0] < w[1]),
            "segments ascend: {:?}",
            t.segments
        );
        if let Some(segments) = engine.segments_of_one_batch() {
            assert_eq!(t.segments, segments);
        }
        assert_eq!((inv.dead_letters, inv.scheduled), (Some(0), Some(1)),);

        assert_eq!(s.load_manifest().unwrap(), None);
        let mut m = Manifest {
            store_id: "abc".into(),
            written_ms: 9,
            ..Manifest::default()
        };
        m.topics.insert(
            T.into(),
            manifest::TopicFacts {
                reserved: 100,
                recorded: Some(t.recorded()),
            },
        );
        block_on(s.save_manifest(&m)).unwrap();
        assert_eq!(s.load_manifest().unwrap(), Some(m));
        if let Some(path) = engine.manifest_file(dir.path()) {
            // A damaged manifest file is refused, not read as missing.
            let mut bytes = std::fs::read(&path).unwrap();
            let last = bytes.len() - 3;
            bytes[last] ^= 1;
            std::fs::write(&path, bytes).unwrap();
            assert!(matches!(s.load_manifest(), Err(StorageError::Corrupt(_))));
        }
    }
}

/// Three dead letters `d0..d2` of subscription 7 (DLQ ids 0..3).
fn three_dead_letters(s: &dyn Storage) {
    let items = (0..3)
        .map(|i| MoveItem {
            from: TierEntry::main(i).of(7),
            from_schedule: None,
            payload: format!("d{i}").into_bytes(),
            target_entry_id: i,
            failures: record(2),
            arrival: Arrival::DeadLetter(DeadLetterRecord {
                origin_topic: T.into(),
                origin_entry_id: i,
                reason: "too many".into(),
                at_ms: 42,
                failures: record(2),
                replay: None,
            }),
            source: None,
        })
        .collect();
    s.move_messages(&TierMove {
        target_topic: DLQ.into(),
        subscription: sub(),
        items,
    })
    .unwrap();
}

pub fn check_dead_letters_return_to_the_retry_tier_all_or_nothing(s: &dyn Storage) {
    three_dead_letters(s);
    let item = |dl: u64, target: u64| ReturnItem {
        dead_letter_id: dl,
        payload: format!("r{dl}").into_bytes(),
        target_entry_id: target,
        due_ms: 5_000,
        failures: record(3),
    };
    let mv = |items| DeadLetterReturn {
        dead_letter_topic: DLQ.into(),
        retry_topic: RETRY.into(),
        subscription: sub(),
        items,
    };
    // One of them is not a dead letter: nothing changes.
    let err = s.return_dead_letters(&mv(vec![item(0, 0), item(9, 1)]));
    assert!(matches!(err, Err(StorageError::Missing(_))), "{err:?}");
    assert_eq!(s.count_dead_letters(7).unwrap(), 3);
    assert!(s.read_one(DLQ, 0).unwrap().is_some());
    assert_eq!(s.read_one(RETRY, 0).unwrap(), None);
    assert!(s.scheduled(None, u64::MAX, 10).unwrap().is_empty());

    s.return_dead_letters(&mv(vec![item(0, 0), item(2, 1)]))
        .unwrap();
    let left: Vec<u64> = s
        .dead_letters(7, None)
        .unwrap()
        .iter()
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(left, vec![1]);
    assert_eq!(s.read_one(DLQ, 0).unwrap(), None);
    assert_eq!(s.read_one(DLQ, 2).unwrap(), None);
    assert_eq!(s.read_one(DLQ, 1).unwrap().as_deref(), Some(&b"d1"[..]));
    assert_eq!(s.read_one(RETRY, 1).unwrap().as_deref(), Some(&b"r2"[..]));
    let due = s.scheduled(None, u64::MAX, 10).unwrap();
    assert_eq!(due.len(), 2);
    assert_eq!(due[1].message, TierEntry::retry(1).of(7));
    assert_eq!(
        s.failure(due[1].message, Some(5_000)).unwrap(),
        Some(record(3)),
        "the failure record rides with the schedule entry"
    );
    // The DLQ's ids are not handed out again.
    assert_eq!(s.entry_range(DLQ).unwrap().1, 3);
}

pub fn check_edits_and_replay_intents_are_kept(s: &dyn Storage) {
    three_dead_letters(s);
    let mut rec = s.dead_letters_by_id(7, &[1, 5]).unwrap();
    assert_eq!(rec.len(), 1, "only those still there");
    let mut failures = record(2);
    failures.push_edit(EditRecord {
        time_ms: 9,
        by: "ops".into(),
        payload_size_before: 3,
        payload_size_after: 4,
        properties_set: vec!["a".into()],
        properties_removed: vec!["b".into()],
        key_changed: true,
    });
    rec[0].1.replay = Some(Box::new(ReplayIntent {
        sequence_id: 77,
        message: b"m".to_vec(),
        failures: Some(failures.clone()),
    }));
    s.put_dead_letters(7, &rec).unwrap();
    assert_eq!(s.dead_letters_by_id(7, &[1]).unwrap(), rec);
    // Edits survive the failure record's stored form too.
    let m = TierEntry::main(3).of(7);
    s.put_failures(&[(m, Some(failures.clone()))]).unwrap();
    assert_eq!(s.failure(m, None).unwrap(), Some(failures));
}

/// Flushes `s`, closes it, and hands the store reopened from `dir` to
/// `check` when the engine is persistent; then the engine's own integrity
/// check (if any) must find nothing wrong.
fn reopened(
    engine: &dyn Engine,
    dir: &Path,
    s: Box<dyn Storage>,
    check: impl FnOnce(&dyn Storage),
) {
    block_on(s.flush()).unwrap();
    if !engine.persistent() {
        return;
    }
    drop(s);
    let again = engine.open(dir);
    check(again.as_ref());
    drop(again);
    if let Some(problems) = engine.verify(dir) {
        assert_eq!(problems, 0, "the reopened store verifies");
    }
}

pub fn check_grants_are_kept_per_role_and_resource_and_survive_reopen(engine: &dyn Engine) {
    let grant = |role: &str, resource: &str, perms: &[&str]| GrantRecord {
        role: role.into(),
        resource: resource.into(),
        permissions: perms
            .iter()
            .map(|p| Permission::from_name(p).expect("a known permission"))
            .collect(),
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let s = engine.open(dir.path());
    assert!(s.grants().unwrap().is_empty());
    s.put_grant(&grant("app", "acme/orders", &["produce"]))
        .unwrap();
    s.put_grant(&grant("app", "acme/orders", &["consume", "produce"]))
        .unwrap();
    s.put_grant(&grant("ops", T, &["admin"])).unwrap();
    // A role that is a prefix of another's must not mix with it.
    s.put_grant(&grant("app2", "acme/orders", &["policy"]))
        .unwrap();
    let mut got = s.grants().unwrap();
    got.sort_by(|a, b| (&a.role, &a.resource).cmp(&(&b.role, &b.resource)));
    assert_eq!(
        got,
        vec![
            grant("app", "acme/orders", &["consume", "produce"]),
            grant("app2", "acme/orders", &["policy"]),
            grant("ops", T, &["admin"]),
        ],
    );
    s.delete_grant("app", "acme/orders").unwrap();
    s.delete_grant("nobody", "acme/orders").unwrap();
    assert_eq!(s.grants().unwrap().len(), 2);
    reopened(engine, dir.path(), s, |again| {
        assert_eq!(again.grants().unwrap().len(), 2, "durable");
    });
}

pub fn check_retention_policies_are_put_replaced_deleted_and_survive_reopen(engine: &dyn Engine) {
    let rec = |target: &str, age: Option<u64>, size: Option<u64>| RetentionRecord {
        target: target.into(),
        max_age_ms: age,
        max_size_bytes: size,
        backlog_quota_bytes: size.map(|s| s * 2),
        quota_action: if age.is_some() {
            QuotaAction::DropOldest
        } else {
            QuotaAction::Refuse
        },
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let s = engine.open(dir.path());
    assert!(s.retention_policies().unwrap().is_empty());
    s.put_retention(&rec("acme/orders", Some(1000), None))
        .unwrap();
    s.put_retention(&rec("acme/orders", None, Some(4096)))
        .unwrap();
    s.put_retention(&rec(T, Some(5), Some(6))).unwrap();
    s.put_retention(&rec("acme/gone", Some(1), None)).unwrap();
    s.delete_retention("acme/gone").unwrap();
    s.delete_retention("acme/never").unwrap();
    let mut got = s.retention_policies().unwrap();
    got.sort_by(|a, b| a.target.cmp(&b.target));
    let want = vec![
        rec("acme/orders", None, Some(4096)),
        rec(T, Some(5), Some(6)),
    ];
    assert_eq!(got, want);
    reopened(engine, dir.path(), s, |again| {
        let mut got = again.retention_policies().unwrap();
        got.sort_by(|a, b| a.target.cmp(&b.target));
        assert_eq!(got, want, "durable");
    });
}

pub fn check_a_subscription_state_reads_out_whole_and_restores_under_another_id(
    engine: &dyn Engine,
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let s = engine.open(dir.path());
    let s = s.as_ref();
    // Sub 7: a failure record of its own, a retry carrying its record in
    // its schedule entry, a held nack's plain schedule entry, three dead
    // letters; sub 8 has a record that must not come along.
    s.put_failures(&[
        (TierEntry::main(10).of(7), Some(record(1))),
        (TierEntry::main(10).of(8), Some(record(5))),
    ])
    .unwrap();
    s.move_messages(&TierMove {
        target_topic: RETRY.into(),
        subscription: sub(),
        items: vec![MoveItem {
            from: TierEntry::main(11).of(7),
            from_schedule: None,
            payload: b"r".to_vec(),
            target_entry_id: 0,
            failures: record(2),
            arrival: Arrival::Retry { due_ms: 5_000 },
            source: None,
        }],
    })
    .unwrap();
    let held = ScheduleKey {
        due_ms: 6_000,
        message: TierEntry::main(10).of(7),
    };
    s.put_schedule(&[(held, true)]).unwrap();
    three_dead_letters(s);
    s.restore_producer_sequences(T, &[("p".into(), 41), ("q".into(), 7)])
        .unwrap();

    let state = s.subscription_state(7).unwrap();
    assert_eq!(state.failures, vec![(TierEntry::main(10), record(1))]);
    let mut schedule = state.schedule.clone();
    schedule.sort_by_key(|(due, ..)| *due);
    assert_eq!(
        schedule,
        vec![
            (5_000, TierEntry::retry(0), Some(record(2))),
            (6_000, TierEntry::main(10), None)
        ]
    );
    assert_eq!(state.dead_letters.len(), 3);

    // Restored into another store as subscription 99.
    let other_dir = tempfile::tempdir().expect("a temporary directory");
    let other = engine.open(other_dir.path());
    other.restore_subscription_state(99, &state).unwrap();
    other
        .restore_producer_sequences(T, &s.producer_sequences(T).unwrap())
        .unwrap();
    let back = other.subscription_state(99).unwrap();
    let mut back_schedule = back.schedule.clone();
    back_schedule.sort_by_key(|(due, ..)| *due);
    assert_eq!(back.failures, state.failures);
    assert_eq!(back_schedule, schedule);
    assert_eq!(back.dead_letters, state.dead_letters);
    assert_eq!(
        other
            .failure(TierEntry::retry(0).of(99), Some(5_000))
            .unwrap(),
        Some(record(2)),
        "the retry's record rides in its schedule entry again"
    );
    assert_eq!(other.count_dead_letters(99).unwrap(), 3);
    let mut seqs = other.producer_sequences(T).unwrap();
    seqs.sort();
    assert_eq!(seqs, vec![("p".into(), 41), ("q".into(), 7)]);
    assert!(other.subscription_state(7).unwrap() == SubscriptionState::default());
}

/// One `#[test]` per contract check for an engine: `$engine` is an
/// expression giving a [`testing::contract::Engine`](crate::testing::contract::Engine),
/// evaluated once per test. Expand it in a module of its own per engine.
#[macro_export]
macro_rules! storage_contract {
    ($engine:expr) => {
        $crate::storage_contract!(@store $engine;
            check_read_many_answers_as_read_one_does_in_the_order_asked,
            check_logs_append_read_trim_and_never_reuse_ids,
            check_retry_moves_keep_the_failure_record_in_the_schedule_entry,
            check_failure_records_read_together_answer_as_one_by_one,
            check_failure_heads_are_the_records_counts_and_holds,
            check_held_heads_due_are_the_holds_ending_in_range,
            check_dead_letter_moves_list_page_and_remove,
            check_the_schedule_is_a_time_index_paged_in_key_order,
            check_dead_letters_return_to_the_retry_tier_all_or_nothing,
            check_edits_and_replay_intents_are_kept,
            check_replay_jobs_are_stored_updated_and_removed,
            check_partitioned_metadata_is_put_listed_raised_and_deleted,
            check_held_messages_keep_their_records_with_their_schedule_entries,
        );
        $crate::storage_contract!(@engine $engine;
            check_the_inventory_describes_the_store_and_the_manifest_reads_back,
            check_grants_are_kept_per_role_and_resource_and_survive_reopen,
            check_retention_policies_are_put_replaced_deleted_and_survive_reopen,
            check_a_subscription_state_reads_out_whole_and_restores_under_another_id,
        );
    };
    (@store $engine:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                $crate::testing::contract::run(&$engine, $crate::testing::contract::$check);
            }
        )*
    };
    (@engine $engine:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                $crate::testing::contract::run_engine(&$engine, $crate::testing::contract::$check);
            }
        )*
    };
}
