//! Choosing among workers scored by a cost, lower being better, as Dynamo's KV router
//! chooses (`kv_aware` and `dynamo_kv` both do): at temperature 0 the cheapest, ties going
//! to fewer requests in flight and then in turn; above 0, a sample of the softmax of the
//! costs normalised to the spread between the cheapest and the dearest.

use super::rng::SplitMix64;
use super::WorkerView;

/// The chooser's own state: its RNG and the turn among tied workers.
#[derive(Debug, Clone)]
pub(crate) struct CostChoice {
    rng: SplitMix64,
    tie_break: usize,
}

impl CostChoice {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            rng: SplitMix64::new(seed),
            tie_break: 0,
        }
    }

    /// One of `scored` (`(cost, worker)`) at `temperature`; `None` when it is empty.
    pub(crate) fn choose<'a>(
        &mut self,
        scored: &[(f64, &'a WorkerView)],
        temperature: f64,
    ) -> Option<&'a WorkerView> {
        let last = scored.last()?.1;
        let min = scored.iter().map(|(c, _)| *c).fold(f64::INFINITY, f64::min);
        let max = scored
            .iter()
            .map(|(c, _)| *c)
            .fold(f64::NEG_INFINITY, f64::max);
        if temperature > 0.0 && max > min {
            let weights: Vec<f64> = scored
                .iter()
                .map(|(c, _)| (-(c - min) / ((max - min) * temperature)).exp())
                .collect();
            let mut x = self.rng.next_f64() * weights.iter().sum::<f64>();
            for (i, w) in weights.iter().enumerate() {
                if x < *w {
                    return Some(scored[i].1);
                }
                x -= w;
            }
            return Some(last);
        }
        let best: Vec<&WorkerView> = scored
            .iter()
            .filter(|(c, _)| *c <= min)
            .map(|(_, w)| *w)
            .collect();
        let fewest = best.iter().map(|w| w.in_flight).min().unwrap_or(0);
        let tied: Vec<&WorkerView> = best.into_iter().filter(|w| w.in_flight == fewest).collect();
        self.tie_break = self.tie_break.wrapping_add(1);
        Some(tied[self.tie_break % tied.len()])
    }
}
