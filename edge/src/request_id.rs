//! Request ids and the per-request middleware every server runs: the client's
//! `X-Request-Id` is kept (or one is made up), put on the request for the handlers (the
//! proxy sends it on every leg to the workers), returned on the response, and carried by
//! the request's tracing span; the request is counted and timed ([`HttpMetrics`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::http_metrics::{Executed, HttpMetrics, TimedBody};

/// The header.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-given id kept; a longer (or non-printable) one is replaced.
const MAX_LEN: usize = 128;

/// The request's id: the client's if it is a short printable string, else a fresh one.
pub fn of(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(&HEADER)
        .filter(|v| {
            let b = v.as_bytes();
            !b.is_empty() && b.len() <= MAX_LEN && b.iter().all(|c| c.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(fresh)
}

/// A process-unique id: start time and a counter.
fn fresh() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    HeaderValue::from_str(&format!("ownerserve-{salt:x}-{n:x}"))
        .unwrap_or_else(|_| HeaderValue::from_static("ownerserve"))
}

/// Middleware: request id, span, metrics.
pub async fn track(
    State(metrics): State<Arc<HttpMetrics>>,
    mut req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let id = of(req.headers());
    req.headers_mut().insert(HEADER, id.clone());
    let span = tracing::info_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        method = %req.method(),
        route = %route,
    );
    let resp = next.run(req).instrument(span).await;
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(HEADER, id);
    let action = parts.extensions.get::<Executed>().map(|e| e.0);
    let histogram = metrics.answered(&route, parts.status.as_str(), action);
    Response::from_parts(parts, Body::new(TimedBody::new(body, histogram, started)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_is_kept_unless_it_is_too_long_or_unprintable() {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_static("client-id-1"));
        assert_eq!(of(&h), "client-id-1");
        h.insert(
            HEADER,
            HeaderValue::from_str(&"x".repeat(200)).expect("ascii"),
        );
        assert!(of(&h).to_str().expect("ascii").starts_with("ownerserve-"));
        h.insert(HEADER, HeaderValue::from_static("has space"));
        assert!(of(&h).to_str().expect("ascii").starts_with("ownerserve-"));
        assert_ne!(of(&HeaderMap::new()), of(&HeaderMap::new()));
    }
}
