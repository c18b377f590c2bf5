//! `dynamo_disagg`: Dynamo's disaggregated serving with conditional disaggregation
//! (`--router-conditional-disagg`, policy `isl_or_load`) at its current defaults.
//!
//! 1. The decode worker is chosen by the KV router ([`DynamoKv`], Dynamo defaults) over
//!    decode and hybrid workers. Conditional disaggregation needs decode-side KV
//!    visibility, so the overlap credit applies there.
//! 2. The request skips remote prefill and prefills locally on that decode worker when
//!    (`lib/llm/src/kv_router/prefill_router/conditional_bypass.rs`):
//!    - *isl_bounding*: the effective ISL (prompt minus the decode worker's cached
//!      tokens) is below `eff_isl_threshold` (default **2,048**) **and** below
//!      `eff_isl_ratio_threshold` (default **0.7**) of the prompt; or
//!    - *prefill load*: the prefill worker the router would pick is busy.
//! 3. Otherwise the prefill worker is chosen by the prefill router: the KV router over
//!    prefill workers, without active-block tracking (`track_active_blocks=false`).
//!
//! Dynamo leaves `prefill_busy_threshold` unset by default (the load arm never fires,
//! so a saturated prefill pool queues). The issue asks for the queue limit, so it is set
//! here to 32,768 queued prefill tokens (four 8,192-token chunks); without it the
//! baseline collapses on 2P6D the way `static_pd` does, which would be a straw man.

use super::{
    full_request_candidates, prefill_candidates, Decision, Dispatch, DynamoKv, DynamoKvConfig,
    Policy, PolicyError, RouteRequest, WorkerView,
};

/// Settings of [`DynamoDisagg`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamoDisaggConfig {
    /// The KV router of both stages.
    pub router: DynamoKvConfig,
    /// `eff_isl_threshold`: net-new prompt tokens at or above which prefill goes remote.
    pub eff_isl_threshold: u64,
    /// `eff_isl_ratio_threshold`: net-new share of the prompt at or above which it does.
    pub eff_isl_ratio_threshold: f64,
    /// `prefill_busy_threshold` as queued prefill tokens on the chosen prefill worker
    /// (`None`: Dynamo's default, the load arm off).
    pub prefill_busy_tokens: Option<u64>,
}

impl Default for DynamoDisaggConfig {
    fn default() -> Self {
        Self {
            router: DynamoKvConfig::default(),
            eff_isl_threshold: 2_048,
            eff_isl_ratio_threshold: 0.7,
            prefill_busy_tokens: Some(32_768),
        }
    }
}

/// Dynamo's conditional disaggregation.
#[derive(Debug, Clone)]
pub struct DynamoDisagg {
    cfg: DynamoDisaggConfig,
    decode: DynamoKv,
    prefill: DynamoKv,
}

impl DynamoDisagg {
    pub fn new(cfg: DynamoDisaggConfig, seed: u64) -> Self {
        Self {
            cfg,
            decode: DynamoKv::new(cfg.router, seed),
            prefill: DynamoKv::new(cfg.router, seed ^ 0x9E37_79B9),
        }
    }

    /// Whether `isl_bounding` keeps the prefill on the decode worker.
    pub fn isl_bypass(&self, prompt_tokens: u64, cached_tokens: u64) -> bool {
        let eff = prompt_tokens.saturating_sub(cached_tokens);
        eff < self.cfg.eff_isl_threshold
            && (eff as f64 / prompt_tokens.max(1) as f64) < self.cfg.eff_isl_ratio_threshold
    }
}

impl Policy for DynamoDisagg {
    fn name(&self) -> &'static str {
        "dynamo_disagg"
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let d = self.decode.pick(req, full_request_candidates(workers))?;
        let mut decision = Decision::single(d.id);
        let cached = (u64::from(d.cached_blocks) * u64::from(req.block_size))
            .min(u64::from(req.prompt_tokens));
        if self.isl_bypass(u64::from(req.prompt_tokens), cached) {
            return Ok(decision);
        }
        // The prefill router: KV router over prefill workers, no decode-block tracking.
        let prefill_views: Vec<WorkerView> = prefill_candidates(workers, d.id)
            .map(|w| WorkerView {
                active_blocks: 0,
                ..*w
            })
            .collect();
        if prefill_views.is_empty() {
            return Ok(decision);
        }
        let Ok(p) = self.prefill.pick(req, prefill_views.iter()) else {
            return Ok(decision);
        };
        let busy = self
            .cfg
            .prefill_busy_tokens
            .is_some_and(|m| p.active_prefill_tokens >= m);
        if !busy {
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

    fn req(tokens: u32) -> RouteRequest<'static> {
        RouteRequest {
            model: "m",
            prompt_tokens: tokens,
            block_size: 16,
            ..Default::default()
        }
    }

    fn fleet() -> Vec<WorkerView> {
        vec![
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView::idle(WorkerId(1), Role::Prefill),
            WorkerView::idle(WorkerId(2), Role::Decode),
            WorkerView::idle(WorkerId(3), Role::Decode),
        ]
    }

    #[test]
    fn isl_bounding_matches_dynamos_rule() {
        let p = DynamoDisagg::new(DynamoDisaggConfig::default(), 1);
        // Dynamo's own cases: 1,000 tokens with 896 cached bypass; 200 uncached do not
        // (ratio 1.0); 2,048 net-new never bypass.
        assert!(p.isl_bypass(1_000, 896));
        assert!(!p.isl_bypass(200, 0));
        assert!(!p.isl_bypass(2_048, 0));
        assert!(!p.isl_bypass(100_000, 64_000));
    }

    #[test]
    fn a_long_uncached_prompt_goes_to_the_least_loaded_prefill_worker() {
        let mut p = DynamoDisagg::new(DynamoDisaggConfig::default(), 1);
        let mut ws = fleet();
        ws[0].active_prefill_tokens = 8_000;
        let d = p.choose(&req(10_000), &ws).unwrap();
        assert_eq!(
            d.dispatch,
            Dispatch::Disaggregated {
                prefill: WorkerId(1)
            }
        );
        assert!(d.worker == WorkerId(2) || d.worker == WorkerId(3));
    }

    #[test]
    fn the_decode_worker_follows_its_cache_and_a_cached_turn_stays_local() {
        let mut p = DynamoDisagg::new(DynamoDisaggConfig::default(), 1);
        let mut ws = fleet();
        ws[3].cached_blocks = 600; // 9,600 of 10,000 tokens
        let d = p.choose(&req(10_000), &ws).unwrap();
        assert_eq!((d.worker, d.dispatch), (WorkerId(3), Dispatch::Single));
    }

    #[test]
    fn a_busy_prefill_pool_prefills_locally() {
        let mut p = DynamoDisagg::new(DynamoDisaggConfig::default(), 1);
        let mut ws = fleet();
        ws[0].active_prefill_tokens = 40_000;
        ws[1].active_prefill_tokens = 50_000;
        let d = p.choose(&req(10_000), &ws).unwrap();
        assert_eq!(d.dispatch, Dispatch::Single);
        // No prefill worker at all (8 hybrids): always local.
        let hybrids: Vec<WorkerView> = (0..4)
            .map(|i| WorkerView::idle(WorkerId(i), Role::Hybrid))
            .collect();
        assert_eq!(
            p.choose(&req(10_000), &hybrids).unwrap().dispatch,
            Dispatch::Single
        );
    }
}
