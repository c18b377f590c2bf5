//! What one run measured: per-step latencies, per-session task times, KV moved, residency,
//! and the summary the report tabulates.

use std::collections::BTreeMap;

/// Percentile of `xs` (nearest rank, `q` in 0..=1); NaN when empty.
pub fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Mean of `xs`; NaN when empty.
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        f64::NAN
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// KV bytes moved between workers, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvBytes {
    /// Prefill worker to decode worker (remote prefill).
    pub prefill_to_decode: u64,
    /// Sealed prefixes fetched from their owner.
    pub fetch: u64,
    /// Sessions moved to another worker.
    pub migration: u64,
}

impl KvBytes {
    pub fn total(&self) -> u64 {
        self.prefill_to_decode + self.fetch + self.migration
    }
}

/// One completed step, as its client saw it (virtual seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    pub session: usize,
    pub step: usize,
    pub issued_s: f64,
    /// First token of the response (NaN if the step was rejected).
    pub ttft_s: f64,
    /// Mean time per output token after the first (NaN with fewer than two tokens).
    pub tpot_s: f64,
    /// Issue to last token.
    pub latency_s: f64,
    pub prompt_tokens: u32,
    /// Prompt tokens the engine found cached (summed over the legs that ran it), host-tier
    /// restores included.
    pub cached_tokens: u32,
    /// Of those, tokens restored from the computing worker's host-DRAM tier.
    pub restored_tokens: u32,
    pub rejected: bool,
    /// Where the simulator placed the step (a live client does not know: default).
    pub placement: Placement,
}

/// Where a step ran and what its plan predicted, for per-step diagnosis
/// (`ownerserve simulate --steps-csv`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Placement {
    /// The policy's action (`Action::name`), if it decided one.
    pub action: Option<&'static str>,
    /// The worker the step decoded on.
    pub decode_on: Option<usize>,
    /// The worker that prefilled it remotely, if one did.
    pub prefill_on: Option<usize>,
    /// Virtual seconds between the step reaching its computing engine and that engine
    /// first admitting it (the engine's own queue).
    pub admit_wait_s: f64,
    /// The plan's queue, compute and interference terms (0 for policies without a plan).
    pub planned_queue_s: f64,
    pub planned_compute_s: f64,
    pub planned_interference_s: f64,
    /// Sequences running on the decode worker when the step was placed.
    pub running_there: u32,
    /// Prompt tokens the plan counted as reused (cached, received or fetched).
    pub planned_reused_tokens: u32,
    /// The decode worker when the step was placed: sequences waiting there, KV tokens not
    /// held by running sequences, and prompt tokens sent there not prefilled yet.
    pub waiting_there: u32,
    pub kv_free_there: u64,
    pub prefill_tokens_there: u64,
    /// Sequences the computing engine preempted between the step's arrival there and its
    /// admission (at arrival: the engine's count so far, replaced at admission).
    pub preempted_while_waiting: u64,
}

/// Everything one policy's run produced.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub policy: String,
    pub cluster: String,
    pub workload: String,
    pub steps: Vec<StepRecord>,
    /// Per session: first issue to last completion, seconds.
    pub session_e2e_s: Vec<f64>,
    pub kv_bytes: KvBytes,
    /// Time-weighted copies over distinct resident blocks.
    pub duplicate_factor: f64,
    /// The same over the workers that decode (decode and hybrid roles) only: without the
    /// copies prefill workers keep in their prefix cache of what they prefilled for a
    /// decoder. 1 when none is resident.
    pub duplicate_factor_decoders: f64,
    /// (virtual s, instantaneous duplicate factor).
    pub duplicate_series: Vec<(f64, f64)>,
    /// Steps with a known prefix served where its longest resident copy was, over such steps.
    pub owner_hit_rate: f64,
    /// Mean step time of decodes sharing a step with prefill over decode-only steps.
    pub decode_interference: f64,
    /// Step time over GPU time during the run (all workers).
    pub gpu_busy: f64,
    /// Executed actions by name.
    pub actions: BTreeMap<String, u64>,
    pub preemptions: u64,
    /// Virtual seconds from the first issue to the last completion.
    pub makespan_s: f64,
    /// Wall-clock seconds the simulation took.
    pub wall_s: f64,
    /// KV bytes restored from host-DRAM tiers into HBM (0 without host tiers).
    pub host_restored_bytes: u64,
    /// The parked sessions' KV lifecycle: decisions, resends and returns by kind (empty
    /// when it was off).
    pub lifecycle: BTreeMap<String, u64>,
}

impl RunResult {
    /// TTFTs of completed steps.
    pub fn ttfts(&self) -> Vec<f64> {
        self.steps
            .iter()
            .filter(|s| !s.rejected)
            .map(|s| s.ttft_s)
            .collect()
    }

    /// TPOTs of completed steps that produced at least two tokens.
    pub fn tpots(&self) -> Vec<f64> {
        self.steps
            .iter()
            .filter(|s| !s.rejected && s.tpot_s.is_finite())
            .map(|s| s.tpot_s)
            .collect()
    }

    /// Steps refused by every engine (too long for the context or the cache).
    pub fn rejected(&self) -> usize {
        self.steps.iter().filter(|s| s.rejected).count()
    }

    /// Prompt tokens restored from host-DRAM tiers over prompt tokens (part of
    /// [`Self::reuse_ratio`]).
    pub fn host_reuse_ratio(&self) -> f64 {
        let (c, p) = self.steps.iter().fold((0u64, 0u64), |(c, p), s| {
            (
                c + u64::from(s.restored_tokens),
                p + u64::from(s.prompt_tokens),
            )
        });
        if p == 0 {
            0.0
        } else {
            c as f64 / p as f64
        }
    }

    /// Steps that restored some of their prompt from a host-DRAM tier.
    pub fn host_hit_steps(&self) -> usize {
        self.steps.iter().filter(|s| s.restored_tokens > 0).count()
    }

    /// Cached prompt tokens (HBM hits, received KV and host-tier restores) over prompt
    /// tokens.
    pub fn reuse_ratio(&self) -> f64 {
        let (c, p) = self.steps.iter().fold((0u64, 0u64), |(c, p), s| {
            (
                c + u64::from(s.cached_tokens),
                p + u64::from(s.prompt_tokens),
            )
        });
        if p == 0 {
            0.0
        } else {
            c as f64 / p as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), 50.0);
        assert_eq!(percentile(&xs, 0.99), 99.0);
        assert_eq!(percentile(&xs, 1.0), 100.0);
        assert_eq!(percentile(&[3.0], 0.01), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
        assert!((mean(&[1.0, 2.0]) - 1.5).abs() < 1e-12);
    }
}
