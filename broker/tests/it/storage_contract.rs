//! The storage contract suite that `ricochet-storage` exports (feature
//! `testing`), run from this crate over the engine the broker opens at
//! start: sled and the segment-file log opened by `LogStorage::open` (the
//! upgrade pass included) with the broker's settings, segments of 16
//! entries. It shows an engine outside the storage crate runs the same
//! checks.

use std::path::Path;
use std::sync::Arc;

use ricochet_broker::BrokerConfig;
use ricochet_storage::testing::contract::{Engine, REOPEN_WAIT, TOPIC};
use ricochet_storage::{LogStorage, SledStorage, Storage};

/// The broker's engine, as `Broker::open` builds it (without tiering).
struct BrokerEngine;

impl BrokerEngine {
    fn config() -> BrokerConfig {
        BrokerConfig {
            segment_entries: 16,
            ..BrokerConfig::default()
        }
    }
}

impl Engine for BrokerEngine {
    fn open(&self, dir: &Path) -> Box<dyn Storage> {
        let cfg = Self::config();
        let sled = Arc::new(
            SledStorage::open_waiting(dir, cfg.segment_entries, cfg.cache_capacity, REOPEN_WAIT)
                .expect("open the store"),
        );
        let log = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(LogStorage::open(sled, dir, cfg.log_settings(), None))
            .unwrap();
        log.route_to_log(TOPIC);
        Box::new(log)
    }

    fn segments_of_one_batch(&self) -> Option<Vec<u64>> {
        // One batch is one record in one segment file.
        Some(vec![0])
    }

    fn verify(&self, dir: &Path) -> Option<u64> {
        let cfg = Self::config();
        let sled =
            SledStorage::open_waiting(dir, cfg.segment_entries, cfg.cache_capacity, REOPEN_WAIT)
                .unwrap();
        Some(sled.verify().problem_count)
    }
}

ricochet_storage::storage_contract!(BrokerEngine);
