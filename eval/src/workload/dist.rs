//! Small samplers over [`SplitMix64`] for the generators.

use ownerserve_planner::policy::SplitMix64;

/// Uniform integer in `lo..=hi` (the bounds may come in either order).
pub(crate) fn uniform(rng: &mut SplitMix64, lo: u32, hi: u32) -> u32 {
    let (lo, hi) = (lo.min(hi), lo.max(hi));
    let span = u64::from(hi - lo) + 1;
    lo + (rng.next_u64() % span) as u32
}

/// True with probability `p`.
pub(crate) fn chance(rng: &mut SplitMix64, p: f64) -> bool {
    rng.next_f64() < p
}

/// Exponential with the given mean (0 for a non-positive or non-finite mean).
pub(crate) fn exponential(rng: &mut SplitMix64, mean: f64) -> f64 {
    if !(mean.is_finite() && mean > 0.0) {
        return 0.0;
    }
    // 1 - u is in (0, 1], so the log is finite.
    -mean * (1.0 - rng.next_f64()).ln()
}

/// A uniformly chosen element of `values` (0 if empty): an empirical distribution.
pub(crate) fn pick(rng: &mut SplitMix64, values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let i = (rng.next_u64() % values.len() as u64) as usize;
    values.get(i).copied().unwrap_or(0.0)
}

/// Lognormal with the given median and log-space spread `sigma` (Box-Muller on two
/// uniforms).
pub(crate) fn lognormal(rng: &mut SplitMix64, median: f64, sigma: f64) -> f64 {
    let (u1, u2) = (1.0 - rng.next_f64(), rng.next_f64());
    let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    median * (sigma * z).exp()
}
