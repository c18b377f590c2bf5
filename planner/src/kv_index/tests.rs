use std::collections::BTreeSet;

use super::*;

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);

fn index() -> KvIndex {
    KvIndex::new(KvIndexConfig {
        block_size: 4,
        ..KvIndexConfig::default()
    })
}

/// Blocks of 4 tokens; block `i` of chain `c` has tokens derived from (c, i) and engine id
/// `c * 1000 + i`.
struct Blocks {
    ids: Vec<u64>,
    tokens: Vec<u32>,
}

fn blocks(chain: u32, range: std::ops::Range<u32>) -> Blocks {
    Blocks {
        ids: range.clone().map(|i| u64::from(chain * 1000 + i)).collect(),
        tokens: range
            .flat_map(|i| (0..4).map(move |t| chain * 100_000 + i * 4 + t))
            .collect(),
    }
}

fn stored(parent: Option<u64>, blocks: Blocks, tier: Tier) -> KvEvent {
    KvEvent::Stored {
        parent,
        block_ids: blocks.ids,
        tokens: blocks.tokens,
        tier,
        lora_name: None,
        extra_keys: None,
    }
}

/// Our hashes for the first `n` blocks of chain `c`.
fn query(chain: u32, n: u32) -> Vec<u64> {
    crate::hash::prompt_hashes(&blocks(chain, 0..n).tokens, 4, crate::hash::XXH3_SEED)
}

fn matches(ix: &KvIndex, q: &[u64]) -> Vec<WorkerMatch> {
    let mut out = Vec::new();
    ix.find_matches(q, &mut MatchScratch::default(), &mut out);
    out.sort_by_key(|m| m.worker);
    let mut reference = ix.find_matches_linear(q);
    reference.sort_by_key(|m| m.worker);
    assert_eq!(out, reference, "bisection disagrees with the linear walk");
    out
}

fn m(worker: WorkerId, gpu: u32, any: u32) -> WorkerMatch {
    WorkerMatch {
        worker,
        gpu_blocks: gpu,
        any_blocks: any,
    }
}

#[test]
fn stored_chains_match_by_longest_prefix_per_worker() {
    let mut ix = index();
    ix.apply(W0, &stored(None, blocks(1, 0..10), Tier::Gpu))
        .unwrap();
    ix.apply(W1, &stored(None, blocks(1, 0..4), Tier::Gpu))
        .unwrap();
    // Extending a chain links through the engine's parent id.
    ix.apply(W1, &stored(Some(1003), blocks(1, 4..6), Tier::Gpu))
        .unwrap();
    assert_eq!(
        matches(&ix, &query(1, 12)),
        vec![m(W0, 10, 10), m(W1, 6, 6)]
    );
    assert_eq!(matches(&ix, &query(2, 5)), vec![]);
    assert_eq!(ix.len(), 10);
}

#[test]
fn events_are_matched_by_content_not_engine_ids() {
    // Two engines with different hash schemes (ids) but the same tokens land on one node.
    let mut ix = index();
    ix.apply(W0, &stored(None, blocks(3, 0..3), Tier::Gpu))
        .unwrap();
    let mut other_ids = blocks(3, 0..3);
    for id in &mut other_ids.ids {
        *id = id.wrapping_mul(0x9E37_79B9) ^ 0xdead;
    }
    ix.apply(W1, &stored(None, other_ids, Tier::Gpu)).unwrap();
    assert_eq!(ix.len(), 3);
    assert_eq!(matches(&ix, &query(3, 3)), vec![m(W0, 3, 3), m(W1, 3, 3)]);
}

#[test]
fn unknown_parents_and_wrong_block_sizes_are_rejected() {
    let mut ix = index();
    assert_eq!(
        ix.apply(W0, &stored(Some(77), blocks(1, 0..2), Tier::Gpu)),
        Err(IndexError::UnknownParent {
            worker: W0,
            parent: 77
        })
    );
    let bad = Blocks {
        ids: vec![1],
        tokens: vec![1, 2, 3],
    };
    assert!(matches!(
        ix.apply(W0, &stored(None, bad, Tier::Gpu)),
        Err(IndexError::BlockSizeMismatch { .. })
    ));
    assert_eq!(ix.stats().events_rejected, 2);
    assert!(ix.is_empty());
}

