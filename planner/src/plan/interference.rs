//! What a prefill costs the sequences already decoding where it runs: the marginal
//! interference of one more prefill on a worker's running batch.
//!
//! A chunked prefill shares each engine step with the worker's running decodes (vLLM V1:
//! running sequences are scheduled first, the prefill gets the rest of the token budget).
//! Every decode still gets its one token per step, but that step now takes the mixed
//! batch's time instead of the decode-only batch's, so each decoding sequence loses the
//! difference once per chunk step:
//!
//! `I = decoding × Σ_chunks (t(chunk + decodes) − t(decodes))`
//!
//! Only sequences that decode count: a prefill worker's running sequences are prefill legs
//! that end at their first token (they queue behind this prefill, which `T_queue` of the
//! steps after it carries), and a prefill leg on a prefill worker stalls no one. Sequences
//! queued ahead of this prefill are not delayed by it (first come, first served); this
//! step waits for them, which its own `T_queue` carries.
//!
//! How many prompt tokens a chunk holds is the engine's: [`StepBudget`].

use serde::Serialize;

use crate::roofline::{Roofline, StepFigures};
use crate::spec::GpuSpec;

/// How an engine cuts a prefill into steps: its step budget, and the cap on one request's
/// share of a step that vLLM can set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StepBudget {
    /// Tokens of one engine step (vLLM `--max-num-batched-tokens`, SGLang
    /// `--chunked-prefill-size`).
    pub tokens: u64,
    /// Most prompt tokens one request computes in a step while other requests run there
    /// (vLLM `--long-prefill-token-threshold`); 0 = no cap. SGLang has no such knob.
    pub long_prefill_cap: u64,
}

impl StepBudget {
    /// A budget of `tokens` a step with no per-request cap.
    pub fn of(tokens: u64) -> Self {
        Self {
            tokens,
            long_prefill_cap: 0,
        }
    }

    /// What an engine on `gpu` runs when its operator did not say:
    /// [`engine_default_chunk_tokens`], no cap (vLLM's default threshold is 0).
    pub fn engine_default(gpu: &GpuSpec) -> Self {
        Self::of(engine_default_chunk_tokens(gpu))
    }

    /// Prompt tokens a prefill computes per step beside `decodes` decoding sequences and
    /// `others` requests running or waiting in all: the budget less one token per decode
    /// (the engine schedules running decodes first), and no more than the cap while any
    /// other request is there (vLLM lifts it for a request that is alone).
    pub fn prefill_chunk(self, decodes: u64, others: u64) -> u64 {
        let room = self.tokens.saturating_sub(decodes).max(1);
        if self.long_prefill_cap > 0 && others > 0 {
            room.min(self.long_prefill_cap)
        } else {
            room
        }
    }
}

/// Token budget of one engine step (`max_num_batched_tokens`) the planner assumes for an
/// engine on `gpu` whose operator did not say: vLLM V1's default for its OpenAI server
/// (`EngineArgs.get_batch_defaults`): 8,192 on GPUs with at least 70 GiB that are not an
/// A100 (H100, H20, H200, MI300X), 2,048 on the rest (A100, L40), where larger chunks cost
/// throughput. The simulated engine's default is 8,192 whatever the GPU; the simulator
/// tells the planner its engines' budgets.
pub fn engine_default_chunk_tokens(gpu: &GpuSpec) -> u64 {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let large = gpu.memory_gb * 1e9 >= 70.0 * GIB;
    if large && !gpu.name.to_ascii_lowercase().contains("a100") {
        8_192
    } else {
        2_048
    }
}

/// The sequences a prefill on a worker with `running` sequences stalls: its decodes, on a
/// worker that `decodes` (`PlanWorker::decodes`). A prefill-only worker's running
/// sequences are prefill legs, not decodes. A prefill worker that may also decode counts
/// all of them: the router cannot tell its prefill legs from its decodes, so this prices
/// the worst case.
pub fn stalled_decodes(decodes: bool, running: u64) -> u64 {
    if decodes {
        running
    } else {
        0
    }
}

