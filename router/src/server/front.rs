//! The router's front service: the proxy's hot routes (the rows of `api::ENDPOINTS` marked
//! `hot`: `POST /v1/chat/completions` and `POST /v1/completions`, when no client keys or
//! rates are configured) go straight to the proxy, the rest to axum's router. Matching two
//! paths here costs nothing; axum's router (path match, parameters, matched path, method
//! router, boxed handler) cost ~2 µs of a 2 KB request at one connection. Both ways run the same per-request layer
//! ([`ownerserve_edge::tracked`]) and the same handler.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use ownerserve_edge::tracked::{self, Route};
use ownerserve_shim::openai::Endpoint;
use tower_service::Service;

use crate::api;
use crate::server::state::AppState;

/// What serves each client connection.
#[derive(Clone)]
pub struct Front {
    state: Arc<AppState>,
    app: Router,
}

impl Front {
    pub fn new(state: Arc<AppState>, app: Router) -> Self {
        Self { state, app }
    }

    /// The hot route `req` is for, if any (none while client keys or rates are set: those
    /// requests go through the router's gate).
    fn hot(&self, req: &hyper::Request<Incoming>) -> Option<(Endpoint, &'static str)> {
        if !self.state.client_gate.is_open() {
            return None;
        }
        let row = api::endpoints::hot(req.method(), req.uri().path())?;
        Some((row.proxied()?, row.path))
    }
}

impl hyper::service::Service<hyper::Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let Some((endpoint, path)) = self.hot(&req) else {
            let mut app = self.app.clone();
            return Box::pin(app.call(req.map(Body::new)));
        };
        let state = self.state.clone();
        tracked::track(
            &self.state.telemetry.http,
            Route::Named(path),
            req.map(Body::new),
            move |req| async move {
                Ok(crate::proxy::handle(&state, req, endpoint)
                    .await
                    .into_response())
            },
        )
    }
}
