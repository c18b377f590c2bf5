//! Dispatch: carrying out a routing decision across workers with the engines' own
//! protocols (`ownerserve_shim::engines`): the prefill leg of a disaggregated step (vLLM
//! NIXL two-step, or SGLang's bootstrap pair sent concurrently), the pull parameters of an
//! artifact fetch, and a migration's copy → owner flip → hand-off; then the decode
//! worker's request itself. Every leg that fails degrades to the decode worker
//! recomputing, so a dead prefill worker or owner costs time, never the request.
//!
//! It reads only what [`Dispatcher`] hands it (engine calls, the worker registry, the
//! directory for a migration's flip, a task tracker) and reports what happened in
//! [`Prepared`]; the feedback stage turns that into metrics and calibration.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::upstream::pool::Pooled;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use serde_json::Value;
use tokio_util::task::TaskTracker;

use ownerserve_ownership::ids::{Epoch, SessionId, Tier, WorkerId as DirWorkerId};
use ownerserve_ownership::{Command, Outcome, Rejection};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::{Decision, Dispatch};
use ownerserve_shim::engines::{
    self, protocol, sglang, vllm, Pairing, EPOCH_HEADER, SESSION_HEADER,
};

use crate::fleet::registry::{Registry, Worker};
use crate::ownership::ownership_sync::OwnershipSync;
use crate::upstream::{EngineCalls, ForwardError, Upstream};
use ownerserve_ownership::node::Lookup;

/// What dispatch may touch.
pub struct Dispatcher<'a> {
    pub engines: &'a Arc<dyn EngineCalls>,
    pub registry: &'a Registry,
    /// Where a migration's owner flip commits (`None`: no directory, no migration).
    pub directory: Option<&'a OwnershipSync>,
    /// Owns the hand-off calls that outlive the request (a migration source's drop).
    pub tasks: &'a TaskTracker,
}

/// What one step knows when its legs run.
pub struct Step<'a> {
    pub path: &'a str,
    pub body: &'a Bytes,
    pub session: Option<&'a str>,
    /// A fork's committed child session and its epoch: the decode request is fenced as
    /// the child rather than as `session`.
    pub fork_fence: Option<(&'a str, Epoch)>,
    pub lookup: &'a Lookup,
    pub hashes: &'a [u64],
    pub block: u64,
    /// The prompt's tokens (its blocks are whole ones: `hashes` covers this less a
    /// partial last block).
    pub prompt_tokens: u64,
    pub request_id: HeaderValue,
    /// `Authorization: Bearer <engine_api_key>` for engines run with `--api-key`, which
    /// every leg carries; a client's own `Authorization` never reaches an engine.
    pub authorization: Option<HeaderValue>,
    /// The engine priority rank of its decode request (`Class::engine_rank`: its class,
    /// and a session's step back from a tool call ahead of new prompts), sent to every
    /// engine that orders its queue by priority: a client's own `priority` never reaches
    /// one.
    pub priority: i8,
}

/// A prefill leg's predicted and observed compute time, for the policy's calibration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillTiming {
    pub worker: WorkerId,
    /// The roofline preset's time for it (`Candidate::preset_compute_s`).
    pub predicted_s: f64,
    /// Wall-clock seconds (the caller scales them to engine time).
    pub observed_s: f64,
}

