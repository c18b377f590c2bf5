//! Arrival processes for session starts: Poisson, a replayed (and rescaled) Azure trace, or
//! everything at once.

use ownerserve_planner::policy::SplitMix64;

use super::dist::exponential;
use super::AzureRequest;

/// When sessions (or requests) arrive, in ms from the start.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrivals {
    /// Exponential inter-arrival times with this mean rate; a non-positive or non-finite
    /// rate degenerates to [`Arrivals::AllAtZero`].
    Poisson {
        /// Mean arrivals per second.
        rate_per_s: f64,
    },
    /// Replayed arrival times (ms, sorted, first at 0), cycled if more are needed; build it
    /// with [`Arrivals::azure`].
    Azure(Vec<f64>),
    /// Every arrival at time 0: a closed-loop burst.
    AllAtZero,
}

impl Arrivals {
    /// The Azure trace's arrival times, shifted to start at 0 and, if `rate_per_s` is given
    /// (and positive), time-scaled so that their mean rate is that rate. The mean rate is
    /// (rows - 1) / span, the inverse of the mean inter-arrival gap.
    pub fn azure(requests: &[AzureRequest], rate_per_s: Option<f64>) -> Self {
        let mut times: Vec<f64> = requests.iter().map(|r| r.at_ms).collect();
        times.sort_by(f64::total_cmp);
        let first = times.first().copied().unwrap_or(0.0);
        let span = times.last().copied().unwrap_or(0.0) - first;
        let factor = match rate_per_s {
            Some(rate) if rate > 0.0 && rate.is_finite() && span > 0.0 && times.len() > 1 => {
                let current = (times.len() - 1) as f64 / (span / 1000.0);
                current / rate
            }
            _ => 1.0,
        };
        Self::Azure(times.iter().map(|t| (t - first) * factor).collect())
    }

    /// `n` non-decreasing arrival times in ms. Deterministic for a given `seed` (only
    /// Poisson uses it). Azure times are cycled with a period of the span plus one mean gap.
    pub fn times_ms(&self, n: usize, seed: u64) -> Vec<f64> {
        match self {
            Self::Poisson { rate_per_s } if rate_per_s.is_finite() && *rate_per_s > 0.0 => {
                let mut rng = SplitMix64::new(seed);
                let mean_gap_ms = 1000.0 / rate_per_s;
                let mut t = 0.0;
                (0..n)
                    .map(|_| {
                        t += exponential(&mut rng, mean_gap_ms);
                        t
                    })
                    .collect()
            }
            Self::Azure(times) if !times.is_empty() => {
                let first = times.first().copied().unwrap_or(0.0);
                let last = times.last().copied().unwrap_or(0.0);
                let span = last - first;
                let period = span + span / times.len().saturating_sub(1).max(1) as f64;
                (0..n)
                    .map(|i| {
                        let cycle = (i / times.len()) as f64;
                        let t = times.get(i % times.len()).copied().unwrap_or(0.0) - first;
                        cycle * period + t
                    })
                    .collect()
            }
            Self::Poisson { .. } | Self::Azure(_) | Self::AllAtZero => vec![0.0; n],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(times: &[f64]) -> Vec<AzureRequest> {
        times
            .iter()
            .map(|&at_ms| AzureRequest {
                at_ms,
                context_tokens: 1,
                generated_tokens: 1,
            })
            .collect()
    }

    #[test]
    fn poisson_is_seeded_and_has_the_requested_rate() {
        let p = Arrivals::Poisson { rate_per_s: 4.0 };
        let a = p.times_ms(20_000, 7);
        assert_eq!(a, p.times_ms(20_000, 7));
        assert_ne!(a, p.times_ms(20_000, 8));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        let rate = a.len() as f64 / (a.last().copied().expect("times") / 1000.0);
        assert!((rate - 4.0).abs() < 0.15, "{rate}");
    }

    #[test]
    fn azure_is_rescaled_to_the_requested_rate_and_cycles() {
        let arr = Arrivals::azure(&rows(&[100.0, 300.0, 200.0, 500.0]), Some(6.0));
        // 3 gaps over 400 ms = 7.5/s; scaled by 7.5/6 to 6/s.
        assert_eq!(arr, Arrivals::Azure(vec![0.0, 125.0, 250.0, 500.0]));
        let t = arr.times_ms(9, 0);
        let period = 500.0 + 500.0 / 3.0;
        let expected = [0.0, 125.0, 250.0, 500.0]
            .iter()
            .chain(&[0.0, 125.0, 250.0, 500.0])
            .chain(&[0.0])
            .enumerate()
            .map(|(i, x)| x + (i / 4) as f64 * period)
            .collect::<Vec<_>>();
        assert_eq!(t, expected);
        let unscaled = Arrivals::azure(&rows(&[100.0, 300.0]), None);
        assert_eq!(unscaled, Arrivals::Azure(vec![0.0, 200.0]));
    }

    #[test]
    fn degenerate_processes_put_everything_at_zero() {
        for arr in [
            Arrivals::AllAtZero,
            Arrivals::Azure(Vec::new()),
            Arrivals::Poisson { rate_per_s: 0.0 },
            Arrivals::Poisson {
                rate_per_s: f64::NAN,
            },
        ] {
            assert_eq!(arr.times_ms(3, 1), vec![0.0; 3], "{arr:?}");
        }
    }
}
