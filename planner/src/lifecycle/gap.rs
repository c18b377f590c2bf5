//! How long a session's tool call will last: a lognormal learned from the gaps the router
//! observes (between a response's end and the session's next request). Tool gaps are
//! heavy-tailed (a `ls` returns in 50 ms, a test suite in 40 s, a human in minutes), so the
//! model keeps the mean and spread of `ln(gap)`, not of the gap: its median is a typical
//! gap and its upper quantiles the tail a decision must survive.
//!
//! A session with few gaps of its own borrows from a wider one (the fleet's, or a tool's):
//! [`GapStats::estimate`] shrinks toward the prior by the number of gaps seen.
//!
//! What a gap waits on shows in how the response before it ended ([`Ending`]): after a tool
//! call, the tool (seconds: a median of 8 s in the real Claude Code sessions); after an
//! answer, a human or nothing (a median of 156 s, a p90 of 85 minutes). [`EndingGaps`]
//! keeps gaps apart by it, so a session that just answered is not expected back as soon as
//! one running `ls`.

use serde::Serialize;

/// Weight of a new gap in the running log-mean and log-variance (an EWMA: a session's
/// tools change as its task does).
const ALPHA: f64 = 0.3;
/// The prior's weight, in gaps: a session's own estimate replaces it after one more.
const PRIOR_WEIGHT: f64 = 2.0;
/// A gap below this (ms) is clamped: the log of 0 is not a gap.
const MIN_GAP_MS: f64 = 1.0;

/// The tool gap assumed before any was seen, seconds: its median and 90th percentile (the
/// router's `[router.sessions] gap_prior_*` defaults, and the simulator's).
pub const PRIOR_MEDIAN_S: f64 = 5.0;
pub const PRIOR_P90_S: f64 = 60.0;

/// How the response before a gap ended, as the router sees it in the stream (its
/// `finish_reason` or `stop_reason`) and a trace records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum Ending {
    /// Not seen (a response the router could not read, a trace without it).
    #[default]
    Unknown,
    /// It asked for a tool call (`tool_calls`, `tool_use`): the client runs the tool.
    ToolCall,
    /// It answered (`stop`, `end_turn`, a length cut): the client's human reads it, or the
    /// session is over.
    Answer,
}

impl Ending {
    fn index(self) -> usize {
        match self {
            Ending::Unknown => 0,
            Ending::ToolCall => 1,
            Ending::Answer => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Ending::Unknown => "unknown",
            Ending::ToolCall => "tool_call",
            Ending::Answer => "answer",
        }
    }
}

/// Gaps kept apart by how the response before each ended: all of them, and per
/// [`Ending`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct EndingGaps {
    all: GapStats,
    by_ending: [GapStats; 3],
}

impl EndingGaps {
    /// Records a gap after a response that ended so.
    pub fn observe(&mut self, ending: Ending, gap_ms: u64) {
        self.all.observe(gap_ms);
        self.by_ending[ending.index()].observe(gap_ms);
    }

    /// Gaps seen.
    pub fn count(&self) -> u32 {
        self.all.count()
    }

    /// The estimate of a gap after a response that ended so: the gaps after such endings,
    /// shrunk toward all the gaps seen, shrunk toward `prior` (an unknown ending: all the
    /// gaps, toward `prior`).
    pub fn estimate(&self, ending: Ending, prior: GapEstimate) -> GapEstimate {
        let all = self.all.estimate(prior);
        match ending {
            Ending::Unknown => all,
            e => self.by_ending[e.index()].estimate(all),
        }
    }
}

/// Running mean and variance of `ln(gap_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct GapStats {
    n: u32,
    mean: f64,
    var: f64,
}

/// A lognormal estimate of a gap, in seconds: `ln(gap_s) ~ N(mu, sigma²)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GapEstimate {
    pub mu: f64,
    pub sigma: f64,
}

