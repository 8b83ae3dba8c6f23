//! Retry-tier references in [`LogStorage`]: a retry move stores a
//! reference (and its index entry) when it can, every read of the tier
//! gives back the copy it stands for, copies written before references
//! (or carrying properties of their own) are read beside them, a
//! consumer-driven drop sees the lowest referenced entry, and a trim first
//! replaces references with copies.

use super::refs::{RetryRef, is_ref};
use super::*;
use prost::Message as _;
use records::sample_history as record;
use ricochet_proto::{Message, props};
use std::sync::Arc;

const T: &str = "persistent://public/default/t";
const RETRY: &str = "persistent://public/default/t-s-RETRY";

struct Fixture {
    store: LogStorage,
    sled: Arc<SledStorage>,
    _dir: tempfile::TempDir,
}

/// A store in `dir` with segments of `segment_entries` entries, and
/// `topic` with its retry tier `retry`.
fn store_with(
    dir: &tempfile::TempDir,
    segment_entries: u64,
    (topic, retry): (&str, &str),
) -> (LogStorage, Arc<SledStorage>) {
    let settings = segments::LogSettings {
        segment_entries,
        max_bytes: 64 << 20,
        max_age: std::time::Duration::from_secs(3600),
    };
    let sled = Arc::new(SledStorage::open(dir.path(), segment_entries, 8 << 20).unwrap());
    let store = LogStorage::with(
        sled.clone(),
        segments::SegmentLog::open(dir.path(), settings, true).unwrap(),
    )
    .unwrap();
    for (name, kind) in [(topic, TopicKind::Normal), (retry, TopicKind::Retry)] {
        store
            .put_topic(&TopicRecord {
                name: name.into(),
                created_ms: 0,
                kind,
                replicas: 1,
                trimmed_below: 0,
            })
            .unwrap();
    }
    (store, sled)
}

/// `T` in the log (segments of 16 entries) with 48 messages `m0..m47`
/// and subscription `s` (id 7).
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let (store, sled) = store_with(&dir, 16, (T, RETRY));
    // One batch per segment.
    for first in [0, 16, 32] {
        let entries: Vec<Vec<u8>> = (first..first + 16)
            .map(|i| source(i).encode_to_vec())
            .collect();
        store.append(T, first, &entries, None).unwrap();
    }
    store
        .put_subscription(&SubscriptionRecord::new(
            7,
            T,
            "s",
            ricochet_proto::SubscriptionType::Shared,
            0,
        ))
        .unwrap();
    Fixture {
        store,
        sled,
        _dir: dir,
    }
}

fn source(i: u64) -> Message {
    Message {
        payload: format!("m{i}").into_bytes(),
        key: format!("k{i}"),
        properties: [("user".to_owned(), i.to_string())].into(),
        publish_time_ms: 1_000 + i,
        producer_name: "p".into(),
        sequence_id: i,
        ..Default::default()
    }
}

/// The copy of `T`'s entry `i` the actor builds for a retry (as
/// `subscription::tiers` does).
fn copy(i: u64, count: u32) -> Message {
    let mut m = source(i);
    m.properties.insert(props::REAL_TOPIC.into(), T.into());
    m.properties
        .insert(props::ORIGIN_MESSAGE_ID.into(), format!("{T}:{i}"));
    m.properties
        .insert(props::RECONSUME_TIMES.into(), count.to_string());
    m.properties
        .insert(props::DELAY_TIME.into(), "60000".into());
    m.deliver_at_ms = 70_000 + i;
    m
}

/// Moves `(from topic, entry, copy, source given?)` into retry entries
/// `first..`.
fn retry(f: &Fixture, first: u64, items: Vec<(TierEntry, Message, bool)>) {
    let from_topic = |e: TierEntry| if e.tier == TierId::Main { T } else { RETRY };
    let items = items
        .into_iter()
        .enumerate()
        .map(|(i, (from, m, source))| MoveItem {
            from: from.of(7),
            from_schedule: None,
            payload: m.encode_to_vec(),
            target_entry_id: first + i as u64,
            failures: record(1),
            arrival: Arrival::Retry { due_ms: 70_000 },
            source: source.then(|| (from_topic(from).to_owned(), from.entry_id)),
        })
        .collect();
    let mut sub = f.store.list_subscriptions(T).unwrap().remove(0);
    sub.main.mark_delete = 0;
    f.store
        .move_messages(&TierMove {
            target_topic: RETRY.into(),
            subscription: sub,
            items,
        })
        .unwrap();
}