/// The decode worker's request, once the earlier legs ran, and what they did.
#[derive(Debug)]
pub struct Prepared {
    pub body: Bytes,
    /// Headers for the decode worker: request id, authorization, session and epoch.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The epoch the step runs under on its decode worker (new after a migration); `None`
    /// when that worker is not the session's owner in the directory (an unrecorded step).
    pub epoch: Option<Epoch>,
    /// SGLang's prefill leg, to run concurrently with the decode leg.
    pub concurrent_prefill: Option<(Arc<Worker>, Bytes)>,
    /// The plan's transfer leg failed: the decode worker recomputes.
    pub fell_back: bool,
    /// A NIXL prefill leg ran and was timed.
    pub prefill: Option<PrefillTiming>,
    /// A migration copied this many KV bytes.
    pub migrated_bytes: Option<u64>,
    /// The session's owner changed since the step was planned (its move was refused for a
    /// stale epoch): nothing may be sent; the step is planned again.
    pub stale: bool,
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

fn headers_for(
    step: &Step<'_>,
    epoch: Option<Epoch>,
    decode: &Worker,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = vec![(ownerserve_edge::request_id::HEADER, step.request_id.clone())];
    if let Some((name, value)) = protocol(decode.spec.engine).priority_header(step.priority) {
        out.push((HeaderName::from_static(name), HeaderValue::from(value)));
    }
    if let Some(a) = &step.authorization {
        out.push((header::AUTHORIZATION, a.clone()));
    }
    match step.fork_fence {
        Some((child, child_epoch)) => out.extend(fence_headers(Some(child), Some(child_epoch))),
        None => out.extend(fence_headers(step.session, epoch)),
    }
    out
}

impl Dispatcher<'_> {
    /// Runs the legs before the decode worker's request and prepares that request.
    pub async fn prepare(
        &self,
        step: &Step<'_>,
        decision: &Decision,
        decode: &Arc<Worker>,
    ) -> Prepared {
        // A session's epoch fences only the worker it was given to: a step planned off its
        // owner whose claim or move did not commit (a directory electing a leader) runs
        // unrecorded, never under the previous owner's epoch on another worker.
        let owned = step
            .lookup
            .epoch
            .filter(|_| step.lookup.owner == Some(decode.id));
        let epoch = step.fork_fence.map(|(_, e)| e).or(owned);
        let mut out = Prepared {
            body: step.body.clone(),
            headers: headers_for(step, epoch, decode),
            epoch,
            concurrent_prefill: None,
            fell_back: false,
            prefill: None,
            migrated_bytes: None,
            stale: false,
        };
        match decision.dispatch {
            Dispatch::Single => {}
            Dispatch::Disaggregated { prefill } => {
                self.disaggregate(step, decision, decode, prefill, &mut out)
                    .await
            }
            Dispatch::Fetch { source, tokens } => match self.pull_source(source, decode, tokens) {
                Some(src) => match serde_json::from_slice::<Value>(step.body) {
                    Ok(v) => out.body = Bytes::from(vllm::fetch_request(&v, &src).to_string()),
                    Err(_) => out.fell_back = true,
                },
                None => out.fell_back = true,
            },
            Dispatch::Migrate { source, tokens } => {
                // Between engines that cannot pull KV, or where the plan found the
                // recompute faster than the copy (or nothing of the prefix survives on the
                // target: 0 tokens), the move is a recompute on the target: no copy is
                // tried, and that is no fallback.
                let copies = tokens > 0
                    && self
                        .registry
                        .get(source)
                        .is_some_and(|s| pulls_between(&s, decode));
                let copied = match copies {
                    true => self.migrate(step, source, decode, tokens, &mut out).await,
                    false => None,
                };
                let moved = match copied {
                    Some(epoch) => Some(epoch),
                    // No copy: the target recomputes, and still becomes the owner first.
                    None => {
                        out.fell_back = copies;
                        match self.take_over(step, decode).await {
                            Ok(epoch) => Some(epoch),
                            Err(stale) => {
                                out.stale = stale;
                                None
                            }
                        }
                    }
                };
                if let Some(new_epoch) = moved {
                    out.epoch = Some(new_epoch);
                    out.headers = headers_for(step, Some(new_epoch), decode);
                }
            }
        }
        if out.fell_back {
            out.body = step.body.clone();
            out.concurrent_prefill = None;
        }
        out
    }

    /// A remote prefill, as both engines' pairing has it: SGLang's bootstrap pair body, or
    /// vLLM's NIXL prefill leg run now; engines of different pairings run it whole.
    async fn disaggregate(
        &self,
        step: &Step<'_>,
        decision: &Decision,
        decode: &Worker,
        prefill: WorkerId,
        out: &mut Prepared,
    ) {
        let Some(p) = self.registry.get(prefill) else {
            out.fell_back = true;
            return;
        };
        let pairing = protocol(p.spec.engine).pairing();
        if pairing != protocol(decode.spec.engine).pairing() {
            tracing::debug!("no P/D protocol between these engines: running whole");
            out.fell_back = true;
            return;
        }
        match pairing {
            Pairing::Bootstrap => match sglang_body(step, &p) {
                Some(body) => {
                    out.body = body.clone();
                    out.concurrent_prefill = Some((p, body));
                }
                None => out.fell_back = true,
            },
            Pairing::NixlTwoStep => match self.nixl_prefill(step, decision, &p).await {
                Some((body, observed_s)) => {
                    out.body = body;
                    out.prefill =
                        decision
                            .plan
                            .as_ref()
                            .zip(observed_s)
                            .map(|(plan, observed_s)| PrefillTiming {
                                worker: p.id,
                                predicted_s: plan.chosen.preset_compute_s,
                                observed_s,
                            });
                }
                None => out.fell_back = true,
            },
        }
    }

