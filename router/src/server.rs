//! The router's HTTP server: the client API (the OpenAI proxy and the coding agents' APIs,
//! every endpoint a row of `api::ENDPOINTS`, routed by `api::routes`), `/health`, the
//! metrics and the operator API (`/admin/v1/...`). `server/front.rs` serves the hot proxy
//! routes without axum's router.

pub(crate) mod route_table;
pub mod state;

use std::sync::Arc;

use anyhow::Context;
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_planner::kv_index::KvIndexConfig;
use ownerserve_planner::policy::{self, OwnerServeConfig};

use crate::api::client_gate::ClientGate;
use crate::api::explain;
use crate::config::{DirectorySetup, RouterConfig};
use crate::error::ApiError;
use crate::fleet::engine_report;
use crate::fleet::health::{self, HealthSettings};
use crate::fleet::kv::{self, KvRouting};
use crate::fleet::kv_copy;
use crate::fleet::registry::Registry;
use crate::fleet::step_budget;
use crate::ops::metrics::fleet::FleetMetrics;
use crate::ops::metrics::proxy::ProxyMetrics;
use crate::ownership::ownership_sync::{OwnershipSync, SyncSettings};
use crate::ownership::sessions::Sessions;
use crate::prompt::{Engines, PromptHasher};
use crate::proxy::admission::Admission;
use crate::proxy::ingress::BodyLimits;
use crate::proxy::plan::RoutingPolicy;
use crate::server::route_table::{admin_route, admin_router, AdminRoute};
use crate::server::state::{AppState, Telemetry};
use crate::upstream::{self, EngineCalls, Upstream};
use ownerserve_edge::auth;
use ownerserve_edge::http_metrics::HttpMetrics;
use ownerserve_ownership::node::metrics::DirectoryMetrics;
use ownerserve_ownership::node::{DirectoryClient, Embedded, Remote};
use ownerserve_ownership::node::{Node, NodeSettings};

/// Runs the router on `listener` until `shutdown` fires, then drains in-flight requests.
pub async fn run(
    listener: TcpListener,
    cfg: RouterConfig,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tracker = TaskTracker::new();
    let ephemeral = match &cfg.directory {
        DirectorySetup::Embedded {
            data_dir,
            ephemeral: true,
        } => Some(data_dir.clone()),
        _ => None,
    };
    let state = AppState::start(cfg, &tracker, &shutdown).await?;
    let directory = state.directory.clone();
    let limits = state.cfg.conn_limits;
    let router = app(state.clone());
    let front = front::Front::new(state, router.clone());
    let served =
        ownerserve_edge::serve::serve_front(listener, front, router, limits, shutdown.clone())
            .await
            .context("router server failed");
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    if let Some(node) = directory {
        node.raft.shutdown().await.ok();
    }
    if let Some(dir) = ephemeral {
        std::fs::remove_dir_all(&dir).ok();
    }
    served
}