/// Decode-seconds a prefill of `tokens` prompt tokens (`compute_s` seconds to its end,
/// run `chunk` tokens a step (`StepBudget::prefill_chunk`), each chunk sharing its step
/// with the decodes: `Roofline::chunked_prefill_s`) costs the
/// `decoding` sequences decoding beside it, which read `decode_context` KV tokens: each
/// loses, per chunk step, the mixed step's time minus the decode-only step's. Never more
/// than `decoding × compute_s`.
pub fn marginal_interference_s(
    roofline: &Roofline,
    figures: &StepFigures<'_>,
    decoding: u64,
    decode_context: u64,
    tokens: u64,
    compute_s: f64,
    chunk: u64,
) -> f64 {
    if decoding == 0 || tokens == 0 {
        return 0.0;
    }
    let chunks = tokens.div_ceil(chunk.max(1));
    let decode_only = roofline.decode_step_s(figures, decoding, decode_context);
    let lost = (compute_s - chunks as f64 * decode_only).max(0.0);
    decoding as f64 * lost
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roofline::{prefill_pairs, Efficiency, StepWork};
    use crate::spec::{GpuSpec, ModelSpec};

    fn llama_h100() -> (ModelSpec, Roofline) {
        let m = ModelSpec::preset("llama-3.1-8b").unwrap_or_else(|e| panic!("{e}"));
        let g = GpuSpec::preset("h100").unwrap_or_else(|e| panic!("{e}"));
        (m, Roofline::new(&g, 1, Efficiency::default()))
    }

    fn prefill_s(r: &Roofline, m: &ModelSpec, tokens: u64) -> f64 {
        r.step_time(
            m,
            &StepWork {
                prefill_tokens: tokens,
                prefill_attention_pairs: prefill_pairs(tokens, 0),
                ..StepWork::default()
            },
        )
        .total_s
    }

    #[test]
    fn only_a_worker_that_decodes_stalls_decodes() {
        assert_eq!(stalled_decodes(false, 12), 0);
        assert_eq!(stalled_decodes(true, 12), 12);
    }

    #[test]
    fn no_decodes_no_interference() {
        let (m, r) = llama_h100();
        assert_eq!(
            marginal_interference_s(&r, &StepFigures::of(&m), 0, 0, 8_000, 0.5, 8_192),
            0.0
        );
    }

    #[test]
    fn the_decodes_lose_the_mixed_step_minus_the_step_they_would_have_run() {
        let (m, r) = llama_h100();
        // One chunk: each of 10 decodes loses exactly the prefill time minus one
        // decode-only step (the weights read at batch 10).
        let c = prefill_s(&r, &m, 4_000);
        let dec = r
            .step_time(
                &m,
                &StepWork {
                    decode_seqs: 10,
                    ..StepWork::default()
                },
            )
            .total_s;
        let i = marginal_interference_s(&r, &StepFigures::of(&m), 10, 0, 4_000, c, 8_182);
        assert!((i - 10.0 * (c - dec)).abs() < 1e-12, "{i}");
        assert!(i < 10.0 * c);
    }

    #[test]
    fn a_short_prefill_costs_the_decodes_about_nothing() {
        let (m, r) = llama_h100();
        // 16 new tokens ride a memory-bound decode step almost for free.
        let c = prefill_s(&r, &m, 16);
        let i = marginal_interference_s(&r, &StepFigures::of(&m), 32, 0, 16, c, 8_160);
        assert!(i < 0.1 * 32.0 * c, "{i} vs {}", 32.0 * c);
    }

    #[test]
    fn a_long_prefill_stalls_each_decode_for_nearly_its_whole_time() {
        let (m, r) = llama_h100();
        let c = prefill_s(&r, &m, 32_000);
        let i = marginal_interference_s(&r, &StepFigures::of(&m), 8, 0, 32_000, c, 8_184);
        assert!(i > 0.9 * 8.0 * c && i <= 8.0 * c, "{i} vs {}", 8.0 * c);
    }

    /// vLLM's server picks its step budget by GPU: 8,192 on the large ones, 2,048 on an
    /// A100 (also 80 GB, excluded by name) and on smaller GPUs.
    #[test]
    fn the_default_budget_is_vllm_s_for_the_gpu() {
        let budget = |g: &str| engine_default_chunk_tokens(&GpuSpec::preset(g).unwrap());
        assert_eq!(budget("h100"), 8_192);
        assert_eq!(budget("h20"), 8_192);
        assert_eq!(budget("a100"), 2_048);
        assert_eq!(budget("l40"), 2_048);
    }

    /// On an engine with a small step budget, or a cap on one request's share of a step,
    /// a long prefill runs in many short chunks, each shared with the decodes'
    /// memory-bound step, so it stalls them less than the same prefill in 8,192-token
    /// chunks.
    #[test]
    fn a_smaller_step_budget_or_prefill_cap_stalls_the_decodes_less() {
        let (m, r) = llama_h100();
        let f = StepFigures::of(&m);
        let (decodes, context, tokens) = (24, 24 * 12_000, 16_000);
        let stall = |budget: StepBudget| {
            let chunk = budget.prefill_chunk(decodes, decodes);
            let compute = r.chunked_prefill_s(
                &f,
                tokens,
                prefill_pairs(tokens, 0),
                0,
                decodes,
                context,
                chunk,
            );
            marginal_interference_s(&r, &f, decodes, context, tokens, compute, chunk)
        };
        let capped = StepBudget {
            tokens: 8_192,
            long_prefill_cap: 512,
        };
        let full = stall(StepBudget::of(8_192));
        assert!(stall(StepBudget::of(1_024)) < 0.8 * full);
        assert!(stall(capped) < stall(StepBudget::of(1_024)));
    }

    /// The chunk is the budget less the decodes' tokens, capped while anything else runs
    /// (vLLM lifts its long-prefill threshold for a request that is alone).
    #[test]
    fn a_prefill_s_chunk_is_the_budget_left_and_the_cap_only_beside_others() {
        let capped = StepBudget {
            tokens: 8_192,
            long_prefill_cap: 512,
        };
        assert_eq!(StepBudget::of(8_192).prefill_chunk(20, 20), 8_172);
        assert_eq!(capped.prefill_chunk(20, 20), 512);
        // A prefill worker's prefill legs are not decodes, but the cap holds beside them.
        assert_eq!(capped.prefill_chunk(0, 3), 512);
        assert_eq!(capped.prefill_chunk(0, 0), 8_192);
        assert_eq!(StepBudget::of(16).prefill_chunk(40, 40), 1);
    }
}