fn raw(f: &Fixture, ids: &[u64]) -> Vec<Vec<u8>> {
    f.sled
        .read_many(RETRY, ids)
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect()
}

fn read(f: &Fixture, ids: &[u64]) -> Vec<Message> {
    f.store
        .read_many(RETRY, ids)
        .unwrap()
        .into_iter()
        .map(|b| Message::decode(b.unwrap().as_slice()).unwrap())
        .collect()
}

/// Retry entry `entry` as the actor retries it a second time: read back
/// (resolved), `RECONSUMETIMES` 2, due at 99 000 + `entry`.
fn retried_again(f: &Fixture, entry: u64) -> Message {
    let mut m = read(f, &[entry]).remove(0);
    m.properties
        .insert(props::RECONSUME_TIMES.into(), "2".into());
    m.deliver_at_ms = 99_000 + entry;
    m
}

#[test]
fn a_retry_stores_a_reference_that_reads_back_as_the_copy() {
    let f = fixture();
    retry(
        &f,
        0,
        (0..3)
            .map(|i| (TierEntry::main(i), copy(i, 1), true))
            .collect(),
    );
    let stored = raw(&f, &[0, 1, 2]);
    assert!(stored.iter().all(|b| is_ref(b)), "{stored:?}");
    assert!(stored[0].len() < copy(0, 1).encoded_len());
    let want: Vec<Message> = (0..3).map(|i| copy(i, 1)).collect();
    assert_eq!(read(&f, &[0, 1, 2]), want);
    // Every read path resolves: a range, one entry.
    let range: Vec<Message> = f
        .store
        .read(RETRY, 0, 10, 1 << 20)
        .unwrap()
        .into_iter()
        .map(|(_, b)| Message::decode(b.as_slice()).unwrap())
        .collect();
    assert_eq!(range, want);
    let one = f.store.read_one(RETRY, 1).unwrap().unwrap();
    assert_eq!(Message::decode(one.as_slice()).unwrap(), want[1]);
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(0));
    let report = f.sled.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
}

#[test]
fn a_retry_of_a_retry_refers_to_the_topic_entry() {
    let f = fixture();
    retry(&f, 0, vec![(TierEntry::main(5), copy(5, 1), true)]);
    // The actor reads retry entry 0 (resolved) and retries it again.
    let again = retried_again(&f, 0);
    retry(&f, 1, vec![(TierEntry::retry(0), again.clone(), true)]);
    let r = RetryRef::parse(&raw(&f, &[1])[0]).unwrap().unwrap();
    assert_eq!((r.source_topic.as_str(), r.source_entry), (T, 5));
    assert_eq!(read(&f, &[1]), vec![again]);
}

/// One move of several retries of retries, out of entry order, beside a
/// first retry: each refers to its own topic entry, and one whose first
/// retry was kept as a copy stays a copy.
#[test]
fn a_move_of_many_retries_of_retries_refers_each_to_its_own_entry() {
    let f = fixture();
    let mut own = copy(6, 1);
    own.properties.insert("why".into(), "mine".into());
    retry(
        &f,
        0,
        vec![
            (TierEntry::main(5), copy(5, 1), true),
            (TierEntry::main(6), own, true),
            (TierEntry::main(7), copy(7, 1), true),
        ],
    );
    let again = |entry| retried_again(&f, entry);
    let (a0, a1, a2) = (again(0), again(1), again(2));
    retry(
        &f,
        3,
        vec![
            (TierEntry::retry(2), a2.clone(), true),
            (TierEntry::main(8), copy(8, 1), true),
            (TierEntry::retry(0), a0.clone(), true),
            (TierEntry::retry(1), a1.clone(), true),
        ],
    );
    let stored = raw(&f, &[3, 4, 5, 6]);
    let source = |b: &[u8]| RetryRef::parse(b).unwrap().map(|r| r.source_entry);
    assert_eq!(
        stored.iter().map(|b| source(b)).collect::<Vec<_>>(),
        [Some(7), Some(8), Some(5), None]
    );
    assert_eq!(read(&f, &[3, 4, 5, 6]), vec![a2, copy(8, 1), a0, a1]);
}

