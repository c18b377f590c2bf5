//! Configuration: one TOML file, overridden by `OWNERSERVE_*` environment variables, then by
//! command-line flags; validated into [`RouterConfig`] before any socket opens. Every key is
//! documented in `docs/CONFIG.md`.
//!
//! # Layout
//! - this file: the TOML tables as written ([`RouterSettings`], [`RouterFile`], [`UpFile`])
//!   and the flags that override them ([`RouterOverrides`]);
//! - `shape`: the sub-tables (`[router.limits]`, `[router.kv]`, ...) and the deprecated
//!   flat keys, rewritten into [`RouterSettings`]'s flat form as it is read; `policy`: the
//!   tagged `[router.policy]` ([`PolicyTable`]);
//! - `validated`: [`RouterConfig`], the settings checked into types that cannot hold
//!   bad values; `planner_setup`: the planner's figures; `directory`: the directory
//!   choice; `tokenizers`: each served model's tokenizer;
//! - `workers`: worker specs, `--worker` flags and worker URLs;
//! - `kubernetes`: the `[kubernetes]` table (worker discovery) and its flags;
//! - `error`: [`ConfigError`], which names the section and key at fault.

use std::net::IpAddr;
use std::path::Path;

use serde::Deserialize;

use crate::ops::logging::LogFormat;
use ownerserve_planner::ids::{EngineKind, Role};
use ownerserve_planner::plan::Weights;
use ownerserve_planner::policy::PrefillWorkersDecode;
use ownerserve_shim::sim::config::SimSettings;

mod directory;
mod error;
mod kubernetes;
mod planner_setup;
mod policy;
mod shape;
mod tenants;
mod tokenizers;
mod validated;
mod workers;

pub use directory::DirectorySetup;
pub use error::ConfigError;
pub use kubernetes::{DiscoverySetup, KubernetesOverrides, KubernetesSettings, PodSource};
pub use policy::{KvAwareTable, PolicyTable, SessionAffinityTable};
pub use tenants::{TenantSpec, TenantTable, Tenants};
pub use tokenizers::ModelTokenizer;
pub use validated::{BodySettings, RequestLimits, Retention, RouterConfig, DEFAULT_KV_BLOCK_SIZE};
pub use workers::{parse_worker_flag, worker_specs, worker_url, WorkerSpec};

