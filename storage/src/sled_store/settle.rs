//! Letting sled's page cache evict what a full read of the store paged in
//! (after the background verify pass). sled 0.34 records each page access
//! in a queue of the page's cache shard (one of 256, by page id) and counts
//! a shard's accesses against its share of `cache_capacity` only once 64
//! of them have queued there: until then the pages they name stay in
//! memory whatever the capacity. A pass that reads each page once leaves
//! up to 63 such pages per shard, some 16 000 pages (hundreds of MB on a
//! store of millions of parked retries), in memory long after it ends. So
//! the pass keeps a sample of the keys it read last in each tree (their
//! pages are still in memory), and once it is done reads them again
//! [`ROUNDS`] times: those accesses fill the queues of the shards their
//! pages fall in, and each full queue makes its shard evict down to its
//! capacity. Only reads: nothing is written, and what the pass reported is
//! not touched. (Keys spread over the whole pass instead, re-read in part
//! from disk, freed less at 5 000 000 parked retries: 201 MB of RSS left
//! against 135 MB.)

use sled::{IVec, Tree};
use std::collections::VecDeque;

/// Accesses a shard queues before sled counts them (its `MAX_QUEUE_ITEMS`).
pub(super) const ROUNDS: usize = 64;

/// A key is sampled once every this many bytes read from a tree (keys and
/// values): a few keys per page of sled's, not one for every small value.
const SAMPLE_EVERY_BYTES: u64 = 4096;

/// Samples kept per tree (the last ones read).
const PER_TREE: usize = 1024;

/// Samples read again after a pass, over all trees (each tree's share in
/// proportion to its samples): 16 per shard of sled's, and few enough
/// that the rounds cost a small part of the pass.
pub(super) const MOST: usize = 4096;

/// The keys one tree's share of the pass read last, one every
/// [`SAMPLE_EVERY_BYTES`].
#[derive(Debug, Default)]
pub(super) struct Tail {
    keys: VecDeque<IVec>,
    since: u64,
}

impl Tail {
    /// Counts one value read under `key`.
    pub(super) fn read(&mut self, key: &IVec, value_len: usize) {
        self.since += (key.len() + value_len) as u64;
        if self.since < SAMPLE_EVERY_BYTES {
            return;
        }
        self.since = 0;
        if self.keys.len() == PER_TREE {
            self.keys.pop_front();
        }
        self.keys.push_back(key.clone());
    }
}

/// Reads each tree's sampled keys again [`ROUNDS`] times (at most [`MOST`]
/// keys, the last ones of each tree), ending early once `stop()`. Returns
/// the keys read per round.
pub(super) fn reread(tails: Vec<(&Tree, Tail)>, stop: &dyn Fn() -> bool) -> usize {
    let total: usize = tails.iter().map(|(_, t)| t.keys.len()).sum();
    let keep = |n: usize| {
        if total <= MOST { n } else { n * MOST / total }
    };
    let keys: Vec<(&Tree, IVec)> = tails
        .into_iter()
        .flat_map(|(tree, t)| {
            let n = keep(t.keys.len());
            let skip = t.keys.len() - n;
            t.keys.into_iter().skip(skip).map(move |k| (tree, k))
        })
        .collect();
    for _ in 0..ROUNDS {
        if stop() {
            break;
        }
        for (tree, k) in &keys {
            // A key removed since is fine: the read still walks its pages.
            let _ = tree.get(k);
        }
    }
    keys.len()
}
