//! The memory budget of tiered reads: blocks of objects read back from the
//! object store, least recently used evicted first once their bytes exceed
//! the budget, and the parsed footers (sparse indexes) of recently read
//! objects.

use super::object::Index;
use lru::LruCache;
use std::num::NonZeroUsize;
use std::sync::Arc;

/// Footers kept parsed (each a few KiB).
const INDEXES: usize = 256;

/// Recently read blocks and footers.
pub struct BlockCache {
    blocks: LruCache<(Arc<str>, u64), Arc<Vec<u8>>>,
    indexes: LruCache<Arc<str>, Arc<Index>>,
    bytes: u64,
    budget: u64,
}

impl BlockCache {
    pub fn new(budget: u64) -> Self {
        Self {
            blocks: LruCache::unbounded(),
            indexes: LruCache::new(NonZeroUsize::new(INDEXES).unwrap_or(NonZeroUsize::MIN)),
            bytes: 0,
            budget,
        }
    }

    pub fn block(&mut self, key: &Arc<str>, n: u64) -> Option<Arc<Vec<u8>>> {
        self.blocks.get(&(key.clone(), n)).cloned()
    }

    pub fn put_block(&mut self, key: Arc<str>, n: u64, bytes: Arc<Vec<u8>>) {
        self.bytes += bytes.len() as u64;
        if let Some(old) = self.blocks.put((key, n), bytes) {
            self.bytes -= old.len() as u64;
        }
        while self.bytes > self.budget {
            let Some((_, b)) = self.blocks.pop_lru() else {
                break;
            };
            self.bytes -= b.len() as u64;
        }
    }

    pub fn index(&mut self, key: &Arc<str>) -> Option<Arc<Index>> {
        self.indexes.get(key).cloned()
    }

    pub fn put_index(&mut self, key: Arc<str>, index: Arc<Index>) {
        self.indexes.put(key, index);
    }

    /// Bytes of blocks held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_stay_within_the_budget_least_recent_first() {
        let mut c = BlockCache::new(250);
        let k: Arc<str> = Arc::from("a");
        for n in 0..3 {
            c.put_block(k.clone(), n, Arc::new(vec![0u8; 100]));
        }
        // 300 bytes over a budget of 250: block 0 went.
        assert_eq!(c.bytes(), 200);
        assert!(c.block(&k, 0).is_none());
        // Block 1 used, then a fourth block: block 2 goes, 1 stays.
        assert!(c.block(&k, 1).is_some());
        c.put_block(k.clone(), 3, Arc::new(vec![0u8; 100]));
        assert!(c.block(&k, 1).is_some());
        assert!(c.block(&k, 2).is_none());
        assert!(c.bytes() <= 250);
    }
}
