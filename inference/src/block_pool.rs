//! The pool of fixed-size KV-cache blocks, after vLLM V1's `BlockPool` (vllm/v1/core/block_pool.py).
//!
//! Owns which physical KV-cache blocks are free. The KV memory itself lives in the backend; this module only hands
//! out block ids. Free blocks sit in a FIFO queue (vLLM's `FreeKVCacheBlockQueue`): freed blocks go to the tail and
//! allocation takes from the head, so recently freed blocks are reused last. Prefix caching (block hashes) is not
//! implemented: every block belongs to exactly one sequence. This module never allocates memory per call beyond the
//! returned id vector and never panics on a bad free (it reports an error instead).

use std::collections::VecDeque;

/// Errors of the block pool.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlockPoolError {
    /// A freed block id is outside the pool.
    #[error("block {0} is outside the pool")]
    OutOfRange(u32),
    /// A block was freed twice (a bookkeeping bug in the caller).
    #[error("block {0} freed twice")]
    DoubleFree(u32),
}

/// A fixed set of `num_blocks` blocks of `block_size` token slots.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    free: VecDeque<u32>,
    is_free: Vec<bool>,
}

impl BlockPool {
    /// A pool with every block free.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            free: (0..num_blocks as u32).collect(),
            is_free: vec![true; num_blocks],
        }
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.is_free.len()
    }

    /// Free blocks.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks in use.
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.num_free()
    }

    /// Fraction of blocks in use, 0..=1 (vLLM's `get_usage`).
    pub fn usage(&self) -> f64 {
        if self.num_blocks() == 0 {
            return 0.0;
        }
        self.num_used() as f64 / self.num_blocks() as f64
    }

    /// Takes `n` blocks from the head of the free queue, or none at all when fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let ids: Vec<u32> = self.free.drain(..n).collect();
        for &id in &ids {
            self.is_free[id as usize] = false;
        }
        Some(ids)
    }

    /// Returns blocks to the tail of the free queue.
    pub fn free(&mut self, ids: &[u32]) -> Result<(), BlockPoolError> {
        for &id in ids {
            let slot = self
                .is_free
                .get_mut(id as usize)
                .ok_or(BlockPoolError::OutOfRange(id))?;
            if *slot {
                return Err(BlockPoolError::DoubleFree(id));
            }
            *slot = true;
            self.free.push_back(id);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests unwrap to fail loudly")]
mod tests {
    use super::*;

    #[test]
    fn allocates_all_or_nothing_and_reports_usage() {
        let mut p = BlockPool::new(4, 16);
        assert_eq!(p.usage(), 0.0);
        let a = p.allocate(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert_eq!(p.num_free(), 1);
        assert!(p.allocate(2).is_none(), "must not partially allocate");
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.usage(), 0.75);
    }

    #[test]
    fn freed_blocks_are_reused_last() {
        let mut p = BlockPool::new(4, 16);
        let a = p.allocate(2).unwrap();
        p.free(&a).unwrap();
        // Blocks 2 and 3 were never used: they come first (FIFO), then the freed 0 and 1.
        assert_eq!(p.allocate(4).unwrap(), vec![2, 3, 0, 1]);
        assert_eq!(p.num_free(), 0);
    }

    #[test]
    fn bad_frees_are_errors_not_panics() {
        let mut p = BlockPool::new(2, 16);
        assert_eq!(p.free(&[7]), Err(BlockPoolError::OutOfRange(7)));
        assert_eq!(p.free(&[0]), Err(BlockPoolError::DoubleFree(0)));
        assert_eq!(p.num_free(), 2);
    }
}
