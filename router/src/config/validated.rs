//! The validated router configuration: every `[router]` setting checked and turned into
//! the types the router runs with (durations, the planner's rooflines and links, the
//! directory choice), before any socket opens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ownerserve_ownership::node::secret::ClusterSecret;
use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::KvIndexConfig;
use ownerserve_planner::plan::{
    engine_default_chunk_tokens, ClassThresholds, Link, Links, StepBudget, Weights,
};
use ownerserve_planner::policy::{
    self, BusyThresholds, KvAwareConfig, OwnerServeConfig, PolicySettings,
};
use ownerserve_planner::roofline::{Efficiency, Roofline};
use ownerserve_planner::spec::{GpuSpec, ModelSpec};
use ownerserve_shim::hf_tokenizer::HfTokenizer;
use ownerserve_shim::kv_events::redis_fanout::FanoutConfig;
use ownerserve_shim::sim::config::load;

use super::{worker_url, ConfigError, DirectoryMode, FanoutRole, RouterSettings, WorkerSpec};
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
    pub admission: crate::admission::AdmissionSettings,
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
    /// (`crate::kv::resolve_block_size`).
    pub kv_index: KvIndexConfig,
    /// `/metrics` and `/metrics/targets` need no token.
    pub metrics_public: bool,
    /// Keys clients must present on `/v1` (`None`: open).
    pub api_keys: Option<ownerserve_edge::api_keys::ApiKeys>,
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
    pub tokens: Tokens,
    /// Whether the admin token was generated (and must be printed).
    pub token_origin: Origin,
    pub directory: DirectorySetup,
    pub worker_lease_ttl: Duration,
    pub ownership_flush: Duration,
    pub ownership_claim_timeout: Duration,
    /// What the cost planner prices plans with; startup refines it with what the engines
    /// report (`crate::step_budget::learn`).
    pub planner: OwnerServeConfig,
    /// Converts observed wall-clock prefill times into the workers' (simulated) time.
    pub planner_time_scale: f64,
    pub planner_calibrate: bool,
    /// Idle-session leases from predicted tool-call gaps.
    pub session_lease: GapLease,
    /// Workers discovered from the Kubernetes API (`None`: static workers only).
    pub discovery: Option<super::DiscoverySetup>,
}

/// The spec of each served model: every preset under its `served_name`, then
/// `router.models` (a preset name or a `.toml` file per served name) over them.
fn served_model_specs(
    s: &RouterSettings,
) -> Result<std::collections::BTreeMap<String, ModelSpec>, ConfigError> {
    let mut models: std::collections::BTreeMap<String, ModelSpec> = ModelSpec::presets()
        .map_err(|e| ConfigError::router("planner_model", e))?
        .into_iter()
        .map(|m| (m.served_name.clone(), m))
        .collect();
    for (served, spec) in &s.models {
        let m = load(spec, ModelSpec::preset, ModelSpec::from_toml)
            .map_err(|e| ConfigError::invalid("router", format!("models.{served}"), e))?;
        models.insert(served.clone(), m);
    }
    Ok(models)
}

/// The operator's per-pair links (`planner_links`), keyed by the registry's worker ids.
fn planner_link_pairs(
    s: &RouterSettings,
    workers: &[WorkerSpec],
) -> Result<std::collections::BTreeMap<(WorkerId, WorkerId), Link>, ConfigError> {
    let index = |name: &str| {
        workers
            .iter()
            .position(|w| w.name == name)
            .map(|i| WorkerId(i as u32))
            .ok_or_else(|| {
                ConfigError::router("planner_links", format!("no worker named `{name}`"))
            })
    };
    let mut pairs = std::collections::BTreeMap::new();
    for l in &s.planner_links {
        if !(l.gbs > 0.0 && l.gbs.is_finite() && l.latency_us >= 0.0 && l.latency_us.is_finite()) {
            return Err(ConfigError::router(
                "planner_links",
                format!(
                    "{} -> {}: gbs must be positive, latency_us >= 0",
                    l.from, l.to
                ),
            ));
        }
        let link = Link {
            bytes_per_s: l.gbs * 1e9,
            latency_s: l.latency_us / 1e6,
        };
        pairs.insert((index(&l.from)?, index(&l.to)?), link);
    }
    Ok(pairs)
}

