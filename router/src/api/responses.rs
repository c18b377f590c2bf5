//! The Responses API's stored answers (the requests themselves are proxied like every
//! generation): a follow-up (`previous_response_id`), a `GET /v1/responses/{id}` and a
//! `POST /v1/responses/{id}/cancel` go to the worker that produced the response, as the
//! directory (or, without one or before it has the record, this router: [`owners`])
//! records it; a stored answer's owner is recorded as it is relayed. An owner that is not
//! answering gives `503 response_owner_unavailable` (retryable) naming the response; one
//! that is gone (its last directory lease ended, or it was removed) gives `410
//! response_lost`. A drained owner keeps serving the responses it holds: they exist
//! nowhere else.

pub mod owners;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use ownerserve_planner::ids::WorkerId;
use ownerserve_shim::openai::ParsedRequest;

use crate::error::ApiError;
use crate::fleet::registry::Worker;
use crate::server::state::AppState;
use crate::upstream::ForwardError;

/// The worker a Responses follow-up must run on: the owner of its previous response
/// (`None` when it names none, or one no record names: the engines answer for it).
pub async fn owner_of_previous(
    st: &AppState,
    parsed: &ParsedRequest<'_>,
) -> Result<Option<WorkerId>, ApiError> {
    let Some(prev) = parsed.previous_response_id.as_deref() else {
        return Ok(None);
    };
    live_owner(st, prev).await.map(|w| w.map(|w| w.id))
}

/// The worker recorded as holding response `id`, and whether the directory marked it
/// lost: the directory's record first (every router replica agrees on it), else this
/// router's own, else the directory's once this router's copy of it has caught up (a
/// record another replica just committed).
async fn recorded(st: &AppState, id: &str) -> Option<(WorkerId, bool)> {
    let in_directory = || {
        let mut found = None;
        if let Some(sync) = &st.ownership {
            sync.client().read_local(&mut |d| {
                found = d.responses.get(id).map(|r| (WorkerId(r.worker.0), r.lost));
            });
        }
        found
    };
    if let Some(r) = in_directory() {
        return Some(r);
    }
    if let Some(w) = st.responses.owners.owner(id, Instant::now()) {
        return Some((w, false));
    }
    let sync = st.ownership.as_ref()?;
    if sync.client().catch_up().await {
        return in_directory();
    }
    None
}

/// The live owner of response `id` (`None`: no record names it); an error naming the
/// response when its owner is gone (410) or not answering (503, retryable).
async fn live_owner(st: &AppState, id: &str) -> Result<Option<Arc<Worker>>, ApiError> {
    let Some((owner, lost)) = recorded(st, id).await else {
        return Ok(None);
    };
    let worker = st.registry.get(owner);
    let name = worker
        .as_ref()
        .map_or_else(|| owner.to_string(), |w| w.spec.name.clone());
    match worker {
        Some(w) if !lost && w.is_healthy() => Ok(Some(w.clone())),
        Some(_) if !lost => Err(ApiError::ResponseOwnerDown {
            id: id.to_owned(),
            worker: name,
        }),
        _ => Err(ApiError::ResponseLost {
            id: id.to_owned(),
            worker: name,
        }),
    }
}

/// How many stored responses (not lost) the directory records on each worker; `None`
/// without a directory.
pub fn held_per_worker(st: &AppState) -> Option<std::collections::HashMap<WorkerId, usize>> {
    let sync = st.ownership.as_ref()?;
    let mut held = std::collections::HashMap::new();
    sync.client().read_local(&mut |d| {
        for r in d.responses.values().filter(|r| !r.lost) {
            *held.entry(WorkerId(r.worker.0)).or_default() += 1;
        }
    });
    Some(held)
}

/// The error of a follow-up whose previous response's owner refused the connection: it
/// is down (retry; lost once its lease ends).
pub fn owner_down(parsed: &ParsedRequest<'_>, worker: &str) -> ApiError {
    ApiError::ResponseOwnerDown {
        id: parsed
            .previous_response_id
            .as_deref()
            .unwrap_or_default()
            .to_owned(),
        worker: worker.to_owned(),
    }
}

/// Records `worker` as the owner of the stored response `response` carries.
pub fn record_owner(st: &AppState, worker: WorkerId, response: Response) -> Response {
    if !response.status().is_success() {
        return response;
    }
    let recorder = st.responses.clone();
    response.map(|b| Body::new(owners::Recording::new(b, worker, recorder)))
}

/// A worker's small answer as the client's response.
fn relayed((status, body): (StatusCode, Bytes)) -> Response {
    let mut r = (status, Body::from(body)).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Asks the owner of response `id` at `path` (`GET` when `post` is false).
async fn at_owner(st: &AppState, id: &str, path: &str, post: bool) -> Result<Response, ApiError> {
    let owner = live_owner(st, id)
        .await?
        .ok_or_else(|| ApiError::ResponseNotFound(id.to_owned()))?;
    let auth = st.cfg.engine_authorization.clone();
    let answer = if post {
        let headers: Vec<_> = auth
            .into_iter()
            .map(|a| (header::AUTHORIZATION, a))
            .collect();
        st.engines
            .post(
                &owner.spec.base_url,
                path,
                &headers,
                Bytes::from_static(b"{}"),
            )
            .await
    } else {
        crate::upstream::get_small_as(
            &st.upstream.client,
            &owner.spec.base_url,
            path,
            auth.as_ref(),
            st.cfg.request_timeout,
        )
        .await
    };
    match answer {
        Ok(a) => Ok(relayed(a)),
        Err(ForwardError::Connect) => {
            owner.mark_down("connection refused");
            Err(ApiError::ResponseOwnerDown {
                id: id.to_owned(),
                worker: owner.spec.name.clone(),
            })
        }
        Err(e) => Err(e.into_api(&owner)),
    }
}

/// `GET /v1/responses/{id}`: from the worker that stored it.
pub async fn get(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    at_owner(&st, &id, &format!("/v1/responses/{id}"), false).await
}

/// `POST /v1/responses/{id}/cancel`: at the worker that runs it.
pub async fn cancel(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    at_owner(&st, &id, &format!("/v1/responses/{id}/cancel"), true).await
}
