//! The index's blocks by sequence hash: nodes in a slab, found through a map of slot
//! numbers.
//!
//! Why not a map holding the nodes (`FastMap<u64, Node>`, as before): in a full index every
//! new block evicts an old one, and an eviction walks its chain up through the parent
//! links. With the nodes inline in a 1M-block map (120 B buckets) each step of that walk
//! and each insert waited on two dependent cache misses (the map's control bytes, then the
//! bucket): ~1 µs per block recorded, so a new 40K-token session's prompt took 2–3.5 ms
//! of the router's core. Here:
//! - the map holds 16 B per block, and a freed slot is the next new block's, still cached
//!   from the eviction that freed it;
//! - each node keeps its parent's slot as a hint, so the walk up a chain reads the parent
//!   directly instead of probing the map;
//! - the map entries of a walk's evicted blocks are removed together at its end, and a
//!   chain's new blocks are probed together before their inserts: independent probes,
//!   whose misses overlap instead of waiting in turn.
//!
//! `ownerserve bench kv` ("record a routed 2500-block prompt into a full 1M-block index"):
//! 0.31–0.38× the time of the map of nodes, run by run; figures in docs/BENCHMARKS.md.

use std::collections::hash_map::Entry;

use super::fast_hash::FastMap;
use super::Node;

/// Nodes keyed by sequence hash.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeStore {
    /// Sequence hash → slot in `nodes`.
    slots: FastMap<u64, usize>,
    /// Live nodes, and default ones in the free slots.
    nodes: Vec<Node>,
    /// Free slots, the most recently freed last (reused first: still in cache).
    free: Vec<usize>,
    /// Hashes of nodes taken out by [`NodeStore::take`] whose map entries are still to go
    /// ([`NodeStore::unmap_taken`]): removed together, their probes' misses overlap.
    taken: Vec<u64>,
    /// The index's limit (0: none known); see [`NodeStore::make_room`].
    max_blocks: usize,
    /// Whether the map was sized for a full index.
    sized_for_full: bool,
}

/// Above this limit the map is left to grow as it needs (a limit that large is "no
/// limit" in practice, and its room would be memory spent up front).
const MOST_PRESIZED: usize = 1 << 26;

