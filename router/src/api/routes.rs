//! The client API's axum routes, one per row of [`ENDPOINTS`]: keys and rates in front of
//! them all when configured, and Anthropic's error shape on the rows that have it.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::{Json, Router};
use serde_json::json;

use super::endpoints::{ApiEndpoint, ErrorShape, Serves, ENDPOINTS};
use crate::error::ApiError;
use crate::server::state::AppState;

/// The client API (`/v1/...`), from the table.
pub fn client_api(state: &AppState) -> Router<Arc<AppState>> {
    let mut openai = Router::new();
    let mut anthropic = Router::new();
    for endpoint in &ENDPOINTS {
        let route = method_router(endpoint);
        match endpoint.errors {
            ErrorShape::OpenAi => openai = openai.route(endpoint.path, route),
            ErrorShape::Anthropic => anthropic = anthropic.route(endpoint.path, route),
        }
    }
    if !state.client_gate.is_open() {
        let guard = axum::middleware::from_fn_with_state(
            state.client_gate.clone(),
            crate::api::client_gate::guard,
        );
        openai = openai.route_layer(guard.clone());
        anthropic = anthropic.route_layer(guard);
    }
    // Claude Code and the anthropic SDKs read Anthropic's error shape on /v1/messages (the
    // other routes go without this layer: each costs the hot path ~2-3 µs).
    openai.merge(anthropic.layer(axum::middleware::from_fn(
        ownerserve_edge::anthropic_errors::rewrite,
    )))
}

/// The handler of one row, on its method.
fn method_router(endpoint: &ApiEndpoint) -> MethodRouter<Arc<AppState>> {
    let filter = MethodFilter::try_from(endpoint.method.clone())
        .expect("the table's methods are standard ones (tested)");
    match endpoint.serves {
        Serves::Proxy(api) => on(
            filter,
            move |State(st): State<Arc<AppState>>, req: Request| async move {
                crate::proxy::handle(&st, req, api).await
            },
        ),
        Serves::CountTokens => on(filter, count_tokens),
        Serves::StoredGet => on(filter, get_response),
        Serves::StoredCancel => on(filter, cancel_response),
        Serves::Models => on(filter, models),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the router routes them.
async fn count_tokens(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, ApiError> {
    crate::proxy::count_tokens::count_tokens(&st, req).await
}

/// `GET /v1/responses/{id}`: from the worker that stored it.
async fn get_response(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    crate::proxy::stored::get(&st, &id).await
}

/// `POST /v1/responses/{id}/cancel`: at the worker that runs it.
async fn cancel_response(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    crate::proxy::stored::cancel(&st, &id).await
}

/// `GET /v1/models`.
async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data: Vec<_> = st
        .registry
        .healthy_models()
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "ownerserve"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rows_method_routes() {
        for endpoint in &ENDPOINTS {
            assert!(
                MethodFilter::try_from(endpoint.method.clone()).is_ok(),
                "{}",
                endpoint.path
            );
        }
    }
}
