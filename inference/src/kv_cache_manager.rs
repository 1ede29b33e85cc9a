//! Per-request KV-cache block tables, after vLLM V1's `KVCacheManager` (vllm/v1/core/kv_cache_manager.py).
//!
//! Owns the mapping request id → ordered list of blocks (the block table the backend's paged attention reads) and
//! the admission arithmetic: `allocate_slots` grows a request's table so it covers a number of tokens, taking all
//! needed blocks from the [`BlockPool`] or none (the scheduler then preempts or stops admitting). `free` returns
//! every block of a request. No prefix caching. It never touches KV memory and never panics on unknown ids.

use std::collections::HashMap;

use crate::block_pool::BlockPool;

/// Block tables of all requests holding KV-cache blocks.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    tables: HashMap<u64, Vec<u32>>,
}

impl KvCacheManager {
    /// A manager over a fresh pool of `num_blocks` blocks of `block_size` slots.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            pool: BlockPool::new(num_blocks, block_size),
            tables: HashMap::new(),
        }
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// Blocks in use.
    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used()
    }

    /// Fraction of blocks in use (vLLM's `kv_cache_usage_perc`, 0..=1).
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size())
    }

    /// Blocks `req` would need to grow to `num_tokens` tokens.
    pub fn blocks_needed(&self, req: u64, num_tokens: usize) -> usize {
        let have = self.tables.get(&req).map_or(0, Vec::len);
        self.blocks_for(num_tokens).saturating_sub(have)
    }

    /// Grows the block table of `req` to cover `num_tokens` tokens. All or nothing: returns false (and changes
    /// nothing) when the pool has too few free blocks.
    pub fn allocate_slots(&mut self, req: u64, num_tokens: usize) -> bool {
        let need = self.blocks_needed(req, num_tokens);
        if need == 0 {
            self.tables.entry(req).or_default();
            return true;
        }
        match self.pool.allocate(need) {
            Some(ids) => {
                self.tables.entry(req).or_default().extend(ids);
                true
            }
            None => false,
        }
    }

    /// The block table of `req` (empty when it holds none).
    pub fn block_table(&self, req: u64) -> &[u32] {
        self.tables.get(&req).map_or(&[], Vec::as_slice)
    }

    /// Frees every block of `req`. Returns how many were freed.
    pub fn free(&mut self, req: u64) -> usize {
        let Some(blocks) = self.tables.remove(&req) else {
            return 0;
        };
        // The tables own disjoint blocks taken from this pool, so freeing cannot fail; if it ever did, the
        // blocks are lost to the pool but the engine keeps serving.
        let _ = self.pool.free(&blocks);
        blocks.len()
    }

    /// Requests holding blocks.
    pub fn num_requests(&self) -> usize {
        self.tables.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn grows_tables_block_by_block() {
        let mut m = KvCacheManager::new(8, 4);
        assert!(m.allocate_slots(1, 5)); // 2 blocks
        assert_eq!(m.block_table(1).len(), 2);
        assert!(m.allocate_slots(1, 8)); // still 2
        assert_eq!(m.block_table(1).len(), 2);
        assert!(m.allocate_slots(1, 9)); // 3
        assert_eq!(m.block_table(1).len(), 3);
        assert_eq!(m.num_used_blocks(), 3);
    }

    #[test]
    fn all_or_nothing_and_free_returns_everything() {
        let mut m = KvCacheManager::new(4, 4);
        assert!(m.allocate_slots(1, 12));
        assert!(!m.allocate_slots(2, 8), "needs 2, only 1 free");
        assert_eq!(m.block_table(2), &[] as &[u32]);
        assert_eq!(m.num_used_blocks(), 3);
        assert_eq!(m.free(1), 3);
        assert_eq!(m.free(1), 0, "second free is a no-op");
        assert_eq!(m.usage(), 0.0);
        assert!(m.allocate_slots(2, 16));
    }
}