#[test]
fn removal_cascades_to_descendants_and_clear_forgets_a_worker() {
    let mut ix = index();
    ix.apply(W0, &stored(None, blocks(1, 0..8), Tier::Gpu))
        .unwrap();
    ix.apply(W1, &stored(None, blocks(1, 0..8), Tier::Gpu))
        .unwrap();
    ix.apply(
        W0,
        &KvEvent::Removed {
            block_ids: vec![1005],
            tier: Tier::Gpu,
        },
    )
    .unwrap();
    assert_eq!(matches(&ix, &query(1, 8)), vec![m(W0, 5, 5), m(W1, 8, 8)]);
    assert_eq!(ix.worker_blocks(W0), 5);
    ix.apply(W1, &KvEvent::Cleared).unwrap();
    assert_eq!(matches(&ix, &query(1, 8)), vec![m(W0, 5, 5)]);
    assert_eq!(ix.len(), 5, "nodes nobody holds are deleted");
    // Removing an unknown id is harmless.
    ix.apply(
        W0,
        &KvEvent::Removed {
            block_ids: vec![424242],
            tier: Tier::Gpu,
        },
    )
    .unwrap();
}

#[test]
fn a_block_stored_twice_stays_until_both_copies_are_removed() {
    // vLLM 0.32: a cached block computed again (here block 7, the last of a repeated
    // prompt) is stored a second time, and each copy's eviction is announced on its own.
    let mut ix = index();
    ix.apply(W0, &stored(None, blocks(1, 0..8), Tier::Gpu))
        .unwrap();
    ix.apply(W0, &stored(Some(1006), blocks(1, 7..8), Tier::Gpu))
        .unwrap();
    let removed = || KvEvent::Removed {
        block_ids: vec![1007],
        tier: Tier::Gpu,
    };
    ix.apply(W0, &removed()).unwrap();
    assert_eq!(
        matches(&ix, &query(1, 8)),
        vec![m(W0, 8, 8)],
        "the first copy is still cached"
    );
    assert_eq!(ix.worker_blocks(W0), 8);
    ix.apply(W0, &removed()).unwrap();
    assert_eq!(matches(&ix, &query(1, 8)), vec![m(W0, 7, 7)]);
}

#[test]
fn tiers_are_tracked_separately() {
    let mut ix = index();
    ix.apply(W0, &stored(None, blocks(1, 0..6), Tier::Gpu))
        .unwrap();
    ix.apply(W0, &stored(None, blocks(1, 0..6), Tier::Cpu))
        .unwrap();
    // The GPU copy of block 2 is evicted; the CPU copy keeps the any-tier chain.
    ix.apply(
        W0,
        &KvEvent::Removed {
            block_ids: vec![1002],
            tier: Tier::Gpu,
        },
    )
    .unwrap();
    assert_eq!(matches(&ix, &query(1, 6)), vec![m(W0, 2, 6)]);
    // The CPU tier is offloaded further (disk): a CPU-only tail extends the chain.
    ix.apply(W0, &stored(Some(1005), blocks(1, 6..8), Tier::Cpu))
        .unwrap();
    assert_eq!(matches(&ix, &query(1, 9)), vec![m(W0, 2, 8)]);
    assert_eq!(Tier::from_medium(Some("CPU")), Tier::Cpu);
    assert_eq!(Tier::from_medium(None), Tier::Gpu);
}

