//! Carrying out a routing decision across workers, before the decode worker's request
//! goes out: the prefill leg of a disaggregated step (vLLM NIXL two-step, or SGLang's
//! concurrent bootstrap leg), the pull parameters of an artifact fetch, and a migration's
//! copy → owner flip → hand-off. Every leg that fails degrades to the decode worker
//! recomputing, so a dead prefill worker or owner costs time, never the request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use serde_json::{json, Value};

use ownerserve_ownership::ids::{Epoch, SessionId, Tier, WorkerId as DirWorkerId};
use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::ids::{EngineKind, WorkerId};
use ownerserve_planner::plan::Action;
use ownerserve_planner::policy::{Decision, Dispatch};
use ownerserve_shim::engines::{sglang, vllm, EPOCH_HEADER, SESSION_HEADER};

use crate::directory_client::Lookup;
use crate::registry::Worker;
use crate::server::AppState;
use crate::upstream::{post_small, ForwardError};

/// What one step knows when its legs run.
pub struct Step<'a> {
    pub path: &'a str,
    pub body: &'a Bytes,
    pub session: Option<&'a str>,
    pub lookup: &'a Lookup,
    pub hashes: &'a [u64],
    pub block: u64,
    pub request_id: HeaderValue,
    /// The client's `Authorization`, which every leg carries (engines run with `--api-key`).
    pub authorization: Option<HeaderValue>,
}

/// The decode worker's request, once the earlier legs ran.
pub struct Prepared {
    pub body: Bytes,
    /// Headers for the decode worker: request id, session and fencing epoch.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The session's epoch after the step (new after a migration).
    pub epoch: Option<Epoch>,
    /// SGLang's prefill leg, to run concurrently with the decode leg.
    pub concurrent_prefill: Option<(Arc<Worker>, Bytes)>,
    /// The plan's transfer leg failed: the decode worker recomputes.
    pub fell_back: bool,
}

/// The fencing headers of a session at `epoch`.
fn fence_headers(
    session: Option<&str>,
    epoch: Option<Epoch>,
) -> impl Iterator<Item = (HeaderName, HeaderValue)> {
    let pair = session.zip(epoch).and_then(|(s, e)| {
        Some([
            (
                HeaderName::from_static(SESSION_HEADER),
                HeaderValue::from_str(s).ok()?,
            ),
            (
                HeaderName::from_static(EPOCH_HEADER),
                HeaderValue::from(e.0),
            ),
        ])
    });
    pair.into_iter().flatten()
}

fn headers_for(step: &Step<'_>, epoch: Option<Epoch>) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = vec![(crate::request_id::HEADER, step.request_id.clone())];
    if let Some(a) = &step.authorization {
        out.push((axum::http::header::AUTHORIZATION, a.clone()));
    }
    out.extend(fence_headers(step.session, epoch));
    out
}

/// Runs the legs before the decode worker's request and prepares that request.
pub async fn prepare(
    st: &AppState,
    step: &Step<'_>,
    decision: &Decision,
    decode: &Arc<Worker>,
) -> Prepared {
    let epoch = step.lookup.epoch;
    let mut out = Prepared {
        body: step.body.clone(),
        headers: headers_for(step, epoch),
        epoch,
        concurrent_prefill: None,
        fell_back: false,
    };
    let action = decision.action();
    match decision.dispatch {
        Dispatch::Single => {}
        Dispatch::Disaggregated { prefill } => {
            let Some(p) = st.registry.get(prefill).cloned() else {
                out.fell_back = true;
                return out;
            };
            match (p.spec.engine, decode.spec.engine) {
                (EngineKind::Sglang, EngineKind::Sglang) => match sglang_body(step, &p) {
                    Some(body) => {
                        out.body = body.clone();
                        out.concurrent_prefill = Some((p, body));
                    }
                    None => out.fell_back = true,
                },
                (EngineKind::Sglang, _) | (_, EngineKind::Sglang) => {
                    tracing::debug!("no P/D protocol between these engines: running whole");
                    out.fell_back = true;
                }
                _ => match nixl_prefill(st, step, decision, &p).await {
                    Some(body) => out.body = body,
                    None => out.fell_back = true,
                },
            }
        }
        Dispatch::Fetch { source, tokens } => match pull_source(st, source, decode, tokens) {
            Some(src) => match serde_json::from_slice::<Value>(step.body) {
                Ok(v) => out.body = Bytes::from(vllm::fetch_request(&v, &src).to_string()),
                Err(_) => out.fell_back = true,
            },
            None => out.fell_back = true,
        },
        Dispatch::Migrate { source, tokens } => {
            match migrate(st, step, source, decode, tokens).await {
                Some(new_epoch) => {
                    out.epoch = Some(new_epoch);
                    out.headers = headers_for(step, Some(new_epoch));
                }
                None => out.fell_back = true,
            }
        }
    }
    if out.fell_back {
        st.metrics.fallback(action);
        out.body = step.body.clone();
        out.concurrent_prefill = None;
    }
    out
}

