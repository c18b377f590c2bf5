//! OwnerServe's KV endpoints on every simulated engine, and the decode leg's load:
//!
//! - `POST /ownerserve/v1/kv/pull` (source side): the leading requested blocks this
//!   engine caches, their size and content; ends the pin of a prefill leg.
//! - `POST /ownerserve/v1/kv/fetch` (target side, migration pre-copy): pulls blocks from a
//!   source into this engine's cache and answers once they are in place.
//! - `POST /ownerserve/v1/kv/drop`: evicts blocks from HBM (offloading them to the host
//!   tier if the engine has one), and with a session and epoch fences the
//!   session (the old owner at the end of a hand-off).
//!
//! A receiver waits the simulated transfer time, `latency + bytes / bandwidth`, divided by
//! the time scale (no wait when instant). The wait counts from when the pull was sent, so
//! the real HTTP round trip is part of it rather than added to it.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use ownerserve_planner::hash::prompt_hashes;

use super::config::TimeMode;
use super::engine::Received;
use super::fence::{AcceptedFor, FenceClaim};
use super::http_error::{json_response, ApiError};
use super::kv_client::PullError;
use super::kv_transfer::{
    DropRequest, DropResponse, FetchRequest, FetchResponse, LoadFrom, PullRequest, PullResponse,
};
use super::respond::TransferReport;
use super::state::AppState;

pub use crate::engines::sim::{DROP_PATH, FETCH_PATH};

/// Longest simulated wait a transfer may cause, whatever the numbers say.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// `POST /ownerserve/v1/kv/pull`.
pub(super) async fn pull(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(serve_pull(&st, &headers, body).await)
}

/// `POST /ownerserve/v1/kv/fetch`.
pub(super) async fn fetch(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(serve_fetch(&st, &headers, body).await)
}

/// `POST /ownerserve/v1/kv/drop`.
pub(super) async fn drop_blocks(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(serve_drop(&st, &headers, body).await)
}

fn answer<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}

/// A JSON object body, or a 400.
fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::bad_request(e.body_text(), None))?;
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request(
            "request body is not a valid JSON object: expected '{'",
            None,
        ));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("request body is not acceptable: {e}"), None))
}

/// The fence claims of a KV request: its headers' and its body's.
fn claims(
    headers: &HeaderMap,
    session: Option<&str>,
    epoch: Option<u64>,
) -> Result<Vec<FenceClaim>, ApiError> {
    let mut all: Vec<FenceClaim> = FenceClaim::from_headers(headers)?.into_iter().collect();
    all.extend(FenceClaim::from_fields(session, epoch));
    Ok(all)
}