#[test]
fn name_only_cpu_stores_are_host_holds_of_known_blocks() {
    // vLLM's offloading connector: BlockStored(medium CPU) with ids only, then the GPU
    // copies go. The worker's hold becomes a host hold: restorable, not HBM.
    let mut ix = index();
    ix.apply(W0, &stored(None, blocks(1, 0..6), Tier::Gpu))
        .unwrap();
    ix.apply(W1, &stored(None, blocks(1, 0..6), Tier::Gpu))
        .unwrap();
    let cpu = KvEvent::Stored {
        parent: None,
        block_ids: vec![1003, 1004, 1005, 9999],
        tokens: Vec::new(),
        tier: Tier::Cpu,
        lora_name: None,
        extra_keys: None,
    };
    ix.apply(W0, &cpu).unwrap();
    ix.apply(
        W0,
        &KvEvent::Removed {
            block_ids: vec![1003, 1004, 1005],
            tier: Tier::Gpu,
        },
    )
    .unwrap();
    assert_eq!(
        matches(&ix, &query(1, 6)),
        vec![m(W0, 3, 6), m(W1, 6, 6)],
        "W0 holds 3 blocks in HBM and 3 more restorable from host memory"
    );
    // Host holds are no HBM copies: 6 distinct blocks, 6 + 3 GPU copies.
    assert_eq!(
        ix.gpu_replication(),
        GpuReplication {
            blocks: 6,
            copies: 9
        }
    );
    // The host tier evicts them: W0 matches only its HBM prefix.
    ix.apply(
        W0,
        &KvEvent::Removed {
            block_ids: vec![1004],
            tier: Tier::Cpu,
        },
    )
    .unwrap();
    assert_eq!(matches(&ix, &query(1, 6))[0], m(W0, 3, 4));
    // HBM room: W0 holds 4 blocks in all (1004's removal dropped 1005's host hold), 3 in HBM.
    assert_eq!((ix.worker_blocks(W0), ix.worker_gpu_blocks(W0)), (4, 3));
    assert_eq!(ix.worker_gpu_blocks(W1), 6);
    // A GPU store without tokens is still malformed.
    let bad = KvEvent::Stored {
        parent: None,
        block_ids: vec![1],
        tokens: Vec::new(),
        tier: Tier::Gpu,
        lora_name: None,
        extra_keys: None,
    };
    assert!(ix.apply(W0, &bad).is_err());
}

#[test]
fn approximate_entries_expire_after_their_ttl() {
    let mut ix = index();
    let q = query(4, 6);
    // A 120 s TTL's expiry grain is 7.5 s: W0's entries end at 127.5 s, W1's at 180 s.
    ix.insert_routed(W0, &q, 1_000, 120_000);
    ix.insert_routed(W1, &q[..3], 60_000, 120_000);
    assert_eq!(matches(&ix, &q), vec![m(W0, 6, 6), m(W1, 3, 3)]);
    ix.expire(127_499);
    assert_eq!(matches(&ix, &q), vec![m(W0, 6, 6), m(W1, 3, 3)]);
    ix.expire(127_500);
    assert_eq!(matches(&ix, &q), vec![m(W1, 3, 3)]);
    // Routing again refreshes the TTL (to 292.5 s).
    ix.insert_routed(W1, &q[..3], 170_000, 120_000);
    ix.expire(181_000);
    assert_eq!(matches(&ix, &q), vec![m(W1, 3, 3)]);
    ix.expire(292_500);
    assert!(ix.is_empty());
    assert_eq!(ix.stats().blocks_expired, 9);
}

#[test]
fn routing_the_same_prompt_again_does_not_grow_the_expiry_queue() {
    let mut ix = index();
    let q = query(4, 6);
    for t in 0..500 {
        // 500 requests within 0.5 s: every expiry rounds up to the same grain (127.5 s).
        ix.insert_routed(W0, &q, 4_500 + t, 120_000);
    }
    assert_eq!(ix.expiries.len(), 6);
    // A longer prompt extends the chain and queues only its new blocks.
    let longer = query(4, 8);
    ix.insert_routed(W0, &longer, 4_900, 120_000);
    assert_eq!(ix.expiries.len(), 8);
    // In the next grain, every block is refreshed once more (to 135 s).
    ix.insert_routed(W0, &longer, 9_000, 120_000);
    assert_eq!(ix.expiries.len(), 16);
    ix.expire(128_000);
    assert_eq!(matches(&ix, &longer), vec![m(W0, 8, 8)]);
    ix.expire(135_000);
    assert!(ix.is_empty());
}

