//! Configuration: one TOML file, overridden by `OWNERSERVE_*` environment variables, then by
//! command-line flags; validated into [`RouterConfig`] before any socket opens. Every key is
//! documented in `configs/README.md`.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::{Origin, Tokens};
use crate::logging::LogFormat;
use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::ids::{EngineKind, Role, WorkerId};
use ownerserve_planner::kv_index::KvIndexConfig;
use ownerserve_planner::plan::{ClassThresholds, Link, Links, Weights};
use ownerserve_planner::policy::{
    self, BusyThresholds, KvAwareConfig, OwnerServeConfig, PolicySettings,
};
use ownerserve_planner::roofline::{Efficiency, Roofline};
use ownerserve_planner::spec::{GpuSpec, ModelSpec};
use ownerserve_shim::kv_events::redis_fanout::FanoutConfig;
use ownerserve_shim::sim::config::{load, SimSettings};

mod error;

pub use error::ConfigError;

/// The `[router]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSettings {
    /// Runtime threads. 1 (the default) runs every task on one thread, as linkerd2-proxy
    /// does by default: no cross-thread wake-ups on the request path, the lowest latency;
    /// long prompts are tokenized on the blocking pool either way. N > 1: a work-stealing
    /// pool of N threads; 0: one per core.
    pub worker_threads: usize,
    pub host: IpAddr,
    pub port: u16,
    pub policy: String,
    pub health_interval_ms: u64,
    pub health_timeout_ms: u64,
    pub health_failure_threshold: u32,
    pub connect_timeout_ms: u64,
    pub request_timeout_s: u64,
    pub max_body_bytes: usize,
    /// Each session's last prompt (tokens and block hashes) is kept, within this many MiB
    /// in all, so its next step hashes only the blocks it adds (0: keep none).
    pub prompt_cache_mb: usize,
    /// Tokens per KV block of the router's index (must match the engines').
    pub kv_block_size: usize,
    /// Most blocks the KV index keeps before pruning.
    pub kv_index_max_blocks: usize,
    /// Lifetime of approximate entries for workers without KV events.
    pub kv_approx_ttl_s: u64,
    /// kv_aware: weight of prefill work against decode blocks.
    pub kv_overlap_weight: f64,
    /// kv_aware: 0 = argmin, > 0 = softmax sampling.
    pub kv_temperature: f64,
    /// Busy when the engine reports this many queued requests.
    pub busy_max_waiting: Option<f64>,
    /// Busy when the engine reports this KV usage (0..1).
    pub busy_max_kv_usage: Option<f64>,
    /// Busy when the router has this many prompt tokens in flight there, not yet prefilled.
    pub busy_max_active_prefill_tokens: Option<u64>,
    /// session_affinity: how long an idle session stays pinned.
    pub session_ttl_s: u64,
    /// How often each worker's `/metrics` is scraped (0: never).
    pub scrape_interval_ms: u64,
    /// Redis URL for sharing KV events between router replicas (unset: each router
    /// subscribes to the engines itself).
    pub kv_redis_url: Option<String>,
    /// `publish`: this replica subscribes to the engines and appends to the streams;
    /// `consume`: it only follows the streams. Every replica follows them.
    pub kv_redis_role: FanoutRole,
    /// Stream key prefix; a worker's stream is `<prefix>:<worker name>`.
    pub kv_redis_stream_prefix: String,
    /// Approximate length the streams are trimmed to.
    pub kv_redis_maxlen: usize,
    /// Bearer token with the admin scope for `/admin/v1`; generated and printed if unset.
    pub admin_token: Option<String>,
    /// Bearer token that may only read `/admin/v1`.
    pub read_token: Option<String>,
    /// The ownership directory: `off`, `embedded` (a single node in this process) or
    /// `remote` (a cluster of `ownerserve directory` nodes at `directory_urls`).
    pub directory: DirectoryMode,
    /// Where the embedded node keeps its log and snapshot (default: a per-process folder
    /// under the system temp dir, so nothing persists unless you set it).
    pub directory_data_dir: Option<std::path::PathBuf>,
    /// `http://host:port` of each directory node, for `remote`.
    pub directory_urls: Vec<String>,
    /// TTL of each worker's directory lease; renewed every third of it while healthy.
    pub worker_lease_ttl_ms: u64,
    /// How often routed requests' ownership records are committed (one batch each time).
    pub ownership_flush_ms: u64,
    /// The cost planner's model: a preset name or a `.toml` preset file.
    pub planner_model: String,
    /// The cost planner's GPU per worker: a preset name or a `.toml` preset file.
    pub planner_gpu: String,
    /// GPUs per worker (tensor parallel).
    pub planner_gpus: u32,
    /// Worker-to-worker KV transfer bandwidth, GB/s (unset: the GPU preset's link).
    pub planner_link_gbs: Option<f64>,
    /// Latency of one KV transfer, microseconds.
    pub planner_link_latency_us: f64,
    /// λ: seconds charged per GB of HBM a plan duplicates.
    pub planner_lambda_s_per_gb: f64,
    /// μ: seconds charged per second a prefill stalls one running decode.
    pub planner_mu: f64,
    /// Simulated seconds per wall-clock second of the workers (sim fleets run faster than
    /// real time); observed prefill times are scaled by it before calibrating the planner.
    pub planner_time_scale: f64,
    /// Whether observed prefill times calibrate the planner (off for instant sim fleets,
    /// whose prefills take no time at all).
    pub planner_calibrate: bool,
    /// Links that differ from the default, per ordered worker pair.
    pub planner_links: Vec<LinkSettings>,
    /// An idle session's lease is `factor` × its predicted tool-call gap ...
    pub session_lease_factor: f64,
    /// ... but at least this long ...
    pub session_lease_min_ms: u64,
    /// ... and at most this long (also the lease before any gap was seen).
    pub session_lease_max_ms: u64,
    /// Log lines as `text` or `json` (overridden by `--log-format` / `OWNERSERVE_LOG_FORMAT`).
    pub log_format: LogFormat,
}

