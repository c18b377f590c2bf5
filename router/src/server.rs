//! The router's HTTP server: the OpenAI proxy (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`), `/health`, and the operator API (`/admin/v1/...`).

use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_planner::hash::HashedPrompt;
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::{self, Decision, Dispatch, Policy, PolicyError, RouteRequest};
use ownerserve_planner::tokenized::Tokenized;
use ownerserve_shim::openai::{self, Endpoint, RenderedPrompt};

use crate::auth;
use crate::config::{DirectorySetup, RouterConfig};
use crate::directory::{Node, NodeSettings};
use crate::directory_client::{DirectoryClient, Embedded, Lookup, Remote};
use crate::dispatch::{self, Prepared, Step};
use crate::error::ApiError;
use crate::explain;
use crate::health::{self, HealthSettings};
use crate::kv::{self, KvRouting};
use crate::metrics::directory::DirectoryMetrics;
use crate::metrics::fleet::FleetMetrics;
use crate::metrics::http::{Executed, HttpMetrics};
use crate::metrics::proxy::{Placement, ProxyMetrics};
use crate::metrics::scrape::Telemetry;
use crate::ownership_sync::{Effects, OwnershipSync, Routed, SyncSettings};
use crate::prompt_cache::PromptCache;
use crate::registry::{self, ModelAvailability, Registry};
use crate::sessions::{self, Sessions};
use crate::upstream::{self, ForwardError, HttpClient};

/// Shared state of the router's handlers.
pub struct AppState {
    pub registry: Arc<Registry>,
    policy: Mutex<Box<dyn Policy>>,
    /// Whether the policy wants prompts tokenized and matched against the KV index.
    needs_match: bool,
    /// Whether the policy reads session owners and owned prefixes from the directory.
    needs_directory: bool,
    pub(crate) kv: Arc<KvRouting>,
    pub(crate) client: HttpClient,
    pub(crate) cfg: RouterConfig,
    /// Records ownership of routed requests, when a directory is configured.
    pub(crate) ownership: Option<OwnershipSync>,
    /// The embedded directory node, whose operator API the router also serves.
    pub(crate) directory: Option<Arc<Node>>,
    pub(crate) metrics: ProxyMetrics,
    /// The process's metrics registry and what is read into it at scrape time.
    pub(crate) telemetry: Telemetry,
    pub(crate) sessions: Arc<Sessions>,
    /// Each session's last prompt, to hash only what its next step adds.
    prompts: PromptCache,
}

impl AppState {
    /// Feeds an observed prefill back to the policy's calibration.
    pub(crate) fn observe_prefill(&self, worker: WorkerId, predicted_s: f64, observed_s: f64) {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe_prefill(worker, predicted_s, observed_s);
    }

    /// The routing policy's cost plan for `req`, every candidate listed (`None` when the
    /// policy has no cost planner).
    pub(crate) fn explain(
        &self,
        req: &RouteRequest<'_>,
        workers: &[policy::WorkerView],
    ) -> Option<Result<ownerserve_planner::plan::Plan, PolicyError>> {
        self.policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .explain(req, workers)
    }

    /// What the directory says about a step (empty without a directory).
    pub(crate) fn lookup(&self, session: Option<&str>, hashes: &[u64]) -> Lookup {
        self.ownership.as_ref().map_or_else(Lookup::default, |o| {
            o.client()
                .lookup(session, hashes, self.kv.block_size() as u64)
        })
    }
}