#[test]
fn copies_old_and_with_properties_of_their_own_read_beside_references() {
    let f = fixture();
    let mut own = copy(1, 1);
    own.properties.insert("why".into(), "mine".into());
    retry(
        &f,
        0,
        vec![
            // Written before references existed: no source.
            (TierEntry::main(0), copy(0, 1), false),
            // A property the reference cannot carry: stays a copy.
            (TierEntry::main(1), own.clone(), true),
            (TierEntry::main(2), copy(2, 1), true),
        ],
    );
    let stored = raw(&f, &[0, 1, 2]);
    assert_eq!(
        stored.iter().map(|b| is_ref(b)).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(read(&f, &[0, 1, 2]), vec![copy(0, 1), own, copy(2, 1)]);
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(2));
}

#[test]
fn a_trim_replaces_references_into_dropped_segments_with_copies() {
    let f = fixture();
    retry(
        &f,
        0,
        [3, 20, 40]
            .into_iter()
            .map(|i| (TierEntry::main(i), copy(i, 1), true))
            .collect(),
    );
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(3));
    // Segments 0 and 1 (entries 0..32) go.
    f.store.trim(T, 32).unwrap();
    assert_eq!(f.store.entry_range(T).unwrap().0, 32);
    let stored = raw(&f, &[0, 1, 2]);
    assert_eq!(
        stored.iter().map(|b| is_ref(b)).collect::<Vec<_>>(),
        [false, false, true],
        "only the references into dropped segments became copies"
    );
    assert_eq!(
        read(&f, &[0, 1, 2]),
        vec![copy(3, 1), copy(20, 1), copy(40, 1)]
    );
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(40));
    let report = f.sled.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
}

#[test]
fn index_entries_of_references_gone_from_the_tier_are_dropped() {
    let f = fixture();
    retry(
        &f,
        0,
        (0..16)
            .map(|i| (TierEntry::main(i), copy(i, 1), true))
            .collect(),
    );
    retry(&f, 16, vec![(TierEntry::main(30), copy(30, 1), true)]);
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(0));
    // The tier's first segment (entries 0..16) consumed and dropped.
    f.store.trim(RETRY, 16).unwrap();
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(30));
    let pairs = |f: &Fixture| -> Vec<(u64, u64)> {
        f.sled
            .references_below(7, u64::MAX)
            .unwrap()
            .iter()
            .map(|i| (i.source, i.target))
            .collect()
    };
    assert_eq!(pairs(&f), vec![(30, 16)]);
    // A deleted subscription leaves no index behind.
    let sub = f.store.list_subscriptions(T).unwrap().remove(0);
    f.store.delete_subscription(&sub).unwrap();
    assert_eq!(pairs(&f), vec![]);
}

