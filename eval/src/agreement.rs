//! How closely a live replay and a simulation of the same workload agree: the relative
//! difference of mean TTFT, mean step latency and mean session task time.

use std::fmt;

use crate::sim::{mean, RunResult};

/// Relative differences (live − simulated) / simulated of the means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    pub ttft: f64,
    pub step_latency: f64,
    pub session_e2e: f64,
}

impl Agreement {
    /// Compares the completed steps of `live` with `simulated`.
    pub fn of(live: &RunResult, simulated: &RunResult) -> Self {
        let lat = |r: &RunResult| {
            let v: Vec<f64> = r
                .steps
                .iter()
                .filter(|s| !s.rejected)
                .map(|s| s.latency_s)
                .collect();
            mean(&v)
        };
        let rel = |a: f64, b: f64| (a - b) / b;
        Self {
            ttft: rel(mean(&live.ttfts()), mean(&simulated.ttfts())),
            step_latency: rel(lat(live), lat(simulated)),
            session_e2e: rel(mean(&live.session_e2e_s), mean(&simulated.session_e2e_s)),
        }
    }

    /// Whether every difference is within `tolerance` (e.g. 0.25 for ±25%).
    pub fn within(&self, tolerance: f64) -> bool {
        [self.ttft, self.step_latency, self.session_e2e]
            .iter()
            .all(|d| d.is_finite() && d.abs() <= tolerance)
    }
}

impl fmt::Display for Agreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "live vs simulated: mean TTFT {:+.1}%, mean step latency {:+.1}%, mean session E2E {:+.1}%",
            self.ttft * 100.0,
            self.step_latency * 100.0,
            self.session_e2e * 100.0
        )
    }
}
