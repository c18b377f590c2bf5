//! KV-aware routing, Dynamo's cost (WIRE_FORMATS.md §2.2): for each candidate,
//! `logit = overlap_weight · prefill_tokens / block_size + decode_blocks`, where
//! `prefill_tokens` is what the worker still has to prefill (its in-flight prefills plus this
//! prompt minus the cached prefix) and `decode_blocks` the KV it will hold (blocks in flight
//! plus this prompt's uncached blocks). Lower is better: match rate minus load.
//!
//! Temperature 0 takes the argmin (ties: fewer requests in flight, then rotation);
//! temperature T > 0 samples `p ∝ exp(-(l - l_min) / ((l_max - l_min) · T))`. Workers past a
//! busy threshold (scraped queue length or KV usage, or predicted prefill tokens) are
//! skipped; if all are, the request is refused so the client can retry.

use super::cost_choice::CostChoice;
use super::{full_request_candidates, Decision, Policy, PolicyError, RouteRequest, WorkerView};

/// Thresholds past which a worker takes no new requests (`None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BusyThresholds {
    /// Scraped queued requests (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`).
    pub max_waiting: Option<f64>,
    /// Scraped KV usage, 0..1.
    pub max_kv_usage: Option<f64>,
    /// The router's predicted prefill tokens not yet done.
    pub max_active_prefill_tokens: Option<u64>,
}

impl BusyThresholds {
    fn is_busy(&self, w: &WorkerView) -> bool {
        let scraped = w.load.is_some_and(|l| {
            self.max_waiting.is_some_and(|m| l.waiting >= m)
                || self.max_kv_usage.is_some_and(|m| l.kv_usage >= m)
        });
        scraped
            || self
                .max_active_prefill_tokens
                .is_some_and(|m| w.active_prefill_tokens >= m)
    }
}

/// Settings of [`KvAware`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvAwareConfig {
    /// Weight of prefill work against decode blocks (Dynamo's default 1.0).
    pub overlap_weight: f64,
    /// 0: deterministic argmin; higher spreads load more randomly.
    pub temperature: f64,
    pub busy: BusyThresholds,
}

impl Default for KvAwareConfig {
    fn default() -> Self {
        Self {
            overlap_weight: 1.0,
            temperature: 0.0,
            busy: BusyThresholds::default(),
        }
    }
}

/// The KV-aware policy.
#[derive(Debug, Clone)]
pub struct KvAware {
    cfg: KvAwareConfig,
    choice: CostChoice,
}

impl KvAware {
    pub fn new(cfg: KvAwareConfig, seed: u64) -> Self {
        Self {
            cfg,
            choice: CostChoice::new(seed),
        }
    }

    /// The cost of sending `req` to `w`; lower is better.
    pub fn logit(&self, req: &RouteRequest<'_>, w: &WorkerView) -> f64 {
        let bs = u64::from(req.block_size.max(1));
        let cached = u64::from(w.cached_blocks).min(req.prompt_blocks());
        let new_prefill = u64::from(req.prompt_tokens).saturating_sub(cached * bs);
        let prefill_tokens = w.active_prefill_tokens + new_prefill;
        let decode_blocks = w.active_blocks + (req.prompt_blocks() - cached);
        self.cfg.overlap_weight * prefill_tokens as f64 / bs as f64 + decode_blocks as f64
    }
}