impl GapStats {
    /// Records an observed gap.
    pub fn observe(&mut self, gap_ms: u64) {
        let x = (gap_ms as f64).max(MIN_GAP_MS).ln();
        if self.n == 0 {
            self.mean = x;
            self.var = 0.0;
        } else {
            // West's exponentially weighted mean and variance.
            let d = x - self.mean;
            self.mean += ALPHA * d;
            self.var = (1.0 - ALPHA) * (self.var + ALPHA * d * d);
        }
        self.n = self.n.saturating_add(1);
    }

    /// Gaps seen.
    pub fn count(&self) -> u32 {
        self.n
    }

    /// This session's estimate, shrunk toward `prior` while it has seen fewer than
    /// `PRIOR_WEIGHT + 1` gaps (with none of its own, the prior).
    pub fn estimate(&self, prior: GapEstimate) -> GapEstimate {
        if self.n == 0 {
            return prior;
        }
        let w = (f64::from(self.n) / (PRIOR_WEIGHT + 1.0)).min(1.0);
        let mu_ms = w * self.mean + (1.0 - w) * (prior.mu + 1e3f64.ln());
        let var = w * self.var + (1.0 - w) * prior.sigma * prior.sigma;
        GapEstimate {
            mu: mu_ms - 1e3f64.ln(),
            sigma: var.max(0.0).sqrt(),
        }
    }
}

impl GapEstimate {
    /// A gap of `median_s` whose 90th percentile is `p90_s` (a prior from an operator's
    /// knowledge of the tools).
    pub fn from_median_p90(median_s: f64, p90_s: f64) -> Self {
        let mu = median_s.max(1e-3).ln();
        let sigma = ((p90_s.max(median_s).max(1e-3)).ln() - mu) / Z90;
        Self {
            mu,
            sigma: sigma.max(0.0),
        }
    }

    /// The gap's `q` quantile, seconds (`q` in 0..1).
    pub fn quantile_s(&self, q: f64) -> f64 {
        (self.mu + self.sigma * probit(q)).exp()
    }

    pub fn median_s(&self) -> f64 {
        self.mu.exp()
    }

    /// P(gap > t_s).
    pub fn survival(&self, t_s: f64) -> f64 {
        if t_s <= 0.0 {
            return 1.0;
        }
        if self.sigma < 1e-9 {
            return if t_s < self.median_s() { 1.0 } else { 0.0 };
        }
        1.0 - normal_cdf((t_s.ln() - self.mu) / self.sigma)
    }

    /// P(gap > idle + t | gap > idle): the chance a session idle for `idle_s` is still away
    /// `t_s` later. A session already away longer than nearly every gap is treated as
    /// sure to stay away (it is likely gone).
    pub fn remaining_survival(&self, idle_s: f64, t_s: f64) -> f64 {
        let now = self.survival(idle_s);
        if now < 1e-9 {
            return 1.0;
        }
        (self.survival(idle_s + t_s) / now).clamp(0.0, 1.0)
    }

    /// The `q` quantile of the time left before a session idle for `idle_s` returns.
    pub fn remaining_quantile_s(&self, idle_s: f64, q: f64) -> f64 {
        if self.sigma < 1e-9 {
            return (self.median_s() - idle_s).max(0.0);
        }
        // Solve S(idle + t) = (1 - q) · S(idle) for t on the lognormal.
        let target = (1.0 - q) * self.survival(idle_s);
        if target <= 1e-12 {
            return f64::INFINITY;
        }
        let z = probit(1.0 - target);
        ((self.mu + self.sigma * z).exp() - idle_s).max(0.0)
    }

    /// The mean time left before a session idle for `idle_s` returns, seconds (the
    /// lognormal's conditional mean, less the time already idle).
    pub fn remaining_mean_s(&self, idle_s: f64) -> f64 {
        let s = self.sigma;
        let mean = (self.mu + s * s / 2.0).exp();
        if idle_s <= 0.0 {
            return mean;
        }
        if s < 1e-9 {
            return (self.median_s() - idle_s).max(0.0);
        }
        let z = (idle_s.ln() - self.mu) / s;
        let tail = 1.0 - normal_cdf(z);
        if tail < 1e-12 {
            return idle_s;
        }
        (mean * (1.0 - normal_cdf(z - s)) / tail - idle_s).max(0.0)
    }
}

