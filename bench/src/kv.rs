//! `ownerserve bench kv`: the KV routing hot paths on one core, each next to a baseline
//! measured in the same run:
//! - hashing a long prompt into block hashes (baseline: one xxh3 pass over the same bytes,
//!   the floor for any hash of the prompt);
//! - ingesting KV events, wire bytes to index (baseline: decoding alone);
//! - matching a long prompt against every worker plus the kv_aware cost (baseline: a plain
//!   walk of the chain, what a radix-tree walk does);
//! - storing a long prompt into a full index, eviction included (baseline: one walk of the
//!   index, the unit the scanning pruning it replaced repeated per chain level).

use std::hint::black_box;
use std::time::Instant;

use ownerserve_edge::runtime_metrics::heap_now;
use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::kv_index::{
    expiry_grain_ms, KvEvent, KvIndex, KvIndexConfig, MatchScratch, Tier, EXPIRY_BATCH,
};
use ownerserve_planner::policy::{KvAware, KvAwareConfig, Policy, SplitMix64, WorkerView};
use ownerserve_planner::step::{self, Needs, Owned, StepInput};
use ownerserve_shim::kv_events::normalize::normalize;
use ownerserve_shim::kv_events::wire::{
    decode_batch, encode_batch, Encoding, WireBatch, WireEvent,
};

use super::{percentile, time_us};
use ownerserve_eval::console::say;

const BLOCK: usize = 16;

/// Flags of `ownerserve bench kv`.
#[derive(Debug, clap::Args)]
pub struct KvBenchArgs {
    /// Workers in the index.
    #[arg(long, default_value_t = 64)]
    workers: u32,
    /// Tokens of the long prompt hashed and matched.
    #[arg(long, default_value_t = 100_000)]
    prompt_tokens: usize,
    /// Timed repetitions of the per-request operations.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Blocks ingested in the ingest measurement.
    #[arg(long, default_value_t = 500_000)]
    ingest_blocks: usize,
    /// Index sizes (blocks) at which eviction is measured, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    prune_sizes: Vec<usize>,
    /// Block-locations (blocks × the workers holding each) of the scale curve, which then
    /// runs alone: memory per location, lookup and event apply rate at each size
    /// (`--scale 1000000,3000000,10000000 --workers 256`).
    #[arg(long, value_delimiter = ',')]
    scale: Vec<usize>,
    /// Workers holding each block in the scale curve (a shared prefix's copies).
    #[arg(long, default_value_t = 4)]
    holders: u32,
}

fn random_tokens(rng: &mut SplitMix64, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % 128_000) as u32 + 256)
        .collect()
}

/// Stores `tokens` (whole blocks) for `worker` as events of 64 blocks each.
fn store_chain(ix: &mut KvIndex, worker: WorkerId, tokens: &[u32], id_base: u64) {
    let mut parent = None;
    for (c, chunk) in tokens.chunks(64 * BLOCK).enumerate() {
        let block_ids: Vec<u64> = (0..chunk.len() / BLOCK)
            .map(|i| id_base + (c * 64 + i) as u64)
            .collect();
        let last = block_ids.last().copied();
        let event = KvEvent::Stored {
            parent,
            block_ids,
            tokens: chunk.to_vec(),
            tier: Tier::Gpu,
            lora_name: None,
            extra_keys: None,
        };
        let _ = ix.apply(worker, &event);
        parent = last;
    }
}