    /// vLLM NIXL step 1: the prefill leg, whose returned params make the decode leg's
    /// body. Returns that body and the leg's wall-clock seconds when it measured the
    /// worker's prefill rate: it started at once there (`WorkerView::starts_prefill_now`);
    /// a leg that queued behind others measured their prefills too.
    async fn nixl_prefill(
        &self,
        step: &Step<'_>,
        decision: &Decision,
        p: &Arc<Worker>,
    ) -> Option<(Bytes, Option<f64>)> {
        let original: Value = serde_json::from_slice(step.body).ok()?;
        let body = Bytes::from(vllm::prefill_request(&original).to_string());
        let tokens = step.hashes.len() as u64 * step.block;
        let alone = p.view().starts_prefill_now(tokens);
        // Its KV in whole blocks, as the worker's count is kept; what it computes from the
        // prompt's own length, as the simulator charges a leg.
        let leg = p.ledger().start_prefill_leg(
            decision,
            step.hashes.len() as u64,
            step.block,
            step.prompt_tokens,
        );
        let _in_flight = p.hold(leg, tokens);
        let started = Instant::now();
        let headers = headers_for(step, step.lookup.epoch, p);
        let sent = self
            .engines
            .post(&p.spec.base_url, step.path, &headers, body)
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
        let observed_s = alone.then(|| started.elapsed().as_secs_f64());
        Some((
            Bytes::from(vllm::decode_request(&original, params).to_string()),
            observed_s,
        ))
    }

