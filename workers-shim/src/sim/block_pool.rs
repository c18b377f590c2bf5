//! Paged KV cache with prefix caching: fixed-size blocks, ref counts, a hash → block map for
//! full blocks, and LRU eviction of free blocks (vLLM's `BlockPool` semantics).
//!
//! A block whose ref count drops to zero stays cached (its hash still resolves) until it is
//! evicted to make room; free blocks are reused least-recently-freed first. A cached block
//! remembers its parent hash and tokens: they are what a KV transfer ships (the simulated
//! stand-in for the KV tensors) and what `BlockStored` events carry.
//!
//! With a host tier ([`BlockPool::with_host_tier`]), a cached block evicted from HBM (to
//! make room, or dropped by [`BlockPool::evict`]) is offloaded to it instead of lost, and
//! [`BlockPool::restore`] brings it back into a fresh block.

use std::collections::hash_map::Entry;

use foldhash::HashMap;

use super::host_tier::{HostChanges, HostTier};

/// Index of a block in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockId(u32);

impl BlockId {
    /// The block's index in the pool (vLLM's block id, as in `remote_block_ids`).
    pub fn index(self) -> u32 {
        self.0
    }
}

/// What a cached block holds: its place in the chain and its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedContent<'a> {
    pub parent: Option<u64>,
    pub tokens: &'a [u32],
}

