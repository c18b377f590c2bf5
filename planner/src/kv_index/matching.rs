//! Longest-prefix match of a request's hash chain against every worker.
//!
//! Because each worker's GPU holds and any-tier holds are prefix-closed, each holder set
//! shrinks monotonically along the chain. Bisection between two depths whose fingerprints
//! are equal can stop (everything between is the same set); otherwise it splits until it
//! finds the boundary depths where workers drop out: their match depth is that boundary.

use super::{KvIndex, Node, Tier};
use crate::ids::WorkerId;

/// How far one worker matches the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerMatch {
    pub worker: WorkerId,
    /// Leading blocks held in GPU memory.
    pub gpu_blocks: u32,
    /// Leading blocks held in any tier.
    pub any_blocks: u32,
}

/// Reusable buffers for [`KvIndex::find_matches`], so the router's hot path does not
/// allocate per request.
#[derive(Debug, Default)]
pub struct MatchScratch {
    stack: Vec<(usize, usize)>,
}

#[derive(Clone, Copy)]
enum Set {
    Gpu,
    Any,
}

impl Set {
    fn tier(self) -> Option<Tier> {
        match self {
            Set::Gpu => Some(Tier::Gpu),
            Set::Any => None,
        }
    }

    fn print(self, node: Option<&Node>) -> u64 {
        node.map_or(0, |n| match self {
            Set::Gpu => n.print_gpu,
            Set::Any => n.print_any,
        })
    }
}

impl KvIndex {
    /// Fills `out` with every worker that holds at least the first block, and how far it
    /// matches `hashes` (a request's sequence hashes, in order).
    pub fn find_matches(
        &self,
        hashes: &[u64],
        scratch: &mut MatchScratch,
        out: &mut Vec<WorkerMatch>,
    ) {
        out.clear();
        let n = hashes.len();
        if n == 0 || !self.nodes.contains_key(&hashes[0]) {
            return;
        }
        for set in [Set::Gpu, Set::Any] {
            self.bisect(hashes, set, scratch, out);
        }
    }

    fn bisect(
        &self,
        hashes: &[u64],
        set: Set,
        scratch: &mut MatchScratch,
        out: &mut Vec<WorkerMatch>,
    ) {
        let n = hashes.len();
        let at = |d: usize| self.nodes.get(&hashes[d]);
        let tier = set.tier();
        // Everyone in the last block's set matches the whole chain.
        if let Some(last) = at(n - 1) {
            for h in last
                .holders
                .iter()
                .filter(|h| tier.is_none_or(|t| h.tier == t))
            {
                record(out, h.worker, set, n);
            }
        }
        scratch.stack.clear();
        scratch.stack.push((0, n - 1));
        while let Some((lo, hi)) = scratch.stack.pop() {
            if lo >= hi || set.print(at(lo)) == set.print(at(hi)) {
                continue;
            }
            if hi == lo + 1 {
                // Workers in the set at `lo` but not at `hi` match exactly `lo + 1` blocks.
                let (here, next) = (at(lo), at(hi));
                for h in here.into_iter().flat_map(|n| n.holders.iter()) {
                    if tier.is_some_and(|t| h.tier != t) {
                        continue;
                    }
                    if !next.is_some_and(|nx| nx.holds(h.worker, tier)) {
                        record(out, h.worker, set, lo + 1);
                    }
                }
                continue;
            }
            let mid = lo + (hi - lo) / 2;
            scratch.stack.push((mid, hi));
            scratch.stack.push((lo, mid));
        }
    }

    /// The match a plain walk finds: per worker, blocks until the first miss (GPU, and any
    /// tier). The reference the bisection is tested against.
    pub fn find_matches_linear(&self, hashes: &[u64]) -> Vec<WorkerMatch> {
        let mut out = Vec::new();
        let Some(first) = hashes.first().and_then(|h| self.nodes.get(h)) else {
            return out;
        };
        for h in &first.holders {
            for set in [Set::Gpu, Set::Any] {
                let depth = hashes
                    .iter()
                    .take_while(|s| {
                        self.nodes
                            .get(s)
                            .is_some_and(|n| n.holds(h.worker, set.tier()))
                    })
                    .count();
                if depth > 0 {
                    record(&mut out, h.worker, set, depth);
                }
            }
        }
        out
    }
}

fn record(out: &mut Vec<WorkerMatch>, worker: WorkerId, set: Set, depth: usize) {
    let depth = depth as u32;
    let i = match out.iter().position(|m| m.worker == worker) {
        Some(i) => i,
        None => {
            out.push(WorkerMatch {
                worker,
                gpu_blocks: 0,
                any_blocks: 0,
            });
            out.len() - 1
        }
    };
    let m = &mut out[i];
    match set {
        Set::Gpu => m.gpu_blocks = m.gpu_blocks.max(depth),
        Set::Any => m.any_blocks = m.any_blocks.max(depth),
    }
}