/// z of the 90th percentile of the standard normal.
const Z90: f64 = 1.281_551_565_544_600_4;

/// The standard normal CDF (Abramowitz & Stegun 7.1.26 on erf; |error| < 1.5e-7).
pub fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

/// The standard normal quantile (Acklam's rational approximation; relative error < 1.2e-9),
/// `p` clamped into (0, 1).
pub fn probit(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.024_25 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.024_25 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_helpers_invert_each_other() {
        for p in [0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99] {
            assert!((normal_cdf(probit(p)) - p).abs() < 1e-6, "{p}");
        }
        assert!((probit(0.9) - Z90).abs() < 1e-8);
    }

    #[test]
    fn a_sessions_gaps_are_learned_in_log_space_and_shrunk_toward_the_prior() {
        let prior = GapEstimate::from_median_p90(2.0, 30.0);
        assert!((prior.median_s() - 2.0).abs() < 1e-9);
        assert!((prior.quantile_s(0.9) - 30.0).abs() < 1e-6);
        let mut s = GapStats::default();
        assert_eq!(s.estimate(prior), prior);
        for _ in 0..30 {
            s.observe(40_000);
        }
        let e = s.estimate(prior);
        // Thirty 40 s test runs: the estimate is the session's, nearly all of it.
        assert!((e.median_s() - 40.0).abs() < 4.0, "{e:?}");
        let mut one = GapStats::default();
        one.observe(40_000);
        let e1 = one.estimate(prior);
        assert!(e1.median_s() > 2.0 && e1.median_s() < 40.0, "{e1:?}");
        assert!(e1.sigma > 0.0, "one gap keeps the prior's spread");
    }

    #[test]
    fn gaps_after_a_tool_call_and_after_an_answer_are_told_apart() {
        let prior = GapEstimate::from_median_p90(5.0, 60.0);
        let mut g = EndingGaps::default();
        for _ in 0..20 {
            g.observe(Ending::ToolCall, 8_000);
            g.observe(Ending::Answer, 150_000);
        }
        let tool = g.estimate(Ending::ToolCall, prior).median_s();
        let answer = g.estimate(Ending::Answer, prior).median_s();
        let any = g.estimate(Ending::Unknown, prior).median_s();
        assert!((tool - 8.0).abs() < 1.0, "{tool}");
        assert!((answer - 150.0).abs() < 15.0, "{answer}");
        assert!(tool < any && any < answer, "{tool} {any} {answer}");
        assert_eq!(g.count(), 40);
        // An ending never seen borrows from all the gaps.
        let mut only_tools = EndingGaps::default();
        only_tools.observe(Ending::ToolCall, 8_000);
        assert_eq!(
            only_tools.estimate(Ending::Answer, prior),
            only_tools.estimate(Ending::Unknown, prior)
        );
    }

    #[test]
    fn a_session_away_longer_is_expected_back_later() {
        let g = GapEstimate::from_median_p90(5.0, 60.0);
        assert!((g.survival(5.0) - 0.5).abs() < 1e-6);
        assert!(g.remaining_survival(0.0, 5.0) > g.remaining_survival(0.0, 10.0));
        // Heavy tail: after 20 s away, more time is expected than at the start.
        assert!(g.remaining_mean_s(20.0) > g.remaining_mean_s(0.0) - 20.0);
        assert!(g.remaining_quantile_s(0.0, 0.5) - 5.0 < 1e-6);
        let q = g.remaining_quantile_s(10.0, 0.25);
        assert!(
            (g.remaining_survival(10.0, q) - 0.75).abs() < 1e-4,
            "{q}: {}",
            g.remaining_survival(10.0, q)
        );
    }
}