async fn serve_pull(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<PullResponse, ApiError> {
    let req: PullRequest = parse_body(body)?;
    st.check_fence(
        claims(headers, req.session.as_deref(), req.epoch)?,
        AcceptedFor::Kv,
    )?;
    let run = st
        .engine
        .serve_pull(req.request_id, req.block_hashes)
        .await?;
    let bytes = run.blocks as u64 * st.block_bytes;
    st.engine.metrics().kv.sent_bytes += bytes;
    Ok(PullResponse {
        blocks: run.blocks,
        bytes,
        engine_id: st.engine_id.to_string(),
        parent_block_hash: run.parent,
        token_ids: run.tokens,
    })
}

async fn serve_fetch(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<FetchResponse, ApiError> {
    let req: FetchRequest = parse_body(body)?;
    let header_claim = FenceClaim::from_headers(headers)?;
    let body_claim = FenceClaim::from_fields(req.session.as_deref(), req.epoch);
    st.check_fence(
        header_claim.iter().cloned().chain(body_claim.clone()),
        AcceptedFor::Kv,
    )?;
    let claim = body_claim.or(header_claim);

    let local = st.engine.cached_prefix(req.block_hashes.clone()).await?;
    let wanted = req.block_hashes.get(local..).unwrap_or_default().to_vec();
    if wanted.is_empty() {
        return Ok(FetchResponse {
            blocks: 0,
            bytes: 0,
            transfer_ms: 0.0,
            cached_blocks: local,
        });
    }
    let request = PullRequest {
        request_id: None,
        block_hashes: wanted.clone(),
        session: claim.as_ref().map(|c| c.session.clone()),
        epoch: claim.as_ref().map(|c| c.epoch),
    };
    let pulled = receive(
        st,
        &req.remote_host,
        req.remote_port,
        &request,
        claim.as_ref(),
    )
    .await
    .map_err(|e| ApiError::BadGateway(e.to_string()))?;
    let parent = match local.checked_sub(1) {
        Some(i) => req.block_hashes.get(i).copied(),
        None => pulled.parent,
    };
    let k = pulled.blocks;
    let cached = st
        .engine
        .insert(parent, wanted[..k].to_vec(), pulled.tokens)
        .await?;
    Ok(FetchResponse {
        blocks: k,
        bytes: pulled.bytes,
        transfer_ms: pulled.transfer_s * 1e3,
        cached_blocks: local + cached,
    })
}

async fn serve_drop(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<DropResponse, ApiError> {
    let req: DropRequest = parse_body(body)?;
    st.check_fence(
        claims(headers, req.session.as_deref(), req.epoch)?,
        AcceptedFor::Kv,
    )?;
    let dropped = st.engine.drop_blocks(req.block_hashes).await?;
    st.engine.metrics().kv.dropped_blocks += dropped as u64;
    tracing::debug!(dropped, "kv blocks dropped on request");
    Ok(DropResponse { dropped })
}

/// A completed pull, as the receiver accounts it.
struct Pulled {
    blocks: usize,
    /// `blocks` × this engine's block size in bytes (the receiver prices what it stores).
    bytes: u64,
    transfer_s: f64,
    parent: Option<u64>,
    tokens: Vec<u32>,
}

/// Pulls from a source, then waits the simulated transfer time; counts the transfer, or
/// the failure. A pull of no hashes only ends a prefill leg's pin: it costs nothing and
/// counts as neither.
async fn receive(
    st: &AppState,
    host: &str,
    port: u16,
    request: &PullRequest,
    claim: Option<&FenceClaim>,
) -> Result<Pulled, PullError> {
    let started = Instant::now();
    let asked = request.block_hashes.len();
    let bs = st.scheduler.block_size as usize;
    let answer = match st.kv_client.pull(host, port, request, claim, bs).await {
        Ok(a) => a,
        Err(e) => {
            if asked > 0 {
                st.engine.metrics().kv.transfer_failures += 1;
            }
            tracing::warn!(error = %e, blocks = asked, "kv pull failed; recomputing");
            return Err(e);
        }
    };
    if asked == 0 {
        return Ok(Pulled {
            blocks: 0,
            bytes: 0,
            transfer_s: 0.0,
            parent: None,
            tokens: Vec::new(),
        });
    }
    let bytes = answer.blocks as u64 * st.block_bytes;
    let transfer_s = st.transfer.link.transfer_s(bytes);
    wait_transfer(st.time, transfer_s, started).await;
    {
        let mut m = st.engine.metrics();
        m.kv.received_bytes += bytes;
        m.kv.transfer_seconds += transfer_s;
        m.kv.transfers += 1;
    }
    tracing::debug!(blocks = answer.blocks, bytes, transfer_s, "kv pulled");
    Ok(Pulled {
        blocks: answer.blocks,
        bytes,
        transfer_s,
        parent: answer.parent_block_hash,
        tokens: answer.token_ids,
    })
}

/// Sleeps until `transfer_s` simulated seconds after `started`, in wall-clock terms.
async fn wait_transfer(time: TimeMode, transfer_s: f64, started: Instant) {
    let TimeMode::Scaled(scale) = time else {
        return;
    };
    let wall = Duration::try_from_secs_f64(transfer_s / scale)
        .unwrap_or(MAX_WAIT)
        .min(MAX_WAIT);
    tokio::time::sleep_until(started + wall).await;
}

/// Decode leg: pulls the prompt's full blocks that are not cached here, up to the
/// source's `remote_num_tokens`. On any failure the request simply recomputes (vLLM does
/// the same when a KV load fails).
pub(super) async fn load_for_decode(
    st: &AppState,
    load: &LoadFrom,
    prompt: &[u32],
    claim: Option<&FenceClaim>,
) -> (Option<Received>, TransferReport) {
    let none = (None, TransferReport::default());
    let bs = st.scheduler.block_size as usize;
    let usable = load
        .num_tokens
        .map_or(prompt.len(), |n| usize::try_from(n).unwrap_or(usize::MAX))
        .min(prompt.len());
    let end = usable / bs.max(1);
    let chain = prompt_hashes(&prompt[..end * bs], bs, st.scheduler.hash_seed);
    let Ok(local) = st.engine.cached_prefix(chain.clone()).await else {
        return none;
    };
    let wanted = chain.get(local..).unwrap_or_default().to_vec();
    if wanted.is_empty() && load.request_id.is_none() {
        return none;
    }
    let request = PullRequest {
        request_id: load.request_id.clone(),
        block_hashes: wanted,
        session: claim.map(|c| c.session.clone()),
        epoch: claim.map(|c| c.epoch),
    };
    let Ok(pulled) = receive(st, &load.host, load.port, &request, claim).await else {
        return none;
    };
    let report = TransferReport {
        received_bytes: pulled.bytes,
        transfer_s: pulled.transfer_s,
    };
    if pulled.blocks == 0 {
        return (None, report);
    }
    let upto = local + pulled.blocks;
    let received = Received {
        chain: chain[..upto].to_vec(),
        from: local,
        tokens: prompt[local * bs..upto * bs].to_vec(),
    };
    (Some(received), report)
}
