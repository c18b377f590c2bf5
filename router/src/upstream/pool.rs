//! The router's pool of HTTP/1.1 connections to workers. A request goes out on an idle
//! connection to its worker's address, or a new one; the connection is put back once its
//! response body has been read to the end (a body left early or failed closes it). The
//! wire itself is [`super::http1`]: no task per connection, the response read by the task
//! that relays it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::uri::{Authority, PathAndQuery};
use axum::http::{header, HeaderValue, Request, Response, Uri};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::net::TcpStream;

use super::http1::{self, Conn, Framing, WireError};

/// How long an idle connection to a worker is kept: well under the 5 s keep-alive of
/// uvicorn, which serves vLLM's and SGLang's APIs. A connection kept longer can be closed by
/// the engine just as the router sends on it, and the request fails mid-flight (the
/// real-engine suite hit it on a loaded machine, at 4 s too: the engine's timer starts when
/// its answer is sent, ours when the body has been read, and a starved router may sit
/// between checkout and write). `upstream::request` also sends such a request again, once.
const IDLE_FOR: Duration = Duration::from_secs(2);

/// Most idle connections kept per worker address.
const MAX_IDLE: usize = 1024;

/// Why a request to a worker got no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be opened (refused, unreachable, timed out, unresolved).
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    /// The URL is not `http://host[:port]/...`.
    #[error("not a worker URL: {0}")]
    BadUrl(String),
    /// The connection failed after it was opened.
    #[error(transparent)]
    Wire(#[from] WireError),
}

impl SendError {
    /// Nothing reached the worker: it could not be connected to.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(..))
    }

    /// The connection closed before the response began (an engine closing an idle
    /// keep-alive connection just as the router wrote on it: the engine read nothing).
    pub fn closed_before_answer(&self) -> bool {
        matches!(self, SendError::Wire(WireError::ClosedBeforeAnswer))
    }
}

/// The pool; clones share it.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    connect_timeout: Duration,
    idle: Mutex<Idle>,
}

/// Idle connections by worker address (`host:port`).
#[derive(Default)]
struct Idle {
    by_address: HashMap<String, Vec<(Conn, Instant)>>,
    /// When every address's expired connections were last dropped.
    swept: Option<Instant>,
}

impl Pool {
    /// An empty pool whose new connections give up after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            shared: Arc::new(Shared {
                connect_timeout,
                idle: Mutex::new(Idle::default()),
            }),
        }
    }

    /// Sends `req` (its URI absolute: `http://host:port/path`) to that worker and reads
    /// the response head; the body is read as the response is polled.
    pub async fn send(&self, req: Request<Bytes>) -> Result<Response<Pooled>, SendError> {
        let (authority, path) = split(req.uri())?;
        let address = authority.as_str().to_owned();
        let (mut parts, body) = req.into_parts();
        if !parts.headers.contains_key(header::HOST) {
            let host =
                HeaderValue::from_str(&address).map_err(|_| SendError::BadUrl(address.clone()))?;
            parts.headers.insert(header::HOST, host);
        }
        let mut head = Vec::with_capacity(512);
        http1::write_head(
            &mut head,
            &parts.method,
            path.as_str(),
            &parts.headers,
            body.len(),
        );
        let mut conn = match self.checkout(&address) {
            Some(c) => c,
            None => self.connect(&authority).await?,
        };
        conn.write_request(&head, &body).await?;
        let (answer, framing) = conn.read_head(&parts.method).await?;
        let mut resp = Response::new(Pooled {
            conn: Some(conn),
            framing,
            back: Some((self.shared.clone(), address)),
        });
        *resp.status_mut() = answer.status;
        *resp.version_mut() = answer.version;
        *resp.headers_mut() = answer.headers;
        Ok(resp)
    }

    /// An idle connection to `address` that can take a request now.
    fn checkout(&self, address: &str) -> Option<Conn> {
        let mut idle = self
            .shared
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let list = idle.by_address.get_mut(address)?;
        while let Some((mut conn, since)) = list.pop() {
            if since.elapsed() < IDLE_FOR && conn.still_open() {
                return Some(conn);
            }
            // Expired, or closed by the worker: dropping it closes it.
        }
        None
    }

    /// A new connection to `authority`.
    async fn connect(&self, authority: &Authority) -> Result<Conn, SendError> {
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(80);
        let failed = |e| SendError::Connect(authority.to_string(), e);
        let stream = tokio::time::timeout(
            self.shared.connect_timeout,
            TcpStream::connect((host, port)),
        )
        .await
        .map_err(|_| failed(std::io::ErrorKind::TimedOut.into()))?
        .map_err(failed)?;
        stream.set_nodelay(true).map_err(failed)?;
        Ok(Conn::new(stream))
    }
}

