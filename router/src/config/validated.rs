//! The validated router configuration: every `[router]` setting checked and turned into
//! the types the router runs with (durations, limits, admission, auth), before any socket
//! opens. The planner's figures are built in `planner_setup`, the directory choice in
//! `directory`, the model tokenizers in `tokenizers`.

use std::net::SocketAddr;
use std::time::Duration;

use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::kv_index::KvIndexConfig;
use ownerserve_planner::lifecycle::GapEstimate;
use ownerserve_planner::policy::{self, OwnerServeConfig, PolicySettings};
use ownerserve_shim::kv_events::redis_fanout::FanoutConfig;

use super::directory::{directory_setup, DirectorySetup};
use super::planner_setup::{baseline_settings, planner_setup, with_planner};
use super::tokenizers::{load_tokenizers, ModelTokenizer};
use super::workers::worker_url;
use super::{ConfigError, FanoutRole, RouterSettings, WorkerSpec};
use ownerserve_edge::auth::{Origin, Tokens};
use ownerserve_edge::rate_limit::RateLimit;
use ownerserve_edge::serve::ConnLimits;

/// Validated router configuration.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub addr: SocketAddr,
    pub policy: String,
    pub health_interval: Duration,
    pub health_timeout: Duration,
    pub health_failure_threshold: u32,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub stream_idle_timeout: Duration,
    /// How much work one request may ask of the engines.
    pub request_limits: RequestLimits,
    /// Per-model slots and queue.
    pub admission: crate::proxy::admission::AdmissionSettings,
    /// How long a worker just up warms up (zero: off).
    pub worker_warmup: Duration,
    /// Connection limits of the client-facing server.
    pub conn_limits: ConnLimits,
    /// How client bodies may arrive and how many bytes of them the router holds at once.
    pub body: BodySettings,
    /// Per-API-key token buckets (`None`: no rate limit).
    pub rate_limit: Option<RateLimit>,
    pub prompt_cache_bytes: usize,
    /// How long prompts are computed ([`crate::prompt::flights`]).
    pub prompt_flights: crate::prompt::flights::FlightSettings,
    /// Models not tokenized with the built-in tokenizer, and how they are.
    pub tokenizers: std::collections::BTreeMap<String, ModelTokenizer>,
    pub workers: Vec<WorkerSpec>,
    /// The other policies' settings; the cost planner's are `planner`
    /// ([`RouterConfig::policy_settings`] puts them together).
    pub baseline_settings: PolicySettings,
    /// The index's settings; its block size is the default until the engines are asked
    /// (`crate::fleet::kv::resolve_block_size`).
    pub kv_index: KvIndexConfig,
    /// `/metrics` and `/metrics/targets` need no token.
    pub metrics_public: bool,
    /// Keys clients must present on `/v1` (`None`: open): `api_keys`, then every tenant's.
    pub api_keys: Option<ownerserve_edge::api_keys::ApiKeys>,
    /// The tenants (`[router.tenants.<name>]`).
    pub tenants: Vec<super::TenantSpec>,
    /// Each of `api_keys`' tenant, by the key's index (`None`: a plain key).
    pub key_tenants: Vec<Option<usize>>,
    /// `Authorization: Bearer <engine_api_key>`, sent to the engines on every request.
    pub engine_authorization: Option<axum::http::HeaderValue>,
    /// `router.kv_block_size` as configured (`None`: learn it from the engines).
    pub kv_block_size: Option<usize>,
    pub kv_approx_ttl: Duration,
    pub scrape_interval: Option<Duration>,
    /// How long the runtime keeps polling after a request's activity (`busy_poll`; zero:
    /// it parks at once).
    pub busy_poll: Duration,
    pub kv_fanout: Option<(FanoutConfig, FanoutRole)>,
    /// Router replicas whose KV index is copied at startup (`kv.peers`).
    pub kv_peers: Vec<String>,
    pub tokens: Tokens,
    /// Whether the admin token was generated (and must be printed).
    pub token_origin: Origin,
    pub directory: DirectorySetup,
    pub worker_lease_ttl: Duration,
    pub ownership_flush: Duration,
    pub ownership_claim_timeout: Duration,
    /// What the retention sweep keeps in the directory (`ownership::retention`).
    pub retention: Retention,
    /// What the cost planner prices plans with; startup refines it with what the engines
    /// report (`crate::fleet::step_budget::learn`).
    pub planner: OwnerServeConfig,
    /// Converts observed wall-clock prefill times into the workers' (simulated) time.
    pub planner_time_scale: f64,
    pub planner_calibrate: bool,
    /// `[router.sessions]`.
    pub sessions: SessionSettings,
    /// Workers discovered from the Kubernetes API (`None`: static workers only).
    pub discovery: Option<super::DiscoverySetup>,
}

