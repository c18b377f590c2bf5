//! A worker's event-fed holds copied from one index into another: what lets a router that
//! starts (or restarts, as in a rolling upgrade) beside a running peer know the engines'
//! caches from before their replay buffers begin. Without it, a block stored before the
//! buffer's first batch is unknown to the new router, and so is every block stored under
//! it later (an event naming an unknown parent is refused): a long agent session's chain
//! stays invisible for as long as the engine keeps it.
//!
//! The copy carries the stream position its holds end with ([`StreamPosition`], recorded
//! with each batch under the index's lock, so the two agree); the new router's subscriber
//! resumes the engine's stream from there, and a replay that no longer reaches back to it
//! starts the worker over, as for a new engine.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{ChainPos, KvIndex, Tier};
use crate::ids::WorkerId;

/// How far an index has applied one worker's event stream: the last batch's sequence
/// number and the xxh3 of its payload (which tells a replay of the same engine from a new
/// one's batch of the same number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPosition {
    pub seq: u64,
    pub payload: u64,
}

/// One `(block, tier)` a worker holds, as its engine announced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopiedHold {
    /// Our sequence hash of the block.
    pub seq: u64,
    /// Our sequence hash of its parent (none at a chain's root).
    pub parent: Option<u64>,
    /// The engine's id for it.
    pub engine_hash: u64,
    pub tier: Tier,
    /// Copies the engine announced (see `Holder::copies`).
    pub copies: u32,
}

/// A worker's event-fed holds, parents before children, and the stream position they end
/// with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCopy {
    /// Tokens per block of the index that made it: sequence hashes of another block size
    /// name other blocks.
    pub block_size: usize,
    pub position: StreamPosition,
    pub holds: Vec<CopiedHold>,
}

/// Why a copy was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    #[error("the copy hashes blocks of {copy} tokens, this index {ours}")]
    BlockSize { copy: usize, ours: usize },
}

impl KvIndex {
    /// Records that `worker`'s stream is applied through `at` (call it under the same lock
    /// as the batch's events).
    pub fn set_position(&mut self, worker: WorkerId, at: StreamPosition) {
        self.positions.insert(worker, at);
    }

    /// How far `worker`'s stream is applied, if it is event-fed and not reset since.
    pub fn position(&self, worker: WorkerId) -> Option<StreamPosition> {
        self.positions.get(&worker).copied()
    }

    /// `worker`'s event-fed holds and the position they end with; `None` if its stream
    /// position is not known (no batch applied since the index last forgot it).
    pub fn copy_worker(&self, worker: WorkerId) -> Option<WorkerCopy> {
        let position = self.position(worker)?;
        let ids = self.engine_ids.get(&worker);
        let held: HashSet<u64> = ids
            .map(|m| m.values().copied().collect())
            .unwrap_or_default();
        let mut holds = Vec::with_capacity(held.len());
        let mut done = HashSet::with_capacity(held.len());
        let mut path = Vec::new();
        for &start in &held {
            // Up the chain to a block already copied (or the root), then down again: a
            // parent always goes before its children.
            let mut at = Some(start);
            while let Some(seq) = at.filter(|s| held.contains(s) && !done.contains(s)) {
                path.push(seq);
                at = self.nodes.get(&seq).and_then(|n| n.parent);
            }
            for seq in path.drain(..).rev() {
                done.insert(seq);
                let Some(node) = self.nodes.get(&seq) else {
                    continue;
                };
                holds.extend(
                    node.holders
                        .iter()
                        .filter(|h| h.worker == worker && h.expires_at_ms.is_none())
                        .map(|h| CopiedHold {
                            seq,
                            parent: node.parent,
                            engine_hash: h.engine_hash,
                            tier: h.tier,
                            copies: h.copies,
                        }),
                );
            }
        }
        Some(WorkerCopy {
            block_size: self.cfg.block_size,
            position,
            holds,
        })
    }

