//! `POST /admin/v1/plan/explain`: the plan the cost planner would choose for a request,
//! with every candidate's cost terms, without executing anything. It asks the routing
//! policy itself (with what its calibration has learned) when that is `ownerserve`, on the
//! router's view of the workers (load, KV-index prefix matches) and the directory's view of
//! the session (owner, longest owned prefix).

use axum::extract::Request;
use serde_json::{json, Value};

use ownerserve_planner::policy::OwnerServe;
use ownerserve_shim::openai::{Endpoint, ParsedRequest};

use crate::error::ApiError;
use crate::prompt::Hashing;
use crate::proxy::front::{front_half, Ask};
use crate::proxy::identity::Identity;
use crate::proxy::view::Needs;
use crate::server::state::AppState;

/// Explains the plan for a chat request (with its session and fork headers), reading
/// every source whatever the routing policy reads.
pub async fn explain(st: &AppState, req: Request) -> Result<Value, ApiError> {
    let ask = Ask {
        endpoint: Endpoint::ChatCompletions,
        hashing: Hashing::Peek,
        admits: false,
    };
    front_half(st, req, ask, async |f| Ok(explained(st, f.parsed, f.id))).await?
}

/// The plan for a request through its front half.
fn explained(
    st: &AppState,
    parsed: &ParsedRequest<'_>,
    id: &Identity<'_>,
) -> Result<Value, ApiError> {
    let sources = st.sources();
    let step = sources.step(&parsed.model, id, parsed.sampling.n, Needs::ALL);
    let views = sources.candidates(&parsed.model, id.hashes(), &[], Needs::ALL);
    let (req, lookup) = (step.route, step.lookup);
    // The routing policy itself when it is the planner, with what its calibration has
    // learned and its migration budget as spent; otherwise a fresh planner shows what
    // `ownerserve` would do, without a migration budget: having routed nothing, its budget
    // would refuse nearly every move.
    let (planned, planner) = match st.policy.explain(&req, &views) {
        Some(p) => (p, "routing"),
        None => {
            let mut cfg = st.cfg.planner.clone();
            cfg.weights.migration_budget = f64::INFINITY;
            (
                OwnerServe::new(cfg).explain_plan(&req, &views),
                "fresh (routing uses another policy; no migration budget)",
            )
        }
    };
    let p = planned.map_err(|_| ApiError::NoHealthyWorker {
        model: parsed.model.to_string(),
    })?;
    let names: Vec<Value> = st
        .registry
        .all()
        .iter()
        .map(|w| {
            let budget = st.cfg.planner.step_budget_of(w.id);
            json!({
                "id": w.id.0,
                "name": w.spec.name,
                "max_num_batched_tokens": budget.tokens,
                "long_prefill_token_threshold": budget.long_prefill_cap,
            })
        })
        .collect();
    // Only an embedded node is read per request (see `DirectoryClient::lookup`).
    let consulted = if lookup.consulted {
        "embedded"
    } else {
        "not consulted (off or remote)"
    };
    Ok(json!({
        "class": p.class,
        "action": p.chosen.action,
        "reason": st.registry.name_workers(&p.reason()),
        "chosen": p.chosen,
        "directory_changes": p.changes,
        "inputs": {
            "model": st.cfg.planner.model_for(&parsed.model).name,
            "prompt_tokens": req.prompt_tokens,
            "session": id.session,
            "decode_owner": lookup.owner,
            "epoch": lookup.epoch.map(|e| e.0),
            "artifact": lookup.artifact,
            "directory": consulted,
            "planner": planner,
        },
        "workers": names,
        // Every candidate, dominated remote prefills included (routing prices fewer).
        "exhaustive": true,
        "candidates": p.ranked(),
    }))
}
