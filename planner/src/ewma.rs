//! Exponentially weighted moving averages, and the two estimates the planner keeps with
//! them: how fast a worker really prefills compared with its preset, and how long a
//! session's tool calls last (which sets its idle lease).

use serde::Serialize;

/// An exponentially weighted moving average; empty until the first sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
}

impl Ewma {
    /// `alpha` is the weight of a new sample (clamped to 0..=1).
    pub fn new(alpha: f64) -> Self {
        Self {
            alpha: alpha.clamp(0.0, 1.0),
            value: None,
        }
    }

    /// Adds a sample; non-finite ones are ignored so one bad reading cannot poison it.
    pub fn observe(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.value = Some(match self.value {
            None => x,
            Some(v) => v + self.alpha * (x - v),
        });
    }

    pub fn value(&self) -> Option<f64> {
        self.value
    }
}

/// A worker's observed prefill speed relative to the roofline preset: the planner
/// multiplies the preset's prefill time by [`PrefillCalibration::scale`], so once
/// observed, the measured rate replaces the preset's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefillCalibration {
    ratio: Ewma,
}

impl Default for PrefillCalibration {
    fn default() -> Self {
        Self {
            ratio: Ewma::new(0.2),
        }
    }
}

impl PrefillCalibration {
    /// Records a prefill the preset predicted to take `predicted_s` that took `observed_s`.
    /// `predicted_s` must be the preset's own time (`Candidate::preset_compute_s`), not
    /// one this scale already multiplied: the plan's calibrated time made the scale settle
    /// at the square root of the true ratio.
    pub fn observe(&mut self, predicted_s: f64, observed_s: f64) {
        if predicted_s > 0.0 && observed_s > 0.0 {
            self.ratio.observe(observed_s / predicted_s);
        }
    }

    /// Factor on the preset's prefill time: 1 until something was observed.
    pub fn scale(&self) -> f64 {
        self.ratio.value().unwrap_or(1.0)
    }
}

/// Idle-session lease TTLs from predicted tool-call gaps: a session's lease should outlive
/// its usual gap (so a tool call does not demote it) but not by much (so an abandoned
/// session frees its HBM soon).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GapLease {
    gap_ms: Ewma,
    /// TTL = `factor` × predicted gap, within `min_ms..=max_ms`.
    pub factor: f64,
    pub min_ms: u64,
    pub max_ms: u64,
}

impl Default for GapLease {
    fn default() -> Self {
        Self {
            gap_ms: Ewma::new(0.3),
            factor: 2.0,
            min_ms: 5_000,
            max_ms: 600_000,
        }
    }
}

impl GapLease {
    /// Leases of `factor` × the predicted gap within `min_ms..=max_ms`, before any gap.
    pub fn new(factor: f64, min_ms: u64, max_ms: u64) -> Self {
        Self {
            factor,
            min_ms,
            max_ms,
            ..Self::default()
        }
    }

    /// Records the gap between a response and the session's next request.
    pub fn observe_gap(&mut self, gap_ms: u64) {
        self.gap_ms.observe(gap_ms as f64);
    }

    /// The predicted gap, once any was observed.
    pub fn predicted_gap_ms(&self) -> Option<f64> {
        self.gap_ms.value()
    }

    /// Steps per second a session parked with this lease is expected to send (1 / its
    /// predicted gap), once a gap was observed: what the cost planner prices as the
    /// returns a new tenant on its owner would delay.
    pub fn return_rate_per_s(&self) -> Option<f64> {
        self.gap_ms.value().map(|gap| 1e3 / gap.max(1.0))
    }

    /// The idle lease to grant: `max_ms` until a gap was seen (a conservative start).
    pub fn ttl_ms(&self) -> u64 {
        match self.gap_ms.value() {
            None => self.max_ms,
            Some(gap) => {
                ((gap * self.factor) as u64).clamp(self.min_ms, self.max_ms.max(self.min_ms))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_starts_at_the_first_sample_and_moves_by_alpha() {
        let mut e = Ewma::new(0.5);
        assert_eq!(e.value(), None);
        e.observe(10.0);
        assert_eq!(e.value(), Some(10.0));
        e.observe(20.0);
        assert_eq!(e.value(), Some(15.0));
        e.observe(f64::NAN);
        assert_eq!(e.value(), Some(15.0));
    }

    #[test]
    fn a_slower_worker_than_its_preset_scales_prefill_up() {
        let mut c = PrefillCalibration::default();
        assert_eq!(c.scale(), 1.0);
        for _ in 0..50 {
            c.observe(0.1, 0.2);
        }
        assert!((c.scale() - 2.0).abs() < 1e-3, "{}", c.scale());
        c.observe(0.0, 1.0);
        c.observe(0.1, -1.0);
        assert!((c.scale() - 2.0).abs() < 1e-3, "bad samples are ignored");
    }

    #[test]
    fn idle_leases_follow_the_tool_gaps_within_bounds() {
        let mut l = GapLease::default();
        assert_eq!(l.ttl_ms(), 600_000);
        for _ in 0..30 {
            l.observe_gap(20_000);
        }
        assert_eq!(l.ttl_ms(), 40_000);
        for _ in 0..30 {
            l.observe_gap(100);
        }
        assert_eq!(l.ttl_ms(), 5_000, "never below min_ms");
        for _ in 0..30 {
            l.observe_gap(10_000_000);
        }
        assert_eq!(l.ttl_ms(), 600_000, "never above max_ms");
    }
}
