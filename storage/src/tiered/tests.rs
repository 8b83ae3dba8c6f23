//! The second tier on its own (sled and a segment log in a temp dir, a
//! local-directory object store): an offload moves every sealed segment
//! out and reads come back whole; a segment that is neither local nor
//! recorded offloaded refuses the store at the next open.

use super::*;
use crate::segments::LogSettings;
use std::time::Duration;

const T: &str = "persistent://public/default/t";

fn open(dir: &std::path::Path, root: &std::path::Path) -> (Arc<SledStorage>, Arc<SegmentLog>) {
    let sled = Arc::new(SledStorage::open(dir, 10, 1 << 20).unwrap());
    let settings = LogSettings {
        segment_entries: 10,
        max_bytes: 64 << 20,
        max_age: Duration::from_secs(3600),
    };
    let log = Arc::new(SegmentLog::open(dir, settings, true).unwrap());
    std::fs::create_dir_all(root).unwrap();
    (sled, log)
}

fn config(root: &std::path::Path) -> TieredConfig {
    TieredConfig {
        url: format!("file://{}", root.display()),
        block_bytes: 4096,
        cache_bytes: 8192,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_neither_local_nor_offloaded_refuses_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tier");
    let logged: HashSet<String> = [T.to_owned()].into();
    {
        let (sled, log) = open(dir.path(), &root);
        for first in (0..30).step_by(5) {
            let batch: Vec<Vec<u8>> = (first..first + 5)
                .map(|i| format!("entry {i} {}", "x".repeat(900)).into_bytes())
                .collect();
            log.append(T, first, &batch).unwrap();
        }
        let t = Tiered::open(config(&root), sled.clone(), log.clone(), &logged).unwrap();
        let done = t.offload_topic(T, true).await.unwrap();
        assert_eq!((done.segments, done.local_deleted), (3, 3));
        assert_eq!(t.remote(T).len(), 3);
        // Read back across objects, through a cache smaller than the data.
        let mut bytes = 0;
        let got = t.read(T, 3, 100, usize::MAX, &mut bytes).unwrap();
        assert_eq!(
            got.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (3..30).collect::<Vec<_>>()
        );
        assert!(got[10].1.starts_with(b"entry 13 "));
        let many = t.read_many(T, &[29, 0, 30]).unwrap();
        assert!(many[0].as_ref().unwrap().starts_with(b"entry 29 "));
        assert!(many[1].as_ref().unwrap().starts_with(b"entry 0 "));
        assert!(many[2].is_none());
        // The middle segment's state is lost: a hole between tiers.
        sled.remove_tiered(&state_key(T, 10)).unwrap();
        sled.flush().await.unwrap();
    }
    let (sled, log) = open(dir.path(), &root);
    let e = Tiered::open(config(&root), sled, log, &logged).unwrap_err();
    assert!(
        matches!(&e, StorageError::Corrupt(w) if w.contains("a segment is missing")),
        "{e}"
    );
}