/// Builds the cost planner's figures for `workers` (indexed as the registry numbers them).
fn planner_setup(
    s: &RouterSettings,
    workers: &[WorkerSpec],
) -> Result<OwnerServeConfig, ConfigError> {
    let model = load(&s.planner_model, ModelSpec::preset, ModelSpec::from_toml)
        .map_err(|e| ConfigError::router("planner_model", e))?;
    let models = served_model_specs(s)?;
    let gpu = load(&s.planner_gpu, GpuSpec::preset, GpuSpec::from_toml)
        .map_err(|e| ConfigError::router("planner_gpu", e))?;
    let link_gbs = s.planner_link_gbs.unwrap_or(gpu.link_gbs);
    if !(link_gbs > 0.0 && link_gbs.is_finite()) {
        return Err(ConfigError::router("planner_link_gbs", "must be positive"));
    }
    let weights = Weights {
        lambda_s_per_gb: s.planner_lambda_s_per_gb,
        mu: s.planner_mu,
        nu: s.planner_nu,
        kappa: s.planner_kappa,
        rho: s.planner_rho,
        migration_budget: s.planner_migration_budget,
        ..Weights::default()
    };
    for (field, v) in [
        ("planner_link_latency_us", s.planner_link_latency_us),
        ("planner_lambda_s_per_gb", weights.lambda_s_per_gb),
        ("planner_mu", weights.mu),
        ("planner_nu", weights.nu),
        ("planner_kappa", weights.kappa),
        ("planner_rho", weights.rho),
    ] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(ConfigError::router(field, "must be zero or positive"));
        }
    }
    let pairs = planner_link_pairs(s, workers)?;
    // `inf` is no budget; NaN and negative shares are refused.
    let b = s.planner_migration_budget;
    if b.is_nan() || b < 0.0 {
        return Err(ConfigError::router(
            "planner_migration_budget",
            "must be zero, positive or inf (no budget)",
        ));
    }
    if s.planner_max_num_batched_tokens == Some(0) {
        return Err(ConfigError::router(
            "planner_max_num_batched_tokens",
            "must be positive",
        ));
    }
    let step_budget = StepBudget {
        tokens: s
            .planner_max_num_batched_tokens
            .unwrap_or_else(|| engine_default_chunk_tokens(&gpu)),
        long_prefill_cap: s.planner_long_prefill_token_threshold.unwrap_or(0),
    };
    let (rooflines, worker_step_budgets) = worker_engines(s, &gpu, step_budget, workers)?;
    Ok(OwnerServeConfig {
        roofline: Roofline::new(&gpu, s.planner_gpus.max(1), Efficiency::default()),
        rooflines,
        step_budget,
        worker_step_budgets,
        model,
        models,
        links: Links {
            default: Link {
                bytes_per_s: link_gbs * 1e9,
                latency_s: s.planner_link_latency_us / 1e6,
            },
            pairs,
        },
        weights,
        thresholds: ClassThresholds::default(),
        // What restoring a host-cached prefix costs (workers whose engines report host
        // holds, medium CPU): the planner GPU preset's host link.
        pcie_bytes_per_s: gpu.pcie_gbs * 1e9,
        prefill_workers_decode: s.planner_prefill_workers_decode,
    })
}

/// Per worker, its roofline and its engine's step budget, where they differ from the
/// planner's defaults.
type WorkerEngines = (
    std::collections::BTreeMap<WorkerId, Roofline>,
    std::collections::BTreeMap<WorkerId, StepBudget>,
);