#[test]
fn a_move_of_references_is_one_frame_and_one_index_key_trimmed_in_part() {
    let f = fixture();
    // Ten retries of entries 10..20 in one move (retry entries 0..10).
    retry(
        &f,
        0,
        (10..20)
            .map(|i| (TierEntry::main(i), copy(i, 1), true))
            .collect(),
    );
    assert_eq!(
        f.sled.stored_keys(RETRY),
        (1, 1),
        "one frame, one index key"
    );
    assert!(
        raw(&f, &(0..10).collect::<Vec<_>>())
            .iter()
            .all(|e| is_ref(e))
    );
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(10));
    // Retention drops entries 0..16: the references to 10..16 become
    // copies, the group keeps the other four under its new lowest.
    f.store.trim(T, 16).unwrap();
    let stored = raw(&f, &(0..10).collect::<Vec<_>>());
    assert!(stored[..6].iter().all(|e| !is_ref(e)));
    assert!(stored[6..].iter().all(|e| is_ref(e)));
    assert_eq!(f.sled.stored_keys(RETRY), (1, 1));
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(16));
    let want: Vec<Message> = (10..20).map(|i| copy(i, 1)).collect();
    assert_eq!(read(&f, &(0..10).collect::<Vec<_>>()), want);
    // The rest once their source goes too.
    f.store.trim(T, 32).unwrap();
    assert_eq!(f.sled.stored_keys(RETRY), (1, 0));
    assert_eq!(f.store.lowest_reference(T).unwrap(), None);
    assert_eq!(read(&f, &(0..10).collect::<Vec<_>>()), want);
    let report = f.sled.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
}

/// What a parked `reconsume_later` costs in sled, as the live bench parks
/// them: 1 024 messages of 100 B retried in one move for 1 h, due a few
/// ms apart, each with the broker's record of one attempt. Prints the
/// bytes per parked retry of the tier's frames, the reference index and
/// the schedule's chunks; the frames hold a few bytes per reference
/// (`sled_store::ref_frame`), not the reference's ~60-byte record.
#[test]
fn a_parked_reconsume_later_costs_a_few_bytes_of_tier_frame() {
    const LIVE: &str = "persistent://public/default/live";
    const LIVE_RETRY: &str = "persistent://public/default/live-s-RETRY";
    const N: u64 = 1024;
    let dir = tempfile::tempdir().unwrap();
    let (store, sled) = store_with(&dir, 16_384, (LIVE, LIVE_RETRY));
    let message = |i: u64| Message {
        payload: vec![b'x'; 100],
        publish_time_ms: 1_765_000_000_000,
        producer_name: "bench-0".into(),
        sequence_id: i,
        ..Default::default()
    };
    let entries: Vec<Vec<u8>> = (0..N).map(|i| message(i).encode_to_vec()).collect();
    store.append(LIVE, 0, &entries, None).unwrap();
    store
        .put_subscription(&SubscriptionRecord::new(
            7,
            LIVE,
            "s",
            ricochet_proto::SubscriptionType::Shared,
            0,
        ))
        .unwrap();
    let now = 1_765_000_000_000u64;
    let copies: Vec<Message> = (0..N)
        .map(|i| {
            let mut m = message(i);
            m.properties.insert(props::REAL_TOPIC.into(), LIVE.into());
            m.properties
                .insert(props::ORIGIN_MESSAGE_ID.into(), format!("{LIVE}:{i}"));
            m.properties
                .insert(props::RECONSUME_TIMES.into(), "1".into());
            m.properties
                .insert(props::DELAY_TIME.into(), "3600000".into());
            m.deliver_at_ms = now + 3_600_000 + i / 8;
            m
        })
        .collect();
    let items = copies
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut failures = FailureRecord::default();
            failures.push(AttemptRecord {
                time_ms: now + i as u64 / 8,
                delivery_count: 1,
                consumer: "bench".into(),
                reason: ricochet_policy::FailureReason::Nack,
                detail: String::new(),
            });
            MoveItem {
                from: TierEntry::main(i as u64).of(7),
                from_schedule: None,
                payload: m.encode_to_vec(),
                target_entry_id: i as u64,
                failures,
                arrival: Arrival::Retry {
                    due_ms: m.deliver_at_ms,
                },
                source: Some((LIVE.to_owned(), i as u64)),
            }
        })
        .collect();
    let sub = store.list_subscriptions(LIVE).unwrap().remove(0);
    store
        .move_messages(&TierMove {
            target_topic: LIVE_RETRY.into(),
            subscription: sub,
            items,
        })
        .unwrap();
    let (frames, index, chunks) = sled.stored_bytes(LIVE_RETRY);
    let per = |b: usize| b as f64 / N as f64;
    println!(
        "per parked reconsume_later: tier frames {:.1} B, reference index {:.1} B, schedule chunks {:.1} B",
        per(frames),
        per(index),
        per(chunks)
    );
    // Every entry still reads back as the copy it stands for.
    let ids: Vec<u64> = (0..N).collect();
    let back: Vec<Message> = store
        .read_many(LIVE_RETRY, &ids)
        .unwrap()
        .into_iter()
        .map(|b| Message::decode(b.unwrap().as_slice()).unwrap())
        .collect();
    assert_eq!(back, copies);
    assert!(
        per(frames) < 8.0,
        "{:.1} B of frame per reference",
        per(frames)
    );
    assert!(
        per(index) < 4.0,
        "{:.1} B of index per reference",
        per(index)
    );
    let report = sled.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
    // The same in the layouts before, for comparison.
    sled.rewrite_in_old_layouts(LIVE_RETRY);
    let (frames, index, chunks) = sled.stored_bytes(LIVE_RETRY);
    println!(
        "the same in the layouts before: tier frames {:.1} B, reference index {:.1} B, schedule chunks {:.1} B",
        per(frames),
        per(index),
        per(chunks)
    );
}