/// Runs the router on `listener` until `shutdown` fires, then drains in-flight requests.
pub async fn run(
    listener: TcpListener,
    cfg: RouterConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let policy = policy::by_name(&cfg.policy, &cfg.policy_settings)?;
    let registry = prometheus::Registry::new();
    let proxy_metrics = ProxyMetrics::register(&registry, &cfg.policy)?;
    let telemetry = Telemetry {
        fleet: FleetMetrics::register(&registry)?,
        http: Arc::new(HttpMetrics::register(&registry)?),
        registry,
    };
    let client = upstream::client(cfg.connect_timeout);
    let registry = Arc::new(Registry::new(cfg.workers.clone()));
    let kv = Arc::new(KvRouting::new(cfg.kv_index, cfg.kv_approx_ttl, &registry));
    let health = HealthSettings {
        interval: cfg.health_interval,
        timeout: cfg.health_timeout,
        failure_threshold: cfg.health_failure_threshold,
    };
    health::check_all(&client, &registry, health).await;
    let tracker = TaskTracker::new();
    health::spawn(&client, &registry, health, &tracker, &shutdown);
    kv::spawn(&kv, &registry, cfg.kv_fanout.as_ref(), &tracker, &shutdown)?;
    if let Some(every) = cfg.scrape_interval {
        kv::spawn_scrapers(
            &registry,
            &client,
            every,
            cfg.health_timeout,
            &tracker,
            &shutdown,
        );
    }
    let (directory, client_dir): (Option<Arc<Node>>, Option<Arc<dyn DirectoryClient>>) =
        match &cfg.directory {
            DirectorySetup::Off => (None, None),
            DirectorySetup::Embedded { data_dir } => {
                let node = Node::start(
                    NodeSettings {
                        id: 1,
                        data_dir: data_dir.clone(),
                        nodes: [(1, openraft::BasicNode::new("127.0.0.1:0"))].into(),
                        init: true,
                        grace_ms: 500,
                        tick_ms: 250,
                        metrics: DirectoryMetrics::register(&telemetry.registry)?,
                    },
                    &tracker,
                    &shutdown,
                )
                .await?;
                (Some(node.clone()), Some(Arc::new(Embedded(node))))
            }
            DirectorySetup::Remote { urls } => (None, Some(Arc::new(Remote::new(urls.clone())))),
        };
    let ownership = client_dir.map(|c| {
        let settings = SyncSettings {
            lease_ttl: cfg.worker_lease_ttl,
            flush_every: cfg.ownership_flush,
            block_size: kv.block_size(),
        };
        OwnershipSync::spawn(c, registry.clone(), settings, &tracker, shutdown.clone())
    });
    let sessions = Sessions::new(cfg.session_lease);
    let prompts = PromptCache::new(cfg.prompt_cache_bytes);
    let state = Arc::new(AppState {
        registry,
        needs_match: policy.needs_prefix_match(),
        needs_directory: policy.needs_directory(),
        policy: Mutex::new(policy),
        kv,
        client,
        cfg,
        ownership,
        directory: directory.clone(),
        metrics: proxy_metrics,
        telemetry,
        sessions,
        prompts,
    });
    if state.ownership.is_some() {
        tracker.spawn(crate::demotion::run(state.clone(), shutdown.clone()));
    }
    let served = axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await
        .context("router server failed");
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    if let Some(node) = directory {
        node.raft.shutdown().await.ok();
    }
    served
}

/// The router's routes; `/admin/v1` needs a bearer token.
pub fn app(state: Arc<AppState>) -> Router {
    let tokens = Arc::new(state.cfg.tokens.clone());
    let http_metrics = state.telemetry.http.clone();
    let admin = Router::new()
        .route("/admin/v1/workers", get(workers))
        .route("/admin/v1/kv", get(kv_index))
        .route("/admin/v1/plan/explain", post(plan_explain))
        .route(
            "/admin/v1/workers/{name}/drain",
            post(drain).delete(undrain),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            auth::require,
        ));
    let directory_admin = state
        .directory
        .clone()
        .map(|node| crate::directory::admin::routes(node, tokens));
    let router = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(crate::metrics::scrape::metrics))
        .route("/metrics/targets", get(crate::metrics::scrape::targets))
        .merge(admin)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    let router = match directory_admin {
        Some(d) => router.merge(d),
        None => router,
    };
    router.layer(axum::middleware::from_fn_with_state(
        http_metrics,
        crate::request_id::track,
    ))
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, ApiError> {
    proxy(&st, req, Endpoint::ChatCompletions, "/v1/chat/completions").await
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    proxy(&st, req, Endpoint::Completions, "/v1/completions").await
}

/// Most bytes of an oversized body read and discarded before answering 413, so the client
/// can finish sending and read the error instead of seeing a reset connection.
const DRAIN_LIMIT_BYTES: u64 = 256 * 1024 * 1024;

/// Reads the body up to `limit` bytes. A bigger body is drained (up to a cap) and refused.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_LIMIT_BYTES) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let mut body = body;
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::BodyRead(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > DRAIN_LIMIT_BYTES {
            break;
        }
        if seen <= limit as u64 {
            buf.extend_from_slice(&data);
        }
    }
    if seen > limit as u64 {
        return Err(ApiError::BodyTooLarge { limit });
    }
    Ok(buf.freeze())
}

