//! One-line summary of a workload, comparable with `trace_stats.py`'s headline numbers.

use foldhash::HashSet;
use std::fmt;

use super::Workload;

/// Summary of a workload's shape: sizes and how much prompt content repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadStats {
    /// Number of sessions.
    pub sessions: usize,
    /// Number of LLM calls.
    pub requests: usize,
    /// Mean prompt length, tokens.
    pub input_mean: f64,
    /// Median prompt length, tokens.
    pub input_p50: u32,
    /// 99th-percentile prompt length, tokens.
    pub input_p99: u32,
    /// Mean output length, tokens.
    pub output_mean: f64,
    /// Median output length, tokens.
    pub output_p50: u32,
    /// 99th-percentile output length, tokens.
    pub output_p99: u32,
    /// Blocks whose id appeared in an earlier request / all blocks: the hit ratio of an
    /// infinite shared prefix cache. Independent of request order, since a block is new
    /// exactly once.
    pub reuse_ratio: f64,
}

impl fmt::Display for WorkloadStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sessions, {} requests, input mean/p50/p99 {:.0}/{}/{}, output mean/p50/p99 {:.0}/{}/{}, reuse {:.3}",
            self.sessions,
            self.requests,
            self.input_mean,
            self.input_p50,
            self.input_p99,
            self.output_mean,
            self.output_p50,
            self.output_p99,
            self.reuse_ratio
        )
    }
}

/// Computes [`WorkloadStats`]; percentiles use the nearest rank, as `trace_stats.py` does.
pub(super) fn compute(w: &Workload) -> WorkloadStats {
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    let mut seen = HashSet::default();
    let (mut blocks, mut reused) = (0usize, 0usize);
    for (_, step) in w.steps() {
        inputs.push(step.input_tokens);
        outputs.push(step.output_tokens);
        blocks += step.hash_ids.len();
        reused += step.hash_ids.iter().filter(|id| seen.contains(*id)).count();
        seen.extend(step.hash_ids.iter().copied());
    }
    WorkloadStats {
        sessions: w.sessions.len(),
        requests: inputs.len(),
        input_mean: mean(&inputs),
        input_p50: percentile(&mut inputs, 50.0),
        input_p99: percentile(&mut inputs, 99.0),
        output_mean: mean(&outputs),
        output_p50: percentile(&mut outputs, 50.0),
        output_p99: percentile(&mut outputs, 99.0),
        reuse_ratio: if blocks == 0 {
            0.0
        } else {
            reused as f64 / blocks as f64
        },
    }
}

fn mean(xs: &[u32]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len() as f64
}

fn percentile(xs: &mut [u32], p: f64) -> u32 {
    xs.sort_unstable();
    let Some(last) = xs.len().checked_sub(1) else {
        return 0;
    };
    let k = ((p / 100.0) * last as f64).round() as usize;
    xs.get(k.min(last)).copied().unwrap_or(0)
}
