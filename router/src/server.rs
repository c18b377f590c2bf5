//! The router's HTTP server: the OpenAI proxy (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`), `/health`, and the operator API (`/admin/v1/...`).

use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_planner::policy::{self, Policy, PolicyError, RouteRequest};
use ownerserve_shim::openai::{self, Endpoint};

use crate::auth;
use crate::config::{DirectorySetup, RouterConfig};
use crate::directory::{Node, NodeSettings};
use crate::directory_client::{DirectoryClient, Embedded, Remote};
use crate::error::ApiError;
use crate::explain;
use crate::health::{self, HealthSettings};
use crate::kv::{self, KvRouting};
use crate::ownership_sync::{OwnershipSync, Routed, SyncSettings};
use crate::registry::{ModelAvailability, Registry};
use crate::upstream::{self, ForwardError, HttpClient};

/// Shared state of the router's handlers.
pub struct AppState {
    pub registry: Arc<Registry>,
    policy: Mutex<Box<dyn Policy>>,
    /// Whether the policy wants prompts tokenized and matched against the KV index.
    needs_match: bool,
    kv: Arc<KvRouting>,
    client: HttpClient,
    cfg: RouterConfig,
    /// Records ownership of routed requests, when a directory is configured.
    ownership: Option<OwnershipSync>,
    /// The embedded directory node, whose operator API the router also serves.
    directory: Option<Arc<Node>>,
}

/// Runs the router on `listener` until `shutdown` fires, then drains in-flight requests.
pub async fn run(
    listener: TcpListener,
    cfg: RouterConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let policy = policy::by_name(&cfg.policy, &cfg.policy_settings)?;
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
    let state = Arc::new(AppState {
        registry,
        needs_match: policy.needs_prefix_match(),
        policy: Mutex::new(policy),
        kv,
        client,
        cfg,
        ownership,
        directory: directory.clone(),
    });
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
    let admin = Router::new()
        .route("/admin/v1/workers", get(workers))
        .route("/admin/v1/kv", get(kv_index))
        .route("/admin/v1/plan/explain", post(plan_explain))
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
        .merge(admin)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    match directory_admin {
        Some(d) => router.merge(d),
        None => router,
    }
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
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, st.cfg.max_body_bytes).await?;
    let parsed = openai::parse(&bytes, endpoint)?;
    let model: &str = &parsed.model;
    check_model(st, model)?;
    // Only policies that use the KV index pay for tokenizing and hashing the prompt.
    let (prompt_tokens, hashes) = if st.needs_match {
        let tokens = parsed
            .prompt_tokens()
            .into_iter()
            .next()
            .unwrap_or_default();
        let hashes = st.kv.hashes(&tokens);
        (u32::try_from(tokens.len()).unwrap_or(u32::MAX), hashes)
    } else {
        (0, Vec::new())
    };
    let session = session_of(&parts.headers, &parsed);
    let route = RouteRequest {
        model,
        prompt_tokens,
        block_size: st.kv.block_size() as u32,
        session,
        now_ms: st.kv.now_ms(),
    };
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
        let cached = candidates
            .iter()
            .find(|c| c.id == worker.id)
            .map_or(0, |c| u64::from(c.cached_blocks));
        let prefill = u64::from(prompt_tokens).saturating_sub(cached * route.block_size as u64);
        let in_flight = worker.start_request(route.prompt_blocks(), prefill);
        let sent = upstream::forward(
            &st.client,
            worker,
            path,
            &parts.headers,
            bytes.clone(),
            st.cfg.request_timeout,
        )
        .await;
        match sent {
            Ok(resp) => {
                st.kv.record_routed(worker, &hashes);
                if let Some(sync) = &st.ownership {
                    sync.record(Routed {
                        worker: worker.id,
                        session: session.map(str::to_owned),
                        endpoint,
                        body: bytes.clone(),
                    });
                }
                return Ok(upstream::relay(resp, worker, in_flight));
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
    let plan = explain::explain(
        &step,
        &st.registry,
        &st.kv,
        &st.cfg.planner,
        st.directory.as_deref(),
    )?;
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