async fn proxy(
    st: &AppState,
    req: Request,
    endpoint: Endpoint,
    path: &str,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, st.cfg.max_body_bytes).await?;
    let parsed = openai::parse(&bytes, endpoint)?;
    let model: &str = &parsed.model;
    check_model(st, model)?;
    let block = st.kv.block_size() as u64;
    let session = session_of(&parts.headers, &parsed);
    // Only policies that use the KV index or the directory pay for tokenizing and hashing.
    let (prompt_tokens, hashes) = if st.needs_match || st.needs_directory {
        match parsed.rendered_prompts().into_iter().next() {
            Some(prompt) => tokenize_and_hash(st, prompt, session).await?,
            None => (0, Vec::new()),
        }
    } else {
        (0, Vec::new())
    };
    let lookup = if st.needs_directory {
        st.lookup(session, &hashes)
    } else {
        Lookup::default()
    };
    let fork = fork_of(&parts.headers);
    let route = RouteRequest {
        model,
        prompt_tokens,
        block_size: block as u32,
        session,
        now_ms: st.kv.now_ms(),
        decode_owner: lookup.owner,
        artifact: lookup.artifact,
        samples: parsed.sampling.n,
        fork: fork.is_some(),
    };
    let request_id = crate::request_id::of(&parts.headers);
    // A fork (`n > 1` or the header) starts a child session; the parent stays put.
    let child = (route.fork || route.samples > 1)
        .then(|| session.map(|s| child_session(s, fork.as_deref(), &request_id)))
        .flatten();
    let tracked = child.as_deref().or(session);
    let mut failed = Vec::new();
    loop {
        let mut candidates = st.registry.candidates(model, &failed);
        if st.needs_match {
            st.kv.fill_cached(&hashes, &mut candidates);
        }
        let decision = st
            .policy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .choose(&route, &candidates)
            .map_err(|e| match e {
                PolicyError::AllBusy => ApiError::AllBusy {
                    model: model.to_owned(),
                },
                PolicyError::NoHealthyWorker => ApiError::NoHealthyWorker {
                    model: model.to_owned(),
                },
            })?;
        let Some(worker) = st.registry.get(decision.worker) else {
            return Err(ApiError::NoHealthyWorker {
                model: model.to_owned(),
            });
        };
        let step = Step {
            path,
            body: &bytes,
            session,
            lookup: &lookup,
            hashes: &hashes,
            block,
            request_id: request_id.clone(),
            authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
        };
        let prepared = dispatch::prepare(st, &step, &decision, worker).await;
        let cached = candidates
            .iter()
            .find(|c| c.id == worker.id)
            .map_or(0, |c| u64::from(c.cached_blocks));
        let prefill = u64::from(prompt_tokens).saturating_sub(cached * block);
        let in_flight = worker.start_request(route.prompt_blocks(), prefill);
        let executed = decision.action();
        st.metrics.dispatched(executed, started.elapsed());
        let sent = send(st, worker, path, &parts.headers, &prepared).await;
        match sent {
            Ok(resp) => {
                let (action, reason) = dispatch::describe(&decision);
                tracing::debug!(
                    action,
                    worker = %worker.spec.name,
                    fell_back = prepared.fell_back,
                    reason,
                    "plan executed"
                );
                observe_step(st, &decision, &lookup, session, &resp, &prepared);
                st.kv.record_routed(worker, &hashes);
                let activity = tracked.map(|s| {
                    st.sessions
                        .start(s, worker.id, tail_hashes(st, &hashes), sessions::now_ms())
                });
                let predicted_gap_ms = activity.as_ref().and_then(|a| a.0);
                if let Some(sync) = &st.ownership {
                    sync.record(Routed {
                        worker: worker.id,
                        session: session.map(str::to_owned),
                        endpoint,
                        body: bytes.clone(),
                        effects: effects(
                            &decision,
                            &lookup,
                            &prepared,
                            child.clone(),
                            predicted_gap_ms,
                        ),
                    });
                }
                let first_byte = upstream::FirstByte {
                    histogram: st.metrics.ttft(executed),
                    started,
                };
                let mut relayed = upstream::relay(
                    resp,
                    worker,
                    in_flight,
                    activity.map(|a| a.1),
                    Some(first_byte),
                );
                relayed.extensions_mut().insert(Executed(executed));
                return Ok(relayed);
            }
            // Nothing reached the worker: mark it down and try the next one.
            Err(ForwardError::Connect) => {
                worker.mark_down("connection refused");
                failed.push(worker.id);
            }
            Err(e) => {
                tracing::warn!(worker = %worker.spec.name, error = %e, "forward failed");
                return Err(e.into_api(worker));
            }
        }
    }
}

/// Prompts with more text than this are tokenized and hashed on the blocking pool, so a
/// 100K-token prompt (a millisecond or more of CPU) never stalls the runtime thread that
/// relays every other request's stream. Below it, the hand-off costs more than it saves.
const OFFLOAD_PROMPT_BYTES: usize = 16 * 1024;

