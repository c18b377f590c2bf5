//! The scheduler's side of KV transfer, outside steps: reading cached blocks for a pull,
//! caching received ones as if computed here, pinning, and dropping on request. Pure, like
//! the rest of the scheduler: cache changes come back as [`CacheEvent`]s for the shell to
//! publish.

use super::{CacheEvent, Scheduler};
use crate::sim::block_pool::{BlockId, Insert};

/// A cache change made outside a step: how many blocks it touched, and the events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheUpdate {
    /// Blocks inserted (or found already cached), or dropped.
    pub blocks: usize,
    /// Cache changes, when the config asks for them.
    pub events: Vec<CacheEvent>,
}

/// The leading cached blocks of a chain, as a transfer ships them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedRun {
    /// Leading hashes of the asked chain that are cached.
    pub blocks: usize,
    /// Parent of the first block.
    pub parent: Option<u64>,
    /// Tokens of those blocks, `blocks × block_size` of them.
    pub tokens: Vec<u32>,
}

impl Scheduler {
    /// How many leading hashes of a chain are cached.
    pub fn cached_prefix(&self, hashes: &[u64]) -> usize {
        self.pool.longest_cached_prefix(hashes)
    }

    /// How many hashes of a chain, past its first `hbm` (its HBM-cached prefix,
    /// [`Self::cached_prefix`]), the host tier holds in a row: what an admission would
    /// restore instead of recomputing.
    pub fn host_cached_after(&self, hashes: &[u64], hbm: usize) -> usize {
        self.pool.host_prefix(hashes.get(hbm..).unwrap_or_default())
    }

    /// The leading cached blocks of `hashes` with their content: what the source of a KV
    /// transfer sends.
    pub fn read_cached(&self, hashes: &[u64]) -> CachedRun {
        let mut run = CachedRun::default();
        for &h in hashes {
            let Some(content) = self.pool.content(h) else {
                break;
            };
            if run.blocks == 0 {
                run.parent = content.parent;
            }
            run.tokens.extend_from_slice(content.tokens);
            run.blocks += 1;
        }
        run
    }

    /// Caches blocks computed elsewhere (received KV), chained under `parent`, as if this
    /// engine had computed them: later prompts hit them and `Stored` events announce them.
    /// `tokens` holds `block_size` tokens per hash. Stops when no free block is left, so
    /// the result is always a prefix of `hashes`; `blocks` counts the leading hashes now
    /// cached (inserted or already there), none when `parent` is not cached here. The
    /// last block becomes the first to evict.
    pub fn insert_cached(
        &mut self,
        parent: Option<u64>,
        hashes: &[u64],
        tokens: &[u32],
    ) -> CacheUpdate {
        let bs = self.block_size();
        let mut evicted = Vec::new();
        let mut stored: Vec<CacheEvent> = Vec::new();
        // Held while inserting, so making room never evicts an earlier block of the chain,
        // nor its parent: an engine caches a block only under a parent it holds (a request
        // holds its whole prefix), and a `Stored` under a parent already removed is
        // refused by every KV index that follows the events. Nothing is cached under a
        // parent that is gone.
        let mut held = Vec::with_capacity(hashes.len() + 1);
        if let Some(p) = parent {
            match self.pool.acquire_cached(p) {
                Some(b) => held.push(b),
                None => {
                    return CacheUpdate {
                        blocks: 0,
                        events: Vec::new(),
                    }
                }
            }
        }
        let under = held.len();
        for (i, (&hash, block_tokens)) in hashes.iter().zip(tokens.chunks_exact(bs)).enumerate() {
            let prev = if i == 0 { parent } else { Some(hashes[i - 1]) };
            match self.pool.insert(hash, prev, block_tokens, &mut evicted) {
                Insert::NoRoom => break,
                Insert::AlreadyCached => {}
                Insert::Stored(_) => match stored.last_mut() {
                    Some(CacheEvent::Stored {
                        hashes: run,
                        tokens: run_tokens,
                        ..
                    }) if run.last() == prev.as_ref() => {
                        run.push(hash);
                        run_tokens.extend_from_slice(block_tokens);
                    }
                    _ => stored.push(CacheEvent::Stored {
                        hashes: vec![hash],
                        parent: prev,
                        tokens: block_tokens.to_vec(),
                    }),
                },
            }
            match self.pool.acquire_cached(hash) {
                Some(b) => held.push(b),
                None => break,
            }
        }
        let blocks = held.len() - under;
        self.unpin(&held);
        let mut events = self.eviction_events(evicted);
        if self.cfg.emit_cache_events {
            events.extend(stored);
        }
        CacheUpdate { blocks, events }
    }

    /// Evicts the cached blocks of `hashes` (a chain, in order) that no request (or pin)
    /// holds and nothing else cached hangs under from HBM, tail first; with a host tier
    /// they are offloaded there (a demoted session's KV then restores at PCIe
    /// speed instead of being recomputed).
    pub fn drop_cached(&mut self, hashes: &[u64]) -> CacheUpdate {
        // Tail first: a block is dropped only once nothing cached hangs under it.
        let dropped: Vec<u64> = hashes
            .iter()
            .rev()
            .copied()
            .filter(|&h| self.pool.evict(h))
            .collect();
        let blocks = dropped.len();
        let events = self.eviction_events(dropped);
        CacheUpdate { blocks, events }
    }

    /// Reserves `n` free blocks for KV on its way here (as vLLM's NIXL connector allocates a
    /// request's blocks before pulling them), evicting the least recently freed cached
    /// blocks now; fewer if the pool runs out. [`Self::unreserve`] gives them back, to be
    /// filled first by [`Self::insert_cached`]. Returns the blocks and the evictions' events.
    pub fn reserve(&mut self, n: usize) -> (Vec<BlockId>, Vec<CacheEvent>) {
        let mut evicted = Vec::new();
        let blocks: Vec<BlockId> = (0..n)
            .map_while(|_| self.pool.allocate(&mut evicted))
            .collect();
        (blocks, self.eviction_events(evicted))
    }

    /// Gives back blocks taken by [`Self::reserve`], empty, to be reused first.
    pub fn unreserve(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.pool.release_empty(b);
        }
    }

    /// Takes a reference on each leading cached block of `hashes`, so none is evicted
    /// until [`Self::unpin`]; returns the blocks held.
    pub fn pin(&mut self, hashes: &[u64]) -> Vec<BlockId> {
        hashes
            .iter()
            .map_while(|&h| self.pool.acquire_cached(h))
            .collect()
    }

    /// Releases blocks taken by [`Self::pin`].
    pub fn unpin(&mut self, blocks: &[BlockId]) {
        self.pool.free(blocks.iter().rev().copied());
    }
}
