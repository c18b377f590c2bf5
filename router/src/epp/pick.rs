//! The endpoint picker's decision for one request, through the proxy's own stages
//! (ingress parse → admission → identity → view → plan → claim), so the gateway's pick is
//! the one the proxy would make: the session's owner, committed in the shared directory
//! before it is answered. Nothing is dispatched; the gateway sends the request.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Request};
use bytes::Bytes;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::PrefillCharge;
use ownerserve_shim::openai::Endpoint;

use crate::error::ApiError;
use crate::fleet::registry::{InFlight, Registry, Worker};
use crate::ownership::ownership_sync::{Effects, Routed};
use crate::proxy::admission::Ticket;
use crate::proxy::front::{front_half, Ask, Front};
use crate::proxy::{claim, Planned};
use crate::server::state::AppState;

/// A pick: the endpoints to try in order (the owner first), and what the step's record
/// needs once the gateway says which endpoint served.
pub struct Picked {
    /// `host:port` of each worker, the decision's first.
    pub endpoints: Vec<String>,
    pub worker: WorkerId,
    /// The record of the step, its worker set to whichever endpoint served.
    pub record: Option<Routed>,
    /// The epoch the session is owned at after the claim (a fallback that served moves
    /// the session with a compare-and-set on it).
    pub epoch: Option<ownerserve_ownership::ids::Epoch>,
    /// Held until the exchange ends: the model's admission slot and the worker's
    /// in-flight count.
    pub held: Option<(Ticket, InFlight)>,
}

/// `host:port` of a worker, as the gateway names endpoints.
pub fn endpoint_name(w: &Worker) -> Option<String> {
    let (host, port) = w.spec.host_port()?;
    Some(if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// The live worker at `host:port`.
pub fn worker_at(registry: &Registry, endpoint: &str) -> Option<Arc<Worker>> {
    let endpoint = endpoint.trim();
    registry
        .all()
        .iter()
        .find(|w| !w.is_retired() && endpoint_name(w).as_deref() == Some(endpoint))
        .cloned()
}

/// Workers outside the gateway's subset (all of them when nothing in it is ours).
fn outside(registry: &Registry, subset: Option<&[String]>) -> Vec<WorkerId> {
    let Some(subset) = subset else {
        return Vec::new();
    };
    registry
        .all()
        .iter()
        .filter(|w| {
            let name = endpoint_name(w);
            !subset.iter().any(|s| Some(s.trim()) == name.as_deref())
        })
        .map(|w| w.id)
        .collect()
}

/// Picks for a request to `path` with `headers` and `body`, within `subset` when the
/// gateway sent one; `fallbacks` more endpoints follow the decision's.
pub async fn pick(
    st: &AppState,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    subset: Option<&[String]>,
    fallbacks: usize,
) -> Result<Picked, ApiError> {
    let excluded = outside(&st.registry, subset);
    let Some(endpoint) = crate::api::endpoints::proxied_at(path) else {
        return any_worker(st, &excluded);
    };
    let mut req = Request::builder()
        .method("POST")
        .uri(path)
        .body(Body::from(body))
        .map_err(|e| ApiError::BodyRead(e.to_string()))?;
    *req.headers_mut() = headers.clone();
    let ask = Ask {
        endpoint,
        hashing: st.hashing(),
        admits: true,
    };
    front_half(st, req, ask, async |f| {
        picked(st, f, endpoint, &excluded, fallbacks).await
    })
    .await
}

/// The pick for a request through its front half: view, plan and claim.
async fn picked(
    st: &AppState,
    f: Front<'_>,
    endpoint: Endpoint,
    excluded: &[WorkerId],
    fallbacks: usize,
) -> Result<Picked, ApiError> {
    let (parsed, id) = (f.parsed, f.id);
    let needs = st.policy.needs();
    if needs.directory {
        claim::catch_up(st, false).await;
    }
    let view = st
        .sources()
        .step(&parsed.model, id, parsed.sampling.n, needs);
    let candidates = st
        .sources()
        .candidates(&parsed.model, id.hashes(), excluded, needs);
    if candidates.is_empty() {
        return Err(ApiError::NoHealthyWorker {
            model: parsed.model.to_string(),
        });
    }
    let planned = Planned {
        view: &view,
        candidates: &candidates,
        failed: excluded,
        // The gateway sends the request whole: no KV copy, no flip after it. A planned
        // migration (the planner moves a session off its owner, past its hysteresis) is
        // claimed before the pick is answered, so the endpoint the gateway is told is the
        // owner the directory records.
        dispatches: false,
    };
    let (decision, lookup, _, _) = planned.decide(st, id, None, endpoint).await?;
    let Some(worker) = st.registry.get(decision.worker) else {
        return Err(ApiError::NoHealthyWorker {
            model: parsed.model.to_string(),
        });
    };
    let mut endpoints: Vec<String> = endpoint_name(&worker).into_iter().collect();
    let others = candidates
        .iter()
        .filter(|c| c.id != worker.id && c.takes_work())
        .filter_map(|c| st.registry.get(c.id))
        .filter_map(|w| endpoint_name(&w))
        .take(fallbacks);
    endpoints.extend(others);
    st.kv.record_routed(&worker, id.hashes());
    let record = st.ownership.as_ref().map(|_| Routed {
        worker: worker.id,
        session: id.tracked().map(str::to_owned),
        root: id.root.map(str::to_owned),
        parent: id.parent.map(str::to_owned),
        prompt: id.prompt.clone(),
        effects: Effects::default(),
    });
    let in_flight = worker.start_request(
        view.route.prompt_blocks(),
        PrefillCharge::default(),
        u64::from(view.route.prompt_tokens),
    );
    Ok(Picked {
        endpoints,
        worker: worker.id,
        record,
        epoch: lookup.epoch.filter(|_| lookup.owner == Some(worker.id)),
        held: f.ticket.map(|t| (t, in_flight)),
    })
}

/// A request the proxy has no plan for (`GET /v1/models`, ...): any healthy worker.
fn any_worker(st: &AppState, excluded: &[WorkerId]) -> Result<Picked, ApiError> {
    let fleet = st.registry.all();
    let w = fleet
        .iter()
        .find(|w| w.is_healthy() && !w.is_draining() && !excluded.contains(&w.id))
        .ok_or_else(|| ApiError::NoHealthyWorker {
            model: "(any)".into(),
        })?;
    Ok(Picked {
        endpoints: endpoint_name(w).into_iter().collect(),
        worker: w.id,
        record: None,
        epoch: None,
        held: None,
    })
}

/// Records the step against the worker that served it (`served`; the pick's own when the
/// gateway did not say): a fallback that served moves the session there, compare-and-set
/// on the epoch it was owned at.
pub fn record_served(st: &AppState, picked: &mut Picked, served: Option<&str>) {
    let Some(mut record) = picked.record.take() else {
        return;
    };
    let Some(sync) = &st.ownership else { return };
    let worker = served
        .and_then(|s| worker_at(&st.registry, s))
        .map_or(picked.worker, |w| w.id);
    if worker != picked.worker {
        record.effects.expect_epoch = picked.epoch;
        tracing::debug!(served = ?served, "a fallback endpoint served: the session moves there");
    }
    record.worker = worker;
    sync.record(record);
}