impl Shared {
    /// Puts a connection whose response has ended back for the next request to `address`.
    fn put_back(&self, address: String, conn: Conn) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // Now and then, every address's expired connections go (a retired worker's too).
        if idle.swept.is_none_or(|t| now.duration_since(t) >= IDLE_FOR) {
            idle.swept = Some(now);
            idle.by_address.retain(|_, list| {
                list.retain(|(_, since)| now.duration_since(*since) < IDLE_FOR);
                !list.is_empty()
            });
        }
        let list = idle.by_address.entry(address).or_default();
        if list.len() < MAX_IDLE {
            list.push((conn, now));
        }
    }
}

/// The authority and the origin-form path of a worker URL.
fn split(uri: &Uri) -> Result<(Authority, PathAndQuery), SendError> {
    let bad = || SendError::BadUrl(uri.to_string());
    if uri.scheme_str() != Some("http") {
        return Err(bad());
    }
    let authority = uri.authority().cloned().ok_or_else(bad)?;
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Ok((authority, path))
}

/// A worker's response body, read from its connection as it is polled; the connection
/// goes back to the pool when the body has been read to the end.
pub struct Pooled {
    /// `None` once the connection went back or failed.
    conn: Option<Conn>,
    framing: Framing,
    back: Option<(Arc<Shared>, String)>,
}

impl Pooled {
    /// Returns the connection to the pool if its body ended and it may carry another.
    fn give_back(&mut self) {
        let (Some(conn), Some((pool, address))) = (self.conn.take(), self.back.take()) else {
            return;
        };
        if self.framing.keep_alive && self.framing.is_done() {
            pool.put_back(address, conn);
        }
    }
}

impl http_body::Body for Pooled {
    type Data = Bytes;
    type Error = WireError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, WireError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        match conn.poll_body(&mut this.framing, cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.give_back();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(data))) => {
                // The last bytes: the connection is free before the end is polled.
                if this.framing.is_done() {
                    this.give_back();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            // A failed connection is not reused.
            Poll::Ready(Some(Err(e))) => {
                this.conn = None;
                Poll::Ready(Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_done() || self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing.exact_left() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for Pooled {
    /// A body read to its end (or empty) frees its connection; one left early closes it.
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A worker answering every request with `ok`; counts the connections it accepted.
    async fn worker() -> (String, Arc<AtomicUsize>, tokio::task::JoinSet<()>) {
        worker_closing(false).await
    }

    /// [`worker`], closing each connection after its first answer when `close` (as an
    /// engine closes a keep-alive connection it found idle too long).
    async fn worker_closing(close: bool) -> (String, Arc<AtomicUsize>, tokio::task::JoinSet<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                conns.spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if conn.write_all(answer).await.is_err() || close {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, accepted, tasks)
    }

    fn get(url: &str) -> Request<Bytes> {
        Request::get(format!("{url}/health"))
            .body(Bytes::new())
            .expect("request")
    }

    #[tokio::test]
    async fn a_connection_is_reused_once_its_body_was_read_and_never_when_left_early() {
        let (url, accepted, _worker) = worker().await;
        let pool = Pool::new(Duration::from_secs(1));
        for _ in 0..3 {
            let resp = pool.send(get(&url)).await.expect("answered");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for three requests"
        );
        // A body dropped unread: its connection may still carry its bytes, so it closes.
        drop(pool.send(get(&url)).await.expect("answered"));
        let resp = pool.send(get(&url)).await.expect("answered");
        let _ = resp.into_body().collect().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a new connection after one left early"
        );
    }

    #[tokio::test]
    async fn a_connection_the_worker_closed_while_idle_is_dropped_and_a_new_one_opened() {
        let (url, accepted, _worker) = worker_closing(true).await;
        let pool = Pool::new(Duration::from_secs(1));
        for round in 1..=3 {
            let resp = pool.send(get(&url)).await.expect("answered");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], b"ok");
            // Let the worker's close arrive before the next request takes the connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(accepted.load(Ordering::SeqCst), round);
        }
    }

    #[tokio::test]
    async fn a_worker_that_refuses_is_a_connect_error_and_a_bad_url_is_refused() {
        let pool = Pool::new(Duration::from_secs(1));
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let refused = pool.send(get(&format!("http://127.0.0.1:{port}"))).await;
        assert!(
            matches!(&refused, Err(e) if e.is_connect()),
            "{:?}",
            refused.err()
        );
        let bad = pool.send(get("https://127.0.0.1:1")).await;
        assert!(matches!(bad, Err(SendError::BadUrl(_))));
    }
}