#[test]
fn the_expiry_queue_keeps_about_one_entry_per_routed_hold() {
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: 4,
        max_blocks: 1_000,
    });
    // What the router's tick does: a chunk at a time until the queue is within bounds.
    let tick = |ix: &mut KvIndex| while ix.compact_expiries_some(1) {};
    // Within twice the holds (at most 1,000 blocks, on two workers) or the floor, plus
    // what the last insert queued.
    let bound = MIN_EXPIRY_COMPACTION + 300;
    // 10,000 new blocks into an index of 1,000: the pruned blocks' entries go.
    for chain in 0..200 {
        let q = query(1_000 + chain, 50);
        ix.insert_routed(W0, &q, 5_000, 120_000);
        tick(&mut ix);
        assert!(ix.len() <= 1_000);
        assert!(ix.expiries.len() <= bound, "{}", ix.expiries.len());
    }
    // One chain refreshed in 40 grains (each 7.5 s) queues an entry per block each time;
    // the refreshed-over ones go.
    let live = query(7, 300);
    for grain in 0..40 {
        ix.insert_routed(W1, &live, 10_000 + grain * 7_500, 120_000);
        tick(&mut ix);
        assert!(ix.expiries.len() <= bound, "{}", ix.expiries.len());
        assert_eq!(matches(&ix, &live), vec![m(W1, 300, 300)]);
    }
    // What is still due expires, in order, as before.
    ix.expire(u64::MAX);
    assert!(ix.is_empty());
    assert_eq!(ix.expiries.len(), 0);
}

#[test]
fn expiring_in_batches_ends_where_expiring_at_once_does() {
    let mut ix = index();
    for chain in 0..30 {
        ix.insert_routed(WorkerId(chain % 3), &query(chain, 40), 1_000, 120_000);
    }
    // A later grain's entries stay: they are not due.
    ix.insert_routed(W0, &query(99, 10), 60_000, 120_000);
    let mut batched = ix.clone();
    ix.expire(130_000);
    let mut batches = Vec::new();
    loop {
        let taken = batched.expire_some(130_000, 100);
        batches.push(taken);
        if taken < 100 {
            break;
        }
    }
    // 1,200 entries due, 100 at a time, then nothing left to take.
    assert_eq!(batches.len(), 13);
    assert!(batches[..12].iter().all(|&n| n == 100));
    assert_eq!(batches[12], 0);
    assert_eq!(batched.len(), ix.len());
    assert_eq!(batched.len(), 10);
    assert_eq!(batched.stats().blocks_expired, ix.stats().blocks_expired);
    assert_eq!(matches(&batched, &query(99, 10)), vec![m(W0, 10, 10)]);
    assert_eq!(batched.expire_some(u64::MAX, 100), 10);
    assert!(batched.is_empty());
}

#[test]
fn size_is_bounded_by_pruning_least_recently_used_leaves() {
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: 4,
        max_blocks: 100,
    });
    for chain in 0..30 {
        ix.apply(W0, &stored(None, blocks(chain, 0..5), Tier::Gpu))
            .unwrap();
        assert!(ix.len() <= 100);
    }
    assert!(ix.stats().blocks_pruned > 0);
    // The newest chain survives whole; the oldest lost its least recently used blocks.
    assert_eq!(matches(&ix, &query(29, 5)), vec![m(W0, 5, 5)]);
    assert!(matches(&ix, &query(0, 5)).iter().all(|m| m.any_blocks < 5));
}

