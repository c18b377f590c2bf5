//! The client API's axum routes, one per row of [`ENDPOINTS`], each to its surface's
//! handler: keys and rates in front of them all when configured, and Anthropic's error
//! shape on the rows that have it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

use super::endpoints::{ApiEndpoint, ErrorShape, Serves, ENDPOINTS};
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
#[expect(
    clippy::expect_used,
    reason = "cannot fail: the table's methods are standard ones (tests::every_rows_method_routes)"
)]
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
        Serves::CountTokens => on(filter, super::messages::count_tokens),
        Serves::StoredGet => on(filter, super::responses::get),
        Serves::StoredCancel => on(filter, super::responses::cancel),
        Serves::Models => on(filter, super::models::models),
    }
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
