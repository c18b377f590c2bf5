//! Health checks: each worker is probed on an interval (its engine's cheap readiness
//! path, then `/v1/models` to learn what it serves) and marked up or down in the registry.
//!
//! Active and passive health together decide: a probe that fails (a timeout or an error
//! status) counts against a worker only if it made no progress on a proxied request since
//! the previous probe, so a busy engine whose probe is slow stays up while it serves. A
//! refused connection counts always (and on the request path marks the worker down at
//! once); `health_failure_threshold` failures in a row mark it down, fewer leave it
//! suspect. Probe paths per engine: [`crate::config::WorkerSpec::probe_path`], from the
//! engine's protocol (`ownerserve_shim::engines::EngineProtocol::probe_path`).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::fleet::registry::{Registry, ServedModel, Worker};
use axum::http::HeaderValue;

use crate::upstream::{get_small, get_small_as, ForwardError, HttpClient};

/// How often and how patiently workers are probed.
#[derive(Debug, Clone)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    /// The engine API key (`/v1/models` is behind vLLM's `--api-key`).
    pub authorization: Option<HeaderValue>,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ServedModel>,
}

impl HealthSettings {
    /// The router's health settings.
    pub fn of(cfg: &crate::config::RouterConfig) -> Self {
        Self {
            interval: cfg.health_interval,
            timeout: cfg.health_timeout,
            failure_threshold: cfg.health_failure_threshold,
            authorization: cfg.engine_authorization.clone(),
        }
    }
}

/// Probes one worker once and records the result.
pub async fn check(client: &HttpClient, worker: &Worker, s: &HealthSettings) {
    let base = &worker.spec.base_url;
    let path = worker.spec.probe_path();
    let failure = match get_small(client, base, path, s.timeout).await {
        Ok((status, _)) if status.is_success() => None,
        Ok((status, _)) => Some((format!("{path} answered {status}"), false)),
        Err(e) => {
            let refused = matches!(e, ForwardError::Connect);
            Some((format!("{path}: {e}"), refused))
        }
    };
    if let Some((why, refused)) = failure {
        // Progress since the previous probe began: the worker is serving, whatever the
        // probe says (a busy engine can be slow to answer it).
        if !refused && worker.is_healthy() && worker.progressed_within(s.interval + s.timeout) {
            tracing::debug!(worker = %worker.spec.name, reason = %why, "probe failed, but the worker is serving: still up");
            return;
        }
        return worker.record_failure(s.failure_threshold, &why);
    }
    if worker.is_healthy() && !worker.models().is_empty() {
        return worker.mark_healthy(worker.models().to_vec());
    }
    let auth = s.authorization.as_ref();
    match get_small_as(client, base, "/v1/models", auth, s.timeout).await {
        Ok((status, body)) if status.is_success() => {
            match serde_json::from_slice::<ModelList>(&body) {
                Ok(list) => worker.mark_healthy(list.data),
                Err(_) => worker.record_failure(s.failure_threshold, "unreadable /v1/models"),
            }
        }
        Ok((status, _)) => worker.record_failure(s.failure_threshold, status.as_str()),
        Err(e) => worker.record_failure(s.failure_threshold, &e.to_string()),
    }
}

/// Probes every worker once, concurrently, so the router starts with a current view.
pub async fn check_all(client: &HttpClient, registry: &Registry, s: &HealthSettings) {
    let tracker = TaskTracker::new();
    for w in registry.all().iter() {
        let (client, w, s) = (client.clone(), w.clone(), s.clone());
        tracker.spawn(async move { check(&client, &w, &s).await });
    }
    tracker.close();
    tracker.wait().await;
}

/// Starts one probe loop per worker; they stop when `cancel` fires.
pub fn spawn(
    client: &HttpClient,
    registry: &Arc<Registry>,
    s: HealthSettings,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) {
    for w in registry.all().iter() {
        spawn_one(client, w, s.clone(), tracker, cancel);
    }
}

/// Starts `w`'s probe loop; it stops when `cancel` fires or the worker is retired.
pub fn spawn_one(
    client: &HttpClient,
    w: &Arc<Worker>,
    s: HealthSettings,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) {
    let (client, w, cancel) = (client.clone(), w.clone(), cancel.clone());
    tracker.spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(s.interval) => check(&client, &w, &s).await,
                () = cancel.cancelled() => return,
                () = w.retired().cancelled() => return,
            }
        }
    });
}
