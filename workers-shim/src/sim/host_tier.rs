//! The host-DRAM tier of one engine: KV blocks evicted from HBM are copied here instead of
//! dropped, kept least-recently-used first, and restored over PCIe when a prompt's prefix
//! continues into them (vLLM's CPU `OffloadingConnector` with its `LRUOffloadingManager`,
//! LMCache's local CPU backend).
//!
//! vLLM's connector stores every computed block write-through; this tier stores a block
//! when HBM evicts it (or a demotion drops it), which holds the same set of restorable
//! blocks as long as the host tier is larger than HBM, without a copy per computed block.
//! Changes are queued as hash lists ([`HostTier::take_changes`]) for the scheduler to
//! publish as `BlockStored`/`BlockRemoved` events with `medium = "CPU"`.

use std::collections::{BTreeMap, HashMap};

/// One block held in host memory.
#[derive(Debug, Clone)]
struct Entry {
    parent: Option<u64>,
    tokens: Vec<u32>,
    /// Its place in the LRU order.
    tick: u64,
}

/// Hashes stored in and removed from the tier since the last [`HostTier::take_changes`],
/// in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostChanges {
    pub stored: Vec<u64>,
    pub removed: Vec<u64>,
}

/// A fixed number of host-memory KV blocks, LRU.
#[derive(Debug, Clone, Default)]
pub struct HostTier {
    capacity: usize,
    entries: HashMap<u64, Entry>,
    /// tick → hash, oldest first.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    changes: HostChanges,
    /// Blocks copied in so far (a block already held is not copied again).
    offloaded: u64,
    /// Blocks read back so far.
    restored: u64,
}

impl HostTier {
    /// A tier of `capacity` blocks; 0 holds nothing (no host tier).
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity as usize,
            ..Self::default()
        }
    }

    /// Whether the tier can hold anything.
    pub fn is_enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Blocks it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Blocks copied in so far.
    pub fn offloaded(&self) -> u64 {
        self.offloaded
    }

    /// Blocks read back into HBM so far.
    pub fn restored(&self) -> u64 {
        self.restored
    }

    /// Whether it holds `hash`.
    pub fn contains(&self, hash: u64) -> bool {
        self.entries.contains_key(&hash)
    }

    /// How many leading hashes of `hashes` it holds (a miss ends the run).
    pub fn longest_prefix(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.entries.contains_key(h))
            .count()
    }

    fn bump(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Copies an HBM block's content in, evicting the least recently used blocks to make
    /// room. A block already held only becomes the most recently used. No-op when off.
    pub fn offload(&mut self, hash: u64, parent: Option<u64>, tokens: Vec<u32>) {
        if self.capacity == 0 {
            return;
        }
        let tick = self.bump();
        if let Some(e) = self.entries.get_mut(&hash) {
            self.lru.remove(&e.tick);
            e.tick = tick;
            self.lru.insert(tick, hash);
            return;
        }
        while self.entries.len() >= self.capacity {
            let Some((_, old)) = self.lru.pop_first() else {
                break;
            };
            self.entries.remove(&old);
            self.changes.removed.push(old);
        }
        self.entries.insert(
            hash,
            Entry {
                parent,
                tokens,
                tick,
            },
        );
        self.lru.insert(tick, hash);
        self.changes.stored.push(hash);
        self.offloaded += 1;
    }

    /// Reads a block back for a restore: its parent and tokens. The host copy stays (it is
    /// a cache: the next eviction from HBM then copies nothing) and becomes the most
    /// recently used.
    pub fn restore(&mut self, hash: u64) -> Option<(Option<u64>, Vec<u32>)> {
        let tick = self.bump();
        let e = self.entries.get_mut(&hash)?;
        self.lru.remove(&e.tick);
        e.tick = tick;
        self.lru.insert(tick, hash);
        self.restored += 1;
        Some((e.parent, e.tokens.clone()))
    }

    /// Drops every block (a cache reset); returns how many were held.
    pub fn clear(&mut self) -> usize {
        let n = self.entries.len();
        self.changes.removed.extend(self.lru.values().copied());
        self.entries.clear();
        self.lru.clear();
        n
    }

    /// The changes queued since the last call.
    pub fn take_changes(&mut self) -> HostChanges {
        std::mem::take(&mut self.changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_tier_holds_nothing() {
        let mut t = HostTier::new(0);
        t.offload(1, None, vec![1]);
        assert!(!t.is_enabled());
        assert!(t.is_empty());
        assert_eq!(t.take_changes(), HostChanges::default());
    }

    #[test]
    fn evicts_least_recently_used_and_restores_keep_the_copy() {
        let mut t = HostTier::new(2);
        t.offload(1, None, vec![1, 2]);
        t.offload(2, Some(1), vec![3, 4]);
        // Restoring 1 makes it the most recent: 2 goes first.
        assert_eq!(t.restore(1), Some((None, vec![1, 2])));
        t.offload(3, Some(2), vec![5, 6]);
        assert!(t.contains(1) && t.contains(3) && !t.contains(2));
        assert_eq!(t.longest_prefix(&[1, 2, 3]), 1);
        assert_eq!(
            t.take_changes(),
            HostChanges {
                stored: vec![1, 2, 3],
                removed: vec![2],
            }
        );
        // Offloading a held block copies nothing again.
        t.offload(1, None, vec![1, 2]);
        assert_eq!(t.offloaded(), 3);
        assert_eq!(t.restored(), 1);
        assert!(t.take_changes().stored.is_empty());
        assert_eq!(t.restore(9), None);
    }
}