/// A store written before the compact layouts (plain frames of full
/// reference records, 16-byte index pairs, fixed chunk headers) reads,
/// takes new retries and trims as before: the upgrade needs no
/// conversion, and old and new layouts stand side by side.
#[test]
fn a_store_in_the_layouts_before_reads_grows_and_trims_as_before() {
    let f = fixture();
    let mut own = copy(9, 1);
    own.properties.insert("why".into(), "mine".into());
    let mut items: Vec<(TierEntry, Message, bool)> = (10..20)
        .map(|i| (TierEntry::main(i), copy(i, 1), true))
        .collect();
    items.push((TierEntry::main(9), own.clone(), true));
    retry(&f, 0, items);
    let before = f.sled.stored_bytes(RETRY);
    f.sled.rewrite_in_old_layouts(RETRY);
    let old = f.sled.stored_bytes(RETRY);
    // Plain references take some 60 bytes more each, fixed pairs 14 more.
    assert!(old.0 > before.0 + 10 * 40, "{old:?} against {before:?}");
    assert!(old.1 > before.1 + 10 * 10, "{old:?} against {before:?}");
    assert!(old.2 > before.2 + 11 * 20, "{old:?} against {before:?}");
    let mut want: Vec<Message> = (10..20).map(|i| copy(i, 1)).collect();
    want.push(own);
    let ids: Vec<u64> = (0..11).collect();
    assert_eq!(read(&f, &ids), want);
    assert!(raw(&f, &ids[..10]).iter().all(|e| is_ref(e)));
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(10));
    let report = f.sled.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
    // New retries land in the new layouts beside the old ones.
    retry(&f, 11, vec![(TierEntry::main(3), copy(3, 1), true)]);
    want.push(copy(3, 1));
    let ids: Vec<u64> = (0..12).collect();
    assert_eq!(read(&f, &ids), want);
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(3));
    // Retention drops entries 0..16: references into them become copies,
    // in old and new frames alike; the old group keeps its other four.
    f.store.trim(T, 16).unwrap();
    let stored = raw(&f, &ids);
    assert_eq!(
        stored.iter().map(|e| is_ref(e)).collect::<Vec<_>>(),
        [
            false, false, false, false, false, false, true, true, true, true, false, false
        ]
    );
    assert_eq!(read(&f, &ids), want);
    assert_eq!(f.store.lowest_reference(T).unwrap(), Some(16));
    let pairs: Vec<(u64, u64)> = f
        .sled
        .references_below(7, u64::MAX)
        .unwrap()
        .iter()
        .map(|i| (i.source, i.target))
        .collect();
    assert_eq!(pairs, vec![(16, 6), (17, 7), (18, 8), (19, 9)]);
    let report = f.sled.verify();
    assert_eq!(report.problem_count, 0, "{:?}", report.problems);
}
