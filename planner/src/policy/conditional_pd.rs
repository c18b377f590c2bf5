//! `conditional_pd`: Dynamo's conditional disaggregation (`isl_or_load`). The decode
//! worker is picked as in colocated routing; the prefill goes remote only when the tokens
//! that worker would have to compute exceed `max_local_prefill_tokens` and the least busy
//! prefill worker's queue is below `max_prefill_queue_tokens`.

use super::{
    least_busy, Colocated, Decision, Dispatch, Policy, PolicyError, RouteRequest, WorkerView,
};
use crate::ids::Role;

/// Thresholds of the rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConditionalPdConfig {
    /// Uncached prompt tokens above which the prefill goes remote.
    pub max_local_prefill_tokens: u64,
    /// Prefill tokens queued on a prefill worker above which it is skipped.
    pub max_prefill_queue_tokens: u64,
}

impl Default for ConditionalPdConfig {
    fn default() -> Self {
        Self {
            max_local_prefill_tokens: 1_000,
            max_prefill_queue_tokens: 32_768,
        }
    }
}

/// Splits long uncached prefills only.
#[derive(Debug, Default)]
pub struct ConditionalPd {
    cfg: ConditionalPdConfig,
    decode: Colocated,
}

impl ConditionalPd {
    pub fn new(cfg: ConditionalPdConfig) -> Self {
        Self {
            cfg,
            decode: Colocated::default(),
        }
    }
}

impl Policy for ConditionalPd {
    fn name(&self) -> &'static str {
        "conditional_pd"
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let mut d = self.decode.choose(req, workers)?;
        let cached = workers.iter().find(|w| w.id == d.worker).map_or(0, |w| {
            u64::from(w.cached_blocks) * u64::from(req.block_size)
        });
        let uncached = u64::from(req.prompt_tokens).saturating_sub(cached);
        if uncached > self.cfg.max_local_prefill_tokens {
            let prefill = least_busy(workers.iter().filter(|w| {
                w.takes_work()
                    && w.role == Role::Prefill
                    && w.id != d.worker
                    && w.active_prefill_tokens < self.cfg.max_prefill_queue_tokens
            }));
            if let Some(p) = prefill {
                d.dispatch = Dispatch::Disaggregated { prefill: p.id };
            }
        }
        Ok(d)
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn needs_directory(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkerId;

    fn req(tokens: u32) -> RouteRequest<'static> {
        RouteRequest {
            prompt_tokens: tokens,
            block_size: 16,
            ..Default::default()
        }
    }

    #[test]
    fn only_long_uncached_prefills_go_remote_and_only_to_a_short_queue() {
        let mut ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        let mut p = ConditionalPd::default();
        assert_eq!(p.choose(&req(900), &ws).unwrap().dispatch, Dispatch::Single);
        assert_eq!(
            p.choose(&req(5_000), &ws).unwrap().dispatch,
            Dispatch::Disaggregated {
                prefill: WorkerId(0)
            }
        );
        // Mostly cached on the decoder: local.
        ws[1].cached_blocks = 300;
        assert_eq!(
            p.choose(&req(5_000), &ws).unwrap().dispatch,
            Dispatch::Single
        );
        // A long queue on the only prefill worker: local.
        ws[1].cached_blocks = 0;
        ws[0].active_prefill_tokens = 40_000;
        assert_eq!(
            p.choose(&req(5_000), &ws).unwrap().dispatch,
            Dispatch::Single
        );
    }
}