/// One `[[router.planner_links]]` entry: the link from one worker to another.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSettings {
    /// Worker name the KV leaves from.
    pub from: String,
    /// Worker name the KV goes to.
    pub to: String,
    /// Bandwidth, GB/s.
    pub gbs: f64,
    /// Latency of one transfer, microseconds.
    #[serde(default)]
    pub latency_us: f64,
}

/// Where the router's ownership directory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectoryMode {
    Off,
    Embedded,
    Remote,
}

/// This replica's part in the Redis fan-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FanoutRole {
    Publish,
    Consume,
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            worker_threads: 1,
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8080,
            policy: "round_robin".to_owned(),
            health_interval_ms: 1000,
            health_timeout_ms: 1000,
            health_failure_threshold: 2,
            connect_timeout_ms: 1000,
            request_timeout_s: 600,
            max_body_bytes: 32 * 1024 * 1024,
            prompt_cache_mb: 256,
            kv_block_size: 16,
            kv_index_max_blocks: 1 << 20,
            kv_approx_ttl_s: 120,
            kv_overlap_weight: 1.0,
            kv_temperature: 0.0,
            busy_max_waiting: None,
            busy_max_kv_usage: None,
            busy_max_active_prefill_tokens: None,
            session_ttl_s: 1800,
            scrape_interval_ms: 500,
            kv_redis_url: None,
            kv_redis_role: FanoutRole::Publish,
            kv_redis_stream_prefix: "ownerserve:kv".to_owned(),
            kv_redis_maxlen: 100_000,
            admin_token: None,
            read_token: None,
            directory: DirectoryMode::Off,
            directory_data_dir: None,
            directory_urls: Vec::new(),
            worker_lease_ttl_ms: 10_000,
            ownership_flush_ms: 50,
            planner_model: "llama-3.1-8b".to_owned(),
            planner_gpu: "h100".to_owned(),
            planner_gpus: 1,
            planner_link_gbs: None,
            planner_link_latency_us: 20.0,
            planner_lambda_s_per_gb: Weights::default().lambda_s_per_gb,
            planner_mu: Weights::default().mu,
            planner_time_scale: 1.0,
            planner_calibrate: true,
            planner_links: Vec::new(),
            session_lease_factor: 2.0,
            session_lease_min_ms: 5_000,
            session_lease_max_ms: 600_000,
            log_format: LogFormat::Text,
        }
    }
}