impl AppState {
    /// Builds the router's state from `cfg` and starts its background tasks on `tracker`
    /// (health checks, KV events and scrapes, the directory node or client, the ownership
    /// sync and the idle-session sweep), all ending with `shutdown`. Serve it with [`app`].
    pub async fn start(
        mut cfg: RouterConfig,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Arc<AppState>> {
        let (proxy_metrics, telemetry) = telemetry(&cfg.policy)?;
        let upstream = Upstream {
            client: upstream::client(cfg.connect_timeout),
            timeout: cfg.request_timeout,
        };
        let client = &upstream.client;
        let registry = Arc::new(Registry::new(cfg.workers.clone()));
        let health = HealthSettings::of(&cfg);
        health::check_all(client, &registry, &health).await;
        let reports = engine_report::read_all(&registry, client, cfg.health_timeout).await;
        // Learned before the policy is built from its settings.
        step_budget::learn(&registry, &reports, &mut cfg);
        let policy = RoutingPolicy::new(policy::by_name(&cfg.policy, &cfg.policy_settings())?);
        let block_size = kv::resolve_block_size(&registry, &reports, cfg.kv_block_size)?;
        let index = KvIndexConfig {
            block_size,
            ..cfg.kv_index
        };
        let kv = Arc::new(KvRouting::new(index, cfg.kv_approx_ttl, &registry));
        warn_unpriced_models(&registry, &cfg.planner);
        health::spawn(client, &registry, health, tracker, shutdown);
        start_kv(&cfg, client, &kv, &registry, (tracker, shutdown)).await?;
        start_discovery(&cfg, client, &kv, &registry, (tracker, shutdown))?;
        let directories = start_directory(&cfg, &telemetry, tracker, shutdown).await?;
        let ownership = directories.client.map(|c| {
            let settings = SyncSettings {
                lease_ttl: cfg.worker_lease_ttl,
                flush_every: cfg.ownership_flush,
                block_size: kv.block_size(),
                dropped: proxy_metrics.ownership_records_dropped.clone(),
            };
            OwnershipSync::spawn(c, registry.clone(), settings, tracker, shutdown.clone())
        });
        let responses = crate::api::responses::owners::Recorder::new(&ownership, &cfg);
        let engines: Arc<dyn EngineCalls> = Arc::new(upstream.clone());
        let (admission, client_gate, body_limits) = gates(&cfg, &proxy_metrics);
        let state = Arc::new(AppState {
            policy,
            engines: engines.clone(),
            upstream,
            sessions: Sessions::new(cfg.sessions.lease, cfg.sessions.gap_prior),
            prompts: PromptHasher::new(
                kv.block_size(),
                cfg.prompt_cache_bytes,
                cfg.tokenizers.clone(),
                Some(Engines {
                    calls: engines.clone(),
                    registry: registry.clone(),
                }),
            )
            .with_flights(cfg.prompt_flights),
            busy_poll: crate::proxy::busy_poll::BusyPoll::new(cfg.busy_poll),
            kv,
            cfg,
            ownership,
            directory: directories.node,
            remote_directory: directories.remote,
            metrics: proxy_metrics,
            telemetry,
            tasks: tracker.clone(),
            admission,
            client_gate,
            body_limits,
            registry,
            responses,
        });
        spawn_state_tasks(&state, tracker, shutdown);
        Ok(state)
    }
}

/// The tasks that read the built state: the idle-session demotion and the retention sweep
/// (with a directory), the parked sessions' KV lifecycle (`[router.sessions] lifecycle`)
/// and the busy polling after each request's activity (`crate::proxy::busy_poll`; it yields while a
/// prompt is tokenized on the blocking pool).
fn spawn_state_tasks(state: &Arc<AppState>, tracker: &TaskTracker, shutdown: &CancellationToken) {
    if state.ownership.is_some() {
        tracker.spawn(crate::ownership::demotion::run(
            state.clone(),
            shutdown.clone(),
        ));
        tracker.spawn(crate::ownership::retention::run(
            state.clone(),
            shutdown.clone(),
        ));
    }
    if state.cfg.sessions.lifecycle {
        tracker.spawn(crate::ownership::lifecycle::run(
            state.clone(),
            tracker.clone(),
            shutdown.clone(),
        ));
    }
    if !state.cfg.busy_poll.is_zero() {
        let (st, shutdown) = (state.clone(), shutdown.clone());
        tracker.spawn(async move {
            let handing_off = || st.prompts.handing_off();
            crate::proxy::busy_poll::run(&st.busy_poll, handing_off, &shutdown).await;
        });
    }
}

/// Fills the KV index from peer routers (`kv.peers`), then starts its event subscribers
/// (and fan-out, expiry) and the engines' load scrapers.
async fn start_kv(
    cfg: &RouterConfig,
    client: &upstream::HttpClient,
    kv: &Arc<KvRouting>,
    registry: &Arc<Registry>,
    (tracker, shutdown): (&TaskTracker, &CancellationToken),
) -> anyhow::Result<()> {
    let max_blocks = cfg.kv_index.max_blocks;
    let token = cfg.tokens.admin();
    let peers = &cfg.kv_peers;
    kv_copy::copy_from_peers(
        &kv.index, &kv.copies, registry, peers, client, token, max_blocks,
    )
    .await;
    kv::spawn(kv, registry, cfg.kv_fanout.as_ref(), tracker, shutdown)?;
    if let Some(every) = cfg.scrape_interval {
        let timeout = cfg.health_timeout;
        kv::spawn_scrapers(registry, client, every, timeout, tracker, shutdown);
    }
    Ok(())
}

/// Starts Kubernetes discovery when configured, each joining worker with its tasks.
fn start_discovery(
    cfg: &RouterConfig,
    client: &upstream::HttpClient,
    kv: &Arc<KvRouting>,
    registry: &Arc<Registry>,
    (tracker, shutdown): (&TaskTracker, &CancellationToken),
) -> anyhow::Result<()> {
    let Some(setup) = cfg.discovery.clone() else {
        return Ok(());
    };
    let tasks = crate::fleet::worker_tasks::WorkerTasks {
        client: client.clone(),
        health: HealthSettings::of(cfg),
        scrape: cfg.scrape_interval.map(|every| (every, cfg.health_timeout)),
        kv: kv.clone(),
        tracker: tracker.clone(),
        shutdown: shutdown.clone(),
    };
    crate::fleet::worker_tasks::discover(setup, registry, tasks)
}

/// Says so when the fleet serves models the planner does not price as themselves: its
/// costs then use `router.planner_model` (named in the warning), never silently.
fn warn_unpriced_models(registry: &Registry, planner: &OwnerServeConfig) {
    for served in registry.healthy_models() {
        if !planner.models.contains_key(&served) {
            tracing::warn!(
                model = %served,
                priced_as = %planner.model.name,
                "no model spec for this served model: the planner prices it as router.planner_model; set router.models.\"{served}\" to its preset or a .toml spec"
            );
        }
    }
}

/// The embedded directory node, or a client of a remote cluster, as configured.
async fn start_directory(
    cfg: &RouterConfig,
    telemetry: &Telemetry,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> anyhow::Result<Directories> {
    Ok(match &cfg.directory {
        DirectorySetup::Off => Directories::default(),
        DirectorySetup::Embedded { data_dir, .. } => {
            let settings = NodeSettings {
                id: 1,
                data_dir: data_dir.clone(),
                nodes: [(1, openraft::BasicNode::new("127.0.0.1:0"))].into(),
                init: true,
                grace_ms: 500,
                tick_ms: 250,
                metrics: DirectoryMetrics::register(&telemetry.registry)?,
                // In process: no Raft or directory endpoint is served.
                cluster_secret: None,
            };
            let node = Node::start(settings, tracker, shutdown).await?;
            Directories {
                node: Some(node.clone()),
                remote: None,
                client: Some(Arc::new(Embedded(node))),
            }
        }
        DirectorySetup::Remote {
            urls,
            secret,
            read_lease,
        } => {
            let remote = Arc::new(
                Remote::connect(urls.clone(), secret.as_ref(), tracker, shutdown.clone())
                    .with_read_lease(*read_lease),
            );
            Directories {
                node: None,
                remote: Some(remote.clone()),
                client: Some(remote),
            }
        }
    })
}

/// The directory as the router holds it: an embedded node, or a remote cluster with this
/// router's replica of it; and the client the request path writes and reads through.
#[derive(Default)]
struct Directories {
    node: Option<Arc<Node>>,
    remote: Option<Arc<Remote>>,
    client: Option<Arc<dyn DirectoryClient>>,
}

/// The operator API the router serves itself (the directory's is added by
/// `replica_admin` or the embedded node): each route once, for [`app`] and for the test
/// that holds `docs/openapi.json` to the routes served.
pub(crate) fn admin_routes() -> [AdminRoute<Arc<AppState>>; 8] {
    [
        admin_route("/admin/v1/workers", Method::GET, workers),
        admin_route("/admin/v1/kv", Method::GET, kv_index),
        admin_route("/admin/v1/kv/workers/{name}/copy", Method::GET, kv_copy),
        admin_route("/admin/v1/lifecycle", Method::GET, lifecycle),
        admin_route("/admin/v1/plan/explain", Method::POST, plan_explain),
        admin_route("/admin/v1/workers/{name}/drain", Method::POST, drain),
        admin_route("/admin/v1/workers/{name}/drain", Method::DELETE, undrain),
        admin_route("/admin/v1/openapi.json", Method::GET, openapi::document),
    ]
}

/// The router's routes; `/admin/v1` needs a bearer token.
pub fn app(state: Arc<AppState>) -> Router {
    let tokens = Arc::new(state.cfg.tokens.clone());
    let http_metrics = state.telemetry.http.clone();
    let admin = admin_router(admin_routes()).route_layer(axum::middleware::from_fn_with_state(
        tokens.clone(),
        auth::require,
    ));
    // The embedded node's operator API, less its own OpenAPI document: the router's
    // (`openapi::document`) names the node's routes too.
    let directory_admin = state
        .directory
        .clone()
        .map(|node| ownerserve_ownership::node::admin::embedded_routes(node, tokens.clone()));
    let remote_admin = state
        .remote_directory
        .clone()
        .map(|remote| crate::ownership::replica_admin::routes(remote, tokens.clone()));
    let client_api = crate::api::routes::client_api(&state);
    // The fleet's figures and its workers' URLs: the read token's, unless made public.
    let mut metrics = Router::new()
        .route("/metrics", get(crate::ops::metrics::scrape::metrics))
        .route(
            "/metrics/targets",
            get(crate::ops::metrics::scrape::targets),
        );
    if !state.cfg.metrics_public {
        metrics = metrics.route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            auth::require,
        ));
    }
    let router = client_api
        .route("/health", get(health))
        .merge(metrics)
        .merge(admin)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    let router = match directory_admin {
        Some(d) => router.merge(d),
        None => router,
    };
    // A remote cluster's view from this router's replica (the embedded node serves its own).
    let router = match remote_admin {
        Some(r) => router.merge(r),
        None => router,
    };
    router.layer(ownerserve_edge::tracked::layer(http_metrics))
}