fn line(what: &str, ours: &str, baseline: &str, ratio: f64, target: &str) {
    say(&format!(
        "| {what} | {ours} | {baseline} | {ratio:.2}x | {target} |"
    ));
}

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: KvBenchArgs) -> anyhow::Result<()> {
    let mut rng = SplitMix64::new(42);
    let n = args.iterations.max(10);
    if !args.scale.is_empty() {
        return scale(&args, &mut rng);
    }
    say(&format!(
        "bench kv: {} workers, {}-token prompt, {} iterations, {} blocks ingested, block size {BLOCK}, one thread",
        args.workers, args.prompt_tokens, n, args.ingest_blocks
    ));
    say("| measurement | ours | baseline (same run) | ours / baseline | target |");
    say("|---|---:|---:|---:|---|");

    // 1. Hashing.
    let prompt = random_tokens(&mut rng, args.prompt_tokens);
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    let ours = time_us(n, || {
        black_box(prompt_hashes(black_box(&prompt), BLOCK, XXH3_SEED));
    });
    let floor = time_us(n, || {
        black_box(xxhash_rust::xxh3::xxh3_64(black_box(&bytes)));
    });
    line(
        &format!("hash a {}-token prompt, p50 (p99)", args.prompt_tokens),
        &format!(
            "{:.1} µs ({:.1})",
            percentile(&ours, 50.0),
            percentile(&ours, 99.0)
        ),
        &format!("{:.1} µs one xxh3 pass", percentile(&floor, 50.0)),
        percentile(&ours, 50.0) / percentile(&floor, 50.0),
        "≤ 40 µs",
    );

    // 2. Ingest: wire bytes → decode → normalize → index.
    let per_event = 8;
    let events_per_batch = 16;
    let mut payloads = Vec::new();
    let mut made = 0;
    let mut next_id = 1u64;
    while made < args.ingest_blocks {
        let mut events = Vec::with_capacity(events_per_batch);
        for _ in 0..events_per_batch {
            let tokens = random_tokens(&mut rng, per_event * BLOCK);
            let hashes: Vec<u64> = (0..per_event as u64).map(|i| next_id + i).collect();
            next_id += per_event as u64;
            events.push(WireEvent::BlockStored {
                block_hashes: hashes,
                parent_block_hash: None,
                token_ids: tokens,
                block_size: BLOCK as u32,
                lora_name: None,
                extra_keys: None,
                medium: Some("GPU".into()),
                group_idx: None,
                kv_cache_spec_kind: None,
            });
            made += per_event;
        }
        let batch = WireBatch {
            ts: 0.0,
            events,
            dp_rank: Some(0),
        };
        payloads.push(encode_batch(&batch, Encoding::Map));
    }
    let workers = args.workers.max(1);
    let decode_only = {
        let t = Instant::now();
        let mut blocks = 0usize;
        for p in &payloads {
            if let Ok(b) = decode_batch(p) {
                for ev in b.events {
                    if let Ok(Some(KvEvent::Stored { block_ids, .. })) = normalize(ev, BLOCK) {
                        blocks += block_ids.len();
                    }
                }
            }
        }
        black_box(blocks);
        made as f64 / t.elapsed().as_secs_f64()
    };
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: BLOCK,
        max_blocks: made * 2,
    });
    let full = {
        let t = Instant::now();
        for (i, p) in payloads.iter().enumerate() {
            let w = WorkerId(i as u32 % workers);
            if let Ok(b) = decode_batch(p) {
                for ev in b.events {
                    if let Ok(Some(e)) = normalize(ev, BLOCK) {
                        let _ = ix.apply(w, &e);
                    }
                }
            }
        }
        made as f64 / t.elapsed().as_secs_f64()
    };
    line(
        "ingest KV events (msgpack → index), blocks/s",
        &format!("{:.2} M/s", full / 1e6),
        &format!("{:.2} M/s decode only", decode_only / 1e6),
        full / decode_only,
        "≥ 1 M blocks/s",
    );
    drop(ix);

    // 3. Match + cost over every worker.
    let prompt_blocks = args.prompt_tokens / BLOCK;
    let query = prompt_hashes(&prompt, BLOCK, XXH3_SEED);
    let match_case = |holders: u32, label: &str, rng: &mut SplitMix64| {
        let mut ix = KvIndex::new(KvIndexConfig {
            block_size: BLOCK,
            max_blocks: 4 << 20,
        });
        for w in 0..workers {
            // Every worker has its own unrelated sessions...
            for c in 0..4u64 {
                let other = random_tokens(rng, 500 * BLOCK);
                store_chain(
                    &mut ix,
                    WorkerId(w),
                    &other,
                    (u64::from(w) << 40) | (c << 32),
                );
            }
            // ...and `holders` of them hold the long prompt to different depths.
            if w < holders {
                let depth = prompt_blocks * (holders - w) as usize / holders as usize;
                store_chain(
                    &mut ix,
                    WorkerId(w),
                    &prompt[..depth * BLOCK],
                    (u64::from(w) << 40) | (9 << 32),
                );
            }
        }
        let views: Vec<WorkerView> = (0..workers)
            .map(|w| WorkerView::idle(WorkerId(w), Role::Decode))
            .collect();
        let input = StepInput {
            model: "m",
            prompt_tokens: args.prompt_tokens as u32,
            block_size: BLOCK as u32,
            session: None,
            now_ms: 0,
            samples: 0,
            fork: false,
        };
        let req = step::route_request(input, Owned::default(), Needs::ALL);
        let mut policy = KvAware::new(KvAwareConfig::default(), 1);
        let mut scratch = MatchScratch::default();
        let mut out = Vec::new();
        let mut candidates = views.clone();
        let mut route = |linear: bool| {
            if linear {
                out = ix.find_matches_linear(&query);
            } else {
                ix.find_matches(&query, &mut scratch, &mut out);
            }
            candidates.clone_from(&views);
            for m in &out {
                if let Some(c) = candidates.get_mut(m.worker.0 as usize) {
                    c.cached_blocks = m.gpu_blocks;
                }
            }
            black_box(policy.choose(&req, &candidates).ok());
        };
        let ours = time_us(n, || route(false));
        let walk = time_us(n.min(200), || route(true));
        line(
            &format!(
                "match {}-token prompt + kv_aware cost, {workers} workers, {label}, p50 (p99)",
                args.prompt_tokens
            ),
            &format!(
                "{:.2} µs ({:.2})",
                percentile(&ours, 50.0),
                percentile(&ours, 99.0)
            ),
            &format!("{:.1} µs plain walk", percentile(&walk, 50.0)),
            percentile(&ours, 50.0) / percentile(&walk, 50.0),
            "≤ 5 µs p99",
        );
    };
    match_case(4, "4 holders", &mut rng);
    match_case(workers, "every worker a holder (worst case)", &mut rng);

    // 4. Eviction in a full index.
    for &size in &args.prune_sizes {
        prune_case(size, workers, &mut rng);
    }

    // 5. Approximate mode: a new session's prompt recorded into a full index.
    routed_case(&mut rng);
    Ok(())
}