    /// Replaces what `worker` holds with `copy` (another index's [`KvIndex::copy_worker`])
    /// and takes its stream position. A hold whose parent the copy did not give first (in
    /// the same tier, for GPU memory) is skipped, as an event would be refused: the index's
    /// closure is kept whatever the copy says. Returns the holds taken.
    pub fn take_copy(&mut self, worker: WorkerId, copy: &WorkerCopy) -> Result<usize, CopyError> {
        if copy.block_size != self.cfg.block_size {
            return Err(CopyError::BlockSize {
                copy: copy.block_size,
                ours: self.cfg.block_size,
            });
        }
        self.clear_worker(worker);
        let mut taken = 0;
        for h in &copy.holds {
            let parent_held = h.parent.is_none_or(|p| {
                let tier = (h.tier == Tier::Gpu).then_some(Tier::Gpu);
                self.nodes.get(&p).is_some_and(|n| n.holds(worker, tier))
            });
            if !parent_held {
                self.stats.events_rejected += 1;
                continue;
            }
            self.add_holder(
                h.seq,
                worker,
                h.tier,
                h.engine_hash,
                None,
                ChainPos::of(h.parent, 0, 1),
            );
            if let Some(held) = self.nodes.get_mut(&h.seq).and_then(|n| {
                n.holders
                    .iter_mut()
                    .find(|x| x.worker == worker && x.tier == h.tier)
            }) {
                held.copies = h.copies.max(1);
            }
            taken += 1;
        }
        self.stats.blocks_stored += taken as u64;
        self.set_position(worker, copy.position);
        self.prune_if_full();
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_index::{KvEvent, KvIndexConfig};

    fn stored(parent: Option<u64>, ids: &[u64], first_token: u32, tier: Tier) -> KvEvent {
        KvEvent::Stored {
            parent,
            block_ids: ids.to_vec(),
            tokens: (0..ids.len() as u32 * 4).map(|t| first_token + t).collect(),
            tier,
            lora_name: None,
            extra_keys: None,
        }
    }

    fn index() -> KvIndex {
        KvIndex::new(KvIndexConfig {
            block_size: 4,
            max_blocks: 1000,
        })
    }

    const W: WorkerId = WorkerId(3);
    const AT: StreamPosition = StreamPosition {
        seq: 41,
        payload: 7,
    };

    /// An index fed a branching chain, a duplicate copy and a host-tier copy for `W`, and
    /// another worker's chain.
    fn fed() -> KvIndex {
        let mut ix = index();
        ix.apply(W, &stored(None, &[1, 2, 3], 0, Tier::Gpu))
            .unwrap();
        ix.apply(W, &stored(Some(2), &[4], 100, Tier::Gpu)).unwrap();
        ix.apply(W, &stored(Some(3), &[5, 6], 200, Tier::Gpu))
            .unwrap();
        // vLLM computed block 6 again: two copies, removed one at a time.
        ix.apply(W, &stored(Some(5), &[6], 204, Tier::Gpu)).unwrap();
        ix.apply(
            W,
            &KvEvent::Stored {
                parent: None,
                block_ids: vec![1, 2],
                tokens: vec![],
                tier: Tier::Cpu,
                lora_name: None,
                extra_keys: None,
            },
        )
        .unwrap();
        ix.apply(WorkerId(9), &stored(None, &[1, 2], 0, Tier::Gpu))
            .unwrap();
        ix.set_position(W, AT);
        ix
    }

    #[test]
    fn a_copy_rebuilds_the_workers_holds_and_what_later_events_do_to_them() {
        let live = fed();
        let copy = live.copy_worker(W).unwrap();
        assert_eq!(copy.position, AT);
        assert_eq!(copy.holds.len(), 8, "{copy:?}");
        let mut new = index();
        new.apply(WorkerId(9), &stored(None, &[1, 2], 0, Tier::Gpu))
            .unwrap();
        assert_eq!(new.take_copy(W, &copy), Ok(8));
        assert_eq!(new.position(W), Some(AT));
        assert_eq!(new.worker_digest(W), live.worker_digest(W));
        assert_eq!(new.digest(), live.digest());
        // The same later events land the same way on both: a child under a block that
        // predates them, and removals, the duplicate's one copy at a time.
        let later = [
            stored(Some(6), &[7], 300, Tier::Gpu),
            KvEvent::Removed {
                block_ids: vec![6],
                tier: Tier::Gpu,
            },
            KvEvent::Removed {
                block_ids: vec![4],
                tier: Tier::Gpu,
            },
        ];
        let mut live = live;
        for ev in &later {
            live.apply(W, ev).unwrap();
            new.apply(W, ev).unwrap();
            assert_eq!(new.digest(), live.digest(), "after {ev:?}");
        }
        assert_eq!(new.worker_blocks(W), live.worker_blocks(W));
        // The last copy of block 6 goes, and its child with it.
        for ix in [&mut live, &mut new] {
            ix.apply(
                W,
                &KvEvent::Removed {
                    block_ids: vec![6],
                    tier: Tier::Gpu,
                },
            )
            .unwrap();
        }
        assert_eq!(new.digest(), live.digest());
        // GPU 1, 2, 3, 5 (1 and 2 also in host memory, under the same engine ids).
        assert_eq!(new.worker_blocks(W), 4);
    }

    #[test]
    fn a_copy_of_another_block_size_or_without_its_parents_is_not_taken() {
        let copy = fed().copy_worker(W).unwrap();
        let mut other = KvIndex::new(KvIndexConfig {
            block_size: 16,
            max_blocks: 1000,
        });
        assert_eq!(
            other.take_copy(W, &copy),
            Err(CopyError::BlockSize { copy: 4, ours: 16 })
        );
        // Children listed before their parents are refused, as out-of-order events are.
        let mut reversed = copy.clone();
        reversed.holds.reverse();
        let mut ix = index();
        let taken = ix.take_copy(W, &reversed).unwrap();
        assert!(taken < copy.holds.len(), "{taken}");
        assert!(ix.stats().events_rejected > 0);
    }

    #[test]
    fn a_reset_worker_has_no_position_to_copy() {
        let mut ix = fed();
        ix.clear_worker(W);
        assert_eq!(ix.position(W), None);
        assert_eq!(ix.copy_worker(W), None);
        assert_eq!(index().copy_worker(W), None);
    }
}
