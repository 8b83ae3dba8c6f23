//! The [`Storage`] contract, checked against every engine: what dispatch
//! relies on must hold for sled and for the in-memory store alike.

use super::*;
use records::sample_history as record;

const T: &str = "persistent://public/default/t";
const RETRY: &str = "persistent://public/default/t-s-RETRY";
const DLQ: &str = "persistent://public/default/t-s-DLQ";

fn engines() -> Vec<(&'static str, Box<dyn Storage>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let sled = SledStorage::open(dir.path(), 16, 8 << 20).unwrap();
    vec![
        ("sled", Box::new(sled), Some(dir)),
        ("memory", Box::new(MemoryStorage::new()), None),
    ]
}

fn sub() -> SubscriptionRecord {
    SubscriptionRecord::new(7, T, "s", ricochet_proto::SubscriptionType::Shared, 0)
}

fn entries(n: usize, tag: &str) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{tag}{i}").into_bytes()).collect()
}

#[test]
fn logs_append_read_trim_and_never_reuse_ids() {
    for (name, s, _dir) in engines() {
        assert_eq!(s.entry_range(T).unwrap(), (0, 0), "{name}");
        s.append(T, 0, &entries(40, "a"), Some(("p", 39))).unwrap();
        assert_eq!(s.entry_range(T).unwrap(), (0, 40), "{name}");
        let got = s.read(T, 10, 5, usize::MAX).unwrap();
        assert_eq!(
            got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![10, 11, 12, 13, 14],
            "{name}"
        );
        assert_eq!(got[0].1, b"a10", "{name}");
        assert_eq!(
            s.read(T, 0, 100, 10).unwrap().len(),
            5,
            "{name}: byte bound"
        );
        assert_eq!(
            s.read_one(T, 39).unwrap().as_deref(),
            Some(&b"a39"[..]),
            "{name}"
        );
        assert_eq!(s.read_one(T, 40).unwrap(), None, "{name}");
        assert_eq!(
            s.producer_sequences(T).unwrap(),
            vec![("p".to_owned(), 39)],
            "{name}"
        );

        s.trim(T, 35).unwrap();
        let (first, next) = s.entry_range(T).unwrap();
        assert!(first <= 35 && first > 0, "{name}: trimmed to {first}");
        assert_eq!(next, 40, "{name}");
        assert_eq!(
            s.read_one(T, 36).unwrap().as_deref(),
            Some(&b"a36"[..]),
            "{name}"
        );

        // Removing the newest entries must not let their ids be handed out again.
        s.remove_entries(T, &[38, 39]).unwrap();
        assert_eq!(s.read_one(T, 39).unwrap(), None, "{name}");
        assert_eq!(s.entry_range(T).unwrap().1, 40, "{name}");
        let ids: Vec<u64> = s
            .read(T, 36, 100, usize::MAX)
            .unwrap()
            .iter()
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(ids, vec![36, 37], "{name}");
    }
}

/// A move into the retry tier writes no failure key of its own: the record
/// rides in the schedule entry, found with the due time; a later
/// `put_failures` overrides it; leaving the tier removes both.
#[test]
fn retry_moves_keep_the_failure_record_in_the_schedule_entry() {
    for (name, s, _dir) in engines() {
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
            }],
        };
        s.move_messages(&mv(from, None, 0, 5_000, 2)).unwrap();
        let first = TierEntry::retry(0).of(7);
        assert_eq!(
            s.failure(from, None).unwrap(),
            None,
            "{name}: the source's record is gone"
        );
        assert_eq!(
            s.failure(first, None).unwrap(),
            None,
            "{name}: not in the failures tree"
        );
        assert_eq!(
            s.failure(first, Some(4_999)).unwrap(),
            None,
            "{name}: wrong due time"
        );
        assert_eq!(
            s.failure(first, Some(5_000)).unwrap(),
            Some(record(2)),
            "{name}"
        );
        assert!(
            s.failures_of(7, TierId::Retry).unwrap().is_empty(),
            "{name}"
        );
        assert_eq!(
            s.read_one(RETRY, 0).unwrap().as_deref(),
            Some(&b"m"[..]),
            "{name}"
        );
        let due = s.scheduled(None, u64::MAX, 10).unwrap();
        assert_eq!(due.len(), 1, "{name}");
        assert_eq!((due[0].due_ms, due[0].message), (5_000, first), "{name}");

        // An in-place redelivery writes the record the ordinary way: it wins.
        s.put_failures(&[(first, Some(record(3)))]).unwrap();
        assert_eq!(
            s.failure(first, Some(5_000)).unwrap(),
            Some(record(3)),
            "{name}"
        );

        // Moving on to a second retry entry drops the first's entry and record.
        s.move_messages(&mv(first, Some(due[0]), 1, 9_000, 4))
            .unwrap();
        let second = TierEntry::retry(1).of(7);
        assert_eq!(s.failure(first, Some(5_000)).unwrap(), None, "{name}");
        assert_eq!(
            s.failure(second, Some(9_000)).unwrap(),
            Some(record(4)),
            "{name}"
        );
        let due = s.scheduled(None, u64::MAX, 10).unwrap();
        assert_eq!(due.len(), 1, "{name}");
        assert_eq!(due[0].message, second, "{name}");
        // The subscription record travels with the move.
        let subs = s.list_subscriptions(T).unwrap();
        assert_eq!(subs.len(), 1, "{name}");
    }
}

