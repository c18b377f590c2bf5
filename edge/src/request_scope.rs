//! The request a task is serving, for the log lines written while it runs: its id, method
//! and route, set by [`crate::tracked`] around the handler and read by the process's log
//! format (the router's `logging`), which writes them as the `request` span.
//!
//! A task-local rather than a `tracing` span: the span cost ~6 µs of every proxied request
//! (its fields formatted into a string at creation, the registry entered and left on every
//! poll) though almost no request logs anything; setting this costs a pointer swap per poll
//! (docs/BENCHMARKS.md, "Logs without a span per request, and the c1 latency").

use std::future::Future;

use axum::extract::MatchedPath;
use axum::http::{HeaderValue, Method};

/// What a request's log lines carry.
pub struct RequestScope {
    pub request_id: HeaderValue,
    pub method: Method,
    pub route: Route,
}

tokio::task_local! {
    static CURRENT: RequestScope;
}

/// Runs `fut` as serving `scope`.
pub fn scoped<F: Future>(scope: RequestScope, fut: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(scope, fut)
}

/// `f` of the request this task is serving; `None` outside any.
pub fn try_with<R>(f: impl FnOnce(&RequestScope) -> R) -> Option<R> {
    CURRENT.try_with(f).ok()
}

impl RequestScope {
    /// The request id as text (an id that is not visible ASCII shows empty).
    pub fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or_default()
    }
}

/// The route a request is counted under.
#[derive(Clone)]
pub enum Route {
    /// A route the server matched itself, without axum's router (the proxy's hot routes).
    Named(&'static str),
    /// The route axum's router matched.
    Matched(MatchedPath),
    /// No route matched (a 404).
    Unmatched,
}

impl Route {
    /// The route as metrics count it and log lines name it.
    pub fn as_str(&self) -> &str {
        match self {
            Route::Named(name) => name,
            Route::Matched(m) => m.as_str(),
            Route::Unmatched => "unmatched",
        }
    }
}
