//! Benchmark commands. Each prints its figures next to a baseline measured in the same run;
//! none of them is a test (figures depend on the machine).

pub mod directory;
pub mod kv;
pub mod planner;
pub mod proxy;
pub mod sim;

/// Percentile (0..=100) of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Times `f` `n` times; returns sorted per-call microseconds.
pub fn time_us(n: usize, mut f: impl FnMut()) -> Vec<f64> {
    let mut out: Vec<f64> = (0..n)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}