#[test]
fn dead_letter_moves_list_page_and_remove() {
    for (name, s, _dir) in engines() {
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
                }),
            })
            .collect();
        s.move_messages(&TierMove {
            target_topic: DLQ.into(),
            subscription: sub(),
            items,
        })
        .unwrap();
        assert_eq!(s.count_dead_letters(7).unwrap(), 3, "{name}");
        assert_eq!(s.count_dead_letters(8).unwrap(), 0, "{name}");
        let after_first: Vec<u64> = s
            .dead_letters(7, Some(0))
            .unwrap()
            .iter()
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(after_first, vec![1, 2], "{name}");
        assert_eq!(
            s.dead_letters(7, None).unwrap()[2].1.failures,
            record(2),
            "{name}"
        );
        s.remove_dead_letters(7, &[1]).unwrap();
        s.remove_entries(DLQ, &[1]).unwrap();
        assert_eq!(s.count_dead_letters(7).unwrap(), 2, "{name}");
        assert_eq!(s.read_one(DLQ, 1).unwrap(), None, "{name}");
        assert_eq!(
            s.read_one(DLQ, 2).unwrap().as_deref(),
            Some(&b"d2"[..]),
            "{name}"
        );
        // Deleting the subscription takes its dead letters with it.
        s.delete_subscription(&sub()).unwrap();
        assert_eq!(s.count_dead_letters(7).unwrap(), 0, "{name}");
    }
}

#[test]
fn the_schedule_is_a_time_index_paged_in_key_order() {
    for (name, s, _dir) in engines() {
        let key = |due_ms, entry| ScheduleKey {
            due_ms,
            message: TierEntry::retry(entry).of(7),
        };
        let keys = [key(30, 1), key(10, 2), key(20, 3), key(20, 4)];
        s.put_schedule(&keys.iter().map(|k| (*k, true)).collect::<Vec<_>>())
            .unwrap();
        let page = s.scheduled(None, 25, 2).unwrap();
        assert_eq!(page, vec![key(10, 2), key(20, 3)], "{name}");
        let rest = s.scheduled(Some(page[1]), 25, 10).unwrap();
        assert_eq!(
            rest,
            vec![key(20, 4)],
            "{name}: up to the window's end only"
        );
        s.put_schedule(&[(key(10, 2), false)]).unwrap();
        assert_eq!(s.scheduled(None, u64::MAX, 10).unwrap().len(), 3, "{name}");
    }
}

/// What the manifest needs from an engine: an identity written into the
/// store, an inventory of what it holds, and the manifest kept beside it.
#[tokio::test]
async fn the_inventory_describes_the_store_and_the_manifest_reads_back() {
    for (name, s, dir) in engines() {
        let empty = s.inventory(true).unwrap();
        assert_eq!(empty.store_id, None, "{name}");
        assert!(!empty.has_data && empty.topics.is_empty(), "{name}");
        assert_eq!((empty.dead_letters, empty.scheduled), (Some(0), Some(0)));
        s.set_store_id("abc").unwrap();
        let id_only = s.inventory(false).unwrap();
        assert_eq!(id_only.store_id.as_deref(), Some("abc"), "{name}");
        assert!(!id_only.has_data, "{name}: the id alone is no data");
        assert_eq!((id_only.dead_letters, id_only.scheduled), (None, None));

        s.put_topic(&TopicRecord {
            name: T.into(),
            created_ms: 1,
            kind: TopicKind::Normal,
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
        assert!(inv.has_data, "{name}");
        let t = &inv.topics[T];
        assert_eq!(
            (t.kind, t.first, t.next),
            (TopicKind::Normal, 0, 40),
            "{name}"
        );
        assert_eq!(
            t.subscriptions.iter().collect::<Vec<_>>(),
            vec!["s"],
            "{name}"
        );
        let segments: Vec<u64> = if name == "sled" {
            vec![0, 1, 2]
        } else {
            vec![]
        };
        assert_eq!(t.segments, segments, "{name}: 16 entries per segment");
        assert_eq!(
            (inv.dead_letters, inv.scheduled),
            (Some(0), Some(1)),
            "{name}"
        );

        assert_eq!(s.load_manifest().unwrap(), None, "{name}");
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
        s.save_manifest(&m).await.unwrap();
        assert_eq!(s.load_manifest().unwrap(), Some(m), "{name}");
        if let Some(dir) = dir {
            // A damaged manifest file is refused, not read as missing.
            let path = dir.path().join(manifest::FILE_NAME);
            let mut bytes = std::fs::read(&path).unwrap();
            let last = bytes.len() - 3;
            bytes[last] ^= 1;
            std::fs::write(&path, bytes).unwrap();
            assert!(
                matches!(s.load_manifest(), Err(StorageError::Corrupt(_))),
                "{name}"
            );
        }
    }
}

#[tokio::test]
async fn grants_are_kept_per_role_and_resource_and_survive_reopen() {
    let grant = |role: &str, resource: &str, perms: &[&str]| GrantRecord {
        role: role.into(),
        resource: resource.into(),
        permissions: perms.iter().map(|p| p.to_string()).collect(),
    };
    for (name, s, dir) in engines() {
        assert!(s.grants().unwrap().is_empty(), "{name}");
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
            "{name}"
        );
        s.delete_grant("app", "acme/orders").unwrap();
        s.delete_grant("nobody", "acme/orders").unwrap();
        assert_eq!(s.grants().unwrap().len(), 2, "{name}");
        s.flush().await.unwrap();
        if let Some(dir) = dir {
            drop(s);
            let reopened = SledStorage::open(dir.path(), 16, 8 << 20).unwrap();
            assert_eq!(reopened.grants().unwrap().len(), 2, "{name}: durable");
            assert_eq!(reopened.verify().problem_count, 0, "{name}: grants verify");
        }
    }
}
