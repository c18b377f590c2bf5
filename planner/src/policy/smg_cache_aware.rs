//! `smg_cache_aware`: SGLang's router, now SMG (lightseekorg/smg), policy `cache_aware`
//! at its defaults (`docs/concepts/routing/cache-aware.md`):
//! - *Imbalanced* when `max_load − min_load > balance_abs_threshold` (**64**) **and**
//!   `max_load > balance_rel_threshold · min_load` (**1.5**), load being each worker's
//!   active requests: route to the least loaded worker.
//! - Otherwise find the worker with the longest cached prefix; if its match ratio exceeds
//!   `cache_threshold` (**0.3**) route there, else to the least loaded worker.
//!
//! In P/D mode SMG always disaggregates (no conditional decision): the prefill worker and
//! the decode worker are each chosen by the same policy over their own pool.

use super::{
    full_request_candidates, least_busy, Decision, Dispatch, Policy, PolicyError, RouteRequest,
    WorkerView,
};
use crate::ids::Role;

/// Settings of [`SmgCacheAware`]; `Default` is SMG's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmgCacheAwareConfig {
    pub cache_threshold: f64,
    pub balance_abs_threshold: u32,
    pub balance_rel_threshold: f64,
}

impl Default for SmgCacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

/// SMG's cache-aware policy.
#[derive(Debug, Clone, Default)]
pub struct SmgCacheAware {
    cfg: SmgCacheAwareConfig,
    rotation: usize,
}

impl SmgCacheAware {
    pub fn new(cfg: SmgCacheAwareConfig) -> Self {
        Self { cfg, rotation: 0 }
    }

    /// The pick among `pool` (non-empty).
    fn pick<'a>(
        &mut self,
        req: &RouteRequest<'_>,
        pool: &[&'a WorkerView],
    ) -> Option<&'a WorkerView> {
        self.rotation = self.rotation.wrapping_add(1);
        let n = pool.len();
        if n == 0 {
            return None;
        }
        // Rotate so ties among equally loaded workers spread.
        let rotated: Vec<&WorkerView> = (0..n).map(|i| pool[(i + self.rotation) % n]).collect();
        let least = || rotated.iter().copied().min_by_key(|w| w.in_flight);
        let max = pool.iter().map(|w| w.in_flight).max().unwrap_or(0);
        let min = pool.iter().map(|w| w.in_flight).min().unwrap_or(0);
        let imbalanced = max - min > self.cfg.balance_abs_threshold
            && f64::from(max) > self.cfg.balance_rel_threshold * f64::from(min);
        if imbalanced {
            return least();
        }
        let best = longest_match(&rotated);
        let ratio = f64::from(best.cached_blocks) / req.prompt_blocks().max(1) as f64;
        if ratio > self.cfg.cache_threshold {
            Some(best)
        } else {
            least()
        }
    }
}

/// The worker with the longest cached prefix (the first among equals).
fn longest_match<'a>(pool: &[&'a WorkerView]) -> &'a WorkerView {
    let mut best = pool[0];
    for w in pool {
        if w.cached_blocks > best.cached_blocks {
            best = w;
        }
    }
    best
}

impl Policy for SmgCacheAware {
    fn name(&self) -> &'static str {
        "smg_cache_aware"
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let prefillers: Vec<&WorkerView> = workers
            .iter()
            .filter(|w| w.takes_work() && w.role == Role::Prefill)
            .collect();
        let decoders: Vec<&WorkerView> = full_request_candidates(workers)
            .filter(|w| prefillers.is_empty() || w.role != Role::Prefill)
            .collect();
        let d = self
            .pick(req, &decoders)
            .or_else(|| least_busy(workers.iter().filter(|w| w.takes_work())))
            .ok_or(PolicyError::NoHealthyWorker)?;
        let mut decision = Decision::single(d.id);
        let prefillers: Vec<&WorkerView> =
            prefillers.into_iter().filter(|w| w.id != d.id).collect();
        if let Some(p) = self.pick(req, &prefillers) {
            decision.dispatch = Dispatch::Disaggregated { prefill: p.id };
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkerId;

    fn req(tokens: u32) -> RouteRequest<'static> {
        RouteRequest {
            model: "m",
            prompt_tokens: tokens,
            block_size: 16,
            ..Default::default()
        }
    }

    fn w(id: u32, cached: u32, in_flight: u32) -> WorkerView {
        WorkerView {
            cached_blocks: cached,
            host_cached_blocks: 0,
            pulls_kv: true,
            in_flight,
            ..WorkerView::idle(WorkerId(id), Role::Hybrid)
        }
    }

    #[test]
    fn a_match_above_the_cache_threshold_wins_below_it_the_least_loaded() {
        let mut p = SmgCacheAware::default();
        // 100 blocks; 31 cached (0.31 > 0.3) on a busier worker.
        let ws = [w(0, 31, 10), w(1, 0, 2)];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(0));
        let ws = [w(0, 30, 10), w(1, 0, 2)];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(1));
    }

    #[test]
    fn imbalance_needs_both_thresholds() {
        let mut p = SmgCacheAware::default();
        // 100 − 30 = 70 > 64 and 100 > 45: imbalanced, the cache is ignored.
        let ws = [w(0, 100, 100), w(1, 0, 30)];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(1));
        // 200 − 140 = 60 ≤ 64: balanced, the cache wins.
        let ws = [w(0, 100, 200), w(1, 0, 140)];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(0));
    }

    #[test]
    fn a_pd_fleet_always_disaggregates() {
        let mut p = SmgCacheAware::default();
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        let d = p.choose(&req(16), &ws).unwrap();
        assert_eq!(
            (d.worker, d.dispatch),
            (
                WorkerId(1),
                Dispatch::Disaggregated {
                    prefill: WorkerId(0)
                }
            )
        );
    }
}
