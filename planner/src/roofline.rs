//! Roofline step-time model: a forward pass takes the longer of its compute time and its
//! memory time, plus a fixed per-step overhead. Prefill-heavy steps end up compute-bound,
//! decode-only steps memory-bound (reading weights once plus every sequence's KV).

use serde::Deserialize;

use crate::spec::{GpuSpec, ModelSpec};

/// How much of the hardware's peak a worker reaches (PRESETS.md: prefill 40–60 % of peak
/// FLOP/s, decode 60–80 % of peak bandwidth).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of peak FLOP/s achieved.
    pub compute: f64,
    /// Fraction of peak memory bandwidth achieved.
    pub memory: f64,
    /// Fixed cost of one engine step in seconds (scheduling, kernel launches).
    pub step_overhead_s: f64,
}

impl Default for Efficiency {
    fn default() -> Self {
        Self {
            compute: 0.5,
            memory: 0.7,
            step_overhead_s: 0.002,
        }
    }
}

/// Work done by one engine step, summed over the sequences scheduled in it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepWork {
    /// Prompt tokens computed this step (chunked prefill).
    pub prefill_tokens: u64,
    /// Σ over prefill tokens of the context each attends to (see [`prefill_pairs`]).
    pub prefill_attention_pairs: u64,
    /// Tokens of already-computed context the prefill chunks read from the KV cache.
    pub prefill_context_tokens: u64,
    /// Sequences decoding one token this step.
    pub decode_seqs: u64,
    /// Σ context length of the decoding sequences: the KV they read.
    pub decode_context_tokens: u64,
}

impl StepWork {
    /// Whether the step does nothing at all.
    pub fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_seqs == 0
    }
}

/// Attention pairs for computing `new` tokens on top of `context` cached ones: token `i`
/// attends to `context + i + 1` positions.
pub fn prefill_pairs(new: u64, context: u64) -> u64 {
    new * context + new * (new + 1) / 2
}

/// A model's figures a step's time is made of, read once for the many prefill and decode
/// steps a plan prices ([`Roofline::prefill_step_s`], [`Roofline::decode_step_s`]).
#[derive(Debug, Clone, Copy)]
pub struct StepFigures<'a> {
    model: &'a ModelSpec,
    two_params_active: f64,
    attention_flops_per_pair: f64,
    kv_bytes_per_token: f64,
    /// The weights a step reads, when that does not depend on its batch (not MoE).
    weight_bytes: Option<f64>,
}

impl<'a> StepFigures<'a> {
    pub fn of(model: &'a ModelSpec) -> Self {
        Self {
            model,
            two_params_active: 2.0 * model.params_active,
            attention_flops_per_pair: model.attention_flops_per_pair(),
            kv_bytes_per_token: model.kv_bytes_per_token(),
            weight_bytes: model.moe.is_none().then(|| model.weight_bytes()),
        }
    }
}

/// The time a step takes and which bound set it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    pub compute_s: f64,
    pub memory_s: f64,
    pub total_s: f64,
}

/// A worker's hardware as the roofline sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Roofline {
    /// Achieved FLOP/s across the worker's GPUs.
    flops_per_s: f64,
    /// Achieved bytes/s across the worker's GPUs.
    bytes_per_s: f64,
    step_overhead_s: f64,
    /// A step takes its compute plus its memory time, not the longer of the two: an engine
    /// that overlaps neither (`Self::with_additive_steps`).
    additive: bool,
}

impl Roofline {
    /// Roofline of `gpus` GPUs of one kind, tensor-parallel.
    pub fn new(gpu: &GpuSpec, gpus: u32, eff: Efficiency) -> Self {
        let n = f64::from(gpus.max(1));
        Self {
            flops_per_s: gpu.bf16_tflops * 1e12 * n * eff.compute,
            bytes_per_s: gpu.bandwidth_tbs * 1e12 * n * eff.memory,
            step_overhead_s: eff.step_overhead_s,
            additive: false,
        }
    }

