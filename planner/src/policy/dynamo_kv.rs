//! `dynamo_kv`: NVIDIA Dynamo's KV router (`--router-mode kv`) with its current defaults.
//!
//! Cost per candidate worker, lower is better (Dynamo docs
//! `components/router/routing-concepts.md` and `configuration-and-tuning.md`):
//!
//! `cost = prefill_load_scale · adjusted_prefill_blocks + decode_blocks`, where
//! - `adjusted_prefill_blocks = (active_prefill_tokens + prompt − overlap_credit · cached) / block_size`:
//!   prompt-side work queued there plus this request's, minus the device-local overlap
//!   credit (`--router-kv-overlap-score-credit`, default **1.0**);
//! - `prefill_load_scale` (`--router-prefill-load-scale`, default **1.0**);
//! - `decode_blocks`: KV blocks of the requests active there plus this request's blocks
//!   it does not already hold (Dynamo's active-block tracking, `assume_kv_reuse`).
//!
//! `--router-temperature` (default **0.0**) picks the argmin; above 0 it samples a softmax
//! of the normalised costs. Busy thresholds (`--active-decode-blocks-threshold`,
//! `--active-prefill-tokens-threshold`) are unset by default: no worker is refused.
//! Credit decay (`--router-kv-overlap-score-credit-decay`) defaults to 0 (off), and the
//! host/disk tier credits (0.75 / 0.25) apply only to tiers the engines report, which the
//! device-only KV index here does not.

use super::cost_choice::CostChoice;
use super::{full_request_candidates, Decision, Policy, PolicyError, RouteRequest, WorkerView};

/// Settings of [`DynamoKv`]; `Default` is Dynamo's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamoKvConfig {
    /// `--router-kv-overlap-score-credit`: share of cached prompt tokens credited.
    pub overlap_credit: f64,
    /// `--router-prefill-load-scale`: weight of prompt-side load against decode blocks.
    pub prefill_load_scale: f64,
    /// `--router-temperature`: 0 picks the cheapest worker.
    pub temperature: f64,
    /// `--active-decode-blocks-threshold` as a block count (`None`: off, the default).
    pub max_active_blocks: Option<u64>,
    /// `--active-prefill-tokens-threshold` (`None`: off, the default).
    pub max_active_prefill_tokens: Option<u64>,
}

impl Default for DynamoKvConfig {
    fn default() -> Self {
        Self {
            overlap_credit: 1.0,
            prefill_load_scale: 1.0,
            temperature: 0.0,
            max_active_blocks: None,
            max_active_prefill_tokens: None,
        }
    }
}

impl DynamoKvConfig {
    fn is_busy(&self, w: &WorkerView) -> bool {
        self.max_active_blocks.is_some_and(|m| w.active_blocks >= m)
            || self
                .max_active_prefill_tokens
                .is_some_and(|m| w.active_prefill_tokens >= m)
    }

    /// Dynamo's cost of sending `req` to `w`; lower is better.
    pub fn cost(&self, req: &RouteRequest<'_>, w: &WorkerView) -> f64 {
        let bs = f64::from(req.block_size.max(1));
        let cached_blocks = u64::from(w.cached_blocks).min(req.prompt_blocks());
        let cached_tokens = (cached_blocks as f64 * bs).min(f64::from(req.prompt_tokens));
        let prefill_tokens = w.active_prefill_tokens as f64 + f64::from(req.prompt_tokens)
            - self.overlap_credit * cached_tokens;
        let decode_blocks = w.active_blocks + (req.prompt_blocks() - cached_blocks);
        self.prefill_load_scale * prefill_tokens.max(0.0) / bs + decode_blocks as f64
    }
}

/// Dynamo's KV router.
#[derive(Debug, Clone)]
pub struct DynamoKv {
    cfg: DynamoKvConfig,
    choice: CostChoice,
}

impl DynamoKv {
    pub fn new(cfg: DynamoKvConfig, seed: u64) -> Self {
        Self {
            cfg,
            choice: CostChoice::new(seed),
        }
    }

