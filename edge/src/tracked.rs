//! The layer every server runs around each request, as one hand-written service rather
//! than a stack of `from_fn` middlewares (each of which clones and boxes the service
//! behind it and boxes its own future). Measured on a 2 KB proxied request at one
//! connection: the three middlewares cost ~8 µs, this layer ~3–4 µs (docs/BENCHMARKS.md,
//! "A leaner HTTP path"). In order:
//!
//! - the request's id ([`crate::request_id::of`]) is put on the request (the proxy sends
//!   it on every leg to the workers) and on the response, and is in scope for the log
//!   lines written while it is served ([`crate::request_scope`]);
//! - an error answer that is not JSON is rewritten in OpenAI's shape
//!   ([`crate::error_body::json_error`]);
//! - the request is counted and timed until its body ends ([`HttpMetrics`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::response::Response;

use crate::http_metrics::{Executed, HttpMetrics, TimedBody};
use crate::request_id;
pub use crate::request_scope::Route;
use crate::request_scope::{self, RequestScope};

/// The layer: `router.layer(tracked::layer(metrics))`.
#[derive(Clone)]
pub struct TrackedLayer {
    metrics: Arc<HttpMetrics>,
}

/// Tracks requests into `metrics`.
pub fn layer(metrics: Arc<HttpMetrics>) -> TrackedLayer {
    TrackedLayer { metrics }
}

impl<S> tower_layer::Layer<S> for TrackedLayer {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`TrackedLayer`] wraps a route in.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    metrics: Arc<HttpMetrics>,
}

impl<S> tower_service::Service<Request> for Tracked<S>
where
    S: tower_service::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let route = match req.extensions().get::<MatchedPath>() {
            Some(m) => Route::Matched(m.clone()),
            None => Route::Unmatched,
        };
        // `poll_ready` readied this very service: call it now, await it in the future.
        let inner = &mut self.inner;
        track(&self.metrics, route, req, |req| inner.call(req))
    }
}

/// Runs `handler` on `req` as [`Tracked`] runs a route: for a server that dispatches some
/// routes itself, in front of its axum router.
pub fn track<F, Fut>(
    metrics: &Arc<HttpMetrics>,
    route: Route,
    mut req: Request,
    handler: F,
) -> Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let started = Instant::now();
    let id = request_id::of(req.headers());
    req.headers_mut().insert(request_id::HEADER, id.clone());
    let scope = RequestScope {
        request_id: id.clone(),
        method: req.method().clone(),
        route: route.clone(),
    };
    // Boxed at once: the handler's future is then moved by pointer into the scope and
    // this future rather than copied twice (the copies showed in `perf` as `memcpy`).
    let answer = request_scope::scoped(scope, Box::pin(handler(req)));
    let metrics = metrics.clone();
    Box::pin(async move {
        let Ok(resp) = answer.await;
        let resp = crate::error_body::json_error(resp).await;
        let (mut parts, body) = resp.into_parts();
        parts.headers.insert(request_id::HEADER, id);
        let action = parts.extensions.get::<Executed>().map(|e| e.0);
        let histogram = metrics.answered(route.as_str(), parts.status.as_str(), action);
        let body = Body::new(TimedBody::new(body, histogram, started));
        Ok(Response::from_parts(parts, body))
    })
}