/// splitmix64: a tiny seeded generator for the randomized check.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn bisection_agrees_with_a_linear_walk_on_random_histories() {
    let seed: u64 = std::env::var("OWNERSERVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261121);
    for round in 0..40 {
        let mut rng = Rng(seed + round);
        let mut ix = index();
        for _ in 0..200 {
            let w = WorkerId(rng.below(6) as u32);
            let chain = rng.below(4) as u32;
            let tier = if rng.below(4) == 0 {
                Tier::Cpu
            } else {
                Tier::Gpu
            };
            match rng.below(10) {
                0..=5 => {
                    // Store a prefix, or extend what this worker already holds.
                    let len = 1 + rng.below(20) as u32;
                    let held = (0..len)
                        .take_while(|i| {
                            ix.engine_ids
                                .get(&w)
                                .is_some_and(|m| m.contains_key(&u64::from(chain * 1000 + i)))
                        })
                        .count() as u32;
                    let start = rng.below(u64::from(held) + 1) as u32;
                    let parent = start.checked_sub(1).map(|p| u64::from(chain * 1000 + p));
                    // Invalid histories (a GPU block under a CPU-only parent) are refused;
                    // the index must stay consistent either way.
                    if start < len {
                        let _ = ix.apply(w, &stored(parent, blocks(chain, start..len), tier));
                    }
                }
                6..=8 => {
                    let id = u64::from(chain * 1000) + rng.below(20);
                    ix.apply(
                        w,
                        &KvEvent::Removed {
                            block_ids: vec![id],
                            tier,
                        },
                    )
                    .unwrap();
                }
                _ => ix.apply(w, &KvEvent::Cleared).unwrap(),
            }
            let q = query(chain, 1 + rng.below(24) as u32);
            // `matches` asserts agreement; print the seed if it fails.
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| matches(&ix, &q)));
            assert!(
                result.is_ok(),
                "failed with OWNERSERVE_SEED={seed} round {round}"
            );
        }
    }
}

#[test]
fn gpu_replication_counts_one_copy_per_worker_and_ignores_other_tiers() {
    let mut ix = index();
    assert_eq!(ix.gpu_replication().duplicate_factor(), 0.0);
    ix.apply(W0, &stored(None, blocks(1, 0..8), Tier::Gpu))
        .unwrap();
    ix.apply(W1, &stored(None, blocks(1, 0..4), Tier::Gpu))
        .unwrap();
    // A CPU copy is not HBM.
    ix.apply(W1, &stored(Some(1003), blocks(1, 4..6), Tier::Cpu))
        .unwrap();
    assert_eq!(
        ix.gpu_replication(),
        GpuReplication {
            blocks: 8,
            copies: 12
        }
    );
    assert_eq!(ix.gpu_replication().duplicate_factor(), 1.5);
}

/// The eviction it replaces, written plainly: while over capacity, scan for the leaf with
/// the oldest use and drop it.
fn prune_by_scanning(ix: &mut KvIndex, max_blocks: usize) {
    while ix.nodes.len() > max_blocks {
        let Some((_, seq)) = ix
            .nodes
            .iter()
            .filter(|(_, n)| n.children.is_empty())
            .map(|(&s, n)| (n.last_used, s))
            .min()
        else {
            return;
        };
        let holders: Vec<_> = ix
            .nodes
            .get(&seq)
            .map(|n| n.holders.to_vec())
            .unwrap_or_default();
        for h in holders {
            if let Some(ids) = ix.engine_ids.get_mut(&h.worker) {
                if ids.get(&h.engine_hash) == Some(&seq) {
                    ids.remove(&h.engine_hash);
                }
            }
        }
        if let Some(n) = ix.nodes.get_mut(&seq) {
            n.holders.clear();
        }
        ix.gc(seq);
    }
}

/// The index's own bookkeeping holds: size within bounds, every child linked to its
/// parent, and the eviction order holding exactly the leaves.
fn assert_consistent(ix: &KvIndex, max_blocks: usize) {
    assert!(ix.len() <= max_blocks);
    let leaves: BTreeSet<(u64, u64)> = ix
        .nodes
        .iter()
        .filter(|(_, n)| n.children.is_empty())
        .map(|(&s, n)| (n.last_used, s))
        .collect();
    assert_eq!(ix.leaves, leaves);
    for (s, n) in ix.nodes.iter() {
        if let Some(p) = n.parent {
            assert!(ix.nodes.get(&p).is_none_or(|pn| pn.children.contains(s)));
        }
    }
}