/// Result of [`BlockPool::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// A free block now holds the content (ref count zero, most recently freed).
    Stored(BlockId),
    /// Some block already held it.
    AlreadyCached,
    /// Every block is in use.
    NoRoom,
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    hash: Option<u64>,
    parent: Option<u64>,
    tokens: Vec<u32>,
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
    /// Blocks holding a hash `cached` maps to another block (duplicates), oldest first.
    dups: HashMap<u64, Vec<u32>>,
    /// How many registered blocks (duplicates included) hang under each hash. A hash
    /// with blocks under it is not evicted on request ([`Self::evict`]): the cache stays
    /// prefix-closed, as an engine's LRU keeps it (a request holds its whole prefix and
    /// frees it tail first, so a parent is never freed before its children). Every KV
    /// index that follows the events relies on it: a child announced under a parent
    /// already removed is refused.
    children: HashMap<u64, u32>,
    free_head: u32,
    free_tail: u32,
    num_free: usize,
    evictions: u64,
    host: HostTier,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks, all free, with a host tier of `host_blocks`
    /// (0: none).
    pub fn with_host_tier(num_blocks: u32, host_blocks: u32) -> Self {
        Self {
            host: HostTier::new(host_blocks),
            ..Self::new(num_blocks)
        }
    }

    /// The host tier (empty and disabled without one).
    pub fn host(&self) -> &HostTier {
        &self.host
    }

    /// Host-tier stores and removals since the last call, for KV events.
    pub fn take_host_changes(&mut self) -> HostChanges {
        self.host.take_changes()
    }

    /// How many leading hashes of `hashes` the host tier holds and HBM does not (a block
    /// HBM holds ends the run: it needs no restore, and a restore into a second block
    /// would fail).
    pub fn host_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|&h| self.host.contains(*h) && !self.cached.contains_key(h))
            .count()
    }

    /// Restores the host-tier copy of `hash` into block `id` (just allocated), cached as if
    /// computed here. False if the host tier lacks it or HBM already caches it.
    pub fn restore(&mut self, id: BlockId, hash: u64) -> bool {
        if self.cached.contains_key(&hash) {
            return false;
        }
        let Some((parent, tokens)) = self.host.restore(hash) else {
            return false;
        };
        self.register(id, hash, parent, &tokens)
    }

    /// Moves block `i`'s cached content to the host tier (a no-op without one).
    fn offload(&mut self, i: u32, hash: u64) {
        if self.host.is_enabled() {
            let block = &mut self.blocks[i as usize];
            let tokens = std::mem::take(&mut block.tokens);
            self.host.offload(hash, block.parent, tokens);
        }
    }

    /// A pool of `num_blocks` empty blocks, all free.
    pub fn new(num_blocks: u32) -> Self {
        let blocks = (0..num_blocks)
            .map(|i| Block {
                hash: None,
                parent: None,
                tokens: Vec::new(),
                ref_cnt: 0,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks { NIL } else { i + 1 },
            })
            .collect();
        Self {
            blocks,
            cached: HashMap::default(),
            dups: HashMap::default(),
            children: HashMap::default(),
            free_head: if num_blocks == 0 { NIL } else { 0 },
            free_tail: num_blocks.checked_sub(1).unwrap_or(NIL),
            num_free: num_blocks as usize,
            evictions: 0,
            host: HostTier::default(),
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

    /// Blocks holding a cached prefix block (in use or not): what the engine has
    /// announced in `BlockStored` events and not removed.
    pub fn holding(&self) -> usize {
        self.cached.len()
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

    /// How many of `hashes` are cached in blocks nobody holds (free, so taking them
    /// shrinks the free list).
    pub fn free_cached(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .filter_map(|h| self.cached.get(h))
            .filter(|id| self.blocks[id.0 as usize].ref_cnt == 0)
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
            let parent = block.parent;
            self.evictions += 1;
            evicted.push(h);
            if self.forget(i, h) {
                self.offload(i, h);
            }
            self.unparent(parent);
        }
        Some(BlockId(i))
    }

    /// Drops block `i` as a holder of `hash`; true if no other block holds it now (else a
    /// duplicate becomes the one prompts reuse, as vLLM's next block under the hash).
    fn forget(&mut self, i: u32, hash: u64) -> bool {
        let Some(dups) = self.dups.get_mut(&hash) else {
            self.cached.remove(&hash);
            return true;
        };
        if self.cached.get(&hash) == Some(&BlockId(i)) {
            let next = dups.remove(0);
            self.cached.insert(hash, BlockId(next));
        } else {
            dups.retain(|&d| d != i);
        }
        if dups.is_empty() {
            self.dups.remove(&hash);
        }
        false
    }

    /// Records that a full block holds content `hash` (chained under `parent`, made of
    /// `tokens`), so later prompts can reuse it. Returns false if the block was already
    /// registered. A block computing content another block already holds (a prompt's last
    /// block, recomputed for its logits; a decode repeating an earlier one) is registered as
    /// a duplicate, as vLLM 0.32 does: announced in a `BlockStored`, reused after the first
    /// holder is evicted, and announced in a `BlockRemoved` when it is evicted itself.
    pub fn register(
        &mut self,
        id: BlockId,
        hash: u64,
        parent: Option<u64>,
        tokens: &[u32],
    ) -> bool {
        let block = &mut self.blocks[id.0 as usize];
        if block.hash.is_some() {
            return false;
        }
        block.hash = Some(hash);
        block.parent = parent;
        block.tokens.clear();
        if let Some(p) = parent {
            *self.children.entry(p).or_default() += 1;
        }
        block.tokens.extend_from_slice(tokens);
        match self.cached.entry(hash) {
            Entry::Vacant(e) => {
                e.insert(id);
            }
            Entry::Occupied(_) => self.dups.entry(hash).or_default().push(id.0),
        }
        true
    }

    /// The content of the cached block holding `hash`.
    pub fn content(&self, hash: u64) -> Option<CachedContent<'_>> {
        let block = &self.blocks[self.cached.get(&hash)?.0 as usize];
        Some(CachedContent {
            parent: block.parent,
            tokens: &block.tokens,
        })
    }

    /// Caches content computed elsewhere (a KV transfer) in a free block, evicting the
    /// least recently freed one if needed (its hash is appended to `evicted`). The block
    /// stays free, most recently freed, exactly like a block whose request just finished.
    pub fn insert(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        tokens: &[u32],
        evicted: &mut Vec<u64>,
    ) -> Insert {
        if self.cached.contains_key(&hash) {
            return Insert::AlreadyCached;
        }
        let Some(id) = self.allocate(evicted) else {
            return Insert::NoRoom;
        };
        self.register(id, hash, parent, tokens);
        self.release(id);
        Insert::Stored(id)
    }

    /// Forgets the cached content `hash` if no request holds its block and, when it is
    /// the last block holding `hash`, no cached block hangs under it (offloading it to the
    /// host tier if there is one); the block goes to the front of the free list (reused
    /// first). Returns whether it was dropped from HBM. A chain is evicted tail first.
    pub fn evict(&mut self, hash: u64) -> bool {
        let Some(&id) = self.cached.get(&hash) else {
            return false;
        };
        if self.blocks[id.0 as usize].ref_cnt > 0 {
            return false;
        }
        if !self.dups.contains_key(&hash) && self.children.contains_key(&hash) {
            return false;
        }
        self.unlink(id.0);
        if self.forget(id.0, hash) {
            self.offload(id.0, hash);
        }
        let block = &mut self.blocks[id.0 as usize];
        let parent = block.parent.take();
        block.hash = None;
        block.tokens.clear();
        self.unparent(parent);
        self.push_head(id.0);
        true
    }

    /// One block fewer under `parent`.
    fn unparent(&mut self, parent: Option<u64>) {
        let Some(p) = parent else { return };
        if let Some(n) = self.children.get_mut(&p) {
            *n -= 1;
            if *n == 0 {
                self.children.remove(&p);
            }
        }
    }

    /// Forgets every cached hash (vLLM's `reset_prefix_cache`), the host tier's included
    /// (one `AllBlocksCleared` covers both tiers for the index); refused while any block is
    /// in use.
    pub fn reset(&mut self) -> bool {
        if self.num_free != self.blocks.len() {
            return false;
        }
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.cached.clear();
        self.dups.clear();
        self.children.clear();
        self.host.clear();
        self.host.take_changes();
        true
    }

    /// Gives back a block taken by [`Self::allocate`] that was never filled (a reservation
    /// no longer needed): empty, it goes to the front of the free list (reused first).
    pub fn release_empty(&mut self, id: BlockId) {
        let block = &mut self.blocks[id.0 as usize];
        if block.ref_cnt == 1 && block.hash.is_none() {
            block.parent = None;
            block.tokens.clear();
        }
        self.release(id);
    }

    /// Drops one reference (see [`Self::free`]).
    pub fn release(&mut self, id: BlockId) {
        self.free([id]);
    }

    /// Drops one reference on each block of `ordered`, given in the order they should be
    /// reused (vLLM's `free_blocks`, to which a request's blocks come tail first). A block
    /// nobody holds any more becomes free: a cached one at the back of the free list (least
    /// recently freed is evicted first), an anonymous one at the front, these in the given
    /// order (vLLM 0.32 reuses blocks that cache nothing first, so no cached block is
    /// evicted while one of them is free).
    pub fn free(&mut self, ordered: impl IntoIterator<Item = BlockId>) {
        let mut front = NIL;
        for id in ordered {
            let block = &mut self.blocks[id.0 as usize];
            if block.ref_cnt == 0 {
                continue;
            }
            block.ref_cnt -= 1;
            if block.ref_cnt > 0 {
                continue;
            }
            if block.hash.is_some() {
                self.push_tail(id.0);
            } else {
                if front == NIL {
                    self.push_head(id.0);
                } else {
                    self.insert_after(front, id.0);
                }
                front = id.0;
            }
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

    fn push_head(&mut self, i: u32) {
        let head = self.free_head;
        {
            let b = &mut self.blocks[i as usize];
            b.prev = NIL;
            b.next = head;
        }
        if head == NIL {
            self.free_tail = i;
        } else {
            self.blocks[head as usize].prev = i;
        }
        self.free_head = i;
        self.num_free += 1;
    }

    /// Links free block `i` right after free block `prev`.
    fn insert_after(&mut self, prev: u32, i: u32) {
        let next = self.blocks[prev as usize].next;
        {
            let b = &mut self.blocks[i as usize];
            b.prev = prev;
            b.next = next;
        }
        self.blocks[prev as usize].next = i;
        if next == NIL {
            self.free_tail = i;
        } else {
            self.blocks[next as usize].prev = i;
        }
        self.num_free += 1;
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
        pool.register(a, 10, None, &[]);
        pool.register(b, 20, Some(10), &[]);
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
    fn blocks_caching_nothing_are_reused_before_any_cached_block() {
        // vLLM 0.32's `free_blocks`: a request's blocks come tail first; the anonymous ones
        // go to the front of the free list in that order, the cached ones to the back.
        let mut pool = BlockPool::new(4);
        let mut none = Vec::new();
        let [a, b, c] = [(); 3].map(|_| pool.allocate(&mut none).unwrap());
        pool.register(a, 10, None, &[]);
        pool.free([c, b, a]);
        let d = pool.allocate(&mut none).unwrap();
        assert_eq!(d, c, "the tail block, anonymous, is reused first");
        assert_eq!(pool.allocate(&mut none).unwrap(), b);
        pool.allocate(&mut none).unwrap(); // the never-used block
        let mut evicted = Vec::new();
        assert_eq!(pool.allocate(&mut evicted), Some(a));
        assert_eq!(evicted, vec![10], "the cached block goes last");
    }

    #[test]
    fn a_duplicate_is_announced_reused_after_the_first_and_removed_on_its_own() {
        let mut pool = BlockPool::new(3);
        let mut none = Vec::new();
        let a = pool.allocate(&mut none).unwrap();
        let b = pool.allocate(&mut none).unwrap();
        assert!(pool.register(a, 10, None, &[1]));
        assert!(
            pool.register(b, 10, None, &[1]),
            "a second copy is announced"
        );
        assert!(!pool.register(b, 10, None, &[1]));
        assert_eq!(pool.holding(), 1);
        pool.free([a, b]);
        let mut evicted = Vec::new();
        pool.allocate(&mut evicted).unwrap(); // the never-used block
        assert_eq!(pool.allocate(&mut evicted), Some(a));
        assert_eq!(evicted, vec![10], "evicting the first copy is announced");
        assert_eq!(
            pool.acquire_cached(10),
            Some(b),
            "the duplicate serves the hash now"
        );
        pool.release(b);
        assert_eq!(pool.allocate(&mut evicted), Some(b));
        assert_eq!(evicted, vec![10, 10]);
        assert_eq!(pool.longest_cached_prefix(&[10]), 0);
    }

    #[test]
    fn acquiring_a_cached_block_takes_it_off_the_free_list() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate(&mut Vec::new()).unwrap();
        pool.register(a, 7, None, &[]);
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
        pool.register(a, 5, None, &[]);
        pool.register(b, 5, None, &[]);
        pool.release(a);
        assert_eq!(pool.acquire_cached(5), Some(a));
    }

    #[test]
    fn inserted_content_is_cached_free_and_evicted_last() {
        let mut pool = BlockPool::new(3);
        let mut evicted = Vec::new();
        let Insert::Stored(a) = pool.insert(1, None, &[1, 2], &mut evicted) else {
            panic!("no room")
        };
        assert_eq!(
            pool.insert(1, None, &[1, 2], &mut evicted),
            Insert::AlreadyCached
        );
        assert!(matches!(
            pool.insert(2, Some(1), &[3, 4], &mut evicted),
            Insert::Stored(_)
        ));
        assert_eq!(pool.num_free(), 3, "inserted blocks are free, only cached");
        assert_eq!(
            pool.content(2),
            Some(CachedContent {
                parent: Some(1),
                tokens: &[3, 4]
            })
        );
        assert_eq!(pool.longest_cached_prefix(&[1, 2]), 2);
        // The never-used block goes first; then the oldest insert.
        let _x = pool.allocate(&mut evicted).unwrap();
        assert!(evicted.is_empty());
        assert_eq!(pool.allocate(&mut evicted), Some(a));
        assert_eq!(evicted, vec![1]);
        let _y = pool.allocate(&mut evicted).unwrap();
        assert_eq!(pool.insert(3, None, &[], &mut evicted), Insert::NoRoom);
    }

    #[test]
    fn evict_drops_only_unreferenced_content_and_reuses_it_first() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate(&mut Vec::new()).unwrap();
        pool.register(a, 9, None, &[7]);
        assert!(!pool.evict(9), "a running request holds it");
        pool.release(a);
        assert!(pool.evict(9));
        assert!(!pool.evict(9), "already gone");
        assert_eq!(pool.content(9), None);
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.allocate(&mut Vec::new()), Some(a), "reused first");
        assert_eq!(pool.evictions(), 0, "a drop is not an eviction");
    }

    #[test]
    fn a_block_with_a_cached_child_is_not_evicted_on_request_unless_a_copy_stays() {
        let mut pool = BlockPool::new(4);
        let put = |pool: &mut BlockPool, hash, parent| {
            let id = pool.allocate(&mut Vec::new()).unwrap();
            pool.register(id, hash, parent, &[]);
            id
        };
        let (a, b) = (put(&mut pool, 1, None), put(&mut pool, 2, Some(1)));
        pool.free([b, a]);
        assert!(!pool.evict(1), "block 2 hangs under it");
        assert!(pool.evict(2) && pool.evict(1), "tail first");
        // A second copy of the parent: one copy may go, the other keeps the child's place.
        let (a, b) = (put(&mut pool, 1, None), put(&mut pool, 2, Some(1)));
        let dup = put(&mut pool, 1, None);
        pool.free([b, dup, a]);
        assert!(pool.evict(1), "a copy stays");
        assert_eq!(pool.longest_cached_prefix(&[1, 2]), 2);
        assert!(!pool.evict(1), "the last copy, block 2 under it");
        // An LRU eviction of the child frees the parent for a drop.
        let mut evicted = Vec::new();
        while evicted.is_empty() {
            pool.allocate(&mut evicted).unwrap();
        }
        assert_eq!(evicted, [2]);
        assert!(pool.evict(1));
    }

    #[test]
    fn evicted_blocks_go_to_the_host_tier_and_restore_from_it() {
        let mut pool = BlockPool::with_host_tier(2, 2);
        let mut evicted = Vec::new();
        for (h, parent, t) in [(1, None, [1, 2]), (2, Some(1), [3, 4])] {
            assert!(matches!(
                pool.insert(h, parent, &t, &mut evicted),
                Insert::Stored(_)
            ));
        }
        // A third block evicts the least recently freed (1) from HBM into host memory.
        assert!(matches!(
            pool.insert(3, None, &[5, 6], &mut evicted),
            Insert::Stored(_)
        ));
        assert_eq!(evicted, vec![1]);
        assert_eq!(pool.longest_cached_prefix(&[1, 2]), 0);
        assert_eq!(pool.host_prefix(&[1, 2]), 1);
        assert_eq!(pool.take_host_changes().stored, vec![1]);
        // A demotion's drop offloads too.
        assert!(pool.evict(2));
        assert_eq!(pool.host_prefix(&[1, 2]), 2);
        // Restoring 1 into a fresh block caches it in HBM again, content and chain intact.
        let id = pool.allocate(&mut evicted).unwrap();
        assert!(pool.restore(id, 1));
        assert_eq!(
            pool.content(1),
            Some(CachedContent {
                parent: None,
                tokens: &[1, 2]
            })
        );
        assert!(pool.host().contains(1), "the host copy stays");
        // Host LRU: 2 was used less recently than the restored 1, so a new offload evicts it.
        pool.release(id);
        let mut more = Vec::new();
        let _a = pool.allocate(&mut more).unwrap();
        let b = pool.allocate(&mut more).unwrap();
        assert_eq!(more, vec![3, 1], "HBM evicts in LRU order");
        let changes = pool.take_host_changes();
        assert_eq!(changes.stored, vec![2, 3]);
        assert_eq!(changes.removed, vec![2]);
        assert_eq!(pool.host_prefix(&[1]), 1);
        // A block held in both tiers ends the restorable run: HBM already has it.
        pool.release(b);
        let c = pool.allocate(&mut more).unwrap();
        assert!(pool.restore(c, 1));
        assert_eq!(pool.host_prefix(&[1]), 0);
    }

    #[test]
    fn without_a_host_tier_evicted_blocks_are_gone() {
        let mut pool = BlockPool::new(1);
        let mut evicted = Vec::new();
        pool.insert(1, None, &[1], &mut evicted);
        pool.insert(2, None, &[2], &mut evicted);
        assert_eq!(evicted, vec![1]);
        assert_eq!(pool.host_prefix(&[1]), 0);
        let id = pool.allocate(&mut evicted).unwrap();
        assert!(!pool.restore(id, 1));
    }

    #[test]
    fn a_reset_clears_the_host_tier_too() {
        let mut pool = BlockPool::with_host_tier(1, 4);
        let mut evicted = Vec::new();
        pool.insert(1, None, &[1], &mut evicted);
        pool.insert(2, None, &[2], &mut evicted);
        assert_eq!(pool.host_prefix(&[1]), 1);
        pool.take_host_changes();
        assert!(pool.reset());
        assert_eq!(pool.host_prefix(&[1]), 0);
        assert!(pool.host().is_empty());
        assert_eq!(pool.take_host_changes(), HostChanges::default());
    }
}