/// The prompt's token count and block hashes. A session's prompt is kept for its next
/// step, which then tokenizes and hashes only what it adds.
async fn tokenize_and_hash(
    st: &AppState,
    prompt: RenderedPrompt,
    session: Option<&str>,
) -> Result<(u32, Vec<u64>), ApiError> {
    let kv = st.kv.clone();
    let prompt_len = prompt.text_len();
    let prev = session.and_then(|s| st.prompts.get(s));
    let kept = session.is_some();
    let work = move || {
        // Only a session's prompt is kept, so only it needs restart points, and should
        // hold no spare capacity (the tokenizer reserves for a dense text).
        let tokenized = if kept {
            let mut t = prompt.into_tokenized(prev.as_deref().map(|p| &p.tokenized));
            t.shrink_to_fit();
            t
        } else {
            Tokenized::from_tokens(prompt.into_tokens())
        };
        let hashes = match &prev {
            Some(prev) => kv.hashes_after(prev, &tokenized.tokens),
            None => kv.hashes(&tokenized.tokens),
        };
        (tokenized, hashes)
    };
    let (tokenized, hashes) = if prompt_len < OFFLOAD_PROMPT_BYTES {
        work()
    } else {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))?
    };
    let count = u32::try_from(tokenized.tokens.len()).unwrap_or(u32::MAX);
    if let Some(s) = session {
        let kept = HashedPrompt {
            tokenized,
            hashes: hashes.clone(),
        };
        st.prompts.put(s, kept);
    }
    Ok((count, hashes))
}

/// Counts an executed step: its plan and the planner's decision, where a session's step
/// ran against its owner, and the KV its decode worker reports receiving.
fn observe_step(
    st: &AppState,
    decision: &Decision,
    lookup: &Lookup,
    session: Option<&str>,
    resp: &hyper::Response<hyper::body::Incoming>,
    prepared: &Prepared,
) {
    let action = decision.action();
    st.metrics.plan(action);
    if let Some(plan) = &decision.plan {
        st.metrics.decided(plan, st.cfg.planner.weights);
    }
    if session.is_some() && st.needs_directory {
        st.metrics.session_step(match lookup.owner {
            Some(owner) if owner == decision.worker => Placement::Owner,
            Some(_) => Placement::Elsewhere,
            None => Placement::Unowned,
        });
    }
    let received = resp
        .headers()
        .get("x-ownerserve-kv-received-bytes")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if !prepared.fell_back {
        st.metrics.kv_received(action, received);
    }
}

/// Sends the decode worker its request; with SGLang, the prefill leg goes at the same
/// time and a failed prefill leg cancels the pair, after which the decode worker runs the
/// request whole.
async fn send(
    st: &AppState,
    worker: &registry::Worker,
    path: &str,
    headers: &HeaderMap,
    prepared: &Prepared,
) -> Result<hyper::Response<hyper::body::Incoming>, ForwardError> {
    let timeout = st.cfg.request_timeout;
    let decode = |body: Bytes| {
        upstream::forward(
            &st.client,
            worker,
            path,
            headers,
            &prepared.headers,
            body,
            timeout,
        )
    };
    let Some((p, p_body)) = &prepared.concurrent_prefill else {
        return decode(prepared.body.clone()).await;
    };
    let prefill = async {
        match upstream::post_small(
            &st.client,
            &p.spec.base_url,
            path,
            &prepared.headers,
            p_body.clone(),
            timeout,
        )
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
        Ok(((), resp)) => Ok(resp),
        Err(e) => {
            tracing::warn!(prefill = %p.spec.name, error = %e, "SGLang pair failed; running whole on the decode worker");
            st.metrics
                .fallback(ownerserve_planner::plan::Action::RemotePrefill);
            let original = strip_bootstrap(&prepared.body);
            decode(original).await
        }
    }
}

/// The client's body without the bootstrap fields (for the whole-request retry).
fn strip_bootstrap(body: &Bytes) -> Bytes {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(mut v) => {
            if let Some(o) = v.as_object_mut() {
                for k in ["bootstrap_host", "bootstrap_port", "bootstrap_room"] {
                    o.remove(k);
                }
            }
            Bytes::from(v.to_string())
        }
        Err(_) => body.clone(),
    }
}

