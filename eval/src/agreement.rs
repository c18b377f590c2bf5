//! How closely a live replay and a simulation of the same workload agree: mean TTFT, mean
//! step latency and mean session task time, side by side.

use std::fmt;

use crate::sim::{mean, RunResult};

/// Means of the live run and of the simulation, seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    /// (live, simulated) mean TTFT.
    pub ttft: (f64, f64),
    /// (live, simulated) mean step latency (issue to last token).
    pub step_latency: (f64, f64),
    /// (live, simulated) mean session task time.
    pub session_e2e: (f64, f64),
}

fn rel((live, sim): (f64, f64)) -> f64 {
    (live - sim) / sim
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
        Self {
            ttft: (mean(&live.ttfts()), mean(&simulated.ttfts())),
            step_latency: (lat(live), lat(simulated)),
            session_e2e: (mean(&live.session_e2e_s), mean(&simulated.session_e2e_s)),
        }
    }

    /// Whether every mean is within `tolerance` (relative, e.g. 0.25) of the simulated
    /// one, allowing TTFT an extra `ttft_overhead_s`: the live path pays HTTP round trips
    /// (client → router → prefill leg → decode leg → KV pull) the simulator does not model,
    /// a fixed cost that dominates when the simulated TTFT is a few milliseconds.
    pub fn within(&self, tolerance: f64, ttft_overhead_s: f64) -> bool {
        let ok = |(live, sim): (f64, f64), extra: f64| {
            live.is_finite() && sim.is_finite() && (live - sim).abs() <= tolerance * sim + extra
        };
        ok(self.ttft, ttft_overhead_s) && ok(self.step_latency, 0.0) && ok(self.session_e2e, 0.0)
    }
}

impl fmt::Display for Agreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = |f: &mut fmt::Formatter<'_>, name: &str, p: (f64, f64)| {
            write!(
                f,
                "{name} {:.4}s live / {:.4}s simulated ({:+.1}%)",
                p.0,
                p.1,
                rel(p) * 100.0
            )
        };
        write!(f, "means: ")?;
        part(f, "TTFT", self.ttft)?;
        write!(f, ", ")?;
        part(f, "step latency", self.step_latency)?;
        write!(f, ", ")?;
        part(f, "session E2E", self.session_e2e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_is_relative_plus_the_ttft_overhead() {
        let a = Agreement {
            ttft: (0.018, 0.013),
            step_latency: (1.02, 1.0),
            session_e2e: (3.1, 3.0),
        };
        assert!(!a.within(0.25, 0.0), "5 ms on 13 ms is 38%");
        assert!(a.within(0.25, 0.010));
        let far = Agreement {
            step_latency: (1.4, 1.0),
            ..a
        };
        assert!(!far.within(0.25, 0.010));
    }
}