    /// The same hardware with every step taking its compute plus its memory time: the
    /// simulator's engine that differs from the planner's model (a prefill chunk no longer
    /// hides the decodes' reads it shares a step with).
    pub fn with_additive_steps(mut self) -> Self {
        self.additive = true;
        self
    }

    /// Achieved memory bandwidth in bytes/s.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes_per_s
    }

    /// Fixed cost of one engine step, seconds.
    pub fn step_overhead_s(&self) -> f64 {
        self.step_overhead_s
    }

    /// Achieved compute in FLOP/s.
    pub fn flops_per_s(&self) -> f64 {
        self.flops_per_s
    }

    /// Time of one step doing `work` for `model`.
    pub fn step_time(&self, model: &ModelSpec, work: &StepWork) -> StepTime {
        let tokens = work.prefill_tokens + work.decode_seqs;
        self.figured_step(
            &StepFigures::of(model),
            tokens,
            work.prefill_attention_pairs + work.decode_context_tokens,
            work.decode_context_tokens + work.prefill_context_tokens + tokens,
        )
    }

    /// [`Self::step_time`]'s total for a step of `seqs` decoding sequences that read
    /// `context` KV tokens, with the model's figures read once: a plan prices a few hundred
    /// such steps (the decode term).
    #[inline]
    pub fn decode_step_s(&self, f: &StepFigures<'_>, seqs: u64, context: u64) -> f64 {
        self.figured_step(f, seqs, context, context + seqs).total_s
    }

    /// [`Self::step_time`]'s total for a prefill-only step computing `tokens` tokens with
    /// `pairs` attention pairs (see [`prefill_pairs`]) over `context` cached tokens, with
    /// the model's figures read once (a plan prices one or two per worker).
    pub fn prefill_step_s(
        &self,
        f: &StepFigures<'_>,
        tokens: u64,
        pairs: u64,
        context: u64,
    ) -> f64 {
        self.figured_step(f, tokens, pairs, context + tokens)
            .total_s
    }

    /// Seconds to the end of a prefill of `tokens` tokens (`pairs` attention pairs over
    /// `context` cached tokens) on an engine that runs it as chunked prefill: `chunk`
    /// prompt tokens a step (`StepBudget::prefill_chunk`), each step shared with `decodes`
    /// decoding sequences that read `decode_context` KV tokens (vLLM V1 schedules the
    /// running decodes first and gives the prefill the rest of the budget, up to its
    /// long-prefill cap; the simulated engine does the same). The chunks are priced as
    /// equal steps of the average chunk.
    ///
    /// Why not one step of all the tokens: the engine runs it so. A long prompt pays a
    /// step's overhead per chunk, and each chunk's step also carries the decodes' tokens
    /// and reads (hidden under a long chunk's compute, not under a short one's).
    #[expect(
        clippy::too_many_arguments,
        reason = "the prefill's three figures, the decodes' two and the chunk, each named"
    )]
    pub fn chunked_prefill_s(
        &self,
        f: &StepFigures<'_>,
        tokens: u64,
        pairs: u64,
        context: u64,
        decodes: u64,
        decode_context: u64,
        chunk: u64,
    ) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let chunks = tokens.div_ceil(chunk.max(1));
        let chunk = tokens / chunks;
        // Each chunk reads the prompt's KV computed before it: on average, the cached
        // context and half of the rest.
        let read_context = context + (tokens - chunk) / 2;
        chunks as f64
            * self
                .figured_step(
                    f,
                    chunk + decodes,
                    pairs / chunks + decode_context,
                    decode_context + read_context + chunk + decodes,
                )
                .total_s
    }

    /// At most [`Self::chunked_prefill_s`] of `tokens` tokens with `pairs` attention pairs
    /// in chunks of at most `chunk`, whatever shares their steps: the FLOPs of the tokens
    /// and pairs its equal chunks cover (all but one per chunk, at least), at full
    /// compute. Non-decreasing as a prompt's computed share grows (`tokens` up, `pairs`
    /// up by at least one a token); a floor that prices no step, to rule a worker out
    /// before pricing it.
    pub fn chunked_prefill_floor_s(
        &self,
        f: &StepFigures<'_>,
        tokens: u64,
        pairs: u64,
        chunk: u64,
    ) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let chunks = tokens.div_ceil(chunk.max(1));
        let covered = |n: u64| (n + 1).saturating_sub(chunks) as f64;
        (f.two_params_active * covered(tokens) + f.attention_flops_per_pair * covered(pairs))
            / self.flops_per_s
    }

    /// A step of `tokens` tokens (prefill tokens and decoding sequences) with `pairs`
    /// attention pairs (a decode's context counts one pair per token), reading `kv_tokens`
    /// KV tokens: the longer of its compute and memory time (their sum on an additive
    /// roofline), plus the step's overhead.
    #[inline]
    fn figured_step(
        &self,
        f: &StepFigures<'_>,
        tokens: u64,
        pairs: u64,
        kv_tokens: u64,
    ) -> StepTime {
        if tokens == 0 {
            return StepTime {
                compute_s: 0.0,
                memory_s: 0.0,
                total_s: 0.0,
            };
        }
        let flops = f.two_params_active * tokens as f64 + f.attention_flops_per_pair * pairs as f64;
        let weights = f
            .weight_bytes
            .unwrap_or_else(|| f.model.weight_bytes_touched(tokens));
        let bytes = weights + f.kv_bytes_per_token * kv_tokens as f64;
        let compute_s = flops / self.flops_per_s;
        let memory_s = bytes / self.bytes_per_s;
        StepTime {
            compute_s,
            memory_s,
            total_s: if self.additive {
                compute_s + memory_s
            } else {
                compute_s.max(memory_s)
            } + self.step_overhead_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefill that fits one step beside no decodes is that one step; a long one pays
    /// a step's overhead per chunk; beside decodes every chunk carries their work too.
    #[test]
    fn a_prefill_is_priced_in_chunks_beside_the_decodes_that_share_its_steps() {
        let g = GpuSpec::preset("h100").unwrap();
        let m = ModelSpec::preset("llama-3.1-8b").unwrap();
        let r = Roofline::new(&g, 1, Efficiency::default());
        let f = StepFigures::of(&m);
        let alone = |n: u64| r.prefill_step_s(&f, n, prefill_pairs(n, 0), 0);
        let beside = |n: u64, d: u64, ctx: u64| {
            r.chunked_prefill_s(&f, n, prefill_pairs(n, 0), 0, d, ctx, 8_192 - d)
        };
        assert_eq!(beside(3_000, 0, 0), alone(3_000));
        assert_eq!(beside(0, 20, 600_000), 0.0);
        // 34K tokens: five chunks, each with its own step overhead.
        assert!(beside(34_000, 0, 0) > alone(34_000));
        for n in [500, 3_000, 34_000] {
            assert!(beside(n, 20, 600_000) > beside(n, 0, 0), "{n} tokens");
        }
        // 200 tokens beside 64 decodes of 60K tokens each: the step is their reads.
        assert!(beside(200, 64, 64 * 60_000) > 3.0 * alone(200));
    }

    #[test]
    fn the_chunked_prefill_floor_is_below_every_chunked_prefill_and_never_falls() {
        let g = GpuSpec::preset("l40").unwrap();
        let r = Roofline::new(&g, 1, Efficiency::default());
        for name in ["llama-3.1-8b", "qwen3-30b-a3b"] {
            let m = ModelSpec::preset(name).unwrap();
            let f = StepFigures::of(&m);
            let mut rng = crate::policy::SplitMix64::new(3);
            for _ in 0..20_000 {
                let tokens = rng.next_u64() % 200_000;
                let chunk = 1 + rng.next_u64() % 9_000;
                let (decodes, ctx) = (rng.next_u64() % 64, rng.next_u64() % 2_000_000);
                let context = rng.next_u64() % 100_000;
                let pairs = prefill_pairs(tokens, context);
                let floor = r.chunked_prefill_floor_s(&f, tokens, pairs, chunk);
                let priced = r.chunked_prefill_s(&f, tokens, pairs, context, decodes, ctx, chunk);
                assert!(
                    floor <= priced,
                    "{name}: {tokens} in {chunk}: {floor} > {priced}"
                );
                // One more token of the same prompt computed, one fewer cached.
                let more = prefill_pairs(tokens + 1, context.saturating_sub(1));
                assert!(floor <= r.chunked_prefill_floor_s(&f, tokens + 1, more, chunk));
            }
        }
    }

    #[test]
    fn a_decode_step_costs_what_the_general_step_time_says_to_the_bit() {
        let g = GpuSpec::preset("h100").unwrap();
        let r = Roofline::new(&g, 2, Efficiency::default());
        for name in ["llama-3.1-8b", "qwen3-30b-a3b"] {
            let m = ModelSpec::preset(name).unwrap();
            let f = StepFigures::of(&m);
            for seqs in [0, 1, 7, 300, 5_000] {
                for context in [0, 1, 90_000, 3_000_000] {
                    let work = StepWork {
                        decode_seqs: seqs,
                        decode_context_tokens: context,
                        ..StepWork::default()
                    };
                    let general = r.step_time(&m, &work).total_s;
                    let fast = r.decode_step_s(&f, seqs, context);
                    assert_eq!(general.to_bits(), fast.to_bits(), "{name} {seqs} {context}");
                }
            }
        }
    }

    #[test]
    fn a_prefill_step_costs_what_the_general_step_time_says_to_the_bit() {
        let g = GpuSpec::preset("h100").unwrap();
        let r = Roofline::new(&g, 2, Efficiency::default());
        for name in ["llama-3.1-8b", "qwen3-30b-a3b"] {
            let m = ModelSpec::preset(name).unwrap();
            let f = StepFigures::of(&m);
            for tokens in [0, 1, 7, 8_192, 100_000] {
                for context in [0, 1, 90_000, 3_000_000] {
                    for n in [1, 3] {
                        let work = StepWork {
                            prefill_tokens: tokens * n,
                            prefill_attention_pairs: prefill_pairs(tokens, context) * n,
                            prefill_context_tokens: context * n,
                            ..StepWork::default()
                        };
                        let general = r.step_time(&m, &work).total_s;
                        let fast = r.prefill_step_s(
                            &f,
                            tokens * n,
                            prefill_pairs(tokens, context) * n,
                            context * n,
                        );
                        assert_eq!(
                            general.to_bits(),
                            fast.to_bits(),
                            "{name} {tokens} {context}"
                        );
                    }
                }
            }
        }
    }

    fn llama_h100() -> (ModelSpec, Roofline) {
        let m = ModelSpec::preset("llama-3.1-8b").unwrap();
        let g = GpuSpec::preset("h100").unwrap();
        (m, Roofline::new(&g, 1, Efficiency::default()))
    }

    #[test]
    fn long_prefill_is_compute_bound() {
        let (m, r) = llama_h100();
        let t = r.step_time(
            &m,
            &StepWork {
                prefill_tokens: 4096,
                prefill_attention_pairs: prefill_pairs(4096, 0),
                ..Default::default()
            },
        );
        assert!(t.compute_s > 5.0 * t.memory_s, "{t:?}");
    }

    #[test]
    fn decode_is_memory_bound_and_linear_in_kv_bytes() {
        let (m, r) = llama_h100();
        let step = |ctx: u64| {
            r.step_time(
                &m,
                &StepWork {
                    decode_seqs: 32,
                    decode_context_tokens: ctx,
                    ..Default::default()
                },
            )
        };
        let (a, b) = (step(32 * 1000), step(32 * 5000));
        assert!(a.memory_s > a.compute_s && b.memory_s > b.compute_s);
        let extra_bytes = m.kv_bytes_per_token() * (32.0 * 4000.0);
        let expected = extra_bytes / r.bytes_per_s();
        assert!(((b.total_s - a.total_s) - expected).abs() < 1e-12);
    }

    #[test]
    fn empty_step_takes_no_time() {
        let (m, r) = llama_h100();
        assert_eq!(r.step_time(&m, &StepWork::default()).total_s, 0.0);
    }
}
