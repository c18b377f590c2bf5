//! `ownerserve bench planner`: the planner's decision latency for one step over a fleet,
//! next to a baseline measured in the same run: hashing the prompt alone, which every
//! KV-aware router pays before it can decide anything.

use std::collections::BTreeMap;
use std::hint::black_box;

use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::plan::{
    plan, ArtifactView, ClassThresholds, Link, Links, PlanInput, PlanWorker, Weights,
};
use ownerserve_planner::policy::SplitMix64;
use ownerserve_planner::roofline::{Efficiency, Roofline};
use ownerserve_planner::spec::{GpuSpec, ModelSpec};

use super::{percentile, time_us};
use crate::cli::say;

const BLOCK: u32 = 16;

/// Flags of `ownerserve bench planner`.
#[derive(Debug, clap::Args)]
pub struct PlannerBenchArgs {
    /// Workers in the fleet (a quarter prefill-only, the rest decode).
    #[arg(long, default_value_t = 64)]
    workers: u32,
    /// Tokens of the prompt planned for.
    #[arg(long, default_value_t = 100_000)]
    prompt_tokens: usize,
    /// Timed decisions per case.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Model preset.
    #[arg(long, default_value = "llama-3.1-8b")]
    model: String,
}

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: PlannerBenchArgs) -> anyhow::Result<()> {
    let model = ModelSpec::preset(&args.model)?;
    let gpu = GpuSpec::preset("h100")?;
    let n = args.iterations.max(10);
    let mut rng = SplitMix64::new(7);
    let prompt: Vec<u32> = (0..args.prompt_tokens)
        .map(|_| (rng.next_u64() % 128_000) as u32 + 256)
        .collect();
    let tokens = prompt.len() as u64;
    let workers: Vec<PlanWorker> = (0..args.workers.max(2))
        .map(|i| PlanWorker {
            id: WorkerId(i),
            role: if i % 4 == 0 {
                Role::Prefill
            } else {
                Role::Decode
            },
            healthy: true,
            draining: false,
            roofline: Roofline::new(&gpu, 1, Efficiency::default()),
            queue_s: (rng.next_u64() % 1000) as f64 / 1e4,
            decoding: rng.next_u64() % 64,
            cached_tokens: rng.next_u64() % tokens.max(1) / u64::from(BLOCK) * u64::from(BLOCK),
            prefill_scale: 1.0,
        })
        .collect();
    let links = Links {
        default: Link {
            bytes_per_s: gpu.link_gbs * 1e9,
            latency_s: 20e-6,
        },
        pairs: BTreeMap::new(),
    };
    let input = |decode_owner: Option<u32>, exhaustive: bool| PlanInput {
        model: &model,
        block_size: BLOCK,
        prompt_tokens: tokens,
        decode_owner: decode_owner.map(WorkerId),
        artifact: Some(ArtifactView {
            owner: WorkerId(1),
            tokens: tokens * 9 / 10 / 128 * 128,
        }),
        workers: &workers,
        links: &links,
        weights: Weights::default(),
        samples: 1,
        fork: false,
        thresholds: ClassThresholds::default(),
        exhaustive,
    };
    say(&format!(
        "bench planner: {} workers ({} prefill), {}-token prompt, {}, {n} iterations, one thread",
        workers.len(),
        workers.iter().filter(|w| w.role == Role::Prefill).count(),
        tokens,
        model.name
    ));
    say("| decision | candidates | p50 µs | p99 µs | baseline: hash the prompt, p50 / p99 µs | p99 / baseline p99 | plan alone, p50 / p99 µs | target |");
    say("|---|---:|---:|---:|---:|---:|---:|---|");
    let hash = time_us(n, || {
        black_box(prompt_hashes(black_box(&prompt), BLOCK as usize, XXH3_SEED));
    });
    for (label, owner, exhaustive) in [
        ("a known session (owner decodes)", Some(3), false),
        ("a new session (best P per D)", None, false),
        ("a new session, every P × D pair (explain)", None, true),
    ] {
        let inp = input(owner, exhaustive);
        let candidates = plan(&inp).map(|p| p.candidates.len()).unwrap_or(0);
        let decide = time_us(n, || {
            black_box(prompt_hashes(black_box(&prompt), BLOCK as usize, XXH3_SEED));
            black_box(plan(black_box(&inp)).ok());
        });
        // The planner's own share, which the hash's noise would hide in the difference.
        let alone = time_us(n, || {
            black_box(plan(black_box(&inp)).ok());
        });
        say(&format!(
            "| hash + plan: {label} | {candidates} | {:.1} | {:.1} | {:.1} / {:.1} | {:.2}x | {:.2} / {:.2} | ≤ 50 µs p99 |",
            percentile(&decide, 50.0),
            percentile(&decide, 99.0),
            percentile(&hash, 50.0),
            percentile(&hash, 99.0),
            percentile(&decide, 99.0) / percentile(&hash, 99.0),
            percentile(&alone, 50.0),
            percentile(&alone, 99.0),
        ));
    }
    Ok(())
}
