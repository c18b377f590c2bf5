//! Serving an axum app over HTTP/1 with the limits a server facing the open internet needs
//! (axum's own `serve` has none): at most `max_connections` at once (one over gets a 503
//! and is closed, so the fd limit is never reached), `reserved_probes` more that answer
//! only `GET /health` and `GET /metrics` (so load cannot starve a probe or a scrape), and
//! a header-read timeout that also bounds an idle keep-alive connection and a client
//! dripping its headers (slowloris). A body that drips is the handler's to bound (the
//! router reads bodies with a deadline and a minimum rate).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Connection limits of a server.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Most connections served at once.
    pub max_connections: usize,
    /// Longest a connection may take to send a request's headers, counted from when the
    /// server starts waiting for them (so also the longest a keep-alive connection idles).
    pub header_read: Duration,
    /// Connections beyond `max_connections` served for `GET /health` and `GET /metrics`
    /// alone.
    pub reserved_probes: usize,
    /// Longest in-flight requests get to finish once shutdown starts.
    pub drain: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            header_read: Duration::from_secs(30),
            reserved_probes: 64,
            drain: Duration::from_secs(30),
        }
    }
}

/// What a connection over the limit reads before it is closed.
const OVER_LIMIT: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\nretry-after: 1\r\ncontent-length: 104\r\n\r\n\
{\"error\":{\"message\":\"too many open connections\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}";

/// Serves `app` on `listener` until `shutdown` fires, then lets in-flight requests finish
/// (up to `limits.drain`).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let front = TowerToHyperService::new(app.clone());
    serve_front(listener, front, app, limits, shutdown).await
}

/// [`serve`] with `front` answering the connections within `limits.max_connections`: a
/// service that dispatches its hot routes itself and hands the rest to `app` (axum's
/// router costs a proxied request ~2 µs). The reserved probe connections are served by
/// `app`.
pub async fn serve_front<S>(
    listener: TcpListener,
    front: S,
    app: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let probe_slots = Arc::new(Semaphore::new(limits.reserved_probes));
    let graceful = GracefulShutdown::new();
    let tasks = TaskTracker::new();
    let probe_service = TowerToHyperService::new(app.layer(axum::middleware::from_fn(only_probes)));
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of fds or similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        match slots.clone().try_acquire_owned() {
            Ok(slot) => run(stream, front.clone(), slot, &limits, &graceful, &tasks),
            Err(_) => match probe_slots.clone().try_acquire_owned() {
                Ok(slot) => run(
                    stream,
                    probe_service.clone(),
                    slot,
                    &limits,
                    &graceful,
                    &tasks,
                ),
                Err(_) => {
                    tasks.spawn(refuse(stream));
                }
            },
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(after = ?limits.drain, "connections still open at shutdown were cut");
    }
    tasks.close();
    Ok(())
}

/// Serves one connection with `service` on `tasks`, holding its `slot` until it closes.
fn run<S>(
    stream: TcpStream,
    service: S,
    slot: OwnedSemaphorePermit,
    limits: &ConnLimits,
    graceful: &GracefulShutdown,
    tasks: &TaskTracker,
) where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .serve_connection(TokioIo::new(stream), service);
    let conn = graceful.watch(conn);
    tasks.spawn(async move {
        let _ = conn.await;
        drop(slot);
    });
}

/// On a reserved connection: lets `GET /health` and `GET /metrics` through and answers
/// anything else as an over-limit connection is answered.
async fn only_probes(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let probe = req.method() == axum::http::Method::GET
        && matches!(req.uri().path(), "/health" | "/metrics");
    if probe {
        return next.run(req).await;
    }
    crate::error_body::ErrorBody {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        message: "too many open connections",
        kind: "server_error",
        code: Some(crate::error_body::ErrorCode {
            param: None,
            code: "overloaded",
        }),
        extra: Default::default(),
    }
    .response()
}

/// Answers a connection over the limit with a 503 and closes it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(OVER_LIMIT)).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_over_limit_answer_is_well_formed() {
        let text = std::str::from_utf8(OVER_LIMIT).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "overloaded");
    }
}
