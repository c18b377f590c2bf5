//! The KV index: which worker holds which block chain, per tier, fed by engine KV events
//! (or, for workers without events, by the router's own routing decisions with a TTL).
//!
//! Blocks are keyed by *our* sequence hash ([`crate::hash`]), recomputed from the tokens in
//! each event; engine hashes are kept only as opaque ids for parent links and removals.
//! The index keeps two sets prefix-closed per worker: the blocks it holds in GPU memory and
//! the blocks it holds in any tier (a worker that holds a block holds its parent). A store
//! needs a known parent, and a removal cascades to the descendants, as a radix-tree walk
//! would stop there anyway. That closure makes a longest-prefix match a search for the
//! depths where the holder set changes, found by bisection with an order-independent
//! fingerprint of each holder set: a 100K-token prompt costs tens of lookups, not thousands.
//!
//! Files: `event.rs` (the events' shape), `matching.rs` (the bisection), `node_store.rs`
//! (the blocks, in a slab behind a map of slots), `fast_hash.rs` (the maps' hasher),
//! `expiry_queue.rs` (approximate-mode expiries, compacted a chunk at a time),
//! `peer_copy.rs` (a worker's holds copied into another router's index).

mod event;
mod expiry_queue;
mod fast_hash;
mod matching;
mod node_store;
mod peer_copy;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use smallvec::SmallVec;

use expiry_queue::ExpiryQueue;
use fast_hash::FastMap;
use node_store::NodeStore;

pub use event::{KvEvent, Tier};
pub use matching::{MatchScratch, WorkerMatch};
pub use peer_copy::{CopiedHold, CopyError, StreamPosition, WorkerCopy};

use crate::hash::{block_seed, local_block_hash, sequence_hash};
use crate::ids::WorkerId;

/// Approximate-mode expiries are rounded up to a grain (see [`KvIndex::insert_routed`]):
/// a sixteenth of the TTL, at least this many milliseconds. Entries may outlive their TTL
/// by up to a grain.
pub const MIN_EXPIRY_GRAIN_MS: u64 = 1000;

/// Expiry entries a caller should take per [`KvIndex::expire_some`] while others wait on
/// the index (the router's tick, between yields). In a full 1M-block index whose whole
/// grain comes due, one call held the index for 337–360 ms; batches of 1,024 hold it
/// ~10 µs at the median, 1.1–1.5 ms at the p99 and 3.3–3.7 ms at most (a batch whose
/// entries remove whole chains) (`ownerserve bench kv`).
pub const EXPIRY_BATCH: usize = 1024;

/// The expiry queue is compacted only beyond this many entries (and twice the routed
/// holds; see [`KvIndex::compact_expiries_some`]).
const MIN_EXPIRY_COMPACTION: usize = 4096;

/// Grains per TTL. A chain routed again in a later grain is refreshed whole (each of its
/// blocks' expiry moves), so this sets how often a live session's whole prompt is walked:
/// 16 per TTL where it was once a second (a 120 s TTL: every 7.5 s instead of every 1 s).
const EXPIRY_GRAINS_PER_TTL: u64 = 16;

/// The expiry grain for entries that live `ttl_ms`.
pub fn expiry_grain_ms(ttl_ms: u64) -> u64 {
    MIN_EXPIRY_GRAIN_MS.max(ttl_ms / EXPIRY_GRAINS_PER_TTL)
}

/// Whether `worker` holds `seq` as routed (approximate mode: in GPU memory, by the
/// router's record) until exactly `expires_ms`: the hold an expiry entry of that time
/// stands for, and the mark of a block already refreshed in that grain.
fn routed_until(nodes: &NodeStore, seq: u64, worker: WorkerId, expires_ms: u64) -> bool {
    nodes.get(&seq).is_some_and(|node| {
        node.holders.iter().any(|h| {
            h.worker == worker && h.tier == Tier::Gpu && h.expires_at_ms == Some(expires_ms)
        })
    })
}

/// Limits and hashing parameters of an index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvIndexConfig {
    /// Tokens per block; events with another block size are refused.
    pub block_size: usize,
    /// Most blocks kept; each insert beyond it evicts the least recently used leaves,
    /// as many as it added, so no operation prunes more than it touched.
    pub max_blocks: usize,
}

