//! Contract checks of the metadata a store keeps beside the logs: replay
//! jobs and partitioned topics' records.

use super::T;
use crate::*;

pub fn check_replay_jobs_are_stored_updated_and_removed(s: &dyn Storage) {
    let mut job = ReplayJobRecord {
        id: 3,
        topic: T.into(),
        subscription: "s".into(),
        dead_letter_ids: vec![1, 2, 3],
        total: 3,
        cursor: 0,
        replayed: 0,
        rate_per_second: 10,
        order: ReplayOrder {
            target: ReplayTarget::RetryTier { due_ms: 0 },
            reset_count: true,
            edit: Some(MessageEdit {
                payload: Some(b"new".to_vec()),
                ..Default::default()
            }),
            by: "anonymous".into(),
        },
        created_ms: 1,
    };
    s.put_replay_job(&job).unwrap();
    // Progress is written without the ids; they stay as first stored.
    job.cursor = 2;
    let progress = ReplayJobRecord {
        dead_letter_ids: Vec::new(),
        ..job.clone()
    };
    s.put_replay_job(&progress).unwrap();
    assert_eq!(s.replay_jobs(true).unwrap(), vec![job.clone()]);
    assert_eq!(s.replay_jobs(false).unwrap(), vec![progress]);
    s.remove_replay_job(3).unwrap();
    assert!(s.replay_jobs(true).unwrap().is_empty());
    // A cancelled job's runner does not bring it back.
    s.put_replay_job(&job).unwrap();
    assert!(s.replay_jobs(false).unwrap().is_empty());
}

pub fn check_partitioned_metadata_is_put_listed_raised_and_deleted(s: &dyn Storage) {
    assert!(s.list_partitioned().unwrap().is_empty());
    let rec = |name: &str, partitions| PartitionedRecord {
        name: name.into(),
        partitions,
    };
    s.put_partitioned(&rec("persistent://a/b/orders", 4))
        .unwrap();
    s.put_partitioned(&rec("persistent://a/b/items", 2))
        .unwrap();
    s.put_partitioned(&rec("persistent://a/b/orders", 8))
        .unwrap();
    let mut got = s.list_partitioned().unwrap();
    got.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        got,
        vec![
            rec("persistent://a/b/items", 2),
            rec("persistent://a/b/orders", 8)
        ],
    );
    s.delete_partitioned("persistent://a/b/items").unwrap();
    assert_eq!(s.list_partitioned().unwrap().len(), 1);
}
