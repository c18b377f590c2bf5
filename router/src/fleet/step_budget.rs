//! Each engine's step budget (vLLM `--max-num-batched-tokens`, SGLang
//! `--chunked-prefill-size`), which the planner prices prefills in: a prefill runs as
//! chunks of it, each sharing its step with the decodes running there.
//!
//! A worker's configured `max_num_batched_tokens` wins; else an SGLang engine reports its
//! budget in `/server_info` (its server arguments), read once at startup with the rest of
//! what the engines report (`crate::fleet::engine_report`; a worker
//! that joins later from discovery, or was down then, keeps the default); else
//! the planner keeps the router's setting or vLLM's default for the worker's GPU
//! (`config::validated`). vLLM publishes no scheduler settings (its `cache_config_info`
//! gauge carries only the cache's), so a vLLM worker's non-default budget is configured,
//! as is its `--long-prefill-token-threshold` (SGLang has no per-request cap).

use std::collections::HashMap;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::StepBudget;
use ownerserve_shim::engines::{self, StepBudgetSource};

use crate::config::RouterConfig;
use crate::fleet::engine_report::EngineReport;
use crate::fleet::registry::Registry;

/// Puts the step budget every worker whose engine reports one (SGLang,
/// `StepBudgetSource::SelfReport`) and has none configured reported
/// (`reports`, read once at startup) into the planner's settings (`cfg.planner`, which the
/// routing policy is then built from); a worker that was down or reported none keeps the
/// planner's default.
pub fn learn(
    registry: &Registry,
    reports: &HashMap<WorkerId, EngineReport>,
    cfg: &mut RouterConfig,
) {
    for w in registry.all().iter() {
        let source = engines::protocol(w.spec.engine).step_budget();
        if source != StepBudgetSource::SelfReport || w.spec.max_num_batched_tokens.is_some() {
            continue;
        }
        if let Some(tokens) = reports.get(&w.id).and_then(|r| r.step_tokens) {
            tracing::debug!(worker = %w.spec.name, tokens, "engine step budget from its self-report");
            let budget = StepBudget {
                tokens,
                ..cfg.planner.step_budget_of(w.id)
            };
            cfg.planner.worker_step_budgets.insert(w.id, budget);
        }
    }
}