    /// The cheapest of `candidates` by Dynamo's cost (or a softmax sample at temperature
    /// > 0); ties go to fewer requests in flight, then rotate. Busy workers are skipped.
    pub fn pick<'a>(
        &mut self,
        req: &RouteRequest<'_>,
        candidates: impl Iterator<Item = &'a WorkerView>,
    ) -> Result<&'a WorkerView, PolicyError> {
        let mut any = false;
        let scored: Vec<(f64, &WorkerView)> = candidates
            .inspect(|_| any = true)
            .filter(|w| !self.cfg.is_busy(w))
            .map(|w| (self.cfg.cost(req, w), w))
            .collect();
        if scored.is_empty() {
            return Err(if any {
                PolicyError::AllBusy
            } else {
                PolicyError::NoHealthyWorker
            });
        }
        self.choice
            .choose(&scored, self.cfg.temperature)
            .ok_or(PolicyError::NoHealthyWorker)
    }
}

impl Policy for DynamoKv {
    fn name(&self) -> &'static str {
        "dynamo_kv"
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let w = self.pick(req, full_request_candidates(workers))?;
        Ok(Decision::single(w.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};

    fn req(tokens: u32) -> RouteRequest<'static> {
        RouteRequest {
            model: "m",
            prompt_tokens: tokens,
            block_size: 16,
            ..Default::default()
        }
    }

    fn w(id: u32, active_blocks: u64, active_prefill: u64, cached: u32) -> WorkerView {
        WorkerView {
            active_blocks,
            active_prefill_tokens: active_prefill,
            cached_blocks: cached,
            host_cached_blocks: 0,
            pulls_kv: true,
            ..WorkerView::idle(WorkerId(id), Role::Decode)
        }
    }

    #[test]
    fn cost_is_scaled_prefill_blocks_plus_decode_blocks() {
        let cfg = DynamoKvConfig::default();
        // 1,600 tokens = 100 blocks, 40 cached; 160 prefill tokens queued, 7 blocks active.
        let c = cfg.cost(&req(1600), &w(0, 7, 160, 40));
        assert_eq!(c, (160.0 + 1600.0 - 640.0) / 16.0 + 7.0 + 60.0);
        let half = DynamoKvConfig {
            overlap_credit: 0.5,
            prefill_load_scale: 2.0,
            ..cfg
        };
        let c = half.cost(&req(1600), &w(0, 7, 160, 40));
        assert_eq!(c, 2.0 * (160.0 + 1600.0 - 320.0) / 16.0 + 7.0 + 60.0);
    }

    #[test]
    fn the_cached_worker_wins_until_its_queue_outweighs_the_overlap() {
        let mut p = DynamoKv::new(DynamoKvConfig::default(), 1);
        let r = req(1600);
        let ws = [w(0, 0, 0, 0), w(1, 0, 0, 90)];
        assert_eq!(p.choose(&r, &ws).unwrap().worker, WorkerId(1));
        // 3,200 prompt tokens queued on worker 1: 200 prefill blocks against 90 saved.
        let ws = [w(0, 0, 0, 0), w(1, 0, 3_200, 90)];
        assert_eq!(p.choose(&r, &ws).unwrap().worker, WorkerId(0));
    }

    #[test]
    fn prefill_only_workers_are_not_candidates_and_busy_ones_are_skipped() {
        let cfg = DynamoKvConfig {
            max_active_prefill_tokens: Some(1_000),
            ..DynamoKvConfig::default()
        };
        let mut p = DynamoKv::new(cfg, 1);
        let ws = [
            WorkerView {
                cached_blocks: 100,
                host_cached_blocks: 0,
                pulls_kv: true,
                ..WorkerView::idle(WorkerId(0), Role::Prefill)
            },
            w(1, 0, 5_000, 100),
            w(2, 50, 0, 0),
        ];
        assert_eq!(p.choose(&req(1600), &ws).unwrap().worker, WorkerId(2));
        let ws = [w(1, 0, 5_000, 100)];
        assert_eq!(p.choose(&req(1600), &ws), Err(PolicyError::AllBusy));
    }
}