/// How long the directory keeps what nothing uses (`[router.directory]`
/// `artifact_retention_s`, `session_retention_s`); zero keeps it forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A prefix artifact no session is built on, from its last access.
    pub artifact: Duration,
    /// A demoted session (no owner), from its last write.
    pub session: Duration,
}

/// How much work one request may ask of the engines (checked at ingress).
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Most choices (`n` × prompts).
    pub max_choices: u64,
    /// Most completion tokens in all (`max_tokens` × choices), when `max_tokens` is given.
    pub max_completion_tokens: u64,
}

/// How a client's body may arrive (checked at ingress).
#[derive(Debug, Clone, Copy)]
pub struct BodySettings {
    /// Largest body (a 413 beyond).
    pub max_bytes: usize,
    /// Longest a body may take in all (a 408 after).
    pub timeout: Duration,
    /// Slowest average rate once the first 5 s are over (0: none).
    pub min_bytes_per_s: u64,
    /// Bytes of bodies the router holds at once, all requests together.
    pub budget_bytes: usize,
}

/// Tokens per KV block when neither the config nor any engine says: our sim engine's.
pub const DEFAULT_KV_BLOCK_SIZE: usize = 16;

fn conn_limits(s: &RouterSettings) -> ConnLimits {
    ConnLimits {
        max_connections: s.max_connections.max(1),
        header_read: Duration::from_secs(s.header_read_timeout_s.max(1)),
        reserved_probes: s.reserved_probe_connections,
        ..ConnLimits::default()
    }
}

fn body_settings(s: &RouterSettings) -> BodySettings {
    BodySettings {
        max_bytes: s.max_body_bytes,
        timeout: Duration::from_secs(s.body_read_timeout_s.max(1)),
        min_bytes_per_s: s.body_min_bytes_per_s,
        budget_bytes: s.max_inflight_body_mb.saturating_mul(1 << 20),
    }
}

/// How long prompts are computed: `tokenize_threads` (0: one per core),
/// `max_tokenizing_prompts`, `tokenize_timeout_ms`.
fn prompt_flights(
    s: &RouterSettings,
) -> Result<crate::prompt::flights::FlightSettings, ConfigError> {
    Ok(crate::prompt::flights::FlightSettings {
        threads: match s.tokenize_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        },
        max: s.max_tokenizing_prompts.max(1),
        timeout: millis("tokenize_timeout_ms", s.tokenize_timeout_ms)?,
    })
}

fn millis(field: &str, v: u64) -> Result<Duration, ConfigError> {
    if v == 0 {
        return Err(ConfigError::router(field, "must be positive"));
    }
    Ok(Duration::from_millis(v))
}

impl RouterConfig {
    /// Every policy's settings, the cost planner's as they are now.
    pub fn policy_settings(&self) -> PolicySettings {
        with_planner(&self.baseline_settings, &self.planner)
    }

    /// Prints the admin token if it was generated (the only way to learn it).
    pub fn announce_token(&self) {
        if self.token_origin == Origin::Generated {
            ownerserve_edge::process::say(&format!(
                "admin token (for /admin/v1, `Authorization: Bearer ...`): {}",
                self.tokens.admin()
            ));
        }
    }

    /// Validates settings and a worker list into a config.
    pub fn validate(s: &RouterSettings, workers: Vec<WorkerSpec>) -> Result<Self, ConfigError> {
        Self::validate_with(s, workers, &super::KubernetesSettings::default())
    }