/// The workers whose rooflines (their `gpu`, `gpus`) or engine step budgets differ from
/// the planner's defaults (`default_budget`). A worker's budget is its own
/// `max_num_batched_tokens`, else the router's, else vLLM's default for its GPU; its
/// long-prefill cap its own `long_prefill_token_threshold`, else the router's.
fn worker_engines(
    s: &RouterSettings,
    gpu: &GpuSpec,
    default_budget: StepBudget,
    workers: &[WorkerSpec],
) -> Result<WorkerEngines, ConfigError> {
    let mut rooflines = std::collections::BTreeMap::new();
    let mut worker_step_budgets = std::collections::BTreeMap::new();
    for (i, w) in workers.iter().enumerate() {
        let g = match &w.gpu {
            Some(name) => Some(
                load(name, GpuSpec::preset, GpuSpec::from_toml)
                    .map_err(|e| ConfigError::invalid("workers", format!("{}.gpu", w.name), e))?,
            ),
            None => None,
        };
        let tokens = w
            .max_num_batched_tokens
            .or(s.planner_max_num_batched_tokens)
            .or_else(|| g.as_ref().map(engine_default_chunk_tokens))
            .unwrap_or(default_budget.tokens);
        let long_prefill_cap = w
            .long_prefill_token_threshold
            .unwrap_or(default_budget.long_prefill_cap);
        let budget = StepBudget {
            tokens,
            long_prefill_cap,
        };
        if budget != default_budget {
            worker_step_budgets.insert(WorkerId(i as u32), budget);
        }
        if g.is_none() && w.gpus.is_none() {
            continue;
        }
        let n = w.gpus.unwrap_or(s.planner_gpus).max(1);
        rooflines.insert(
            WorkerId(i as u32),
            Roofline::new(g.as_ref().unwrap_or(gpu), n, Efficiency::default()),
        );
    }
    Ok((rooflines, worker_step_budgets))
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

/// The validated directory choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectorySetup {
    Off,
    Embedded {
        data_dir: std::path::PathBuf,
        /// The per-process temp folder (no `directory_data_dir` set): removed at shutdown,
        /// since no later process would find it.
        ephemeral: bool,
    },
    Remote {
        urls: Vec<String>,
        secret: Option<ClusterSecret>,
    },
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
        Ok(Self {
            addr: SocketAddr::new(s.host, s.port),
            policy: s.policy.clone(),
            health_interval: millis("health_interval_ms", s.health_interval_ms)?,
            health_timeout: millis("health_timeout_ms", s.health_timeout_ms)?,
            health_failure_threshold: s.health_failure_threshold,
            connect_timeout: millis("connect_timeout_ms", s.connect_timeout_ms)?,
            request_timeout: Duration::from_secs(s.request_timeout_s.max(1)),
            stream_idle_timeout: Duration::from_secs(s.stream_idle_timeout_s.max(1)),
            admission: crate::admission::AdmissionSettings {
                max_inflight_per_worker: s.max_inflight_per_worker.max(1),
                max_queued_per_model: s.max_queued_per_model,
                queue_timeout: Duration::from_millis(s.queue_timeout_ms),
            },
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
            api_keys: api_keys(s)?,
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
            tokens,
            token_origin,
            directory,
            worker_lease_ttl: Duration::from_millis(s.worker_lease_ttl_ms),
            ownership_flush: Duration::from_millis(s.ownership_flush_ms.max(5)),
            ownership_claim_timeout: Duration::from_millis(s.ownership_claim_timeout_ms),
            planner,
            planner_time_scale: s.planner_time_scale,
            planner_calibrate: s.planner_calibrate,
            session_lease: GapLease::new(
                s.session_lease_factor,
                s.session_lease_min_ms,
                s.session_lease_max_ms,
            ),
            discovery,
        })
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
    if !(s.session_lease_factor > 0.0 && s.session_lease_factor.is_finite()) {
        return Err(ConfigError::router(
            "session_lease_factor",
            "must be positive",
        ));
    }
    if s.session_lease_min_ms == 0 || s.session_lease_max_ms < s.session_lease_min_ms {
        return Err(ConfigError::router(
            "session_lease_min_ms",
            "must be positive and at most session_lease_max_ms",
        ));
    }
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

/// `baseline`'s settings with the cost planner's `planner` beside them.
fn with_planner(baseline: &PolicySettings, planner: &OwnerServeConfig) -> PolicySettings {
    PolicySettings {
        ownerserve: Some(planner.clone()),
        ..baseline.clone()
    }
}

/// The settings of every policy but the cost planner (the `--policy` chosen reads its own).
fn baseline_settings(s: &RouterSettings) -> PolicySettings {
    PolicySettings {
        kv_aware: KvAwareConfig {
            overlap_weight: s.kv_overlap_weight,
            temperature: s.kv_temperature,
            busy: BusyThresholds {
                max_waiting: s.busy_max_waiting,
                max_kv_usage: s.busy_max_kv_usage,
                max_active_prefill_tokens: s.busy_max_active_prefill_tokens,
            },
        },
        session_ttl_ms: s.session_ttl_s.saturating_mul(1000),
        ..PolicySettings::default()
    }
}

/// How the router tokenizes one served model (other than with the built-in tokenizer).
#[derive(Debug, Clone)]
pub enum ModelTokenizer {
    /// The model's own `tokenizer.json` and chat template, loaded at startup.
    Own(Arc<HfTokenizer>),
    /// The engine's `POST /tokenize`, asked per request (for a template the router cannot
    /// render, or no local copy of the tokenizer).
    Engine,
}

/// Each `router.tokenizers` entry but `builtin`; a model directory is loaded now, so a
/// missing or broken tokenizer stops the router before it starts.
fn load_tokenizers(
    s: &RouterSettings,
) -> Result<std::collections::BTreeMap<String, ModelTokenizer>, ConfigError> {
    s.tokenizers
        .iter()
        .filter(|(_, v)| v.as_str() != "builtin")
        .map(|(model, value)| {
            if value == "engine" {
                return Ok((model.clone(), ModelTokenizer::Engine));
            }
            let key = format!("tokenizers.{model}");
            let tokenizer = HfTokenizer::from_dir(std::path::Path::new(value))
                .map_err(|e| ConfigError::invalid("router", key, with_causes(&e)))?;
            Ok((model.clone(), ModelTokenizer::Own(Arc::new(tokenizer))))
        })
        .collect()
}

/// An error and its causes on one line (`cannot read X: No such file or directory`).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
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

/// The client API's keys, checked: each printable and at least 8 characters.
fn api_keys(s: &RouterSettings) -> Result<Option<ownerserve_edge::api_keys::ApiKeys>, ConfigError> {
    if let Some(bad) = s
        .api_keys
        .iter()
        .find(|k| k.len() < 8 || !k.bytes().all(|b| b.is_ascii_graphic()))
    {
        let shown: String = bad.chars().take(3).collect();
        return Err(ConfigError::router(
            "api_keys",
            format!("the key starting `{shown}` must be at least 8 printable characters, without spaces"),
        ));
    }
    Ok(ownerserve_edge::api_keys::ApiKeys::new(&s.api_keys))
}

/// Where the directory lives: nowhere, in this process, or a remote cluster.
fn directory_setup(s: &RouterSettings) -> Result<DirectorySetup, ConfigError> {
    Ok(match s.directory {
        DirectoryMode::Off => DirectorySetup::Off,
        DirectoryMode::Embedded => DirectorySetup::Embedded {
            data_dir: s
                .directory_data_dir
                .clone()
                .unwrap_or_else(|| crate::scratch_dir::scratch_dir("directory")),
            ephemeral: s.directory_data_dir.is_none(),
        },
        DirectoryMode::Remote => {
            if s.directory_urls.is_empty() {
                return Err(ConfigError::router(
                    "directory_urls",
                    "directory = \"remote\" needs at least one url",
                ));
            }
            let urls = s
                .directory_urls
                .iter()
                .map(|u| worker_url(u).map_err(|e| ConfigError::router("directory_urls", e)))
                .collect::<Result<Vec<_>, _>>()?;
            let secret = match &s.directory_secret {
                Some(v) => Some(
                    ClusterSecret::new(v)
                        .map_err(|e| ConfigError::router("directory_secret", e))?,
                ),
                None => {
                    tracing::warn!("router.directory_secret is not set: the directory's nodes must run with --no-cluster-secret");
                    None
                }
            };
            DirectorySetup::Remote { urls, secret }
        }
    })
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