/// Approximate mode (no KV events): a full 1M-block index of routed 40K-token prompts on
/// two workers, then new 40K-token prompts recorded one by one, each evicting about as
/// many blocks as it adds (what a fleet of agent sessions does to the router's index).
/// Baseline: a walk of the same number of blocks already in the index, one lookup each.
fn routed_case(rng: &mut SplitMix64) {
    const TTL_MS: u64 = 120_000;
    let blocks = 40_000 / BLOCK;
    let mut ix = KvIndex::new(KvIndexConfig::default());
    let record = |ix: &mut KvIndex, rng: &mut SplitMix64, i: u64| {
        let hashes = prompt_hashes(&random_tokens(rng, blocks * BLOCK), BLOCK, XXH3_SEED);
        ix.insert_routed(WorkerId((i % 2) as u32), &hashes, 0, TTL_MS);
        hashes
    };
    let mut i = 0;
    let mut held = Vec::new();
    while ix.len() < KvIndexConfig::default().max_blocks {
        held = record(&mut ix, rng, i);
        i += 1;
    }
    let fresh: Vec<Vec<u64>> = (0..40)
        .map(|_| prompt_hashes(&random_tokens(rng, blocks * BLOCK), BLOCK, XXH3_SEED))
        .collect();
    let mut times = Vec::new();
    for (k, hashes) in fresh.iter().enumerate() {
        let t = Instant::now();
        ix.insert_routed(WorkerId((k % 2) as u32), hashes, 0, TTL_MS);
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    let walk = time_us(20, || {
        black_box(ix.find_matches_linear(black_box(&held)));
    });
    let record_p50 = percentile(&times, 50.0);
    line(
        &format!("record a routed {blocks}-block prompt into a full 1M-block index, p50 (p99)"),
        &format!("{record_p50:.0} µs ({:.0})", percentile(&times, 99.0)),
        &format!("{:.0} µs plain walk", percentile(&walk, 50.0)),
        record_p50 / percentile(&walk, 50.0),
        "O(blocks), no allocation per block",
    );
    // As many prompts again as the index holds: the expiry queue is past twice the routed
    // holds, most of it entries of pruned blocks. The router's tick drops them a chunk
    // per lock hold; one call over the whole queue (what the first version did) is the
    // baseline.
    for _ in 0..(KvIndexConfig::default().max_blocks / blocks + 1) {
        record(&mut ix, rng, i);
        i += 1;
    }
    let mut whole = ix.clone();
    let t = Instant::now();
    whole.compact_expiries_some(usize::MAX);
    let whole_us = t.elapsed().as_secs_f64() * 1e6;
    drop(whole);
    let holds = lock_holds(|| ix.compact_expiries_some(1));
    let steps = holds.len();
    line(
        &format!(
            "drop the stale entries of a 1M-block index's expiry queue: lock hold p50 (p99, longest), {steps} chunks"
        ),
        &format!(
            "{:.0} µs ({:.0}, {:.0})",
            percentile(&holds, 50.0),
            percentile(&holds, 99.0),
            holds.last().copied().unwrap_or(0.0)
        ),
        &format!("{whole_us:.0} µs in one call"),
        holds.last().copied().unwrap_or(0.0) / whole_us,
        "a few ms per hold",
    );
    // Everything was recorded in one grain, so it all comes due at once: a whole index
    // of removals. The router's tick takes them in batches, giving up the lock between.
    let due = TTL_MS.div_ceil(expiry_grain_ms(TTL_MS)) * expiry_grain_ms(TTL_MS);
    let mut whole = ix.clone();
    let t = Instant::now();
    whole.expire(due);
    let whole_us = t.elapsed().as_secs_f64() * 1e6;
    let holds = lock_holds(|| ix.expire_some(due, EXPIRY_BATCH) == EXPIRY_BATCH);
    let batches = holds.len();
    let longest = holds.last().copied().unwrap_or(0.0);
    line(
        &format!(
            "expire a full index's due grain: lock hold p50 (p99, longest), {batches} batches of {EXPIRY_BATCH}"
        ),
        &format!(
            "{:.0} µs ({:.0}, {longest:.0})",
            percentile(&holds, 50.0),
            percentile(&holds, 99.0)
        ),
        &format!("{:.0} µs in one call", whole_us),
        longest / whole_us,
        "a few ms per hold",
    );
}

/// The time of each call of `step` (a hold of the router's index lock) until it says it
/// is done, in µs, sorted.
fn lock_holds(mut step: impl FnMut() -> bool) -> Vec<f64> {
    let mut holds = Vec::new();
    loop {
        let t = Instant::now();
        let more = step();
        holds.push(t.elapsed().as_secs_f64() * 1e6);
        if !more {
            break;
        }
    }
    holds.sort_by(f64::total_cmp);
    holds
}

/// A full index of `size` blocks (100K-token chains, spread over the workers), then
/// 100K-token prompts arriving one by one: the time to store each, which evicts about as
/// many blocks as it adds. Baseline: one walk over the whole index, which the pruning this
/// replaced did once per level of the longest chain (thousands of walks per prune).
fn prune_case(size: usize, workers: u32, rng: &mut SplitMix64) {
    let chain_tokens = 100_000 / BLOCK * BLOCK;
    let mut ix = KvIndex::new(KvIndexConfig {
        block_size: BLOCK,
        max_blocks: size,
    });
    let mut chain = 0u64;
    let mut store_next = |ix: &mut KvIndex, rng: &mut SplitMix64| {
        let tokens = random_tokens(rng, chain_tokens);
        let w = WorkerId((chain % u64::from(workers)) as u32);
        store_chain(ix, w, &tokens, chain << 32);
        chain += 1;
    };
    while ix.len() < size {
        store_next(&mut ix, rng);
    }
    let mut times = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        store_next(&mut ix, rng);
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    let walk = time_us(5, || {
        black_box(ix.gpu_replication());
    });
    let pruned = ix.stats().blocks_pruned;
    line(
        &format!(
            "store a 100K-token prompt into a full {:.0}M-block index (evicts ~{} blocks), p50 (p99)",
            size as f64 / 1e6,
            chain_tokens / BLOCK
        ),
        &format!(
            "{:.2} ms ({:.2})",
            percentile(&times, 50.0) / 1e3,
            percentile(&times, 99.0) / 1e3
        ),
        &format!("{:.1} ms one walk of the index", percentile(&walk, 50.0) / 1e3),
        percentile(&times, 50.0) / percentile(&walk, 50.0),
        &format!("no stall ({pruned} blocks evicted in all)"),
    );
}

/// Blocks per stored chain in the scale curve (a 100K-token prompt).
const SCALE_CHAIN_BLOCKS: usize = 100_000 / BLOCK;

/// Blocks per KV event when the scale curve times event apply (vLLM sends a request's new
/// blocks in one event; 8 is a step's worth at this block size).
const SCALE_EVENT_BLOCKS: usize = 8;

/// The KV index as the fleet grows: for each size in `args.scale` (block-locations), an
/// index of 100K-token chains, each held by `args.holders` of `args.workers` workers, built
/// from empty; the memory it took per block-location (the live heap's growth where the
/// binary's allocator counts it, and the resident set's, which also holds what the
/// allocator freed and has not yet returned); the lookup of a stored
/// chain's next step (its holders matched) next to hashing it; and events of 8 blocks applied into
/// the full index (each store evicts as many) next to the same events into an empty one.
fn scale(args: &KvBenchArgs, rng: &mut SplitMix64) -> anyhow::Result<()> {
    let workers = args.workers.max(1);
    let holders = args.holders.clamp(1, workers);
    let n = args.iterations.max(10);
    say(&format!(
        "bench kv --scale: {workers} workers, each block on {holders} of them, chains of {SCALE_CHAIN_BLOCKS} blocks of {BLOCK} tokens, {n} lookups, one thread"
    ));
    say("| block-locations | blocks | live heap per location (per block); RSS per location | lookup p50 / p99 µs | baseline: hash the prompt, p50 / p99 µs | events applied into the full index, /s (blocks/s) | baseline: into an empty index, /s | ratio |");
    say("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let empty_rate = apply_rate(
        &mut KvIndex::new(KvIndexConfig {
            block_size: BLOCK,
            max_blocks: 1 << 20,
        }),
        workers,
        rng,
    );
    for &locations in &args.scale {
        let blocks = (locations / holders as usize).max(SCALE_CHAIN_BLOCKS);
        let before = super::directory::rss_bytes();
        let live_before = heap_now().map(|(live, _)| live);
        let mut ix = KvIndex::new(KvIndexConfig {
            block_size: BLOCK,
            max_blocks: blocks,
        });
        let mut chain = 0u64;
        let mut last = Vec::new();
        while ix.len() + SCALE_CHAIN_BLOCKS <= blocks {
            last = random_tokens(rng, SCALE_CHAIN_BLOCKS * BLOCK);
            for h in 0..u64::from(holders) {
                let w = WorkerId(((chain * u64::from(holders) + h) % u64::from(workers)) as u32);
                store_chain(&mut ix, w, &last, (chain << 34) | (h << 32));
            }
            chain += 1;
        }
        let grown = super::directory::rss_bytes().saturating_sub(before) as f64;
        let live = live_before
            .zip(heap_now())
            .map(|(b, (now, _))| now.saturating_sub(b) as f64);
        let (stored, held) = (ix.len(), ix.len() * holders as usize);
        let live = live.map_or("–".to_owned(), |live| {
            format!(
                "{:.0} B ({:.0} B)",
                live / held as f64,
                live / stored as f64
            )
        });
        let memory = format!("{live}; {:.0} B", grown / held as f64);
        // The last chain's session's next step: its prompt and 1,000 new tokens.
        last.extend(random_tokens(rng, 1_000));
        let query = prompt_hashes(&last, BLOCK, XXH3_SEED);
        let mut scratch = MatchScratch::default();
        let mut out = Vec::new();
        let lookup = time_us(n, || {
            ix.find_matches(black_box(&query), &mut scratch, &mut out);
            black_box(&out);
        });
        let hash = time_us(n, || {
            black_box(prompt_hashes(black_box(&last), BLOCK, XXH3_SEED));
        });
        let full_rate = apply_rate(&mut ix, workers, rng);
        say(&format!(
            "| {held} | {stored} | {memory} | {:.2} / {:.2} | {:.1} / {:.1} | {:.2} M ({:.2} M) | {:.2} M | {:.2}x |",
            percentile(&lookup, 50.0),
            percentile(&lookup, 99.0),
            percentile(&hash, 50.0),
            percentile(&hash, 99.0),
            full_rate / 1e6,
            full_rate * SCALE_EVENT_BLOCKS as f64 / 1e6,
            empty_rate / 1e6,
            full_rate / empty_rate,
        ));
        drop(ix);
    }
    say("targets (issue 65): ≤ 64 B per block-location; ≥ 1M events/s per core");
    Ok(())
}

/// Events of [`SCALE_EVENT_BLOCKS`] blocks applied per second into `ix` (normalized
/// events, as the router applies them after decoding): new 100K-token chains stored on
/// `workers` in turn, ten of them.
fn apply_rate(ix: &mut KvIndex, workers: u32, rng: &mut SplitMix64) -> f64 {
    let chains: Vec<Vec<KvEvent>> = (0..10u64)
        .map(|c| {
            let tokens = random_tokens(rng, SCALE_CHAIN_BLOCKS * BLOCK);
            let base = (1u64 << 62) | (c << 32);
            let mut parent = None;
            tokens
                .chunks(SCALE_EVENT_BLOCKS * BLOCK)
                .enumerate()
                .map(|(i, chunk)| {
                    let block_ids: Vec<u64> = (0..chunk.len() / BLOCK)
                        .map(|b| base + (i * SCALE_EVENT_BLOCKS + b) as u64)
                        .collect();
                    let event = KvEvent::Stored {
                        parent,
                        block_ids: block_ids.clone(),
                        tokens: chunk.to_vec(),
                        tier: Tier::Gpu,
                        lora_name: None,
                        extra_keys: None,
                    };
                    parent = block_ids.last().copied();
                    event
                })
                .collect()
        })
        .collect();
    let events: usize = chains.iter().map(Vec::len).sum();
    let t = Instant::now();
    for (c, chain) in chains.iter().enumerate() {
        let w = WorkerId(c as u32 % workers);
        for e in chain {
            let _ = ix.apply(w, black_box(e));
        }
    }
    events as f64 / t.elapsed().as_secs_f64()
}