/// vLLM NIXL step 1: the prefill leg, whose returned params make the decode leg's body.
async fn nixl_prefill(
    st: &AppState,
    step: &Step<'_>,
    decision: &Decision,
    p: &Arc<Worker>,
) -> Option<Bytes> {
    let original: Value = serde_json::from_slice(step.body).ok()?;
    let body = Bytes::from(vllm::prefill_request(&original).to_string());
    let tokens = step.hashes.len() as u64 * step.block;
    let _in_flight = p.start_request(step.hashes.len() as u64, tokens);
    let started = Instant::now();
    let sent = post_small(
        &st.client,
        &p.spec.base_url,
        step.path,
        &headers_for(step, step.lookup.epoch),
        body,
        st.cfg.request_timeout,
    )
    .await;
    let (status, bytes) = match sent {
        Ok(r) => r,
        Err(e) => {
            if matches!(e, ForwardError::Connect) {
                p.mark_down("connection refused");
            }
            tracing::warn!(worker = %p.spec.name, error = %e, "prefill leg failed; decoding worker recomputes");
            return None;
        }
    };
    if !status.is_success() {
        tracing::warn!(worker = %p.spec.name, %status, "prefill leg refused; decoding worker recomputes");
        return None;
    }
    let resp: Value = serde_json::from_slice(&bytes).ok()?;
    let Some(params) = vllm::returned_params(&resp) else {
        tracing::warn!(worker = %p.spec.name, "prefill leg returned no kv_transfer_params");
        return None;
    };
    if let Some(plan) = decision.plan.as_ref().filter(|_| st.cfg.planner_calibrate) {
        let observed = started.elapsed().as_secs_f64() * st.cfg.planner_time_scale;
        st.observe_prefill(p.id, plan.chosen.cost.compute_s, observed);
    }
    Some(Bytes::from(
        vllm::decode_request(&original, params).to_string(),
    ))
}

/// SGLang: one body with the bootstrap triple for both legs.
fn sglang_body(step: &Step<'_>, p: &Worker) -> Option<Bytes> {
    let original: Value = serde_json::from_slice(step.body).ok()?;
    let (host, _) = p.spec.host_port()?;
    let rooms: Vec<u64> = (0..sglang::batch_size(&original))
        .map(|_| sglang::room(random_u64()))
        .collect();
    let b = sglang::Bootstrap {
        host,
        port: p.spec.bootstrap_port,
    };
    Some(Bytes::from(
        sglang::with_bootstrap(&original, &b, &rooms).to_string(),
    ))
}

/// A random 64-bit number (bootstrap rooms): std's per-process random hasher keys, mixed
/// with a counter, so no RNG crate is pulled in for one function.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// Where `decode` can pull a sealed prefix from `source`: only between engines that speak
/// OwnerServe's pull (the sim engine).
fn pull_source(
    st: &AppState,
    source: WorkerId,
    decode: &Worker,
    tokens: u64,
) -> Option<vllm::PullSource> {
    let s = st.registry.get(source)?;
    if s.spec.engine != EngineKind::Sim || decode.spec.engine != EngineKind::Sim {
        tracing::debug!(source = %s.spec.name, "engine cannot pull a sealed prefix: recomputing");
        return None;
    }
    let (host, port) = s.spec.host_port()?;
    Some(vllm::PullSource {
        engine_id: s.spec.name.clone(),
        host,
        port,
        tokens,
    })
}