#[test]
fn bounded_eviction_drops_what_scanning_for_the_oldest_leaf_drops() {
    let seed: u64 = std::env::var("OWNERSERVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261122);
    const MAX: usize = 40;
    for round in 0..60 {
        let mut rng = Rng(seed + round);
        let mut ix = KvIndex::new(KvIndexConfig {
            block_size: 4,
            max_blocks: MAX,
        });
        for step in 0..300 {
            let w = WorkerId(rng.below(3) as u32);
            let chain = rng.below(8) as u32;
            // The model: the same history without a bound, then pruned by scanning.
            let mut model = ix.clone();
            model.cfg.max_blocks = usize::MAX;
            let op = rng.below(10);
            for x in [&mut ix, &mut model] {
                match op {
                    0..=6 => {
                        let len = 1 + (chain + step) % 12;
                        let _ = x.apply(w, &stored(None, blocks(chain, 0..len), Tier::Gpu));
                    }
                    7 | 8 => {
                        let q = query(chain, 12);
                        let mut out = Vec::new();
                        x.find_matches(&q, &mut MatchScratch::default(), &mut out);
                        let depth = out.iter().map(|m| m.any_blocks).max().unwrap_or(0);
                        if depth > 0 {
                            x.touch(q[depth as usize - 1]);
                        }
                    }
                    _ => {
                        let id = u64::from(chain * 1000) + u64::from(step % 12);
                        x.apply(
                            w,
                            &KvEvent::Removed {
                                block_ids: vec![id],
                                tier: Tier::Gpu,
                            },
                        )
                        .unwrap();
                    }
                }
            }
            prune_by_scanning(&mut model, MAX);
            assert_eq!(
                ix.dump(),
                model.dump(),
                "OWNERSERVE_SEED={seed} round {round} step {step}"
            );
            assert_consistent(&ix, MAX);
        }
        assert!(ix.stats().blocks_pruned > 0);
    }
}

#[test]
fn pruning_a_full_index_of_long_chains_touches_only_what_it_evicts() {
    // The reported stall: 100K-token prompts (6,250 blocks of 16) fill the index; every
    // later prompt must evict about its own size, not rescan the index per chain level.
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: 4,
        max_blocks: 50_000,
    });
    for chain in 0..40 {
        ix.apply(W0, &stored(None, blocks(chain, 0..6_250), Tier::Gpu))
            .unwrap();
        assert!(ix.len() <= 50_000);
    }
    assert_eq!(ix.stats().blocks_pruned, 40 * 6_250 - 50_000);
    // The newest chains survive whole. (The cost is measured by `ownerserve bench kv`.)
    assert_eq!(matches(&ix, &query(39, 6_250)), vec![m(W0, 6_250, 6_250)]);
}

#[test]
fn a_session_steps_routed_insert_touches_only_its_new_blocks() {
    let mut ix = index();
    let step = query(5, 2000);
    ix.insert_routed(W0, &step[..1900], 10_100, 120_000);
    let before = ix.tick;
    // The next step (the same prompt and 100 blocks more) within the same expiry grain:
    // the 1,900 held blocks are found by a binary search, not walked again.
    ix.insert_routed(W0, &step, 10_200, 120_000);
    assert!(
        ix.tick - before <= 101,
        "{} blocks touched",
        ix.tick - before
    );
    assert_eq!(matches(&ix, &step), vec![m(W0, 2000, 2000)]);
    // In a later grain, the whole chain is refreshed (each block's expiry moves from
    // 135 s to 142.5 s).
    ix.insert_routed(W0, &step, 20_000, 120_000);
    ix.expire(136_000);
    assert_eq!(matches(&ix, &step), vec![m(W0, 2000, 2000)]);
    ix.expire(142_500);
    assert!(ix.is_empty());
}