    /// Validates settings, a worker list and the discovery table into a config; with
    /// discovery on, the static worker list may be empty.
    pub fn validate_with(
        s: &RouterSettings,
        workers: Vec<WorkerSpec>,
        kubernetes: &super::KubernetesSettings,
    ) -> Result<Self, ConfigError> {
        check_numbers(s)?;
        let discovery = discovery_setup(&workers, kubernetes)?;
        check_workers(&workers)?;
        let planner = planner_setup(s, &workers)?;
        let baseline_settings = baseline_settings(s);
        policy::by_name(&s.policy, &with_planner(&baseline_settings, &planner))
            .map_err(|e| ConfigError::router("policy", e))?;
        let (tokens, token_origin) = Tokens::resolve(s.admin_token.clone(), s.read_token.clone())
            .map_err(|e| ConfigError::router("admin_token", e))?;
        let directory = directory_setup(s)?;
        let tenants = super::tenants::validate(&s.tenants, &s.api_keys)?;
        Ok(Self {
            addr: SocketAddr::new(s.host, s.port),
            policy: s.policy.clone(),
            health_interval: millis("health_interval_ms", s.health_interval_ms)?,
            health_timeout: millis("health_timeout_ms", s.health_timeout_ms)?,
            health_failure_threshold: s.health_failure_threshold,
            connect_timeout: millis("connect_timeout_ms", s.connect_timeout_ms)?,
            request_timeout: Duration::from_secs(s.request_timeout_s.max(1)),
            stream_idle_timeout: Duration::from_secs(s.stream_idle_timeout_s.max(1)),
            admission: admission_settings(s)?,
            worker_warmup: Duration::from_secs(s.worker_warmup_s),
            request_limits: RequestLimits {
                max_choices: s.max_choices.max(1),
                max_completion_tokens: s.max_completion_tokens.max(1),
            },
            conn_limits: conn_limits(s),
            body: body_settings(s),
            rate_limit: (s.rate_limit_per_s > 0.0).then_some(RateLimit {
                per_s: s.rate_limit_per_s,
                burst: s.rate_limit_burst,
            }),
            prompt_cache_bytes: s.prompt_cache_mb.saturating_mul(1 << 20),
            prompt_flights: prompt_flights(s)?,
            tokenizers: load_tokenizers(s)?,
            workers,
            baseline_settings,
            kv_index: KvIndexConfig {
                block_size: s.kv_block_size.unwrap_or(DEFAULT_KV_BLOCK_SIZE),
                max_blocks: s.kv_index_max_blocks.max(1024),
            },
            kv_block_size: s.kv_block_size,
            api_keys: api_keys(s, &tenants.keys)?,
            key_tenants: key_tenants(s, &tenants),
            tenants: tenants.tenants,
            metrics_public: s.metrics_public,
            engine_authorization: engine_authorization(s)?,
            kv_approx_ttl: Duration::from_secs(s.kv_approx_ttl_s.max(1)),
            scrape_interval: (s.scrape_interval_ms > 0)
                .then(|| Duration::from_millis(s.scrape_interval_ms)),
            busy_poll: Duration::from_micros(s.busy_poll_us.min(1_000_000)),
            kv_fanout: s.kv_redis_url.clone().map(|url| {
                (
                    FanoutConfig {
                        url,
                        prefix: s.kv_redis_stream_prefix.clone(),
                        maxlen: s.kv_redis_maxlen.max(1000),
                    },
                    s.kv_redis_role,
                )
            }),
            kv_peers: kv_peers(s)?,
            tokens,
            token_origin,
            directory,
            worker_lease_ttl: Duration::from_millis(s.worker_lease_ttl_ms),
            ownership_flush: Duration::from_millis(s.ownership_flush_ms.max(5)),
            ownership_claim_timeout: Duration::from_millis(s.ownership_claim_timeout_ms),
            retention: Retention {
                artifact: Duration::from_secs(s.directory_artifact_retention_s),
                session: Duration::from_secs(s.directory_session_retention_s),
            },
            planner,
            planner_time_scale: s.planner_time_scale,
            planner_calibrate: s.planner_calibrate,
            sessions: SessionSettings::of(s),
            discovery,
        })
    }
}

/// `[router.sessions]`, validated.
#[derive(Debug, Clone, Copy)]
pub struct SessionSettings {
    /// Idle-session leases from predicted tool-call gaps.
    pub lease: GapLease,
    /// Parked sessions' KV lifecycle on or off.
    pub lifecycle: bool,
    /// The gap assumed before any was seen.
    pub gap_prior: GapEstimate,
    /// A returning step is marked ahead of new prompts.
    pub return_priority: bool,
    /// A new session's first step waits for room in the fleet's KV, at most this long.
    pub admission: Option<std::time::Duration>,
    /// The share of the fleet's KV admission keeps for the live sessions' growth.
    pub admission_headroom: f64,
}