/// A migration: the target copies the session's KV from `source`, and only once it
/// reports the blocks in place does the directory flip the session (and the prefix it
/// owns there) to the target; the source then drops its copy and learns the new epoch, so
/// a stale request to it is refused. Returns the session's new epoch.
async fn migrate(
    st: &AppState,
    step: &Step<'_>,
    source: WorkerId,
    target: &Arc<Worker>,
    tokens: u64,
) -> Option<Epoch> {
    let src = pull_source(st, source, target, tokens)?;
    let blocks = (tokens / step.block.max(1)) as usize;
    let hashes = &step.hashes[..blocks.min(step.hashes.len())];
    let body = json!({
        "remote_host": src.host,
        "remote_port": src.port,
        "block_hashes": hashes,
        "session": step.session,
        "epoch": step.lookup.epoch.map(|e| e.0),
    });
    let request_id = [(crate::request_id::HEADER, step.request_id.clone())];
    let copied = post_small(
        &st.client,
        &target.spec.base_url,
        "/ownerserve/v1/kv/fetch",
        &request_id,
        Bytes::from(body.to_string()),
        st.cfg.request_timeout,
    )
    .await;
    let report: Value = match copied {
        Ok((status, bytes)) if status.is_success() => serde_json::from_slice(&bytes).ok()?,
        other => {
            tracing::warn!(target = %target.spec.name, ?other, "migration copy failed; target recomputes");
            return None;
        }
    };
    st.metrics
        .migrated(report["bytes"].as_u64().unwrap_or_default());
    let new_epoch = flip_owner(st, step, source, target).await?;
    if let Some(s) = st.registry.get(source) {
        let drop_body = json!({
            "block_hashes": hashes,
            "session": step.session,
            "epoch": new_epoch.0,
        });
        let (client, url, timeout) = (
            st.client.clone(),
            s.spec.base_url.clone(),
            st.cfg.request_timeout,
        );
        // The hand-off's last step does not hold up the request.
        tokio::spawn(async move {
            let dropped = post_small(
                &client,
                &url,
                "/ownerserve/v1/kv/drop",
                &request_id,
                Bytes::from(drop_body.to_string()),
                timeout,
            )
            .await;
            if let Err(e) = dropped {
                tracing::warn!(worker = %url, error = %e, "migration source did not drop its copy");
            }
        });
    }
    tracing::info!(session = ?step.session, from = %source, to = %target.spec.name, epoch = new_epoch.0, "session migrated");
    Some(new_epoch)
}

/// The owner flip of a migration, in one directory entry: the target's copy is
/// registered, the prefix the source owns moves (CAS on its epoch), and the session's
/// decode owner moves (CAS on the session's epoch).
async fn flip_owner(
    st: &AppState,
    step: &Step<'_>,
    source: WorkerId,
    target: &Worker,
) -> Option<Epoch> {
    let sync = st.ownership.as_ref()?;
    let lease = sync.lease_of(target.id)?;
    let mut commands = Vec::new();
    if let (Some(view), Some((key, key_epoch))) = (step.lookup.artifact, step.lookup.artifact_key) {
        commands.push(Command::ReplicateReadOnly {
            key,
            worker: DirWorkerId(target.id.0),
            tier: Tier::Gpu,
        });
        if view.owner == source {
            commands.push(Command::Migrate {
                key,
                from_epoch: key_epoch,
                to_lease: lease,
            });
        }
    }
    let session = step.session?;
    commands.push(Command::SetDecodeOwner {
        session: SessionId(session.to_owned()),
        lease,
        prefix: step.lookup.artifact_key.map(|(k, _)| k),
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch: step.lookup.epoch,
    });
    match sync.client().write(Command::Batch { commands }).await {
        Ok(Outcome::Batch { outcomes }) => match outcomes.last() {
            Some(Outcome::Owned { epoch, .. }) => Some(*epoch),
            other => {
                tracing::warn!(?other, "migration flip refused");
                None
            }
        },
        other => {
            tracing::warn!(?other, "migration flip not committed");
            None
        }
    }
}

/// Labels a plan for logs.
pub fn describe(decision: &Decision) -> (&'static str, &str) {
    let action: Action = decision.action();
    (
        action.name(),
        decision.plan.as_ref().map_or("", |p| p.reason.as_str()),
    )
}