impl Default for KvIndexConfig {
    fn default() -> Self {
        // Dynamo's default size, 2^20 blocks.
        Self {
            block_size: 16,
            max_blocks: 1 << 20,
        }
    }
}

/// Why an event was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("parent block {parent:#x} is unknown for worker {worker}: events were missed")]
    UnknownParent { worker: WorkerId, parent: u64 },
    #[error(
        "worker {worker} stored GPU block under {parent:#x}, which it does not hold in GPU memory"
    )]
    ParentNotInGpu { worker: WorkerId, parent: u64 },
    #[error("event has {tokens} tokens for {blocks} blocks of {block_size}")]
    BlockSizeMismatch {
        tokens: usize,
        blocks: usize,
        block_size: usize,
    },
}

/// One `(worker, tier)` holding a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holder {
    worker: WorkerId,
    tier: Tier,
    /// The engine's id for this block on this worker (our hash in approximate mode).
    engine_hash: u64,
    /// Approximate-mode entries expire; event-fed ones do not.
    expires_at_ms: Option<u64>,
    /// Copies of the block the engine announced in this tier (event-fed GPU holds): vLLM
    /// 0.32 stores a second copy when it computes a cached block again (a prompt's last
    /// block, recomputed for its logits; two requests prefilling the same new prefix at
    /// once) and removes each copy on its own. The hold goes with the last copy.
    copies: u32,
}

/// Where a block sits in the chain one insert adds. Every block of it but the last gets
/// its child within the same insert, so only the last enters the eviction order (entering
/// and leaving it again per block cost three B-tree operations each).
#[derive(Debug, Clone, Copy)]
struct ChainPos {
    /// The block before it (none for a chain's first block).
    parent: Option<u64>,
    /// The parent was added by this insert (so it is not in the eviction order).
    parent_in_chain: bool,
    /// The next block this insert adds is this one's child.
    child_follows: bool,
}