/// Block hashes of the prompt past its sealed prefix: what a demotion drops.
fn tail_hashes(st: &AppState, hashes: &[u64]) -> Vec<u64> {
    let block = st.kv.block_size() as u64;
    let tokens = hashes.len() as u64 * block;
    let sealed = st
        .cfg
        .planner
        .model
        .prefix_state(tokens, block as u32)
        .sealed_tokens;
    hashes[((sealed / block.max(1)) as usize).min(hashes.len())..].to_vec()
}

/// The directory effects of an executed decision.
fn effects(
    decision: &Decision,
    lookup: &Lookup,
    prepared: &Prepared,
    child: Option<String>,
    predicted_gap_ms: Option<u64>,
) -> Effects {
    let moved = lookup.owner != Some(decision.worker);
    let fetched = matches!(decision.dispatch, Dispatch::Fetch { .. }) && !prepared.fell_back;
    Effects {
        expect_epoch: if moved { prepared.epoch } else { None },
        replicate: fetched
            .then_some(lookup.artifact_key.map(|k| k.0))
            .flatten(),
        fork: child.zip(lookup.epoch),
        predicted_gap_ms,
    }
}

/// The child session of a fork of `session`: the header's name, or one made up from the
/// request id (`x-ownerserve-fork: 1`, or `n > 1` without the header).
fn child_session(session: &str, fork: Option<&str>, request_id: &HeaderValue) -> String {
    match fork {
        Some(named) if !matches!(named, "1" | "true") => named.to_owned(),
        _ => format!("{session}/fork-{}", request_id.to_str().unwrap_or("fork")),
    }
}

/// The fork a request asks for: `x-ownerserve-fork: <child session>` (or `1`/`true`).
fn fork_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(explain::FORK_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && !matches!(*v, "0" | "false"))
        .map(str::to_owned)
}

/// The session a request belongs to: the `x-session-id` header, else OpenAI's `user`, else
/// `metadata.session_id`.
fn session_of<'a>(
    headers: &'a HeaderMap,
    parsed: &'a openai::ParsedRequest<'_>,
) -> Option<&'a str> {
    headers
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .or(parsed.user.as_deref())
        .or(parsed.session_id.as_deref())
}

/// Fails like the proxy does for a model no worker serves.
fn check_model(st: &AppState, model: &str) -> Result<(), ApiError> {
    match st.registry.availability(model) {
        ModelAvailability::Available => Ok(()),
        ModelAvailability::Unavailable => Err(ApiError::NoHealthyWorker {
            model: model.to_owned(),
        }),
        ModelAvailability::Unknown => Err(ApiError::ModelNotFound(model.to_owned())),
    }
}

async fn plan_explain(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, st.cfg.max_body_bytes).await?;
    let parsed = openai::parse(&bytes, Endpoint::ChatCompletions)?;
    check_model(&st, &parsed.model)?;
    let tokens = parsed
        .prompt_tokens()
        .into_iter()
        .next()
        .unwrap_or_default();
    let fork = parts
        .headers
        .get(explain::FORK_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v, "1" | "true"));
    let step = explain::Step {
        model: &parsed.model,
        tokens: &tokens,
        session: session_of(&parts.headers, &parsed),
        samples: parsed.sampling.n,
        fork,
    };
    let plan = explain::explain(&st, &step)?;
    Ok(Json(plan).into_response())
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data: Vec<_> = st
        .registry
        .healthy_models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "ownerserve"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let healthy = st.registry.all().iter().filter(|w| w.is_healthy()).count();
    let body =
        json!({"status": "ok", "healthy_workers": healthy, "workers": st.registry.all().len()});
    (StatusCode::OK, Json(body)).into_response()
}

async fn kv_index(State(st): State<Arc<AppState>>) -> Response {
    Json(st.kv.describe(&st.registry)).into_response()
}

async fn workers(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"policy": st.cfg.policy, "workers": st.registry.describe()})).into_response()
}

/// `POST /admin/v1/workers/{name}/drain`: the worker takes no new work; sessions it owns
/// move off (migrate, fetch or recompute, as the planner prices them) on their next step.
async fn drain(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    set_draining(&st, &name, true)
}

/// `DELETE /admin/v1/workers/{name}/drain`: ends a drain.
async fn undrain(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    set_draining(&st, &name, false)
}

fn set_draining(st: &AppState, name: &str, draining: bool) -> Response {
    match st.registry.all().iter().find(|w| w.spec.name == name) {
        Some(w) => {
            let was = w.set_draining(draining);
            Json(json!({"worker": name, "draining": draining, "was_draining": was})).into_response()
        }
        None => ApiError::UnknownWorker(name.to_owned()).into_response(),
    }
}
