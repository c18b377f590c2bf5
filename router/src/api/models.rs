//! `GET /v1/models`: the models some healthy worker serves.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::server::state::AppState;

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data: Vec<_> = st
        .registry
        .healthy_models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "ownerserve"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}