/// The process's metrics registry, with the proxy's, the fleet's and the HTTP metrics.
fn telemetry(policy: &str) -> prometheus::Result<(ProxyMetrics, Telemetry)> {
    let registry = prometheus::Registry::new();
    let proxy = ProxyMetrics::register(&registry, policy)?;
    let telemetry = Telemetry {
        fleet: FleetMetrics::register(&registry)?,
        http: Arc::new(HttpMetrics::register(&registry)?),
        runtime: ownerserve_edge::runtime_metrics::RuntimeMetrics::register(&registry)?,
        registry,
    };
    Ok((proxy, telemetry))
}

/// What stands in front of the request path: per-model admission, `/v1`'s keys and rate
/// limits, and the body budget.
fn gates(cfg: &RouterConfig, metrics: &ProxyMetrics) -> (Admission, Arc<ClientGate>, BodyLimits) {
    (
        Admission::new(cfg.admission),
        Arc::new(ClientGate::new(
            cfg.api_keys.clone(),
            key_tenants(cfg),
            cfg.rate_limit,
            metrics.clone(),
        )),
        BodyLimits::new(cfg.body),
    )
}

/// Each API key's tenant, one `Tenant` per configured tenant shared by its keys.
fn key_tenants(cfg: &RouterConfig) -> Vec<Option<Arc<crate::api::tenants::Tenant>>> {
    let tenants: Vec<_> = cfg
        .tenants
        .iter()
        .map(|t| Arc::new(crate::api::tenants::Tenant::new(t.clone())))
        .collect();
    cfg.key_tenants
        .iter()
        .map(|t| t.and_then(|i| tenants.get(i).cloned()))
        .collect()
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

/// `POST /admin/v1/plan/explain`: the plan for a chat request, without running it.
async fn plan_explain(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    Ok(Json(explain::explain(&st, req).await?).into_response())
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let fleet = st.registry.all();
    let healthy = fleet.iter().filter(|w| w.is_healthy()).count();
    let live = fleet.iter().filter(|w| !w.is_retired()).count();
    let body = json!({"status": "ok", "healthy_workers": healthy, "workers": live});
    (StatusCode::OK, Json(body)).into_response()
}

async fn kv_index(State(st): State<Arc<AppState>>) -> Response {
    Json(st.kv.describe(&st.registry)).into_response()
}

/// `GET /admin/v1/kv/workers/{name}/copy`: the worker's event-fed blocks in this router's
/// index and the stream position they end with, for a starting peer (`kv_copy`); 404 for
/// a worker without an event stream applied since the index last forgot it.
async fn kv_copy(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    let Some(w) = st.registry.by_name(&name) else {
        return ApiError::UnknownWorker(name).into_response();
    };
    let copy = st.kv.index.lock().copy_worker(w.id);
    match copy {
        Some(copy) => Json(copy).into_response(),
        None => ApiError::NoKvCopy(name).into_response(),
    }
}

async fn workers(State(st): State<Arc<AppState>>) -> Response {
    let mut rows = serde_json::to_value(st.registry.describe()).unwrap_or_default();
    // How far the router's index of each worker's cache can be trusted now.
    if let Some(rows) = rows.as_array_mut() {
        let fleet = st.registry.all();
        for row in rows.iter_mut() {
            if let Some(w) = fleet
                .iter()
                .find(|w| row["id"].as_str() == Some(w.spec.name.as_str()))
            {
                row["index"] = json!(st.kv.mode_of(w).name());
            }
        }
    }
    // With a directory: the stored responses each worker holds (what a drain leaves).
    if let (Some(held), Some(rows)) = (
        crate::api::responses::held_per_worker(&st),
        rows.as_array_mut(),
    ) {
        // Rows are named by worker name (describe() leaves retired workers out).
        let fleet = st.registry.all();
        for row in rows.iter_mut() {
            let id = fleet
                .iter()
                .find(|w| row["id"].as_str() == Some(w.spec.name.as_str()))
                .map(|w| w.id);
            let count = id.and_then(|id| held.get(&id).copied()).unwrap_or(0);
            row["stored_responses"] = json!(count);
        }
    }
    Json(json!({"policy": st.cfg.policy, "workers": rows})).into_response()
}

/// Rows `GET /admin/v1/lifecycle` lists at most (`count` says how many are tracked).
const LIFECYCLE_ROWS: usize = 1_000;

/// `GET /admin/v1/lifecycle`: the sessions this router tracks (their owner, context, and
/// while parked the lifecycle's course and where their KV is), and what session admission
/// counts per served model.
async fn lifecycle(State(st): State<Arc<AppState>>) -> Response {
    let (rows, count, counts) = st
        .sessions
        .lifecycle_view(LIFECYCLE_ROWS, crate::ownership::sessions::now_ms());
    let fleet = st.registry.all();
    let rows: Vec<serde_json::Value> = rows
        .into_iter()
        .map(|r| {
            let mut v = serde_json::to_value(&r).unwrap_or_default();
            v["owner"] = json!(fleet
                .iter()
                .find(|w| w.id == r.owner)
                .map(|w| w.spec.name.as_str()));
            v
        })
        .collect();
    Json(json!({
        "lifecycle": st.cfg.sessions.lifecycle,
        "admission": st.cfg.sessions.admission.is_some(),
        "count": count,
        "sessions": rows,
        "live_tokens": counts.live,
        "admitted_tokens": counts.admitted,
    }))
    .into_response()
}

/// `POST /admin/v1/workers/{name}/drain`: the worker takes no new work; sessions it owns
/// move off (migrate, fetch or recompute, as the planner prices them) on their next step.
/// Stored responses it holds stay: their follow-ups, reads and cancels still go to it
/// (the state exists in its engine alone); `stored_responses` in `/admin/v1/workers`
/// counts them.
async fn drain(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    set_draining(&st, &name, true)
}

/// `DELETE /admin/v1/workers/{name}/drain`: ends a drain.
async fn undrain(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    set_draining(&st, &name, false)
}

fn set_draining(st: &AppState, name: &str, draining: bool) -> Response {
    match st.registry.by_name(name) {
        Some(w) => {
            let was = w.set_draining(draining);
            Json(json!({"worker": name, "draining": draining, "was_draining": was})).into_response()
        }
        None => ApiError::UnknownWorker(name.to_owned()).into_response(),
    }
}

mod front;
mod openapi;
#[cfg(test)]
mod tests;
