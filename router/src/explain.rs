//! `POST /admin/v1/plan/explain`: the plan the cost planner would choose for a request,
//! with every candidate's cost terms, without executing anything. It asks the routing
//! policy itself (with what its calibration has learned) when that is `ownerserve`, on the
//! router's view of the workers (load, KV-index prefix matches) and the directory's view of
//! the session (owner, longest owned prefix).

use ownerserve_planner::policy::{OwnerServe, RouteRequest};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::server::AppState;

/// Header a client sets to mark a request as a fork of its session.
pub const FORK_HEADER: &str = "x-ownerserve-fork";

/// What the explain request asks about.
pub struct Step<'a> {
    pub model: &'a str,
    pub tokens: &'a [u32],
    pub session: Option<&'a str>,
    pub samples: u32,
    pub fork: bool,
}

/// Explains the plan for `step`.
pub fn explain(st: &AppState, step: &Step<'_>) -> Result<Value, ApiError> {
    let block = st.kv.block_size() as u64;
    let hashes = st.kv.hashes(step.tokens);
    let mut views = st.registry.candidates(step.model, &[]);
    st.kv.fill_cached(&hashes, &mut views);
    let lookup = st.lookup(step.session, &hashes);
    let req = RouteRequest {
        model: step.model,
        prompt_tokens: u32::try_from(step.tokens.len()).unwrap_or(u32::MAX),
        block_size: block as u32,
        session: step.session,
        now_ms: st.kv.now_ms(),
        decode_owner: lookup.owner,
        artifact: lookup.artifact,
        samples: step.samples,
        fork: step.fork,
    };
    // The routing policy itself when it is the planner, with what its calibration has
    // learned; otherwise a fresh planner shows what `ownerserve` would do.
    let (planned, planner) = match st.explain(&req, &views) {
        Some(p) => (p, "routing"),
        None => (
            OwnerServe::new(st.cfg.planner.clone()).explain_plan(&req, &views),
            "fresh (routing uses another policy)",
        ),
    };
    let p = planned.map_err(|_| ApiError::NoHealthyWorker {
        model: step.model.to_owned(),
    })?;
    let names: Vec<Value> = st
        .registry
        .all()
        .iter()
        .map(|w| json!({"id": w.id.0, "name": w.spec.name}))
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
        "reason": p.reason,
        "chosen": p.chosen,
        "directory_changes": p.changes,
        "inputs": {
            "model": st.cfg.planner.model.name,
            "prompt_tokens": req.prompt_tokens,
            "session": step.session,
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
