//! The router's shared state: what every handler and stage reads (workers, KV index,
//! policy, engines, directory, metrics), and the narrow views the request-path stages
//! take of it. It imports the stages' types but no stage imports more of it than it
//! reads; `server` builds it and starts its tasks.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::config::RouterConfig;
use crate::fleet::kv::KvRouting;
use crate::fleet::registry::Registry;
use crate::ops::metrics::fleet::FleetMetrics;
use crate::ops::metrics::proxy::ProxyMetrics;
use crate::ownership::ownership_sync::OwnershipSync;
use crate::ownership::sessions::Sessions;
use crate::prompt::{Hashing, PromptHasher};
use crate::proxy::dispatch::Dispatcher;
use crate::proxy::plan::RoutingPolicy;
use crate::proxy::view::Sources;
use crate::upstream::{EngineCalls, Upstream};
use ownerserve_edge::http_metrics::HttpMetrics;
use ownerserve_ownership::node::Node;

/// The router's metrics registry: the proxy's counters, the fleet read at scrape time,
/// and the HTTP middleware's counters.
pub struct Telemetry {
    pub registry: prometheus::Registry,
    pub fleet: FleetMetrics,
    pub http: Arc<HttpMetrics>,
    pub runtime: ownerserve_edge::runtime_metrics::RuntimeMetrics,
}

/// Shared state of the router's handlers.
pub struct AppState {
    pub registry: Arc<Registry>,
    pub(crate) policy: RoutingPolicy,
    pub(crate) kv: Arc<KvRouting>,
    pub(crate) upstream: Upstream,
    /// The same client, as the dispatch stage's seam to engines.
    pub(crate) engines: Arc<dyn EngineCalls>,
    pub(crate) cfg: RouterConfig,
    /// Records ownership of routed requests, when a directory is configured.
    pub(crate) ownership: Option<OwnershipSync>,
    /// The embedded directory node, whose operator API the router also serves.
    pub(crate) directory: Option<Arc<Node>>,
    /// A remote directory cluster and this router's live replica of it.
    pub(crate) remote_directory: Option<Arc<ownerserve_ownership::node::Remote>>,
    pub(crate) metrics: ProxyMetrics,
    /// The process's metrics registry and what is read into it at scrape time.
    pub(crate) telemetry: Telemetry,
    pub(crate) sessions: Arc<Sessions>,
    /// Tokenizes and hashes prompts, keeping each session's last one.
    pub(crate) prompts: PromptHasher,
    /// Owns every task the router starts, request hand-offs included.
    pub(crate) tasks: TaskTracker,
    /// Per-model slots and queue in front of the request path.
    pub(crate) admission: crate::proxy::admission::Admission,
    /// API keys and per-key rate limits of `/v1`.
    pub(crate) client_gate: Arc<crate::api::client_gate::ClientGate>,
    /// How client bodies may arrive, and the bytes all of them may hold at once.
    pub(crate) body_limits: crate::proxy::ingress::BodyLimits,
    /// Which worker holds each stored Responses answer: this router's records, and the
    /// directory they are recorded in.
    pub(crate) responses: Arc<crate::api::responses::owners::Recorder>,
    /// Keeps the runtime polling for a short window after each request's activity.
    pub(crate) busy_poll: crate::proxy::busy_poll::BusyPoll,
}

impl AppState {
    /// What a step's view is read from.
    pub(crate) fn sources(&self) -> Sources<'_> {
        Sources {
            registry: &self.registry,
            kv: &self.kv,
            directory: self.ownership.as_ref().map(|o| o.client().as_ref()),
            sessions: Some(&self.sessions),
            time_scale: self.cfg.planner_time_scale,
            warmup: self.cfg.worker_warmup,
        }
    }

    /// What the dispatch stage may touch.
    pub(crate) fn dispatcher(&self) -> Dispatcher<'_> {
        Dispatcher {
            engines: &self.engines,
            registry: &self.registry,
            directory: self.ownership.as_ref(),
            tasks: &self.tasks,
        }
    }

    /// Whether the identity stage tokenizes and hashes: for a policy that reads the KV
    /// index or the directory, and for the ownership records.
    pub(crate) fn hashing(&self) -> Hashing {
        let needs = self.policy.needs();
        if needs.prefix_match || needs.directory || self.ownership.is_some() {
            Hashing::Keep
        } else {
            Hashing::Skip
        }
    }
}