impl ChainPos {
    /// Block `i` of an insert of `n`, after `parent`.
    fn of(parent: Option<u64>, i: usize, n: usize) -> Self {
        Self {
            parent,
            parent_in_chain: i > 0,
            child_follows: i + 1 < n,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Node {
    parent: Option<u64>,
    /// Where the parent sits in the [`NodeStore`]: a hint, checked before use, that saves
    /// an eviction walking up a chain one map probe (a cache miss) per block.
    parent_slot: Option<u32>,
    /// Inline up to one (a chain's blocks have one child, its last none).
    children: SmallVec<[u64; 1]>,
    /// Inline up to one (most blocks are held by one worker).
    holders: SmallVec<[Holder; 1]>,
    /// XOR of the prints of the workers holding this block in GPU memory.
    print_gpu: u64,
    /// XOR of the prints of the workers holding this block in any tier.
    print_any: u64,
    last_used: u64,
}

impl Node {
    fn holds(&self, worker: WorkerId, tier: Option<Tier>) -> bool {
        self.holders
            .iter()
            .any(|h| h.worker == worker && tier.is_none_or(|t| h.tier == t))
    }

    fn recompute_prints(&mut self) {
        let (mut gpu, mut any) = (0, 0);
        for (i, h) in self.holders.iter().enumerate() {
            if h.tier == Tier::Gpu {
                gpu ^= worker_print(h.worker);
            }
            // Count each worker once, at its first hold.
            if !self.holders[..i].iter().any(|x| x.worker == h.worker) {
                any ^= worker_print(h.worker);
            }
        }
        self.print_gpu = gpu;
        self.print_any = any;
    }
}

fn worker_print(worker: WorkerId) -> u64 {
    // splitmix64 of the id: spreads ids so XORs of different sets differ.
    let mut z = u64::from(worker.0).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Counters of what the index has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub events_rejected: u64,
    pub blocks_pruned: u64,
    pub blocks_expired: u64,
}

/// GPU copies of the indexed blocks ([`KvIndex::gpu_replication`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuReplication {
    /// Distinct blocks held in some worker's GPU memory.
    pub blocks: u64,
    /// (block, worker) pairs in GPU memory.
    pub copies: u64,
}

impl GpuReplication {
    /// Copies per distinct block (1 with no duplication; 0 for an empty index).
    pub fn duplicate_factor(&self) -> f64 {
        if self.blocks == 0 {
            0.0
        } else {
            self.copies as f64 / self.blocks as f64
        }
    }
}

/// The index.
#[derive(Debug, Clone)]
pub struct KvIndex {
    cfg: KvIndexConfig,
    nodes: NodeStore,
    /// Per worker: engine block id → our sequence hash, for event-fed holds.
    engine_ids: FastMap<WorkerId, FastMap<u64, u64>>,
    /// Per worker: approximate-mode holds. They are not in `engine_ids` (their engine id is
    /// the sequence hash itself, and no event names them), which saved a map insert and
    /// removal per routed block: ~10% of a router's CPU on 171 KB session steps.
    routed_holds: FastMap<WorkerId, usize>,
    /// Per worker: event-fed holds in GPU memory (a block also held in host memory shares
    /// its engine id, so `engine_ids` alone cannot tell HBM from host holds).
    gpu_holds: FastMap<WorkerId, usize>,
    /// Approximate-mode expiries in insertion order (non-decreasing with a fixed TTL).
    /// An entry outlives its hold when the hold is refreshed in a later grain or pruned;
    /// [`KvIndex::compact_expiries_some`] drops such stale entries.
    expiries: ExpiryQueue,
    /// `(last_used, seq)` of every node without children: the eviction order. Only a leaf
    /// can go without breaking a chain, and a chain is as recent as its leaf (a match
    /// touches the deepest block it reached), so popping the first is LRU by chain.
    leaves: BTreeSet<(u64, u64)>,
    /// Per event-fed worker: how far its stream is applied (`peer_copy.rs`).
    positions: FastMap<WorkerId, StreamPosition>,
    tick: u64,
    stats: IndexStats,
}

impl KvIndex {
    /// An empty index.
    pub fn new(cfg: KvIndexConfig) -> Self {
        Self {
            cfg: KvIndexConfig {
                block_size: cfg.block_size.max(1),
                ..cfg
            },
            nodes: NodeStore::for_limit(cfg.max_blocks),
            engine_ids: FastMap::default(),
            routed_holds: FastMap::default(),
            gpu_holds: FastMap::default(),
            expiries: ExpiryQueue::default(),
            leaves: BTreeSet::new(),
            positions: FastMap::default(),
            tick: 0,
            stats: IndexStats::default(),
        }
    }

    /// Blocks in the index.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What the index has seen.
    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// Block size the index hashes with.
    pub fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    /// Applies one event from `worker`.
    pub fn apply(&mut self, worker: WorkerId, event: &KvEvent) -> Result<(), IndexError> {
        let result = match event {
            KvEvent::Stored {
                parent,
                block_ids,
                tokens,
                tier,
                lora_name,
                extra_keys,
            } => self.store(
                worker,
                *parent,
                block_ids,
                tokens,
                *tier,
                BlockKeys {
                    lora_name: lora_name.as_deref(),
                    extra: extra_keys.as_deref(),
                },
            ),
            KvEvent::Removed { block_ids, tier } => {
                self.remove(worker, block_ids, *tier);
                Ok(())
            }
            KvEvent::Cleared => {
                self.clear_worker(worker);
                Ok(())
            }
        };
        if result.is_err() {
            self.stats.events_rejected += 1;
        }
        self.prune_if_full();
        result
    }

    fn store(
        &mut self,
        worker: WorkerId,
        parent: Option<u64>,
        block_ids: &[u64],
        tokens: &[u32],
        tier: Tier,
        keys: BlockKeys<'_>,
    ) -> Result<(), IndexError> {
        let bs = self.cfg.block_size;
        if tier != Tier::Gpu && tokens.is_empty() && !block_ids.is_empty() {
            self.store_copies(worker, block_ids, tier);
            return Ok(());
        }
        if tokens.len() != block_ids.len() * bs {
            return Err(IndexError::BlockSizeMismatch {
                tokens: tokens.len(),
                blocks: block_ids.len(),
                block_size: bs,
            });
        }
        let ids = self.engine_ids.entry(worker).or_default();
        let mut prev = match parent {
            None => None,
            Some(p) => match ids.get(&p) {
                Some(&seq) => Some(seq),
                None => return Err(IndexError::UnknownParent { worker, parent: p }),
            },
        };
        // An engine's GPU prefix cache only stores a block whose parent it holds; anything
        // else would break the closure the matching relies on.
        if let (Some(seq), Tier::Gpu) = (prev, tier) {
            if !self
                .nodes
                .get(&seq)
                .is_some_and(|n| n.holds(worker, Some(Tier::Gpu)))
            {
                return Err(IndexError::ParentNotInGpu {
                    worker,
                    parent: parent.unwrap_or_default(),
                });
            }
        }
        let seed = block_seed(keys.lora_name, None);
        let n = block_ids.len();
        for (i, (&id, block)) in block_ids.iter().zip(tokens.chunks_exact(bs)).enumerate() {
            let local = local_block_hash(block, seed);
            let local = match keys.extra.and_then(|e| e.get(i)).filter(|&&k| k != 0) {
                Some(&k) => sequence_hash(local, k),
                None => local,
            };
            let seq = prev.map_or(local, |p| sequence_hash(p, local));
            self.add_holder(seq, worker, tier, id, None, ChainPos::of(prev, i, n));
            prev = Some(seq);
        }
        self.stats.blocks_stored += block_ids.len() as u64;
        Ok(())
    }

    /// Records `worker` holding, in `tier` (host memory, disk), copies of blocks it
    /// announced before under the engine ids `block_ids` (vLLM's offloading connector
    /// names offloaded blocks only). Ids it never announced, or no longer holds, are
    /// skipped: without their tokens they cannot be placed in a chain.
    fn store_copies(&mut self, worker: WorkerId, block_ids: &[u64], tier: Tier) {
        for &id in block_ids {
            let Some(seq) = self
                .engine_ids
                .get(&worker)
                .and_then(|m| m.get(&id))
                .copied()
            else {
                continue;
            };
            let parent = self.nodes.get(&seq).and_then(|n| n.parent);
            self.add_holder(seq, worker, tier, id, None, ChainPos::of(parent, 0, 1));
            self.stats.blocks_stored += 1;
        }
    }

    /// Records `worker` holding block `seq` in `tier`; returns the expiry the holder had
    /// before, or None if it is new. `pos` is where `seq` sits in the chain being added.
    fn add_holder(
        &mut self,
        seq: u64,
        worker: WorkerId,
        tier: Tier,
        engine_hash: u64,
        expires_at_ms: Option<u64>,
        pos: ChainPos,
    ) -> Option<Option<u64>> {
        self.tick += 1;
        let tick = self.tick;
        let parent = pos.parent;
        let (fresh, node) = self.nodes.get_or_insert(seq, parent);
        if node.children.is_empty() {
            if !fresh {
                self.leaves.remove(&(node.last_used, seq));
            }
            if !pos.child_follows {
                self.leaves.insert((tick, seq));
            }
        }
        node.last_used = tick;
        let (previous, replaced) = match node
            .holders
            .iter_mut()
            .find(|h| h.worker == worker && h.tier == tier)
        {
            Some(h) => {
                let replaced = *h;
                if tier == Tier::Gpu && replaced.expires_at_ms.is_none() && expires_at_ms.is_none()
                {
                    h.copies = h.copies.saturating_add(1);
                }
                h.engine_hash = engine_hash;
                h.expires_at_ms = expires_at_ms;
                // A routed GPU hold the engine now reports becomes an event-fed one.
                if tier == Tier::Gpu && replaced.expires_at_ms.is_some() && expires_at_ms.is_none()
                {
                    *self.gpu_holds.entry(worker).or_default() += 1;
                }
                (Some(replaced.expires_at_ms), Some(replaced))
            }
            None => {
                if tier == Tier::Gpu && expires_at_ms.is_none() {
                    *self.gpu_holds.entry(worker).or_default() += 1;
                }
                node.holders.push(Holder {
                    worker,
                    tier,
                    engine_hash,
                    expires_at_ms,
                    copies: 1,
                });
                node.recompute_prints();
                (None, None)
            }
        };
        if fresh {
            if let Some((p, pn)) = parent.and_then(|p| Some(p).zip(self.nodes.get_mut(&p))) {
                if pn.children.is_empty() && !pos.parent_in_chain {
                    self.leaves.remove(&(pn.last_used, p));
                }
                pn.children.push(seq);
            }
        }
        let routed = expires_at_ms.is_some();
        match replaced {
            // A hold that changed kind (an engine's event for a block the router had
            // routed there, or the reverse): its old bookkeeping goes.
            Some(old) if old.expires_at_ms.is_some() != routed => {
                let other_tier = self.nodes.get(&seq).is_some_and(|n| {
                    n.holders
                        .iter()
                        .any(|h| h.worker == worker && h.tier != tier)
                });
                self.forget_hold(&old, seq, !other_tier);
            }
            // A routed hold refreshed: already counted. (An event-fed one is mapped again
            // below: its engine id may have changed.)
            Some(_) if routed => return previous,
            _ => {}
        }
        if routed {
            *self.routed_holds.entry(worker).or_default() += 1;
        } else {
            self.engine_ids
                .entry(worker)
                .or_default()
                .insert(engine_hash, seq);
        }
        previous
    }

    /// Drops the bookkeeping of `h`, a hold on `seq` that is gone or replaced. An event-fed
    /// hold's engine id goes only when `last` (the worker holds `seq` in no other tier
    /// under that id).
    fn forget_hold(&mut self, h: &Holder, seq: u64, last: bool) {
        if h.tier == Tier::Gpu && h.expires_at_ms.is_none() {
            if let Some(n) = self.gpu_holds.get_mut(&h.worker) {
                *n = n.saturating_sub(1);
            }
        }
        if h.expires_at_ms.is_some() {
            if let Some(n) = self.routed_holds.get_mut(&h.worker) {
                *n = n.saturating_sub(1);
            }
        } else if last {
            if let Some(ids) = self.engine_ids.get_mut(&h.worker) {
                if ids.get(&h.engine_hash) == Some(&seq) {
                    ids.remove(&h.engine_hash);
                }
            }
        }
    }

    fn remove(&mut self, worker: WorkerId, block_ids: &[u64], tier: Tier) {
        for id in block_ids {
            let Some(seq) = self
                .engine_ids
                .get(&worker)
                .and_then(|m| m.get(id))
                .copied()
            else {
                continue;
            };
            let copy = self.nodes.get_mut(&seq).and_then(|n| {
                n.holders
                    .iter_mut()
                    .find(|h| h.worker == worker && h.tier == tier && h.copies > 1)
            });
            if let Some(h) = copy {
                h.copies -= 1;
                continue;
            }
            self.stats.blocks_removed += self.remove_cascade(seq, worker, Some(tier));
        }
    }

    /// Drops `worker`'s hold (in `tier`, or every tier) on `seq`, and keeps the closure: a
    /// dropped GPU hold drops the descendants' GPU holds, and a block the worker no longer
    /// holds in any tier drops all of the worker's holds below it. Deletes nodes nobody
    /// holds. Returns how many holds were dropped.
    fn remove_cascade(&mut self, seq: u64, worker: WorkerId, tier: Option<Tier>) -> u64 {
        let mut dropped = 0;
        let mut stack = vec![(seq, tier)];
        let mut emptied = Vec::new();
        while let Some((s, t)) = stack.pop() {
            let Some(node) = self.nodes.get_mut(&s) else {
                continue;
            };
            let mut gone = Vec::new();
            node.holders.retain(|h| {
                let hit = h.worker == worker && t.is_none_or(|t| h.tier == t);
                if hit {
                    gone.push(*h);
                }
                !hit
            });
            if gone.is_empty() {
                continue;
            }
            dropped += gone.len() as u64;
            node.recompute_prints();
            let still_held = node.holds(worker, None);
            let below = match (still_held, t) {
                (false, _) => Some(None),
                (true, Some(Tier::Gpu)) => Some(Some(Tier::Gpu)),
                (true, _) => None,
            };
            if let Some(below) = below {
                stack.extend(node.children.iter().map(|&c| (c, below)));
            }
            if node.holders.is_empty() {
                emptied.push(s);
            }
            for h in &gone {
                self.forget_hold(h, s, !still_held);
            }
        }
        for s in emptied.into_iter().rev() {
            self.gc(s);
        }
        dropped
    }

    /// Deletes `seq` if nobody holds it and it has no children, then tries its parent.
    fn gc(&mut self, mut seq: u64) {
        loop {
            let Some(node) = self.nodes.get(&seq) else {
                return;
            };
            if !node.holders.is_empty() || !node.children.is_empty() {
                return;
            }
            let (parent, last_used) = (node.parent, node.last_used);
            self.nodes.remove(&seq);
            self.leaves.remove(&(last_used, seq));
            let Some(p) = parent else { return };
            if let Some(pn) = self.nodes.get_mut(&p) {
                pn.children.retain(|c| *c != seq);
                if pn.children.is_empty() {
                    self.leaves.insert((pn.last_used, p));
                }
            }
            seq = p;
        }
    }

    /// Forgets everything `worker` holds (engine reset or worker gone).
    pub fn clear_worker(&mut self, worker: WorkerId) {
        self.positions.remove(&worker);
        let mut touched: Vec<u64> = self
            .engine_ids
            .remove(&worker)
            .map(|ids| ids.into_values().collect())
            .unwrap_or_default();
        self.gpu_holds.remove(&worker);
        // Its approximate holds are all in the expiry queue (a scan: a worker is cleared
        // when it resets or goes, not per request).
        if self.routed_holds.remove(&worker).is_some() {
            touched.extend(
                self.expiries
                    .iter()
                    .filter(|(_, w, _)| *w == worker)
                    .map(|&(_, _, seq)| seq),
            );
        }
        touched.sort_unstable();
        touched.dedup();
        for &seq in &touched {
            if let Some(node) = self.nodes.get_mut(&seq) {
                let before = node.holders.len();
                node.holders.retain(|h| h.worker != worker);
                self.stats.blocks_removed += (before - node.holders.len()) as u64;
                node.recompute_prints();
            }
        }
        for seq in touched {
            self.gc(seq);
        }
    }

    /// Approximate mode: records that the router sent a request with these block hashes to
    /// `worker`, valid until `now_ms + ttl_ms` rounded up to [`expiry_grain_ms`].
    ///
    /// The rounding bounds the expiry queue: a block refreshed many times within one grain
    /// keeps one queue entry instead of one per request, and a prompt routed again to the
    /// same worker within the grain costs one lookup (its last block is held at least that
    /// long, so every block before it is too: each insert refreshes the whole chain).
    pub fn insert_routed(&mut self, worker: WorkerId, hashes: &[u64], now_ms: u64, ttl_ms: u64) {
        let grain = expiry_grain_ms(ttl_ms);
        let expires = now_ms
            .saturating_add(ttl_ms)
            .div_ceil(grain)
            .saturating_mul(grain);
        let Some(&last) = hashes.last() else {
            return;
        };
        self.tick += 1;
        let tick = self.tick;
        let held = |ix: &Self, seq: u64| routed_until(&ix.nodes, seq, worker, expires);
        if held(self, last) {
            if let Some(node) = self.nodes.get_mut(&last) {
                if node.children.is_empty() {
                    self.leaves.remove(&(node.last_used, last));
                    self.leaves.insert((tick, last));
                }
                node.last_used = tick;
            }
            return;
        }
        // A block held until `expires` was put there by an insert that refreshed its whole
        // chain, so the blocks held so form a prefix: found in O(log n) lookups, and only
        // the rest (a session step's new blocks) is inserted, not the whole prompt again.
        let start = hashes.partition_point(|&seq| held(self, seq));
        let mut prev = start.checked_sub(1).map(|i| hashes[i]);
        let new = &hashes[start..];
        // Each block's map probe is a cache miss in a large index; probed in a tight loop
        // first, independent of each other, they overlap instead of waiting in turn.
        self.nodes.warm(new);
        for (i, &seq) in new.iter().enumerate() {
            let pos = ChainPos::of(prev, i, new.len());
            let previous = self.add_holder(seq, worker, Tier::Gpu, seq, Some(expires), pos);
            if previous != Some(Some(expires)) {
                self.expiries.push_back((expires, worker, seq));
            }
            prev = Some(seq);
        }
        self.prune_if_full();
    }

    /// One step of the expiry queue's compaction, when it holds more than twice the routed
    /// holds (and 4,096 entries): the entries of up to `chunks` chunks (4,096
    /// entries each as queued) whose hold is gone (pruned with its block) or was refreshed
    /// to a later grain since are dropped. Returns whether to call again: the queue is
    /// still over that bound and the pass over it has chunks left. The router's tick calls
    /// it a chunk at a time, giving up the index's lock between chunks.
    ///
    /// Without it the queue grew with every routed block for a whole TTL whatever the
    /// index's size (a live chain refreshed in each grain kept 16 entries per block, and a
    /// pruned block's entry stayed until its TTL): a router taking 171 KB agent session
    /// steps at ~1,050 a second (`bench proxy --peers`, `ownerserve` real) had an RSS of
    /// 1,454 and 1,289 MB after 61 s, 969 and 893 MB with this. Compacting the whole queue
    /// at once held the index 63–92 ms (`ownerserve bench kv`); a chunk, under 0.3 ms.
    pub fn compact_expiries_some(&mut self, chunks: usize) -> bool {
        let routed: usize = self.routed_holds.values().sum();
        let bound = (2 * routed).max(MIN_EXPIRY_COMPACTION);
        if self.expiries.len() <= bound {
            return false;
        }
        let nodes = &self.nodes;
        let more = self.expiries.compact_some(chunks, |&(at, worker, seq)| {
            routed_until(nodes, seq, worker, at)
        });
        more && self.expiries.len() > bound
    }

    /// Drops approximate-mode entries whose TTL has passed.
    pub fn expire(&mut self, now_ms: u64) {
        self.expire_some(now_ms, usize::MAX);
    }

    /// [`KvIndex::expire`], stopping after `budget` queue entries; returns how many it
    /// took (fewer than `budget`: nothing due is left). Expiries come due a grain at a
    /// time, and one grain of a full index can be all of its blocks, so the router's
    /// tick takes them in batches and gives up the index's lock between them: no request
    /// waits for a whole grain's removals (`ownerserve bench kv` times both).
    pub fn expire_some(&mut self, now_ms: u64, budget: usize) -> usize {
        let mut taken = 0;
        while taken < budget {
            let Some(&(at, worker, seq)) = self.expiries.front() else {
                break;
            };
            if at > now_ms {
                break;
            }
            self.expiries.pop_front();
            taken += 1;
            let still_due = self.nodes.get(&seq).is_some_and(|n| {
                n.holders
                    .iter()
                    .any(|h| h.worker == worker && h.expires_at_ms.is_some_and(|e| e <= now_ms))
            });
            if still_due {
                self.stats.blocks_expired += self.remove_cascade(seq, worker, Some(Tier::Gpu));
            }
        }
        taken
    }

    /// Evicts least recently used chains, a leaf at a time, until the index is within
    /// `max_blocks`: O(log n) per block evicted, so an insert evicts at most about as many
    /// blocks as it added and never scans the index.
    fn prune_if_full(&mut self) {
        while self.nodes.len() > self.cfg.max_blocks {
            let Some((_, leaf)) = self.leaves.pop_first() else {
                return;
            };
            self.evict_up(leaf);
        }
    }

    /// Evicts `seq` (a leaf, already out of the eviction order), then each ancestor it
    /// leaves childless that would be the next leaf to go anyway (older than every leaf in
    /// the order: a chain's blocks were used in order, so a chain usually goes whole this
    /// way without entering the order block by block), while the index is over its size.
    /// The block where it stops enters the order, or goes if nobody holds it.
    fn evict_up(&mut self, mut seq: u64) {
        let Some(mut slot) = self.nodes.slot(&seq) else {
            return;
        };
        // Where the walk stops short of a root: that block enters the eviction order.
        let mut stopped = None;
        loop {
            let node = self.nodes.take(slot, seq);
            if !node.holders.is_empty() {
                self.stats.blocks_pruned += 1;
            }
            for h in &node.holders {
                self.forget_hold(h, seq, true);
            }
            let Some((p, parent)) = node.parent.zip(self.nodes.parent_slot(&node, seq)) else {
                break;
            };
            let pn = self.nodes.at_mut(parent);
            pn.children.retain(|c| *c != seq);
            if !pn.children.is_empty() {
                break;
            }
            let key = (pn.last_used, p);
            let goes_next = self.nodes.len() > self.cfg.max_blocks
                && self.leaves.first().is_none_or(|&first| key < first);
            if !goes_next {
                self.leaves.insert(key);
                stopped = Some(p);
                break;
            }
            (seq, slot) = (p, parent);
        }
        // Every way out of the walk unmaps what it took, before anything looks blocks up.
        self.nodes.unmap_taken();
        if let Some(p) = stopped {
            self.gc(p);
        }
    }

    /// Marks `seq` (the deepest block a request matched) as just used, so its chain is
    /// the last to be evicted.
    pub fn touch(&mut self, seq: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(node) = self.nodes.get_mut(&seq) {
            if node.children.is_empty() {
                self.leaves.remove(&(node.last_used, seq));
                self.leaves.insert((tick, seq));
            }
            node.last_used = tick;
        }
    }

    /// Blocks `worker` holds in any tier.
    pub fn worker_blocks(&self, worker: WorkerId) -> usize {
        self.engine_ids.get(&worker).map_or(0, |m| m.len())
            + self.routed_holds.get(&worker).copied().unwrap_or(0)
    }

    /// Blocks `worker` holds in GPU memory: what takes room in its HBM (host-tier holds
    /// do not).
    pub fn worker_gpu_blocks(&self, worker: WorkerId) -> usize {
        self.gpu_holds.get(&worker).copied().unwrap_or(0)
            + self.routed_holds.get(&worker).copied().unwrap_or(0)
    }

    /// How many distinct blocks some GPU holds, and how many GPU copies of them there are
    /// (one per worker holding a block in GPU memory); `copies / blocks` is the fleet's HBM
    /// duplication. Walks the whole index: for scrapes, not the request path.
    pub fn gpu_replication(&self) -> GpuReplication {
        let mut out = GpuReplication::default();
        for node in self.nodes.values() {
            let copies = node
                .holders
                .iter()
                .enumerate()
                .filter(|(i, h)| {
                    h.tier == Tier::Gpu
                        && !node.holders[..*i]
                            .iter()
                            .any(|x| x.tier == Tier::Gpu && x.worker == h.worker)
                })
                .count() as u64;
            if copies > 0 {
                out.blocks += 1;
                out.copies += copies;
            }
        }
        out
    }

    /// A fingerprint of [`KvIndex::dump`]: equal for indexes holding the same blocks.
    pub fn digest(&self) -> u64 {
        self.digest_of(|_| true)
    }

    /// A fingerprint of the blocks one worker holds: comparing it per worker tells which
    /// worker two indexes disagree on.
    pub fn worker_digest(&self, worker: WorkerId) -> u64 {
        self.digest_of(|w| w == worker)
    }

    fn digest_of(&self, keep: impl Fn(WorkerId) -> bool) -> u64 {
        let mut bytes = Vec::with_capacity(self.nodes.len() * 13);
        for (seq, worker, tier) in self.dump().into_iter().filter(|h| keep(h.1)) {
            bytes.extend_from_slice(&seq.to_le_bytes());
            bytes.extend_from_slice(&worker.0.to_le_bytes());
            bytes.push(tier as u8);
        }
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// Every `(sequence hash, worker, tier)` held, sorted: a canonical dump for comparing
    /// two indexes (router replicas) and for tests.
    pub fn dump(&self) -> Vec<(u64, WorkerId, Tier)> {
        let mut out: Vec<_> = self
            .nodes
            .iter()
            .flat_map(|(&s, n)| n.holders.iter().map(move |h| (s, h.worker, h.tier)))
            .collect();
        out.sort_unstable();
        out
    }
}

/// What besides its tokens keys a stored block: the LoRA adapter that computed it and the
/// engine's extra keys (multimodal inputs, salt). Blocks that differ in either chain apart.
#[derive(Debug, Clone, Copy)]
struct BlockKeys<'a> {
    lora_name: Option<&'a str>,
    extra: Option<&'a [u64]>,
}