/// The `[router]` table, in its flat form: the sub-tables (`[router.limits]`, ...) and the
/// deprecated flat keys are both rewritten into it as it is read (`shape`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct RouterSettings {
    /// Runtime threads. 1 (the default) runs every task on one thread, as linkerd2-proxy
    /// does by default: no cross-thread wake-ups on the request path, the lowest latency;
    /// long prompts are tokenized on the blocking pool either way. N > 1: a work-stealing
    /// pool of N threads; 0: one per core.
    pub worker_threads: usize,
    /// Microseconds the runtime keeps polling its sockets after a request's activity
    /// before it parks (0: never), so the worker's answer and the client's next request
    /// find the thread awake (`busy_poll`).
    pub busy_poll_us: u64,
    pub host: IpAddr,
    pub port: u16,
    pub policy: String,
    pub health_interval_ms: u64,
    pub health_timeout_ms: u64,
    pub health_failure_threshold: u32,
    /// Seconds a worker just up (new, or back after being down) warms up: it takes new work
    /// only up to that fraction of its warm peers' load (0: off).
    pub worker_warmup_s: u64,
    pub connect_timeout_ms: u64,
    pub request_timeout_s: u64,
    /// Longest silence between two frames of a worker's streamed body; a silent worker's
    /// stream ends with an error event and counts as a failed health check.
    pub stream_idle_timeout_s: u64,
    pub max_body_bytes: usize,
    /// Most choices one request may ask for (`n` × prompts of a completions batch).
    pub max_choices: u64,
    /// Most completion tokens one request may ask for in all (`max_tokens` × choices).
    pub max_completion_tokens: u64,
    /// Requests one healthy worker may have in flight from this router; more wait.
    pub max_inflight_per_worker: u32,
    /// Requests of one model that may wait for a slot; more get a 429 at once.
    pub max_queued_per_model: usize,
    /// Longest an interactive request waits for a slot before its 503 (the default of
    /// `admission.classes.interactive.queue_timeout_ms`).
    pub queue_timeout_ms: u64,
    /// Each admission class's queue deadline and share of the slots.
    pub admission_classes: crate::proxy::admission::class::ClassesTable,
    /// The class of a request that names none and whose API key sets none.
    pub admission_default_class: crate::proxy::admission::Class,
    /// Most client connections open at once; one more gets a 503 and is closed.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers, counted from when the router
    /// starts waiting for them (so also how long a keep-alive connection may idle).
    pub header_read_timeout_s: u64,
    /// Longest a client may take to send a request's body (a 408 after it).
    pub body_read_timeout_s: u64,
    /// Slowest a body may arrive, in bytes per second on average once its first 5 s are
    /// over (a 408 after; 0: no floor). Catches a dripping body long before the timeout.
    pub body_min_bytes_per_s: u64,
    /// Most MiB of request bodies the router holds at once, read or being read, across all
    /// requests; a body that would exceed it gets a 503 `overloaded` with `Retry-After`.
    pub max_inflight_body_mb: usize,
    /// Connections kept beyond `max_connections` for `/health` and `/metrics` alone, so a
    /// probe or a scrape gets through a router whose connections are all taken.
    pub reserved_probe_connections: usize,
    /// Requests per second each API key may send, sustained (0: no limit). With no
    /// `api_keys`, the limit holds for the whole client API. Beyond it: 429
    /// `rate_limit_exceeded` with `Retry-After`.
    pub rate_limit_per_s: f64,
    /// Requests a key may send at once after being idle (the token bucket's size).
    pub rate_limit_burst: f64,
    /// Each session's last prompt (tokens and block hashes) is kept, within this many MiB
    /// in all, so its next step hashes only the blocks it adds (0: keep none).
    pub prompt_cache_mb: usize,
    /// Threads rendering, tokenizing and hashing long prompts (over 16 KiB) at once; 0: one
    /// per core the router may run on.
    pub tokenize_threads: usize,
    /// Long prompts being tokenized or waiting for a thread at most; one more gets a 503
    /// `overloaded` at once. Requests with the same prompt share one computation.
    pub max_tokenizing_prompts: usize,
    /// Longest a request waits for its prompt to be tokenized (a 503 `tokenize_timeout`
    /// after it; the computation goes on and is kept for the next request).
    pub tokenize_timeout_ms: u64,
    /// Per served model, the tokenizer whose tokens (and so block hashes) the router
    /// computes: a model directory with `tokenizer.json` and `tokenizer_config.json` (the
    /// engine's own), `engine` (ask the engine's `POST /tokenize` per request), or
    /// `builtin` (the approximate tokenizer the simulated engine uses). Models not listed
    /// use `builtin`.
    pub tokenizers: std::collections::BTreeMap<String, String>,
    /// Per served model name, the model spec the planner prices its requests with: a
    /// preset name or a `.toml` spec. A model served under a preset's `served_name` is
    /// priced with that preset; any other with `planner_model`, and a warning at startup.
    pub models: std::collections::BTreeMap<String, String>,
    /// Tokens per KV block of the router's index; it must be the engines'. Unset: learned
    /// from the engines at startup (vLLM's `cache_config_info`, SGLang's `page_size`), and
    /// 16 if none reports one. A worker's own `kv_block_size` overrides it for that worker.
    pub kv_block_size: Option<usize>,
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
    /// `http://host:port` of router replicas whose KV index this router copies at startup,
    /// worker by worker, before it follows the engines' events from where the copy ends
    /// (the first that answers for a worker; none, or none answering: the engines' replay
    /// buffers alone).
    pub kv_peers: Vec<String>,
    /// Bearer token with the admin scope for `/admin/v1`; generated and printed if unset.
    pub admin_token: Option<String>,
    /// Bearer token that may only read `/admin/v1`.
    pub read_token: Option<String>,
    /// Serve `/metrics` and `/metrics/targets` (worker URLs) to anyone; otherwise they need
    /// the read or admin token, as Prometheus's `authorization` sends it.
    pub metrics_public: bool,
    /// Keys a client must present on `/v1` (`Authorization: Bearer KEY` or `x-api-key`);
    /// empty: `/v1` is open. Never forwarded to the engines.
    pub api_keys: Vec<String>,
    /// `[router.tenants.<name>]`: tenants' keys, class and fleet-wide budgets.
    pub tenants: std::collections::BTreeMap<String, TenantTable>,
    /// The key the engines expect (vLLM's `--api-key`), sent by the router as
    /// `Authorization: Bearer` on every request to them (a client's own never is).
    pub engine_api_key: Option<String>,
    /// The ownership directory: `off`, `embedded` (a single node in this process) or
    /// `remote` (a cluster of `ownerserve directory` nodes at `directory_urls`).
    pub directory: DirectoryMode,
    /// Where the embedded node keeps its log and snapshot (default: a per-process folder
    /// under the system temp dir, so nothing persists unless you set it).
    pub directory_data_dir: Option<std::path::PathBuf>,
    /// `http://host:port` of each directory node, for `remote`.
    pub directory_urls: Vec<String>,
    /// The cluster secret of the `remote` directory (its nodes' `--cluster-secret`), sent
    /// with every request to it. Prefer `OWNERSERVE_DIRECTORY_SECRET` to the file.
    pub directory_secret: Option<String>,
    /// TTL of each worker's directory lease; renewed every third of it while healthy.
    pub worker_lease_ttl_ms: u64,
    /// How often routed requests' ownership records are committed (one batch each time).
    pub ownership_flush_ms: u64,
    /// How long a new session's step waits for its owner claim to commit before it goes
    /// where it was planned, unrecorded (a directory electing a leader).
    pub ownership_claim_timeout_ms: u64,
    /// How long a `remote` directory's replica is read as current after a read sent to
    /// the leader, and how long a move off a live owner waits before its first step; the
    /// same on every router of a cluster.
    pub read_lease_ms: u64,
    /// How long a prefix artifact no session is built on stays in the directory after
    /// its last access, seconds (the retention sweep forgets it then); `0`: kept forever.
    pub directory_artifact_retention_s: u64,
    /// How long a demoted session (no owner) stays in the directory after its last write,
    /// seconds (the retention sweep ends it then); `0`: kept forever.
    pub directory_session_retention_s: u64,
    /// The cost planner's model: a preset name or a `.toml` preset file.
    pub planner_model: String,
    /// The cost planner's GPU per worker: a preset name or a `.toml` preset file.
    pub planner_gpu: String,
    /// GPUs per worker (tensor parallel).
    pub planner_gpus: u32,
    /// Worker-to-worker KV transfer bandwidth, GB/s (unset: the GPU preset's link).
    pub planner_link_gbs: Option<f64>,
    /// Token budget of one engine step the planner prices prefills with (unset: vLLM's
    /// default for each worker's GPU, `engine_default_chunk_tokens`).
    pub planner_max_num_batched_tokens: Option<u64>,
    /// Most prompt tokens one request computes per engine step while others run (vLLM
    /// `--long-prefill-token-threshold`; unset or 0: no cap, vLLM's default).
    pub planner_long_prefill_token_threshold: Option<u64>,
    /// Latency of one KV transfer, microseconds.
    pub planner_link_latency_us: f64,
    /// λ: seconds charged per GB of HBM a plan duplicates.
    pub planner_lambda_s_per_gb: f64,
    /// μ: seconds charged per second a prefill stalls one running decode.
    pub planner_mu: f64,
    /// ν: seconds charged per second a step's compute delays a prefill that will queue
    /// behind it on its worker.
    pub planner_nu: f64,
    /// κ: share of its recompute value charged for the second copy of a shared prefix a
    /// fork's branch holds off the prefix owner.
    pub planner_kappa: f64,
    /// ρ: seconds charged per decode-second a step's expected decode takes on its decode
    /// worker, its own and what it adds to the sequences running there.
    pub planner_rho: f64,
    /// Share of the KV bytes of the prompts this router has routed that the planner's
    /// migrations may move in all (`Weights::migration_budget`, 0.1; `inf`: no budget; 0:
    /// no migration).
    pub planner_migration_budget: f64,
    /// When the cost planner may decode sessions on prefill workers whose engine serves
    /// whole requests (vLLM, sim; never SGLang's prefill servers), if that is the cheaper
    /// plan: `never`, `auto` (where the worker reports a KV pool sized for decoding) or
    /// `always`.
    pub planner_prefill_workers_decode: PrefillWorkersDecode,
    /// Simulated seconds per wall-clock second of the workers (sim fleets run faster than
    /// real time); observed prefill and decode times are scaled by it before calibrating
    /// the planner.
    pub planner_time_scale: f64,
    /// Whether observed prefill times and streams' decode times calibrate the planner (off
    /// for instant sim fleets, whose prefills take no time at all).
    pub planner_calibrate: bool,
    /// Links that differ from the default, per ordered worker pair.
    pub planner_links: Vec<LinkSettings>,
    /// An idle session's lease is `factor` × its predicted tool-call gap ...
    pub session_lease_factor: f64,
    /// ... but at least this long ...
    pub session_lease_min_ms: u64,
    /// ... and at most this long (also the lease before any gap was seen).
    pub session_lease_max_ms: u64,
    /// Whether parked sessions' KV is kept, offloaded, prefetched or let go by the
    /// lifecycle decision (`ownerserve_planner::lifecycle`).
    pub session_lifecycle: bool,
    /// The tool gap assumed before any was seen: its median and 90th percentile, seconds.
    pub session_gap_prior_median_s: f64,
    pub session_gap_prior_p90_s: f64,
    /// Whether a returning session's step goes to its engine marked ahead of new prompts
    /// (the engine protocol's priority header).
    pub session_return_priority: bool,
    /// Whether a new session's first step waits while the fleet's KV cannot hold its
    /// prompt beside the live sessions' contexts (`ownerserve_planner::lifecycle::admits`).
    pub session_admission: bool,
    /// The longest a first step waits for admission, ms; then it goes anyway.
    pub session_admission_max_wait_ms: u64,
    /// The share of the fleet's KV admission keeps for the live sessions' growth
    /// (`ownerserve_planner::lifecycle::admission_room`), 0 to 0.9.
    pub session_admission_headroom: f64,
    /// Log lines as `text` or `json` (overridden by `--log-format` / `OWNERSERVE_LOG_FORMAT`).
    pub log_format: LogFormat,
    /// `router.X is deprecated: use router.Y`, one per deprecated key the file used
    /// (logged by [`RouterSettings::warn_deprecated`]).
    #[serde(skip)]
    pub deprecated: Vec<String>,
}