    /// Where `decode` can pull a sealed prefix from `source`: only between engines that
    /// speak OwnerServe's pull (the sim engine).
    fn pull_source(
        &self,
        source: WorkerId,
        decode: &Worker,
        tokens: u64,
    ) -> Option<vllm::PullSource> {
        let s = self.registry.get(source)?;
        if !pulls_between(&s, decode) {
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
    /// owns there) to the target; the source then drops its copy and learns the new
    /// epoch, so a stale request to it is refused. Returns the new epoch; the bytes
    /// copied go to `out` even if the flip then fails.
    async fn migrate(
        &self,
        step: &Step<'_>,
        source: WorkerId,
        target: &Arc<Worker>,
        tokens: u64,
        out: &mut Prepared,
    ) -> Option<Epoch> {
        let src = self.pull_source(source, target, tokens)?;
        let copy_path = protocol(target.spec.engine).kv_copy_path()?;
        let blocks = (tokens / step.block.max(1)) as usize;
        let hashes = &step.hashes[..blocks.min(step.hashes.len())];
        let fetch = engines::sim::FetchRequest {
            remote_host: src.host,
            remote_port: src.port,
            block_hashes: hashes.to_vec(),
            session: step.session.map(str::to_owned),
            epoch: step.lookup.epoch.map(|e| e.0),
        };
        let request_id = [(ownerserve_edge::request_id::HEADER, step.request_id.clone())];
        let copied = self
            .engines
            .post(
                &target.spec.base_url,
                copy_path,
                &request_id,
                json_body(&fetch),
            )
            .await;
        let report: engines::sim::FetchResponse = match copied {
            Ok((status, bytes)) if status.is_success() => serde_json::from_slice(&bytes).ok()?,
            other => {
                tracing::warn!(target = %target.spec.name, ?other, "migration copy failed; target recomputes");
                return None;
            }
        };
        out.migrated_bytes = Some(report.bytes);
        let new_epoch = self.flip_owner(step, source, target).await?;
        let source_drop = self
            .registry
            .get(source)
            .and_then(|s| Some((protocol(s.spec.engine).drop_path()?, s)));
        if let Some((drop_path, s)) = source_drop {
            let drop = engines::sim::DropRequest {
                block_hashes: hashes.to_vec(),
                session: step.session.map(str::to_owned),
                epoch: Some(new_epoch.0),
            };
            let (engines, url) = (self.engines.clone(), s.spec.base_url.clone());
            // The hand-off's last step does not hold up the request.
            self.tasks.spawn(async move {
                let dropped = engines
                    .post(&url, drop_path, &request_id, json_body(&drop))
                    .await;
                if let Err(e) = dropped {
                    tracing::warn!(worker = %url, error = %e, "migration source did not drop its copy");
                }
            });
        }
        tracing::info!(session = ?step.session, from = %source, to = %target.spec.name, epoch = new_epoch.0, "session migrated");
        Some(new_epoch)
    }

    /// Makes `target` the session's owner (CAS on the epoch the step was planned at) when a
    /// migration could not copy the KV or flip: the step still runs there, so it must own
    /// it. `Err(true)`: the session moved on since this router read it (the step must be
    /// planned again); `Err(false)`: no directory answer, or no session to own.
    async fn take_over(&self, step: &Step<'_>, target: &Worker) -> Result<Epoch, bool> {
        let (Some(sync), Some(session)) = (self.directory, step.session) else {
            return Err(false);
        };
        let lease = sync.lease_of(target.id).ok_or(false)?;
        let command =
            crate::ownership::ownership_sync::owner_claim(session, lease, step.lookup.epoch);
        match sync.client().write(command).await {
            Ok(Outcome::Owned { epoch, .. }) => Ok(epoch),
            Ok(Outcome::Rejected(Rejection::StaleEpoch { .. })) => Err(true),
            other => {
                tracing::warn!(?other, target = %target.spec.name, "session not taken over after a failed migration");
                Err(false)
            }
        }
    }

    /// The owner flip of a migration, in one directory entry: the target's copy is
    /// registered, the prefix the source owns moves (CAS on its epoch), and the session's
    /// decode owner moves (CAS on the session's epoch).
    async fn flip_owner(
        &self,
        step: &Step<'_>,
        source: WorkerId,
        target: &Worker,
    ) -> Option<Epoch> {
        let sync = self.directory?;
        let lease = sync.lease_of(target.id)?;
        let mut commands = Vec::new();
        if let (Some(view), Some((key, key_epoch))) =
            (step.lookup.artifact, step.lookup.artifact_key)
        {
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
}

/// The decode worker's response, and whether an SGLang pair failed on the way.
pub struct Sent {
    pub response: hyper::Response<Pooled>,
    /// The SGLang prefill leg failed and the decode worker ran the request whole.
    pub pair_failed: bool,
}

/// Sends the decode worker its request; with SGLang, the prefill leg goes at the same
/// time and a failed prefill leg cancels the pair, after which the decode worker runs the
/// request whole.
pub async fn send(
    upstream: &Upstream,
    worker: &Worker,
    path: &str,
    client_headers: &HeaderMap,
    prepared: &Prepared,
) -> Result<Sent, ForwardError> {
    let decode =
        |body: Bytes| upstream.forward(worker, path, client_headers, &prepared.headers, body);
    let Some((p, p_body)) = &prepared.concurrent_prefill else {
        let response = decode(prepared.body.clone()).await?;
        return Ok(Sent {
            response,
            pair_failed: false,
        });
    };
    let prefill = async {
        match upstream
            .post(&p.spec.base_url, path, &prepared.headers, p_body.clone())
            .await
        {
            Ok((status, _)) if status.is_success() => Ok(()),
            Ok((status, _)) => Err(ForwardError::Refused(status.as_u16())),
            Err(ForwardError::Connect) => {
                p.mark_down("connection refused");
                Err(ForwardError::Connect)
            }
            Err(e) => Err(e),
        }
    };
    match tokio::try_join!(prefill, decode(prepared.body.clone())) {
        Ok(((), response)) => Ok(Sent {
            response,
            pair_failed: false,
        }),
        Err(e) => {
            tracing::warn!(prefill = %p.spec.name, error = %e, "SGLang pair failed; running whole on the decode worker");
            let whole = match serde_json::from_slice::<Value>(&prepared.body) {
                Ok(v) => Bytes::from(sglang::without_bootstrap(&v).to_string()),
                Err(_) => prepared.body.clone(),
            };
            let response = decode(whole).await?;
            Ok(Sent {
                response,
                pair_failed: true,
            })
        }
    }
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

/// A typed request body as JSON (these types always serialize).
fn json_body(v: &impl serde::Serialize) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

/// Whether `decode` can pull a sealed prefix from `source`: both engines pull KV
/// (`EngineProtocol::pulls_kv`, what the planner priced the step with).
fn pulls_between(source: &Worker, decode: &Worker) -> bool {
    protocol(source.spec.engine).pulls_kv() && protocol(decode.spec.engine).pulls_kv()
}

#[cfg(test)]
mod tests;
