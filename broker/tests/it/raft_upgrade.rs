//! A replicated partition whose Raft logs are in the format of earlier
//! brokers (a sled tree `log/<group>` in `<dir>/raft`: key the index,
//! big-endian; value the CBOR openraft entry) comes back after the upgrade
//! to segment-file logs: every node converts its log when the group opens,
//! keeps its vote and every entry, a leader is elected, and new publishes
//! commit on all three.

use crate::raft::cluster::{Cluster, TOPIC, batch, publish_within, stored};
use ricochet_replication::log_store::{LogStore, group_log_dir};
use ricochet_replication::{NodeSettings, RaftDb, open_db};
use std::path::Path;
use std::time::{Duration, Instant};

/// The node's Raft database once the killed node's runtime let go of it.
fn open_when_free(dir: &Path) -> RaftDb {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match open_db(dir, &NodeSettings::default()) {
            Ok(db) => return db,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("raft db of {}: {e}", dir.display()),
        }
    }
}

/// Rewrites the group's log on the node in `dir` as an earlier broker kept
/// it (the sled tree), and removes the segment files; returns the last
/// index.
fn back_to_sled(dir: &Path) -> u64 {
    let db = open_when_free(dir);
    let log = LogStore::open(&db, TOPIC, &NodeSettings::default()).expect("log");
    let entries = log.raw_entries(0, u64::MAX).expect("entries");
    drop(log);
    let (first, last) = match (entries.first(), entries.last()) {
        (Some(f), Some(l)) => (f.0, l.0),
        _ => panic!("no log in {}", dir.display()),
    };
    assert_eq!(entries.len() as u64, last + 1 - first, "a gap");
    let tree = db.open_tree(format!("log/{TOPIC}")).expect("tree");
    for (index, bytes) in &entries {
        tree.insert(index.to_be_bytes(), bytes.as_slice())
            .expect("insert");
    }
    db.flush().expect("flush");
    std::fs::remove_dir_all(group_log_dir(db.log_dir(), TOPIC)).expect("remove the segments");
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_raft_logs_are_sled_trees_comes_back_after_the_upgrade() {
    let mut c = Cluster::start(false).await;
    let leader = c.leader().await;
    c.create_topic(leader).await;
    for b in 0..20 {
        let part = c.node(leader).part();
        let r = publish_within(part, batch("p", 1 + b * 5, 5), Duration::from_secs(5)).await;
        assert!(matches!(r, Some(Ok(_))), "batch {b}: {r:?}");
    }
    for id in 1..=3 {
        c.node_mut(id).kill();
    }
    let mut lasts = Vec::new();
    for id in 1..=3 {
        lasts.push(back_to_sled(&c.dir(id)));
    }
    // The leader holds every batch; a follower may be behind (a batch
    // needs a majority only).
    assert!(lasts.iter().any(|l| *l > 20), "logs: {lasts:?}");
    for id in 1..=3 {
        c.restart(id).await;
    }
    for id in 1..=3 {
        let segments = std::fs::read_dir(group_log_dir(&c.dir(id).join("raft-log"), TOPIC))
            .expect("converted log")
            .count();
        assert!(segments >= 1, "node {id} has no segment file");
    }
    let leader = c.leader().await;
    for b in 20..25 {
        let part = c.node(leader).part();
        let r = publish_within(part, batch("p", 1 + b * 5, 5), Duration::from_secs(10)).await;
        assert!(
            matches!(r, Some(Ok(_))),
            "batch {b} after the upgrade: {r:?}"
        );
    }
    for id in 1..=3 {
        c.caught_up(id, leader).await;
        let seqs: Vec<u64> = stored(c.node(id).part().storage())
            .into_iter()
            .map(|(_, _, s)| s)
            .collect();
        assert_eq!(seqs, (1..=125).collect::<Vec<u64>>(), "node {id}");
        let last = c
            .node(id)
            .part()
            .node()
            .raft()
            .metrics()
            .borrow()
            .last_log_index;
        assert!(last > Some(lasts[(id - 1) as usize]), "node {id}: {last:?}");
    }
}
