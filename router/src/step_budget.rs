//! Each engine's step budget (vLLM `--max-num-batched-tokens`, SGLang
//! `--chunked-prefill-size`), which the planner prices prefills in: a prefill runs as
//! chunks of it, each sharing its step with the decodes running there.
//!
//! A worker's configured `max_num_batched_tokens` wins; else an SGLang engine reports its
//! budget in `/server_info` (its server arguments) and it is read once at startup (a worker
//! that joins later from discovery, or was down then, keeps the default); else
//! the planner keeps the router's setting or vLLM's default for the worker's GPU
//! (`config::validated`). vLLM publishes no scheduler settings (its `cache_config_info`
//! gauge carries only the cache's), so a vLLM worker's non-default budget is configured,
//! as is its `--long-prefill-token-threshold` (SGLang has no per-request cap).

use ownerserve_planner::ids::EngineKind;
use ownerserve_planner::plan::StepBudget;

use crate::config::RouterConfig;
use crate::registry::Registry;
use crate::upstream::{get_small, HttpClient};

/// Reads the step budget every SGLang worker without a configured one reports into the
/// planner's settings (`cfg.planner`, which the routing policy is then built from); a worker
/// that is down or reports none keeps the planner's default.
pub async fn learn(registry: &Registry, client: &HttpClient, cfg: &mut RouterConfig) {
    let timeout = cfg.health_timeout;
    for w in registry.all().iter() {
        if w.spec.engine != EngineKind::Sglang || w.spec.max_num_batched_tokens.is_some() {
            continue;
        }
        let Ok((status, body)) = get_small(client, &w.spec.base_url, "/server_info", timeout).await
        else {
            continue;
        };
        if let Some(tokens) = status.is_success().then(|| reported(&body)).flatten() {
            tracing::debug!(worker = %w.spec.name, tokens, "engine step budget from /server_info");
            let budget = StepBudget {
                tokens,
                ..cfg.planner.step_budget_of(w.id)
            };
            cfg.planner.worker_step_budgets.insert(w.id, budget);
        }
    }
}

/// `chunked_prefill_size` of an SGLang `/server_info` body, when chunked prefill is on
/// (SGLang sends -1 or null when it is off, and then runs a prompt in one step, which no
/// budget describes: the default stays).
fn reported(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("chunked_prefill_size")?
        .as_u64()
        .filter(|&t| t > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_s_chunk_size_is_its_budget_unless_chunking_is_off() {
        assert_eq!(
            reported(br#"{"chunked_prefill_size": 4096, "page_size": 16}"#),
            Some(4096)
        );
        assert_eq!(reported(br#"{"chunked_prefill_size": -1}"#), None);
        assert_eq!(reported(br#"{"chunked_prefill_size": null}"#), None);
        assert_eq!(reported(b"not json"), None);
    }
}