/// One `[[workers]]` entry of a router config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// Defaults to `<role>-<index>`.
    #[serde(default)]
    pub name: Option<String>,
    pub url: String,
    pub role: Role,
    #[serde(default = "default_engine")]
    pub engine: EngineKind,
    /// ZMQ endpoint of the worker's KV-event publisher; without it the router keeps an
    /// approximate index from its own routing decisions.
    #[serde(default)]
    pub kv_events: Option<String>,
    /// ZMQ ROUTER endpoint for replaying missed event batches.
    #[serde(default)]
    pub kv_replay: Option<String>,
    /// The worker's GPU preset (or `.toml` file) when it differs from `planner_gpu`.
    #[serde(default)]
    pub gpu: Option<String>,
    /// GPUs of this worker when they differ from `planner_gpus`.
    #[serde(default)]
    pub gpus: Option<u32>,
    /// SGLang prefill workers: the `disaggregation_bootstrap_port` (from `/server_info`).
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
}

fn default_engine() -> EngineKind {
    EngineKind::Vllm
}

/// One `[[fleet]]` entry of `up.toml`: `count` simulated workers of one role.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetGroup {
    pub role: Role,
    #[serde(default = "one")]
    pub count: u32,
    /// GPU preset of this group's workers, when it differs from `[sim] gpu`.
    #[serde(default)]
    pub gpu: Option<String>,
}

fn one() -> u32 {
    1
}

/// A router config file (`ownerserve router --config`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterFile {
    pub router: RouterSettings,
    pub workers: Vec<WorkerSettings>,
}

/// The `up.toml` file: a router plus a fleet of simulated workers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpFile {
    #[serde(default)]
    pub router: RouterSettings,
    #[serde(default)]
    pub sim: SimSettings,
    pub fleet: Vec<FleetGroup>,
}

/// The embedded default for `ownerserve up`: `configs/up.toml` as built.
pub const DEFAULT_UP_TOML: &str = include_str!("../../../configs/up.toml");

/// Reads a TOML file into `T`, naming the file in every error.
pub fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Flags (or their `OWNERSERVE_*` variables) that override the `[router]` table.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RouterOverrides {
    /// Address the router listens on.
    #[arg(long, env = "OWNERSERVE_HOST")]
    pub host: Option<IpAddr>,
    /// Port the router listens on (0 picks a free one).
    #[arg(long, env = "OWNERSERVE_PORT")]
    pub port: Option<u16>,
    /// Routing policy: round_robin, least_loaded, kv_aware, session_affinity.
    #[arg(long, env = "OWNERSERVE_POLICY")]
    pub policy: Option<String>,
    /// Admin bearer token for /admin/v1 (generated and printed when none is set).
    #[arg(long, env = "OWNERSERVE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Read-only bearer token for /admin/v1.
    #[arg(long, env = "OWNERSERVE_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
    /// Runtime threads: 1 = one thread (lowest latency), N = a pool of N, 0 = one per core.
    #[arg(long, env = "OWNERSERVE_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
}

impl RouterOverrides {
    /// Applies the overrides that are set.
    pub fn apply(&self, s: &mut RouterSettings) {
        if let Some(h) = self.host {
            s.host = h;
        }
        if let Some(p) = self.port {
            s.port = p;
        }
        if let Some(p) = &self.policy {
            s.policy.clone_from(p);
        }
        if self.admin_token.is_some() {
            s.admin_token.clone_from(&self.admin_token);
        }
        if self.read_token.is_some() {
            s.read_token.clone_from(&self.read_token);
        }
        if let Some(n) = self.worker_threads {
            s.worker_threads = n;
        }
    }
}

