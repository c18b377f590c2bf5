//! Workers as the router runs with them: specs from `[[workers]]` entries and `--worker`
//! flags, with checked URLs and names.

use ownerserve_planner::ids::{EngineKind, Role};

use super::{default_engine, ConfigError, WorkerSettings};

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
    /// Tokens per KV block of its engine, as configured (`None`: the router's setting).
    pub kv_block_size: Option<usize>,
    /// Its health probe's path, when it differs from its engine's ([`WorkerSpec::probe_path`]).
    pub health_path: Option<String>,
    /// Its KV capacity in tokens as configured (`None`: what the engine reports).
    pub kv_capacity_tokens: Option<u64>,
    /// Its engine's step budget as configured (`None`: the router's setting).
    pub max_num_batched_tokens: Option<u64>,
    /// Its engine's long-prefill cap as configured (`None`: the router's setting).
    pub long_prefill_token_threshold: Option<u64>,
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
            kv_block_size: None,
            health_path: None,
            kv_capacity_tokens: None,
            max_num_batched_tokens: None,
            long_prefill_token_threshold: None,
        }
    }

    /// The path the health checker probes: `health_path` if set, else its engine's cheap
    /// readiness check (`EngineProtocol::probe_path`).
    pub fn probe_path(&self) -> &str {
        match &self.health_path {
            Some(p) => p,
            None => ownerserve_shim::engines::protocol(self.engine).probe_path(),
        }
    }

    /// `(host, port)` of its base URL.
    pub fn host_port(&self) -> Option<(String, u16)> {
        let rest = self.base_url.split_once("://")?.1;
        let (host, port) = rest.rsplit_once(':')?;
        Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
    }
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

/// Parses `--worker URL[,role=R][,engine=E][,name=N][,gpu=G][,gpus=N][,bootstrap_port=P]`
/// (also `kv_events`, `kv_replay`, `kv_block_size`, `health_path`, `kv_capacity_tokens`,
/// `max_num_batched_tokens`, `long_prefill_token_threshold`).
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
        kv_block_size: None,
        health_path: None,
        kv_capacity_tokens: None,
        max_num_batched_tokens: None,
        long_prefill_token_threshold: None,
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
            "kv_block_size" => {
                w.kv_block_size = Some(v.parse().map_err(|e| bad(format!("kv_block_size: {e}")))?)
            }
            "health_path" => w.health_path = Some(v.to_owned()),
            "kv_capacity_tokens" => {
                w.kv_capacity_tokens =
                    Some(v.parse().map_err(|e| bad(format!("kv_capacity_tokens: {e}")))?)
            }
            "max_num_batched_tokens" => {
                w.max_num_batched_tokens =
                    Some(v.parse().map_err(|e| bad(format!("max_num_batched_tokens: {e}")))?)
            }
            "long_prefill_token_threshold" => {
                w.long_prefill_token_threshold = Some(
                    v.parse()
                        .map_err(|e| bad(format!("long_prefill_token_threshold: {e}")))?,
                )
            }
            _ => return Err(bad(format!(
                "unknown key `{k}` (role, engine, name, kv_events, kv_replay, gpu, gpus, bootstrap_port, kv_block_size, health_path, kv_capacity_tokens, max_num_batched_tokens, long_prefill_token_threshold)"
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
                kv_block_size: w.kv_block_size,
                health_path: w.health_path.clone(),
                kv_capacity_tokens: w.kv_capacity_tokens,
                max_num_batched_tokens: w.max_num_batched_tokens,
                long_prefill_token_threshold: w.long_prefill_token_threshold,
                ..WorkerSpec::new(&name, &url(w, &name)?, w.role, w.engine)
            })
        })
        .collect()
}