impl Policy for KvAware {
    fn name(&self) -> &'static str {
        "kv_aware"
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let mut any = false;
        let scored: Vec<(f64, &WorkerView)> = full_request_candidates(workers)
            .inspect(|_| any = true)
            .filter(|w| !self.cfg.busy.is_busy(w))
            .map(|w| (self.logit(req, w), w))
            .collect();
        if scored.is_empty() {
            return Err(if any {
                PolicyError::AllBusy
            } else {
                PolicyError::NoHealthyWorker
            });
        }
        let pick = self
            .choice
            .choose(&scored, self.cfg.temperature)
            .ok_or(PolicyError::NoHealthyWorker)?;
        Ok(Decision::single(pick.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};
    use crate::policy::EngineLoad;

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
    fn reproduces_dynamos_documented_example() {
        // docs/architecture/kv_cache_routing.md: W1 8+10=18, W2 5+5=10, W3 2+9=11.
        // Expressed as prefill blocks + decode blocks for a request of 0 tokens.
        let p = KvAware::new(KvAwareConfig::default(), 1);
        let r = req(0);
        let ws = [w(1, 10, 8 * 16, 0), w(2, 5, 5 * 16, 0), w(3, 9, 2 * 16, 0)];
        let logits: Vec<f64> = ws.iter().map(|x| p.logit(&r, x)).collect();
        assert_eq!(logits, vec![18.0, 10.0, 11.0]);
        assert_eq!(
            KvAware::new(KvAwareConfig::default(), 1).choose(&r, &ws),
            Ok(Decision::single(WorkerId(2)))
        );
    }

    #[test]
    fn a_cached_prefix_wins_until_load_outweighs_it() {
        let mut p = KvAware::new(KvAwareConfig::default(), 1);
        let r = req(1600); // 100 blocks
                           // Worker 1 holds 90 blocks of the prompt.
        let ws = [w(0, 0, 0, 0), w(1, 0, 0, 90)];
        assert_eq!(p.choose(&r, &ws).unwrap().worker, WorkerId(1));
        // With 300 blocks of other work in flight, the idle worker is cheaper.
        let ws = [w(0, 0, 0, 0), w(1, 300, 0, 90)];
        assert_eq!(p.choose(&r, &ws).unwrap().worker, WorkerId(0));
    }

    #[test]
    fn ties_go_to_fewer_in_flight_then_rotate() {
        let mut p = KvAware::new(KvAwareConfig::default(), 1);
        let r = req(160);
        let mut ws = [w(0, 0, 0, 0), w(1, 0, 0, 0), w(2, 0, 0, 0)];
        ws[0].in_flight = 1;
        let picks: Vec<u32> = (0..4)
            .map(|_| p.choose(&r, &ws).unwrap().worker.0)
            .collect();
        assert!(picks.iter().all(|&x| x != 0));
        assert!(picks.contains(&1) && picks.contains(&2));
    }

    #[test]
    fn temperature_samples_in_proportion_and_is_seeded() {
        let cfg = KvAwareConfig {
            temperature: 1.0,
            ..KvAwareConfig::default()
        };
        let r = req(1600);
        let ws = [w(0, 0, 0, 100), w(1, 0, 0, 50), w(2, 0, 0, 0)];
        let run = |seed| {
            let mut p = KvAware::new(cfg, seed);
            let mut counts = [0u32; 3];
            for _ in 0..3000 {
                counts[p.choose(&r, &ws).unwrap().worker.0 as usize] += 1;
            }
            counts
        };
        let counts = run(7);
        assert_eq!(counts, run(7), "same seed, same choices");
        assert!(counts[0] > counts[1] && counts[1] > counts[2], "{counts:?}");
        assert!(counts[2] > 0, "the worst worker still gets some traffic");
    }

    #[test]
    fn busy_workers_are_skipped_and_all_busy_is_an_error() {
        let cfg = KvAwareConfig {
            busy: BusyThresholds {
                max_waiting: Some(4.0),
                max_kv_usage: Some(0.95),
                max_active_prefill_tokens: Some(10_000),
            },
            ..KvAwareConfig::default()
        };
        let mut p = KvAware::new(cfg, 1);
        let r = req(160);
        let mut ws = [w(0, 0, 0, 10), w(1, 0, 0, 0), w(2, 0, 20_000, 0)];
        ws[0].load = Some(EngineLoad {
            running: 8.0,
            waiting: 6.0,
            kv_usage: 0.5,
            kv_room_tokens: None,
            kv_free_tokens: None,
            kv_capacity_tokens: None,
        });
        assert_eq!(p.choose(&r, &ws).unwrap().worker, WorkerId(1));
        ws[1].load = Some(EngineLoad {
            running: 1.0,
            waiting: 0.0,
            kv_usage: 0.99,
            kv_room_tokens: None,
            kv_free_tokens: None,
            kv_capacity_tokens: None,
        });
        assert_eq!(p.choose(&r, &ws), Err(PolicyError::AllBusy));
        for x in &mut ws {
            x.healthy = false;
        }
        assert_eq!(p.choose(&r, &ws), Err(PolicyError::NoHealthyWorker));
    }
}