/// A worker as the router runs with it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    pub name: String,
    /// `http://host:port`, without a trailing slash.
    pub base_url: String,
    pub role: Role,
    pub engine: EngineKind,
    pub kv_events: Option<String>,
    pub kv_replay: Option<String>,
    /// GPU preset when it differs from the planner's default.
    pub gpu: Option<String>,
    pub gpus: Option<u32>,
    /// SGLang bootstrap port of a prefill worker.
    pub bootstrap_port: Option<u16>,
}

impl WorkerSpec {
    /// A worker with the planner's default GPU and no event sockets.
    pub fn new(name: &str, base_url: &str, role: Role, engine: EngineKind) -> Self {
        Self {
            name: name.to_owned(),
            base_url: base_url.to_owned(),
            role,
            engine,
            kv_events: None,
            kv_replay: None,
            gpu: None,
            gpus: None,
            bootstrap_port: None,
        }
    }

    /// `(host, port)` of its base URL.
    pub fn host_port(&self) -> Option<(String, u16)> {
        let rest = self.base_url.split_once("://")?.1;
        let (host, port) = rest.rsplit_once(':')?;
        Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
    }
}

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
    pub max_body_bytes: usize,
    pub prompt_cache_bytes: usize,
    pub workers: Vec<WorkerSpec>,
    pub policy_settings: PolicySettings,
    pub kv_index: KvIndexConfig,
    pub kv_approx_ttl: Duration,
    pub scrape_interval: Option<Duration>,
    pub kv_fanout: Option<(FanoutConfig, FanoutRole)>,
    pub tokens: Tokens,
    /// Whether the admin token was generated (and must be printed).
    pub token_origin: Origin,
    pub directory: DirectorySetup,
    pub worker_lease_ttl: Duration,
    pub ownership_flush: Duration,
    /// What the cost planner prices plans with (also in `policy_settings.ownerserve`).
    pub planner: OwnerServeConfig,
    /// Converts observed wall-clock prefill times into the workers' (simulated) time.
    pub planner_time_scale: f64,
    pub planner_calibrate: bool,
    /// Idle-session leases from predicted tool-call gaps.
    pub session_lease: GapLease,
}

/// Builds the cost planner's figures for `workers` (indexed as the registry numbers them).
fn planner_setup(
    s: &RouterSettings,
    workers: &[WorkerSpec],
) -> Result<OwnerServeConfig, ConfigError> {
    let model = load(&s.planner_model, ModelSpec::preset, ModelSpec::from_toml)
        .map_err(|e| ConfigError::router("planner_model", e))?;
    let gpu = load(&s.planner_gpu, GpuSpec::preset, GpuSpec::from_toml)
        .map_err(|e| ConfigError::router("planner_gpu", e))?;
    let link_gbs = s.planner_link_gbs.unwrap_or(gpu.link_gbs);
    if !(link_gbs > 0.0 && link_gbs.is_finite()) {
        return Err(ConfigError::router("planner_link_gbs", "must be positive"));
    }
    let weights = Weights {
        lambda_s_per_gb: s.planner_lambda_s_per_gb,
        mu: s.planner_mu,
    };
    for (field, v) in [
        ("planner_link_latency_us", s.planner_link_latency_us),
        ("planner_lambda_s_per_gb", weights.lambda_s_per_gb),
        ("planner_mu", weights.mu),
    ] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(ConfigError::router(field, "must be zero or positive"));
        }
    }
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
    let mut rooflines = std::collections::BTreeMap::new();
    for (i, w) in workers.iter().enumerate() {
        if w.gpu.is_none() && w.gpus.is_none() {
            continue;
        }
        let g = match &w.gpu {
            Some(name) => load(name, GpuSpec::preset, GpuSpec::from_toml)
                .map_err(|e| ConfigError::invalid("workers", format!("{}.gpu", w.name), e))?,
            None => gpu.clone(),
        };
        let n = w.gpus.unwrap_or(s.planner_gpus).max(1);
        rooflines.insert(
            WorkerId(i as u32),
            Roofline::new(&g, n, Efficiency::default()),
        );
    }
    Ok(OwnerServeConfig {
        roofline: Roofline::new(&gpu, s.planner_gpus.max(1), Efficiency::default()),
        rooflines,
        model,
        links: Links {
            default: Link {
                bytes_per_s: link_gbs * 1e9,
                latency_s: s.planner_link_latency_us / 1e6,
            },
            pairs,
        },
        weights,
        thresholds: ClassThresholds::default(),
    })
}

