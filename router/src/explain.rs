//! `POST /admin/v1/plan/explain`: the plan the cost planner would choose for a request,
//! with every candidate's cost terms, without executing anything. It gathers what the
//! planner needs from the router's state (workers' load, the KV index's prefix matches)
//! and the embedded directory (the session's decode owner, the prompt's longest owned
//! prefix), then runs the pure planner.

use ownerserve_ownership::ids::{PrefixKey, SessionId};
use ownerserve_ownership::Directory;
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::{plan, ArtifactView, ClassThresholds, PlanInput, PlanWorker};
use ownerserve_planner::roofline::{prefill_pairs, StepWork};
use serde_json::{json, Value};

use crate::config::PlannerSetup;
use crate::directory::Node;
use crate::error::ApiError;
use crate::kv::KvRouting;
use crate::registry::Registry;

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

/// The session's decode owner and the prompt's longest owned prefix, from the directory.
fn from_directory(
    d: &Directory,
    session: Option<&str>,
    hashes: &[u64],
    block: u64,
) -> (Option<WorkerId>, Option<ArtifactView>) {
    let owner = session
        .and_then(|s| d.sessions.get(&SessionId(s.to_owned())))
        .and_then(|s| s.owner)
        .map(|o| WorkerId(o.worker.0));
    let artifact = hashes.iter().enumerate().rev().find_map(|(i, h)| {
        let owner = d.artifacts.get(&PrefixKey(*h))?.owner?;
        Some(ArtifactView {
            owner: WorkerId(owner.worker.0),
            tokens: (i as u64 + 1) * block,
        })
    });
    (owner, artifact)
}

/// Explains the plan for `step`.
pub fn explain(
    step: &Step<'_>,
    registry: &Registry,
    kv: &KvRouting,
    planner: &PlannerSetup,
    directory: Option<&Node>,
) -> Result<Value, ApiError> {
    let block = kv.block_size() as u64;
    let hashes = kv.hashes(step.tokens);
    let mut views = registry.candidates(step.model, &[]);
    kv.fill_cached(&hashes, &mut views);
    let workers: Vec<PlanWorker> = views
        .iter()
        .map(|v| {
            // Prompt tokens sent there and not yet prefilled are the queue ahead of us.
            let waiting = v.active_prefill_tokens;
            let queue_s = if waiting == 0 {
                0.0
            } else {
                let work = StepWork {
                    prefill_tokens: waiting,
                    prefill_attention_pairs: prefill_pairs(waiting, 0),
                    ..StepWork::default()
                };
                planner.roofline.step_time(&planner.model, &work).total_s
            };
            PlanWorker {
                id: v.id,
                role: v.role,
                healthy: v.healthy,
                draining: false,
                roofline: planner.roofline.clone(),
                queue_s,
                decoding: v
                    .load
                    .map_or(u64::from(v.in_flight), |l| l.running.max(0.0) as u64),
                cached_tokens: u64::from(v.cached_blocks) * block,
                prefill_scale: 1.0,
            }
        })
        .collect();
    let (decode_owner, artifact, consulted) = match directory {
        Some(node) => {
            let (o, a) = node
                .machine
                .read(|s| from_directory(&s.directory, step.session, &hashes, block));
            (o, a, "embedded")
        }
        None => (None, None, "not consulted (off or remote)"),
    };
    let input = PlanInput {
        model: &planner.model,
        block_size: block as u32,
        prompt_tokens: step.tokens.len() as u64,
        decode_owner,
        artifact,
        workers: &workers,
        links: &planner.links,
        weights: planner.weights,
        samples: step.samples,
        fork: step.fork,
        thresholds: ClassThresholds::default(),
    };
    let p = plan(&input).map_err(|_| ApiError::NoHealthyWorker {
        model: step.model.to_owned(),
    })?;
    let names: Vec<Value> = registry
        .all()
        .iter()
        .map(|w| json!({"id": w.id.0, "name": w.spec.name}))
        .collect();
    Ok(json!({
        "class": p.class,
        "action": p.chosen.action,
        "reason": p.reason,
        "chosen": p.chosen,
        "directory_changes": p.changes,
        "inputs": {
            "model": planner.model.name,
            "prompt_tokens": input.prompt_tokens,
            "session": step.session,
            "decode_owner": decode_owner,
            "artifact": artifact,
            "directory": consulted,
        },
        "workers": names,
        "candidates": p.ranked(),
    }))
}