impl NodeStore {
    /// An empty store for an index of at most `max_blocks` blocks.
    pub(super) fn for_limit(max_blocks: usize) -> Self {
        Self {
            max_blocks,
            ..Self::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.taken.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn contains_key(&self, seq: &u64) -> bool {
        self.slots.contains_key(seq)
    }

    pub(super) fn get(&self, seq: &u64) -> Option<&Node> {
        self.slots.get(seq).map(|&i| &self.nodes[i])
    }

    pub(super) fn get_mut(&mut self, seq: &u64) -> Option<&mut Node> {
        self.slots.get(seq).map(|&i| &mut self.nodes[i])
    }

    /// Where `seq`'s node sits.
    pub(super) fn slot(&self, seq: &u64) -> Option<usize> {
        self.slots.get(seq).copied()
    }

    /// The node in `slot` (one [`NodeStore::slot`] or [`NodeStore::parent_slot`] gave).
    pub(super) fn at_mut(&mut self, slot: usize) -> &mut Node {
        &mut self.nodes[slot]
    }

    /// Where the parent of `node` (block `seq`) sits: its hint if that slot holds a node
    /// with `seq` as a child, else looked up.
    pub(super) fn parent_slot(&self, node: &Node, seq: u64) -> Option<usize> {
        let hinted = node
            .parent_slot
            .map(|s| s as usize)
            .filter(|&s| self.nodes.get(s).is_some_and(|n| n.children.contains(&seq)));
        hinted.or_else(|| self.slots.get(&node.parent?).copied())
    }

    /// `seq`'s node, made (as a child of `parent`) if there is none; true if it was made.
    pub(super) fn get_or_insert(&mut self, seq: u64, parent: Option<u64>) -> (bool, &mut Node) {
        debug_assert!(self.taken.is_empty(), "a freed slot is still mapped");
        if self.slots.len() >= self.slots.capacity() {
            self.make_room();
        }
        let parent_slot = parent
            .and_then(|p| self.slots.get(&p))
            .and_then(|&s| u32::try_from(s).ok());
        let (fresh, slot) = match self.slots.entry(seq) {
            Entry::Occupied(e) => (false, *e.get()),
            Entry::Vacant(e) => {
                let node = Node {
                    parent,
                    parent_slot,
                    ..Node::default()
                };
                let slot = match self.free.pop() {
                    Some(slot) => {
                        self.nodes[slot] = node;
                        slot
                    }
                    None => {
                        self.nodes.push(node);
                        self.nodes.len() - 1
                    }
                };
                e.insert(slot);
                (true, slot)
            }
        };
        (fresh, &mut self.nodes[slot])
    }

    /// Sizes the map for a full index once it holds half of one: room for twice the
    /// limit.
    ///
    /// Why: a full index inserts a block and removes one for every block it records. A
    /// removal where the map is crowded leaves a tombstone, which takes room until the
    /// next rehash. A map sized just above its blocks (a doubling leaves it at most
    /// 7/8 full) runs out of room to tombstones after enough churn, and then it doubles
    /// again, into fresh memory, rehashing every entry under the index's lock. In one
    /// 8 s `perf` window of a router taking 171 KB session steps (`bench proxy --peers`,
    /// `ownerserve` real, 1M-block index) that doubling and its page faults were 5% of the
    /// router's samples. Sized at twice the limit, the map reaches the size that doubling
    /// gave anyway, while it fills; under a quarter full, a removal almost never leaves a
    /// tombstone, and when room does run out the map is rehashed in place.
    fn make_room(&mut self) {
        let full = self.max_blocks.saturating_mul(2);
        if self.sized_for_full
            || self.max_blocks == 0
            || full > MOST_PRESIZED
            || self.slots.len() < self.max_blocks / 2
        {
            return;
        }
        self.slots.reserve(full - self.slots.len());
        self.sized_for_full = true;
    }

    /// Brings the map's entries for `seqs` into cache ahead of their inserts: the probes
    /// do not depend on each other, so their misses overlap.
    pub(super) fn warm(&self, seqs: &[u64]) {
        let found = seqs.iter().filter(|s| self.slots.contains_key(s)).count();
        std::hint::black_box(found);
    }

    /// Takes `seq`'s node out; its slot is reused by the next new node.
    pub(super) fn remove(&mut self, seq: &u64) -> Option<Node> {
        let slot = self.slots.remove(seq)?;
        self.free.push(slot);
        Some(std::mem::take(&mut self.nodes[slot]))
    }

    /// Takes the node of `seq` out of `slot`, leaving its map entry until
    /// [`NodeStore::unmap_taken`], which must come before anything else looks `seq` up or
    /// inserts.
    pub(super) fn take(&mut self, slot: usize, seq: u64) -> Node {
        self.free.push(slot);
        self.taken.push(seq);
        std::mem::take(&mut self.nodes[slot])
    }

    /// Removes the map entries of the nodes [`NodeStore::take`] took out.
    pub(super) fn unmap_taken(&mut self) {
        for seq in self.taken.drain(..) {
            self.slots.remove(&seq);
        }
    }

    /// Every node with its sequence hash, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &Node)> {
        self.slots.iter().map(|(seq, &i)| (seq, &self.nodes[i]))
    }

    /// Every node, in slab order: a walk of the whole index reads the slab front to back
    /// (through the map, each node would be a random read).
    pub(super) fn values(&self) -> impl Iterator<Item = &Node> {
        let mut free = self.free.clone();
        free.sort_unstable();
        let mut free = free.into_iter().peekable();
        self.nodes.iter().enumerate().filter_map(move |(i, node)| {
            if free.next_if_eq(&i).is_some() {
                return None;
            }
            Some(node)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots are reused, most recently freed first; a reused slot holds only its new node;
    /// a child's parent is found through its hint, and without it once the hint is stale.
    #[test]
    fn a_freed_slot_is_the_next_new_nodes_and_parents_are_found_by_hint() {
        let mut store = NodeStore::default();
        let mut parent = None;
        for seq in 1..=3 {
            let (fresh, node) = store.get_or_insert(seq, parent);
            assert!(fresh);
            node.last_used = seq * 10;
            if let Some(n) = parent.and_then(|p| store.get_mut(&p)) {
                n.children.push(seq);
            }
            parent = Some(seq);
        }
        let (fresh, node) = store.get_or_insert(2, Some(1));
        assert!(!fresh, "an existing node is returned, not made");
        assert_eq!(node.last_used, 20);
        let three = store.get(&3).cloned().unwrap_or_default();
        assert_eq!(store.parent_slot(&three, 3), store.slot(&2));
        // Taken out: gone from the count at once, from the map when unmapped.
        let slot = store.slot(&3).unwrap_or_default();
        assert_eq!(store.take(slot, 3).last_used, 30);
        assert_eq!(store.len(), 2);
        store.unmap_taken();
        assert!(!store.contains_key(&3));
        let (fresh, node) = store.get_or_insert(7, Some(2));
        assert!(fresh);
        assert_eq!((node.parent, node.last_used), (Some(2), 0));
        assert_eq!(store.nodes.len(), 3, "slot 2 was reused");
        // A hint to a slot whose node does not have the child is not trusted.
        let stale = Node {
            parent: Some(1),
            parent_slot: store.slot(&7).and_then(|s| u32::try_from(s).ok()),
            ..Node::default()
        };
        assert_eq!(store.parent_slot(&stale, 2), store.slot(&1));
        assert_eq!(store.remove(&2).map(|n| n.last_used), Some(20));
        let mut seen: Vec<(u64, u64)> = store.iter().map(|(&s, n)| (s, n.last_used)).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![(1, 10), (7, 0)]);
        let mut walked: Vec<u64> = store.values().map(|n| n.last_used).collect();
        walked.sort_unstable();
        assert_eq!(walked, vec![0, 10], "free slots are skipped");
    }

    /// A full index inserts a block and removes one, over and over. The map must not
    /// grow (into fresh memory, rehashing every entry) once it holds the limit.
    #[test]
    fn a_full_stores_churn_never_grows_its_map() {
        let max = 1 << 14;
        let mut store = NodeStore::for_limit(max);
        let mut seq = 0u64;
        let mut next = || {
            seq += 1;
            seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        let mut live = std::collections::VecDeque::new();
        for _ in 0..max {
            let s = next();
            store.get_or_insert(s, None);
            live.push_back(s);
        }
        let sized = store.slots.capacity() + store.slots.len();
        for _ in 0..20 * max {
            let s = next();
            store.get_or_insert(s, None);
            live.push_back(s);
            let old = live.pop_front().unwrap_or_default();
            store.remove(&old);
            assert!(
                store.slots.capacity() + store.slots.len() <= sized,
                "the map grew from {sized} to {} entries' room",
                store.slots.capacity() + store.slots.len()
            );
        }
    }
}
