//! Tool-gap samples for the generators: the SWE-smith derived trace's (all under a second),
//! and long gaps drawn from a lognormal (test runs, builds, a human reading).

use std::path::Path;

use ownerserve_planner::policy::SplitMix64;

use super::dist::lognormal;
use super::{agentic, WorkloadError};

/// Long tool gaps: median 4 s, log-space spread 1.63 (90th percentile ~32 s, 99th ~3 min),
/// the shape of a coding agent's tool calls once test suites, builds and a human's reading
/// are among them (`long-gap` workload).
pub const LONG_GAP_MEDIAN_MS: f64 = 4_000.0;
pub const LONG_GAP_SIGMA: f64 = 1.63;

/// `n` samples (ms) of the long-gap lognormal, capped at 10 minutes, deterministic for `seed`.
pub fn long_gaps(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed ^ 0x6c6f_6e67_6761_7073);
    (0..n)
        .map(|_| lognormal(&mut rng, LONG_GAP_MEDIAN_MS, LONG_GAP_SIGMA).min(600_000.0))
        .collect()
}

/// The `tool_gap_ms` of every call that has a next call in its session, from the derived
/// SWE-smith JSONL at `path`. The last call's gap is left out: no tool time follows it.
pub fn swe_smith_gaps(path: impl AsRef<Path>) -> Result<Vec<f64>, WorkloadError> {
    let w = agentic::read(path)?;
    Ok(w.sessions
        .iter()
        .flat_map(|s| {
            let n = s.steps.len().saturating_sub(1);
            s.steps.iter().take(n).map(|st| st.gap_after_ms)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_gaps_have_a_median_of_seconds_and_a_tail_of_minutes() {
        let mut g = long_gaps(4_000, 1);
        g.sort_by(f64::total_cmp);
        let q = |p: f64| g[((g.len() - 1) as f64 * p) as usize];
        assert!((3_000.0..5_500.0).contains(&q(0.5)), "median {}", q(0.5));
        assert!((20_000.0..50_000.0).contains(&q(0.9)), "p90 {}", q(0.9));
        assert!(q(0.99) > 100_000.0, "p99 {}", q(0.99));
        assert_eq!(long_gaps(10, 1), long_gaps(10, 1));
    }

    #[test]
    fn gaps_exclude_each_sessions_last_call() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/traces/continuum_swesmith_derived.jsonl"
        );
        let gaps = swe_smith_gaps(path).expect("read gaps");
        assert_eq!(gaps.len(), 120);
        // Bimodal: editor calls under 1 ms, bash runs around half a second.
        assert!(gaps.iter().all(|g| (0.0..1000.0).contains(g)));
        assert!(gaps.iter().any(|&g| g > 400.0));
        assert!(gaps.iter().any(|&g| g < 1.0));
    }
}