impl SessionSettings {
    fn of(s: &RouterSettings) -> Self {
        Self {
            lease: GapLease::new(
                s.session_lease_factor,
                s.session_lease_min_ms,
                s.session_lease_max_ms,
            ),
            lifecycle: s.session_lifecycle,
            gap_prior: GapEstimate::from_median_p90(
                s.session_gap_prior_median_s,
                s.session_gap_prior_p90_s,
            ),
            return_priority: s.session_return_priority,
            admission: s
                .session_admission
                .then(|| std::time::Duration::from_millis(s.session_admission_max_wait_ms)),
            admission_headroom: s.session_admission_headroom,
        }
    }
}

/// The discovery setup; with none, static workers are required.
fn discovery_setup(
    workers: &[WorkerSpec],
    kubernetes: &super::KubernetesSettings,
) -> Result<Option<super::DiscoverySetup>, ConfigError> {
    let discovery = kubernetes.validate()?;
    if workers.is_empty() && discovery.is_none() {
        return Err(ConfigError::invalid(
            "workers",
            "url",
            "no workers configured (list [[workers]], pass --worker, or discover them with [kubernetes])",
        ));
    }
    Ok(discovery)
}

/// The numeric and URL settings that have a valid range.
fn check_numbers(s: &RouterSettings) -> Result<(), ConfigError> {
    if let Some(url) = &s.kv_redis_url {
        redis_url_ok(url)?;
    }
    if s.kv_block_size.is_some_and(|b| !(1..=1024).contains(&b)) {
        return Err(ConfigError::router("kv_block_size", "must be in 1..=1024"));
    }
    if !(s.kv_overlap_weight >= 0.0 && s.kv_overlap_weight.is_finite()) {
        return Err(ConfigError::router(
            "kv_overlap_weight",
            "must be a non-negative number",
        ));
    }
    if !(s.kv_temperature >= 0.0 && s.kv_temperature.is_finite()) {
        return Err(ConfigError::router(
            "kv_temperature",
            "must be a non-negative number",
        ));
    }
    if !(s.planner_time_scale > 0.0 && s.planner_time_scale.is_finite()) {
        return Err(ConfigError::router(
            "planner_time_scale",
            "must be positive",
        ));
    }
    check_sessions(s)?;
    if s.worker_lease_ttl_ms < 300 {
        return Err(ConfigError::router(
            "worker_lease_ttl_ms",
            "must be at least 300",
        ));
    }
    if s.max_body_bytes < 1024 {
        return Err(ConfigError::router(
            "max_body_bytes",
            "must be at least 1024",
        ));
    }
    if s.max_inflight_body_mb.saturating_mul(1 << 20) < s.max_body_bytes {
        return Err(ConfigError::router(
            "max_inflight_body_mb",
            "must hold at least one body of max_body_bytes",
        ));
    }
    if !(s.rate_limit_per_s.is_finite() && s.rate_limit_per_s >= 0.0) {
        return Err(ConfigError::router(
            "rate_limit_per_s",
            "must be a finite number, 0 or more",
        ));
    }
    if !(s.rate_limit_burst.is_finite() && s.rate_limit_burst >= 1.0) {
        return Err(ConfigError::router(
            "rate_limit_burst",
            "must be a finite number, 1 or more",
        ));
    }
    if s.health_failure_threshold == 0 {
        return Err(ConfigError::router(
            "health_failure_threshold",
            "must be at least 1",
        ));
    }
    Ok(())
}

/// `[router.sessions]`'s numbers.
fn check_sessions(s: &RouterSettings) -> Result<(), ConfigError> {
    if !(s.session_lease_factor > 0.0 && s.session_lease_factor.is_finite()) {
        return Err(ConfigError::router(
            "session_lease_factor",
            "must be positive",
        ));
    }
    let headroom = s.session_admission_headroom;
    if !(0.0..=ownerserve_planner::lifecycle::admission::MAX_HEADROOM).contains(&headroom) {
        return Err(ConfigError::router(
            "sessions.admission_headroom",
            "must be a share from 0 to 0.9",
        ));
    }
    let (median, p90) = (s.session_gap_prior_median_s, s.session_gap_prior_p90_s);
    if !(median > 0.0 && median.is_finite() && p90 >= median && p90.is_finite()) {
        return Err(ConfigError::router(
            "session_gap_prior_median_s",
            "must be positive, and session_gap_prior_p90_s at least as long",
        ));
    }
    if s.session_lease_min_ms == 0 || s.session_lease_max_ms < s.session_lease_min_ms {
        return Err(ConfigError::router(
            "session_lease_min_ms",
            "must be positive and at most session_lease_max_ms",
        ));
    }
    Ok(())
}

