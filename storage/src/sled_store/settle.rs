//! Letting sled's page cache evict what a full read of the store paged in
//! (after the background verify pass). sled 0.34 records each page access
//! in a queue of the page's cache shard (one of 256, by page id) and counts
//! a shard's accesses against its share of `cache_capacity` only once 64
//! of them have queued there: until then the pages they name stay in
//! memory whatever the capacity. A pass that reads each page once leaves
//! up to 63 such pages per shard, some 16 000 pages (hundreds of MB on a
//! store of millions of parked retries), in memory long after it ends. So
//! the pass keeps keys spread evenly over what it read (by bytes, so about
//! one per page or fewer), and once it is done reads [`MOST`] of them again
//! [`ROUNDS`] times: their pages (read in again if evicted meanwhile) fall
//! in every shard, those accesses fill every shard's queue, and each full
//! queue makes its shard evict down to its capacity. What stays is the
//! cache and the sampled pages. Only reads: nothing is written, and what
//! the pass reported is not touched.

use sled::{IVec, Tree};

/// Accesses a shard queues before sled counts them (its `MAX_QUEUE_ITEMS`).
pub(super) const ROUNDS: usize = 64;

/// Keys read again after a pass, over all trees: 8 times as many as sled
/// has shards, so that every shard holds some of their pages (page ids
/// are spread over the shards; with 2 048 pages a shard misses them all
/// with a chance of e^-8), and few enough that the rounds cost a small
/// part of the pass.
pub(super) const MOST: usize = 2048;

/// The first sample is taken after this many bytes (keys and values).
const FIRST_STRIDE: u64 = 4096;

/// Keys spread evenly over one tree's share of the pass: one every
/// `stride` bytes read, the stride doubled (and every other key dropped)
/// whenever `2 * MOST` are kept.
#[derive(Debug)]
pub(super) struct Tail {
    keys: Vec<IVec>,
    stride: u64,
    since: u64,
    /// Bytes read in all.
    bytes: u64,
}

impl Default for Tail {
    fn default() -> Self {
        Tail {
            keys: Vec::new(),
            stride: FIRST_STRIDE,
            since: 0,
            bytes: 0,
        }
    }
}

impl Tail {
    /// Counts one value read under `key`.
    pub(super) fn read(&mut self, key: &IVec, value_len: usize) {
        let n = (key.len() + value_len) as u64;
        self.bytes += n;
        self.since += n;
        if self.since < self.stride {
            return;
        }
        self.since = 0;
        if self.keys.len() == 2 * MOST {
            let mut i = 0;
            self.keys.retain(|_| {
                i += 1;
                i % 2 == 0
            });
            self.stride *= 2;
        }
        self.keys.push(key.clone());
    }
}

/// Reads the trees' sampled keys again [`ROUNDS`] times (at most [`MOST`]
/// keys, each tree's share as its share of the bytes read, evenly spread
/// over its samples), ending early once `stop()`. Returns the keys read
/// per round.
pub(super) fn reread(tails: Vec<(&Tree, Tail)>, stop: &dyn Fn() -> bool) -> usize {
    let bytes: u64 = tails.iter().map(|(_, t)| t.bytes).sum::<u64>().max(1);
    let keys: Vec<(&Tree, IVec)> = tails
        .into_iter()
        .flat_map(|(tree, t)| {
            let share = (MOST as u64 * t.bytes).div_ceil(bytes) as usize;
            let every = t.keys.len().div_ceil(share.max(1)).max(1);
            t.keys.into_iter().step_by(every).map(move |k| (tree, k))
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