/// The validated directory choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectorySetup {
    Off,
    Embedded { data_dir: std::path::PathBuf },
    Remote { urls: Vec<String> },
}

fn millis(field: &str, v: u64) -> Result<Duration, ConfigError> {
    if v == 0 {
        return Err(ConfigError::router(field, "must be positive"));
    }
    Ok(Duration::from_millis(v))
}

impl RouterConfig {
    /// Prints the admin token if it was generated (the only way to learn it).
    pub fn announce_token(&self) {
        if self.token_origin == Origin::Generated {
            crate::process::say(&format!(
                "admin token (for /admin/v1, `Authorization: Bearer ...`): {}",
                self.tokens.admin()
            ));
        }
    }

    /// Validates settings and a worker list into a config.
    pub fn validate(s: &RouterSettings, workers: Vec<WorkerSpec>) -> Result<Self, ConfigError> {
        if let Some(url) = &s.kv_redis_url {
            redis_url_ok(url)?;
        }
        if !(1..=1024).contains(&s.kv_block_size) {
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
        if workers.is_empty() {
            return Err(ConfigError::invalid(
                "workers",
                "url",
                "no workers configured",
            ));
        }
        let planner = planner_setup(s, &workers)?;
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
        let policy_settings = PolicySettings {
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
            ownerserve: Some(planner.clone()),
            ..PolicySettings::default()
        };
        policy::by_name(&s.policy, &policy_settings)
            .map_err(|e| ConfigError::router("policy", e))?;
        let (tokens, token_origin) = Tokens::resolve(s.admin_token.clone(), s.read_token.clone())
            .map_err(|e| ConfigError::router("admin_token", e))?;
        let directory = match s.directory {
            DirectoryMode::Off => DirectorySetup::Off,
            DirectoryMode::Embedded => DirectorySetup::Embedded {
                data_dir: s.directory_data_dir.clone().unwrap_or_else(|| {
                    std::env::temp_dir()
                        .join(format!("ownerserve-directory-{}", std::process::id()))
                }),
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
                DirectorySetup::Remote { urls }
            }
        };
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
        if s.health_failure_threshold == 0 {
            return Err(ConfigError::router(
                "health_failure_threshold",
                "must be at least 1",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for w in &workers {
            if !names.insert(&w.name) {
                return Err(ConfigError::invalid(
                    "workers",
                    "name",
                    format!("`{}` is used twice", w.name),
                ));
            }
        }
        Ok(Self {
            addr: SocketAddr::new(s.host, s.port),
            policy: s.policy.clone(),
            health_interval: millis("health_interval_ms", s.health_interval_ms)?,
            health_timeout: millis("health_timeout_ms", s.health_timeout_ms)?,
            health_failure_threshold: s.health_failure_threshold,
            connect_timeout: millis("connect_timeout_ms", s.connect_timeout_ms)?,
            request_timeout: Duration::from_secs(s.request_timeout_s.max(1)),
            max_body_bytes: s.max_body_bytes,
            prompt_cache_bytes: s.prompt_cache_mb.saturating_mul(1 << 20),
            workers,
            policy_settings,
            kv_index: KvIndexConfig {
                block_size: s.kv_block_size,
                max_blocks: s.kv_index_max_blocks.max(1024),
                ..KvIndexConfig::default()
            },
            kv_approx_ttl: Duration::from_secs(s.kv_approx_ttl_s.max(1)),
            scrape_interval: (s.scrape_interval_ms > 0)
                .then(|| Duration::from_millis(s.scrape_interval_ms)),
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
            planner,
            planner_time_scale: s.planner_time_scale,
            planner_calibrate: s.planner_calibrate,
            session_lease: GapLease::new(
                s.session_lease_factor,
                s.session_lease_min_ms,
                s.session_lease_max_ms,
            ),
        })
    }
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

/// Checks a worker URL (`http://host:port`, no path) and strips a trailing slash; the
/// error says what is wrong with it (the caller names the key).
pub fn worker_url(url: &str) -> Result<String, String> {
    let trimmed = url.trim_end_matches('/');
    let uri: http::Uri = trimmed
        .parse()
        .map_err(|e| format!("invalid url `{url}`: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "url `{url}` must look like http://host:port (https is not supported)"
        ));
    }
    if !matches!(uri.path(), "" | "/") {
        return Err(format!("url `{url}` must not have a path"));
    }
    Ok(trimmed.to_owned())
}

/// Parses `--worker URL[,role=R][,engine=E][,name=N][,gpu=G][,gpus=N][,bootstrap_port=P]`.
pub fn parse_worker_flag(flag: &str) -> Result<WorkerSettings, ConfigError> {
    let bad = |reason: String| ConfigError::WorkerFlag {
        flag: flag.to_owned(),
        reason,
    };
    let mut parts = flag.split(',');
    let url = parts.next().unwrap_or_default().to_owned();
    let mut w = WorkerSettings {
        name: None,
        url,
        role: Role::Hybrid,
        engine: default_engine(),
        kv_events: None,
        kv_replay: None,
        gpu: None,
        gpus: None,
        bootstrap_port: None,
    };
    for kv in parts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad(format!("expected key=value, got `{kv}`")))?;
        match k {
            "role" => w.role = v.parse().map_err(|e| bad(format!("{e}")))?,
            "engine" => w.engine = v.parse().map_err(|e| bad(format!("{e}")))?,
            "name" => w.name = Some(v.to_owned()),
            "kv_events" => w.kv_events = Some(v.to_owned()),
            "kv_replay" => w.kv_replay = Some(v.to_owned()),
            "gpu" => w.gpu = Some(v.to_owned()),
            "gpus" => w.gpus = Some(v.parse().map_err(|e| bad(format!("gpus: {e}")))?),
            "bootstrap_port" => {
                w.bootstrap_port = Some(v.parse().map_err(|e| bad(format!("bootstrap_port: {e}")))?)
            }
            _ => return Err(bad(format!(
                "unknown key `{k}` (role, engine, name, kv_events, kv_replay, gpu, gpus, bootstrap_port)"
            ))),
        }
    }
    Ok(w)
}

/// A configured worker's checked URL; the error names the worker.
fn url(w: &WorkerSettings, name: &str) -> Result<String, ConfigError> {
    worker_url(&w.url).map_err(|e| ConfigError::invalid("workers", format!("{name}.url"), e))
}

/// Turns configured workers into specs, naming unnamed ones `<role>-<n>`.
pub fn worker_specs(workers: &[WorkerSettings]) -> Result<Vec<WorkerSpec>, ConfigError> {
    let mut counts = std::collections::HashMap::new();
    workers
        .iter()
        .map(|w| {
            let n = counts.entry(w.role).or_insert(0u32);
            let name = w
                .name
                .clone()
                .unwrap_or_else(|| format!("{}-{}", w.role.as_str(), n));
            *n += 1;
            Ok(WorkerSpec {
                kv_events: w.kv_events.clone(),
                kv_replay: w.kv_replay.clone(),
                gpu: w.gpu.clone(),
                gpus: w.gpus,
                bootstrap_port: w.bootstrap_port,
                ..WorkerSpec::new(&name, &url(w, &name)?, w.role, w.engine)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_up_config_parses_and_validates() {
        let up: UpFile = toml::from_str(DEFAULT_UP_TOML).unwrap();
        assert!(up.fleet.iter().map(|g| g.count).sum::<u32>() >= 3);
        up.sim.build().unwrap();
        RouterConfig::validate(
            &up.router,
            vec![WorkerSpec::new(
                "a",
                "http://127.0.0.1:1",
                Role::Decode,
                EngineKind::Sim,
            )],
        )
        .unwrap();
    }

    #[test]
    fn the_example_router_config_parses() {
        let file: RouterFile =
            toml::from_str(include_str!("../../../configs/router.example.toml")).unwrap();
        let specs = worker_specs(&file.workers).unwrap();
        RouterConfig::validate(&file.router, specs).unwrap();
    }

    #[test]
    fn worker_flags_parse_and_bad_ones_are_named() {
        let w =
            parse_worker_flag("http://10.0.0.1:8000/,role=decode,engine=sglang,name=d1").unwrap();
        assert_eq!(w.role, Role::Decode);
        assert_eq!(w.engine, EngineKind::Sglang);
        let specs = worker_specs(&[w]).unwrap();
        assert_eq!(specs[0].base_url, "http://10.0.0.1:8000");
        assert!(parse_worker_flag("http://x:1,role=chef").is_err());
        assert!(worker_specs(&[parse_worker_flag("ftp://x:1").unwrap()]).is_err());
        assert!(worker_specs(&[parse_worker_flag("http://x:1/v1").unwrap()]).is_err());
    }

    #[test]
    fn errors_name_the_section_and_key() {
        let bad = |s: RouterSettings| {
            let one = vec![WorkerSpec::new(
                "a",
                "http://127.0.0.1:1",
                Role::Decode,
                EngineKind::Sim,
            )];
            RouterConfig::validate(&s, one).unwrap_err().to_string()
        };
        let d = RouterSettings::default;
        assert_eq!(
            bad(RouterSettings {
                kv_block_size: 0,
                ..d()
            }),
            "router.kv_block_size: must be in 1..=1024"
        );
        assert_eq!(
            bad(RouterSettings {
                health_timeout_ms: 0,
                ..d()
            }),
            "router.health_timeout_ms: must be positive"
        );
        assert_eq!(
            bad(RouterSettings {
                kv_redis_url: Some("http://r".into()),
                ..d()
            }),
            "router.kv_redis_url: `http://r` must start with redis://"
        );
        assert!(bad(RouterSettings {
            planner_gpu: "abacus".into(),
            ..d()
        })
        .starts_with("router.planner_gpu: "));
        let flag = parse_worker_flag("http://x:1,rol=decode")
            .unwrap_err()
            .to_string();
        assert!(
            flag.starts_with("--worker `http://x:1,rol=decode`: unknown key `rol`"),
            "{flag}"
        );
        let named =
            worker_specs(&[parse_worker_flag("http://x:1/v1,name=d7").unwrap()]).unwrap_err();
        assert_eq!(
            named.to_string(),
            "workers.d7.url: url `http://x:1/v1` must not have a path"
        );
    }

    #[test]
    fn unknown_policy_and_keys_are_refused() {
        let s = RouterSettings {
            policy: "magic".into(),
            ..RouterSettings::default()
        };
        let one = vec![WorkerSpec::new(
            "a",
            "http://127.0.0.1:1",
            Role::Decode,
            EngineKind::Sim,
        )];
        let err = RouterConfig::validate(&s, one).unwrap_err().to_string();
        assert!(
            err.contains("magic") && err.contains("round_robin"),
            "{err}"
        );
        assert!(toml::from_str::<RouterFile>("[router]\nprot = 1").is_err());
    }

    #[test]
    fn overrides_win_over_the_file() {
        let mut s = RouterSettings::default();
        RouterOverrides {
            host: None,
            port: Some(9),
            policy: Some("least_loaded".into()),
            admin_token: Some("t".into()),
            read_token: None,
            worker_threads: Some(4),
        }
        .apply(&mut s);
        assert_eq!(s.admin_token.as_deref(), Some("t"));
        assert_eq!((s.port, s.policy.as_str()), (9, "least_loaded"));
        assert_eq!(s.worker_threads, 4);
    }
}