/// Worker names are unique and block sizes in range.
fn check_workers(workers: &[WorkerSpec]) -> Result<(), ConfigError> {
    let mut names = std::collections::HashSet::new();
    for w in workers {
        if !names.insert(&w.name) {
            return Err(ConfigError::invalid(
                "workers",
                "name",
                format!("`{}` is used twice", w.name),
            ));
        }
        if w.kv_block_size.is_some_and(|b| !(1..=1024).contains(&b)) {
            return Err(ConfigError::invalid(
                "workers",
                format!("{}.kv_block_size", w.name),
                "must be in 1..=1024",
            ));
        }
        if w.health_path.as_ref().is_some_and(|p| !p.starts_with('/')) {
            return Err(ConfigError::invalid(
                "workers",
                format!("{}.health_path", w.name),
                "must start with /",
            ));
        }
        for (key, v) in [
            ("kv_capacity_tokens", w.kv_capacity_tokens),
            ("max_num_batched_tokens", w.max_num_batched_tokens),
        ] {
            if v == Some(0) {
                return Err(ConfigError::invalid(
                    "workers",
                    format!("{}.{key}", w.name),
                    "must be positive",
                ));
            }
        }
    }
    Ok(())
}

/// `Authorization: Bearer <engine_api_key>`, if there is a key.
fn engine_authorization(
    s: &RouterSettings,
) -> Result<Option<axum::http::HeaderValue>, ConfigError> {
    let Some(key) = &s.engine_api_key else {
        return Ok(None);
    };
    let mut v = axum::http::HeaderValue::from_str(&format!("Bearer {key}"))
        .map_err(|_| ConfigError::router("engine_api_key", "must be printable ASCII"))?;
    v.set_sensitive(true);
    Ok(Some(v))
}

/// Per-model admission: slots, queue, and each class's deadline and share.
fn admission_settings(
    s: &RouterSettings,
) -> Result<crate::proxy::admission::AdmissionSettings, ConfigError> {
    Ok(crate::proxy::admission::AdmissionSettings {
        max_inflight_per_worker: s.max_inflight_per_worker.max(1),
        max_queued_per_model: s.max_queued_per_model,
        classes: s
            .admission_classes
            .resolve(
                Duration::from_millis(s.queue_timeout_ms),
                s.admission_default_class,
            )
            .map_err(|why| ConfigError::invalid("router", "admission.classes", why))?,
    })
}

/// `kv.peers`, each a checked `http://host:port`.
fn kv_peers(s: &RouterSettings) -> Result<Vec<String>, ConfigError> {
    s.kv_peers
        .iter()
        .map(|u| worker_url(u).map_err(|e| ConfigError::router("kv.peers", e)))
        .collect()
}

/// Each client key's tenant, in `api_keys`' order: the plain keys have none.
fn key_tenants(s: &RouterSettings, tenants: &super::Tenants) -> Vec<Option<usize>> {
    s.api_keys
        .iter()
        .map(|_| None)
        .chain(tenants.of_key.iter().map(|t| Some(*t)))
        .collect()
}

/// The client API's keys, checked: each printable and at least 8 characters; the tenants'
/// (checked by `tenants::validate`) after them.
fn api_keys(
    s: &RouterSettings,
    tenant_keys: &[String],
) -> Result<Option<ownerserve_edge::api_keys::ApiKeys>, ConfigError> {
    if let Some(bad) = s.api_keys.iter().find(|k| !super::tenants::key_is_valid(k)) {
        let shown: String = bad.chars().take(3).collect();
        return Err(ConfigError::router(
            "api_keys",
            format!("the key starting `{shown}` must be at least 8 printable characters, without spaces"),
        ));
    }
    let all: Vec<String> = s.api_keys.iter().chain(tenant_keys).cloned().collect();
    Ok(ownerserve_edge::api_keys::ApiKeys::new(&all))
}

fn redis_url_ok(url: &str) -> Result<(), ConfigError> {
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err(ConfigError::router(
            "kv_redis_url",
            format!("`{url}` must start with redis://"),
        ));
    }
    Ok(())
}
