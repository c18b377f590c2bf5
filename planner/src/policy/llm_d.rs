//! `llm_d`: the llm-d router's endpoint picker (EPP) as its guides configure it.
//!
//! Decode profile (llm-d `guides/precise-prefix-cache-aware`, scheduling profile
//! `default`): `decode-filter`, then the weighted sum of three scorers, each in 0..1, and
//! `max-score-picker` (ties: random in llm-d, rotation here):
//! - `precise-prefix-cache-scorer`, weight **3**: matched prompt blocks over prompt blocks,
//!   from the engines' KV events;
//! - `kv-cache-utilization-scorer`, weight **2**: `1 − kv_usage`;
//! - `queue-scorer`, weight **2**: `(max_q − q) / (max_q − min_q)` over the candidates'
//!   waiting requests (1 for all when they are equal).
//!
//! P/D (`prefix-based-pd-decider`, `pkg/plugins/profile/prefix_based_pd_decider.go`):
//! disaggregate when the decode pick's non-cached prompt tokens reach `nonCachedTokens`
//! (the plugin's default 0 disables it; the `guides/pd-disaggregation` config sets **16**).
//! The prefill profile picks among prefill workers with the prefix and queue scorers.
//! llm-d has no prefill-queue limit: a remote prefill waits in the prefill pool.

use super::{
    full_request_candidates, prefill_candidates, Decision, Dispatch, Policy, PolicyError,
    RouteRequest, WorkerView,
};

/// Settings of [`LlmD`]; `Default` is the guides'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmDConfig {
    pub prefix_weight: f64,
    pub kv_utilization_weight: f64,
    pub queue_weight: f64,
    /// `nonCachedTokens` of the P/D decider (0: never disaggregate).
    pub non_cached_tokens: u64,
}

impl Default for LlmDConfig {
    fn default() -> Self {
        Self {
            prefix_weight: 3.0,
            kv_utilization_weight: 2.0,
            queue_weight: 2.0,
            non_cached_tokens: 16,
        }
    }
}

/// The llm-d endpoint picker.
#[derive(Debug, Clone, Default)]
pub struct LlmD {
    cfg: LlmDConfig,
    tie_break: usize,
}

/// Waiting requests as the queue scorer reads them (the scraped gauge, else the router's
/// requests in flight).
fn waiting(w: &WorkerView) -> f64 {
    w.load
        .map_or(f64::from(w.in_flight), |l| l.waiting.max(0.0))
}

impl LlmD {
    pub fn new(cfg: LlmDConfig) -> Self {
        Self { cfg, tie_break: 0 }
    }

    /// The weighted score of each candidate, higher is better.
    pub fn scores(&self, req: &RouteRequest<'_>, ws: &[&WorkerView], kv_util: bool) -> Vec<f64> {
        let (min_q, max_q) = ws
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), w| {
                (a.min(waiting(w)), b.max(waiting(w)))
            });
        let blocks = req.prompt_blocks().max(1) as f64;
        ws.iter()
            .map(|w| {
                let prefix = (f64::from(w.cached_blocks) / blocks).min(1.0);
                let queue = if max_q > min_q {
                    (max_q - waiting(w)) / (max_q - min_q)
                } else {
                    1.0
                };
                let kv = w.load.map_or(1.0, |l| (1.0 - l.kv_usage).clamp(0.0, 1.0));
                self.cfg.prefix_weight * prefix
                    + self.cfg.queue_weight * queue
                    + if kv_util {
                        self.cfg.kv_utilization_weight * kv
                    } else {
                        0.0
                    }
            })
            .collect()
    }

    fn pick<'a>(
        &mut self,
        req: &RouteRequest<'_>,
        ws: &[&'a WorkerView],
        kv_util: bool,
    ) -> Option<&'a WorkerView> {
        let scores = self.scores(req, ws, kv_util);
        let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let tied: Vec<&WorkerView> = ws
            .iter()
            .zip(&scores)
            .filter(|(_, s)| **s >= best)
            .map(|(w, _)| *w)
            .collect();
        self.tie_break = self.tie_break.wrapping_add(1);
        (!tied.is_empty()).then(|| tied[self.tie_break % tied.len()])
    }
}

impl Policy for LlmD {
    fn name(&self) -> &'static str {
        "llm_d"
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let decoders: Vec<&WorkerView> = full_request_candidates(workers).collect();
        let d = self
            .pick(req, &decoders, true)
            .ok_or(PolicyError::NoHealthyWorker)?;
        let mut decision = Decision::single(d.id);
        let cached = u64::from(d.cached_blocks) * u64::from(req.block_size);
        let non_cached = u64::from(req.prompt_tokens).saturating_sub(cached);
        if self.cfg.non_cached_tokens == 0 || non_cached < self.cfg.non_cached_tokens {
            return Ok(decision);
        }
        let prefillers: Vec<&WorkerView> = prefill_candidates(workers, d.id).collect();
        if let Some(p) = self.pick(req, &prefillers, false) {
            decision.dispatch = Dispatch::Disaggregated { prefill: p.id };
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Role;
    use crate::ids::WorkerId;
    use crate::policy::EngineLoad;

    fn req(tokens: u32) -> RouteRequest<'static> {
        RouteRequest {
            model: "m",
            prompt_tokens: tokens,
            block_size: 16,
            ..Default::default()
        }
    }

    fn w(id: u32, role: Role, cached: u32, waiting: f64, kv: f64) -> WorkerView {
        WorkerView {
            cached_blocks: cached,
            host_cached_blocks: 0,
            pulls_kv: true,
            load: Some(EngineLoad {
                running: 1.0,
                waiting,
                kv_usage: kv,
                kv_room_tokens: None,
                kv_free_tokens: None,
                kv_capacity_tokens: None,
            }),
            ..WorkerView::idle(WorkerId(id), role)
        }
    }

    #[test]
    fn scores_are_the_weighted_sum_of_the_three_scorers() {
        let p = LlmD::default();
        let a = w(0, Role::Decode, 50, 0.0, 0.5);
        let b = w(1, Role::Decode, 0, 4.0, 0.0);
        let s = p.scores(&req(1600), &[&a, &b], true);
        assert_eq!(s, vec![3.0 * 0.5 + 2.0 * 1.0 + 2.0 * 0.5, 2.0]);
    }

    #[test]
    fn the_prefix_wins_until_queue_and_memory_outweigh_it() {
        let mut p = LlmD::default();
        let ws = [
            w(0, Role::Decode, 100, 0.0, 0.2),
            w(1, Role::Decode, 0, 0.0, 0.2),
        ];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(0));
        // Half the prompt cached, but the longest queue and a full cache.
        let ws = [
            w(0, Role::Decode, 50, 8.0, 0.95),
            w(1, Role::Decode, 0, 0.0, 0.2),
        ];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(1));
    }

    #[test]
    fn the_decider_disaggregates_on_sixteen_uncached_tokens() {
        let mut p = LlmD::default();
        let ws = [
            w(0, Role::Prefill, 0, 3.0, 0.1),
            w(1, Role::Prefill, 0, 0.0, 0.1),
            w(2, Role::Decode, 99, 0.0, 0.1),
        ];
        // 1,600 tokens, 1,584 cached: 16 uncached, disaggregated to the shorter queue.
        assert_eq!(
            p.choose(&req(1600), &ws).unwrap().dispatch,
            Dispatch::Disaggregated {
                prefill: WorkerId(1)
            }
        );
        // 1,599 tokens: 15 uncached, local.
        assert_eq!(
            p.choose(&req(1599), &ws).unwrap().dispatch,
            Dispatch::Single
        );
    }
}