impl<'de> Deserialize<'de> for RouterSettings {
    /// Reads `[router]` in its sub-table shape, its flat shape or a mix of the two.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(d)?;
        let flat = shape::flatten(table).map_err(D::Error::custom)?;
        let mut settings = RouterSettings::deserialize(toml::Value::Table(flat.table))
            .map_err(|e| D::Error::custom(e.message()))?;
        settings.deprecated = flat.deprecated;
        Ok(settings)
    }
}

impl RouterSettings {
    /// Logs one warning per deprecated key the file used (call once the logs are set up).
    pub fn warn_deprecated(&self) {
        for note in &self.deprecated {
            tracing::warn!("{note}");
        }
    }
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
    #[expect(
        clippy::too_many_lines,
        reason = "one default per [router] key, read top to bottom"
    )]
    fn default() -> Self {
        Self {
            worker_threads: 1,
            busy_poll_us: 200,
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8080,
            policy: "round_robin".to_owned(),
            health_interval_ms: 1000,
            health_timeout_ms: 1000,
            health_failure_threshold: 2,
            worker_warmup_s: 30,
            connect_timeout_ms: 1000,
            request_timeout_s: 600,
            stream_idle_timeout_s: 60,
            max_body_bytes: 32 * 1024 * 1024,
            max_choices: 256,
            max_completion_tokens: 1 << 20,
            max_inflight_per_worker: 256,
            max_queued_per_model: 1024,
            queue_timeout_ms: 10_000,
            admission_classes: Default::default(),
            admission_default_class: Default::default(),
            max_connections: 4096,
            header_read_timeout_s: 30,
            body_read_timeout_s: 60,
            body_min_bytes_per_s: 4096,
            max_inflight_body_mb: 1024,
            reserved_probe_connections: 64,
            rate_limit_per_s: 0.0,
            rate_limit_burst: 20.0,
            prompt_cache_mb: 256,
            tokenize_threads: 0,
            max_tokenizing_prompts: 256,
            tokenize_timeout_ms: 10_000,
            tokenizers: std::collections::BTreeMap::new(),
            models: std::collections::BTreeMap::new(),
            kv_block_size: None,
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
            kv_peers: Vec::new(),
            admin_token: None,
            read_token: None,
            api_keys: Vec::new(),
            tenants: Default::default(),
            metrics_public: false,
            engine_api_key: None,
            directory: DirectoryMode::Off,
            directory_data_dir: None,
            directory_urls: Vec::new(),
            directory_secret: None,
            worker_lease_ttl_ms: 10_000,
            ownership_flush_ms: 50,
            ownership_claim_timeout_ms: 5_000,
            read_lease_ms: 100,
            directory_artifact_retention_s: 600,
            directory_session_retention_s: 600,
            planner_model: "llama-3.1-8b".to_owned(),
            planner_gpu: "h100".to_owned(),
            planner_gpus: 1,
            planner_link_gbs: None,
            planner_max_num_batched_tokens: None,
            planner_long_prefill_token_threshold: None,
            planner_link_latency_us: 20.0,
            planner_lambda_s_per_gb: Weights::default().lambda_s_per_gb,
            planner_mu: Weights::default().mu,
            planner_nu: Weights::default().nu,
            planner_kappa: Weights::default().kappa,
            planner_rho: Weights::default().rho,
            planner_migration_budget: Weights::default().migration_budget,
            planner_prefill_workers_decode: PrefillWorkersDecode::Auto,
            planner_time_scale: 1.0,
            planner_calibrate: true,
            planner_links: Vec::new(),
            session_lease_factor: 2.0,
            session_lifecycle: false,
            session_gap_prior_median_s: ownerserve_planner::lifecycle::gap::PRIOR_MEDIAN_S,
            session_gap_prior_p90_s: ownerserve_planner::lifecycle::gap::PRIOR_P90_S,
            session_return_priority: true,
            session_admission: false,
            session_admission_max_wait_ms: 120_000,
            session_admission_headroom: 0.0,
            session_lease_min_ms: 5_000,
            session_lease_max_ms: 600_000,
            log_format: LogFormat::Text,
            deprecated: Vec::new(),
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
    /// The worker's GPU preset (or `.toml` file) when it differs from `router.planner.gpu`.
    #[serde(default)]
    pub gpu: Option<String>,
    /// GPUs of this worker when they differ from `router.planner.gpus`.
    #[serde(default)]
    pub gpus: Option<u32>,
    /// SGLang prefill workers: the `disaggregation_bootstrap_port` (from `/server_info`).
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Tokens per KV block of this worker's engine, when it differs from
    /// `router.kv.block_size` (checked against what the engine reports at startup).
    #[serde(default)]
    pub kv_block_size: Option<usize>,
    /// The path of this worker's health probe, when it differs from its engine's (vLLM
    /// and the simulated engine `/health`, SGLang `/ready`).
    #[serde(default)]
    pub health_path: Option<String>,
    /// KV capacity of this worker's engine in tokens, overriding what the engine reports
    /// in its metrics (SGLang `max_total_num_tokens`, vLLM `num_gpu_blocks × block_size`).
    #[serde(default)]
    pub kv_capacity_tokens: Option<u64>,
    /// Token budget of one of this worker's engine steps (vLLM `--max-num-batched-tokens`,
    /// SGLang `--chunked-prefill-size`), when it differs from
    /// `router.planner.max_num_batched_tokens`: the chunks the planner prices its
    /// prefills in.
    #[serde(default)]
    pub max_num_batched_tokens: Option<u64>,
    /// This worker's vLLM `--long-prefill-token-threshold`, when it differs from
    /// `router.planner.long_prefill_token_threshold` (0: no cap): the most prompt tokens
    /// one request computes per step beside others.
    #[serde(default)]
    pub long_prefill_token_threshold: Option<u64>,
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
    /// Workers discovered from the Kubernetes API, beside the static ones.
    pub kubernetes: KubernetesSettings,
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
    /// Routing policy: any name `ownerserve_planner::policy::POLICY_NAMES` lists.
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
    /// Microseconds the runtime keeps polling after a request's activity (0: off).
    #[arg(long, env = "OWNERSERVE_BUSY_POLL_US")]
    pub busy_poll_us: Option<u64>,
    /// The remote directory's cluster secret.
    #[arg(long, env = "OWNERSERVE_DIRECTORY_SECRET", hide_env_values = true)]
    pub directory_secret: Option<String>,
    /// API keys clients must present on /v1 (comma-separated; unset: /v1 is open).
    #[arg(
        long,
        env = "OWNERSERVE_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Option<Vec<String>>,
    /// The key the engines expect (vLLM's `--api-key`), sent as a bearer token to them.
    #[arg(long, env = "OWNERSERVE_ENGINE_API_KEY", hide_env_values = true)]
    pub engine_api_key: Option<String>,
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
        if let Some(us) = self.busy_poll_us {
            s.busy_poll_us = us;
        }
        if self.directory_secret.is_some() {
            s.directory_secret.clone_from(&self.directory_secret);
        }
        if let Some(keys) = &self.api_keys {
            s.api_keys.clone_from(keys);
        }
        if self.engine_api_key.is_some() {
            s.engine_api_key.clone_from(&self.engine_api_key);
        }
    }
}

#[cfg(test)]
mod shape_tests;
#[cfg(test)]
mod tests;
