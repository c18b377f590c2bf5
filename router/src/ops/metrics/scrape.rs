//! The router's `GET /metrics` and `GET /metrics/targets` (the workers, for Prometheus's
//! HTTP service discovery), and the registry they serve.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::server::state::AppState;

/// `GET /metrics`: the fleet, the runtime, the prompt cache and the embedded directory
/// read now, then the exposition.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    st.telemetry.fleet.refresh(&st.registry, &st.kv);
    st.telemetry.runtime.refresh();
    st.metrics.prompt_cache(st.prompts.cached_bytes());
    if let Some(node) = &st.directory {
        node.metrics.refresh(node);
    }
    (
        [(
            header::CONTENT_TYPE,
            ownerserve_edge::exposition::CONTENT_TYPE,
        )],
        ownerserve_edge::exposition::render(&st.telemetry.registry),
    )
        .into_response()
}

/// `GET /metrics/targets`: the workers' `/metrics` as a Prometheus HTTP service-discovery
/// list (`http_sd_configs`), labelled with each worker's name and role, so a Prometheus
/// scrapes the engines of whatever fleet the router fronts (`ownerserve up` starts them on
/// free ports).
pub async fn targets(State(st): State<Arc<AppState>>) -> Response {
    let groups: Vec<_> = st
        .registry
        .all()
        .iter()
        .filter_map(|w| {
            let (host, port) = w.spec.host_port()?;
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            Some(json!({
                "targets": [format!("{host}:{port}")],
                "labels": {"worker": w.spec.name, "role": w.spec.role.as_str(), "engine": w.spec.engine.as_str()},
            }))
        })
        .collect();
    Json(groups).into_response()
}