/// Every hold of `worker` in the index, counted by walking it: what `worker_blocks` must
/// say for a worker that holds each block in one tier.
fn holds_walked(ix: &KvIndex, worker: WorkerId) -> usize {
    ix.nodes
        .values()
        .filter(|n| n.holders.iter().any(|h| h.worker == worker))
        .count()
}

/// Approximate holds are counted without an engine-id entry each: through random routed
/// inserts, engine events for the same blocks, expiry, pruning and a cleared worker, each
/// worker's count is the walk's, and a cleared worker holds nothing.
#[test]
fn routed_holds_are_counted_through_inserts_events_expiry_pruning_and_clearing() {
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: 4,
        max_blocks: 300,
    });
    let mut rng = Rng(7);
    let mut now = 1_000;
    for _ in 0..2_000 {
        let w = WorkerId(rng.below(3) as u32);
        let chain = rng.below(6) as u32;
        let len = 1 + rng.below(40) as u32;
        match rng.below(20) {
            0..=13 => ix.insert_routed(w, &query(chain, len), now, 5_000),
            // The engine reports a block the router had routed there: the hold changes kind.
            14..=16 => {
                let _ = ix.apply(w, &stored(None, blocks(chain, 0..len.min(8)), Tier::Gpu));
            }
            17 => ix.expire(now),
            18 => ix.apply(w, &KvEvent::Cleared).unwrap(),
            _ => ix.clear_worker(w),
        }
        now += rng.below(400);
        for worker in [W0, W1, WorkerId(2)] {
            assert_eq!(ix.worker_blocks(worker), holds_walked(&ix, worker));
        }
        assert!(ix.len() <= 300);
    }
    ix.clear_worker(W0);
    assert_eq!(holds_walked(&ix, W0), 0);
    assert_eq!(ix.worker_blocks(W0), 0);
}

/// GPU holds counted by walking the index: what `worker_gpu_blocks` must say.
fn gpu_holds_walked(ix: &KvIndex, worker: WorkerId) -> usize {
    ix.nodes
        .values()
        .filter(|n| n.holds(worker, Some(Tier::Gpu)))
        .count()
}

/// The HBM count follows routed inserts, engine GPU events (a routed hold changing kind),
/// host copies, GPU and host removals, expiry, pruning and clearing.
#[test]
fn gpu_holds_are_counted_apart_from_host_holds() {
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: 4,
        max_blocks: 300,
    });
    let mut rng = Rng(11);
    let mut now = 1_000;
    for _ in 0..2_000 {
        let w = WorkerId(rng.below(3) as u32);
        let chain = rng.below(6) as u32;
        let len = 1 + rng.below(8) as u32;
        let ids = blocks(chain, 0..len).ids;
        let tier_event = |block_ids: Vec<u64>, tier| KvEvent::Stored {
            parent: None,
            block_ids,
            tokens: Vec::new(),
            tier,
            lora_name: None,
            extra_keys: None,
        };
        match rng.below(12) {
            0..=2 => ix.insert_routed(w, &query(chain, len), now, 5_000),
            3..=5 => {
                let _ = ix.apply(w, &stored(None, blocks(chain, 0..len), Tier::Gpu));
            }
            6..=7 => {
                let _ = ix.apply(w, &tier_event(ids, Tier::Cpu));
            }
            8 => {
                let tail = ids[ids.len() / 2..].to_vec();
                let _ = ix.apply(
                    w,
                    &KvEvent::Removed {
                        block_ids: tail,
                        tier: Tier::Gpu,
                    },
                );
            }
            9 => {
                let _ = ix.apply(
                    w,
                    &KvEvent::Removed {
                        block_ids: ids,
                        tier: Tier::Cpu,
                    },
                );
            }
            10 => ix.expire(now),
            _ => ix.clear_worker(w),
        }
        now += rng.below(400);
        for worker in [W0, W1, WorkerId(2)] {
            assert_eq!(ix.worker_gpu_blocks(worker), gpu_holds_walked(&ix, worker));
        }
    }
}
