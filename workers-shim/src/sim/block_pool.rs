//! Paged KV cache with prefix caching: fixed-size blocks, ref counts, a hash → block map for
//! full blocks, and LRU eviction of free blocks (vLLM's `BlockPool` semantics).
//!
//! A block whose ref count drops to zero stays cached (its hash still resolves) until it is
//! evicted to make room; free blocks are reused least-recently-freed first.

use std::collections::HashMap;

/// Index of a block in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockId(u32);

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    hash: Option<u64>,
    ref_cnt: u32,
    // Intrusive doubly linked free list, so removing a reused cached block is O(1).
    prev: u32,
    next: u32,
}

/// The pool of KV blocks of one engine.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    cached: HashMap<u64, BlockId>,
    free_head: u32,
    free_tail: u32,
    num_free: usize,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks, all free.
    pub fn new(num_blocks: u32) -> Self {
        let blocks = (0..num_blocks)
            .map(|i| Block {
                hash: None,
                ref_cnt: 0,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks { NIL } else { i + 1 },
            })
            .collect();
        Self {
            blocks,
            cached: HashMap::new(),
            free_head: if num_blocks == 0 { NIL } else { 0 },
            free_tail: num_blocks.checked_sub(1).unwrap_or(NIL),
            num_free: num_blocks as usize,
            evictions: 0,
        }
    }

    /// Total blocks.
    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with ref count zero (cached or empty).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks in use by running requests (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - self.num_free as f64 / self.blocks.len() as f64
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many leading hashes of a chain are cached (a miss ends the match).
    pub fn longest_cached_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Takes a reference on the cached block holding `hash`.
    pub fn acquire_cached(&mut self, hash: u64) -> Option<BlockId> {
        let id = *self.cached.get(&hash)?;
        let block = &mut self.blocks[id.0 as usize];
        if block.ref_cnt == 0 {
            self.unlink(id.0);
        }
        self.blocks[id.0 as usize].ref_cnt += 1;
        Some(id)
    }

    /// Takes the least recently freed block, evicting its cached content; the evicted
    /// hash, if any, is appended to `evicted`.
    pub fn allocate(&mut self, evicted: &mut Vec<u64>) -> Option<BlockId> {
        let i = self.free_head;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        let block = &mut self.blocks[i as usize];
        block.ref_cnt = 1;
        if let Some(h) = block.hash.take() {
            self.cached.remove(&h);
            self.evictions += 1;
            evicted.push(h);
        }
        Some(BlockId(i))
    }

    /// Records that a full block holds content `hash`, so later prompts can reuse it.
    /// Returns false if the block was already registered or another block already holds
    /// that content (this one then stays anonymous, as in vLLM).
    pub fn register(&mut self, id: BlockId, hash: u64) -> bool {
        if self.blocks[id.0 as usize].hash.is_some() || self.cached.contains_key(&hash) {
            return false;
        }
        self.blocks[id.0 as usize].hash = Some(hash);
        self.cached.insert(hash, id);
        true
    }

    /// Forgets every cached hash (vLLM's `reset_prefix_cache`); refused while any block is
    /// in use.
    pub fn reset(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.cached.clear();
        true
    }

    /// Drops one reference; at zero the block becomes evictable, most recently freed last.
    pub fn release(&mut self, id: BlockId) {
        let block = &mut self.blocks[id.0 as usize];
        if block.ref_cnt == 0 {
            return;
        }
        block.ref_cnt -= 1;
        if block.ref_cnt == 0 {
            self.push_tail(id.0);
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let b = &self.blocks[i as usize];
            (b.prev, b.next)
        };
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[i as usize];
        b.prev = NIL;
        b.next = NIL;
        self.num_free -= 1;
    }

    fn push_tail(&mut self, i: u32) {
        let tail = self.free_tail;
        {
            let b = &mut self.blocks[i as usize];
            b.prev = tail;
            b.next = NIL;
        }
        if tail == NIL {
            self.free_head = i;
        } else {
            self.blocks[tail as usize].next = i;
        }
        self.free_tail = i;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_stay_cached_until_evicted_lru_first() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate(&mut Vec::new()).unwrap();
        let b = pool.allocate(&mut Vec::new()).unwrap();
        pool.register(a, 10);
        pool.register(b, 20);
        pool.release(a);
        pool.release(b);
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.longest_cached_prefix(&[10, 20, 30]), 2);
        // The never-used block goes first, then the least recently freed (a).
        let mut evicted = Vec::new();
        let _c = pool.allocate(&mut evicted).unwrap();
        let _d = pool.allocate(&mut evicted).unwrap();
        assert_eq!(evicted, vec![10]);
        assert_eq!(pool.longest_cached_prefix(&[10, 20]), 0);
        assert_eq!(pool.longest_cached_prefix(&[20]), 1);
        assert_eq!(pool.evictions(), 1);
    }

    #[test]
    fn acquiring_a_cached_block_takes_it_off_the_free_list() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate(&mut Vec::new()).unwrap();
        pool.register(a, 7);
        pool.release(a);
        assert_eq!(pool.acquire_cached(7), Some(a));
        assert_eq!(pool.num_free(), 1);
        assert!(pool.allocate(&mut Vec::new()).is_some());
        assert!(
            pool.allocate(&mut Vec::new()).is_none(),
            "the cached block is in use"
        );
        assert!((pool.usage() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn duplicate_content_is_not_registered_twice() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate(&mut Vec::new()).unwrap();
        let b = pool.allocate(&mut Vec::new()).unwrap();
        pool.register(a, 5);
        pool.register(b, 5);
        pool.release(a);
        assert_eq!(pool.acquire_cached(5), Some(a));
    }
}
