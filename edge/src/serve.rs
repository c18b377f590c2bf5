//! Serving an axum app over HTTP/1 with the limits a server facing the open internet needs
//! (axum's own `serve` has none): at most `max_connections` at once (one over gets a 503
//! and is closed, so the fd limit is never reached and `/health` stays reachable through
//! a keep-alive connection), and a header-read timeout that also bounds an idle keep-alive
//! connection and a client dripping its headers (slowloris). A body that drips is the
//! handler's to bound (the router reads bodies with a deadline).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
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
    /// Longest in-flight requests get to finish once shutdown starts.
    pub drain: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            header_read: Duration::from_secs(30),
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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let tasks = TaskTracker::new();
    let service = TowerToHyperService::new(app);
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tasks.spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read)
            .serve_connection(TokioIo::new(stream), service.clone());
        let conn = graceful.watch(conn);
        tasks.spawn(async move {
            let _ = conn.await;
            drop(slot);
        });
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
