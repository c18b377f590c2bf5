//! Talking to workers: one pooled HTTP/1.1 client, request forwarding with timeouts, and
//! the relay body that streams a worker's response back chunk by chunk.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::error::ApiError;
use crate::registry::{InFlight, Worker};
use crate::sessions::Activity;

/// The pooled client every worker call goes through.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the client: no Nagle delay, a short connect timeout so a dead worker fails fast.
pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(connector)
}

/// Why a forward failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Nothing reached the worker: safe to try another one.
    #[error("cannot connect")]
    Connect,
    #[error("no response headers within {0:?}")]
    Timeout(Duration),
    #[error("the connection failed mid-request")]
    Failed,
    /// The worker answered with this error status (a leg whose body is not relayed).
    #[error("the worker answered {0}")]
    Refused(u16),
}

impl ForwardError {
    /// The client-facing error for a failure at `worker`.
    pub fn into_api(self, worker: &Worker) -> ApiError {
        let worker = worker.spec.name.clone();
        match self {
            ForwardError::Timeout(after) => ApiError::UpstreamTimeout { worker, after },
            ForwardError::Connect | ForwardError::Failed | ForwardError::Refused(_) => {
                ApiError::UpstreamUnreachable { worker }
            }
        }
    }
}

/// Headers copied from the client's request to the worker.
const FORWARDED: &[HeaderName] = &[header::AUTHORIZATION, header::ACCEPT];

/// Sends `body` to `path` on `worker` and waits for the response headers. `extra`
/// headers (request id, session, epoch) are set on top of the client's forwarded ones.
pub async fn forward(
    client: &HttpClient,
    worker: &Worker,
    path: &str,
    headers: &HeaderMap,
    extra: &[(HeaderName, HeaderValue)],
    body: Bytes,
    timeout: Duration,
) -> Result<Response<Incoming>, ForwardError> {
    let mut req = Request::post(format!("{}{}", worker.spec.base_url, path))
        .body(Full::new(body))
        .map_err(|_| ForwardError::Failed)?;
    let out = req.headers_mut();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for name in FORWARDED {
        if let Some(v) = headers.get(name) {
            out.insert(name, v.clone());
        }
    }
    if let Some(v) = headers.get("x-request-id") {
        out.insert("x-request-id", v.clone());
    }
    for (name, v) in extra {
        out.insert(name, v.clone());
    }
    match tokio::time::timeout(timeout, client.request(req)).await {
        Err(_) => Err(ForwardError::Timeout(timeout)),
        Ok(Err(e)) if e.is_connect() => Err(ForwardError::Connect),
        Ok(Err(_)) => Err(ForwardError::Failed),
        Ok(Ok(resp)) => Ok(resp),
    }
}

/// GETs `path` on a worker and reads a small body (health checks, model lists).
pub async fn get_small(
    client: &HttpClient,
    base_url: &str,
    path: &str,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    let req = Request::get(format!("{base_url}{path}"))
        .body(Full::new(Bytes::new()))
        .map_err(|_| ForwardError::Failed)?;
    send_small(client, req, timeout).await
}

/// POSTs a JSON body with `headers` to `path` on a worker and reads its (small) answer:
/// prefill legs and the sim's KV endpoints.
pub async fn post_small(
    client: &HttpClient,
    base_url: &str,
    path: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: Bytes,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    let mut req = Request::post(format!("{base_url}{path}"))
        .body(Full::new(body))
        .map_err(|_| ForwardError::Failed)?;
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for (name, v) in headers {
        req.headers_mut().insert(name, v.clone());
    }
    send_small(client, req, timeout).await
}

async fn send_small(
    client: &HttpClient,
    req: Request<Full<Bytes>>,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    let read = async {
        let resp = client.request(req).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::Connect
            } else {
                ForwardError::Failed
            }
        })?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), 1 << 20)
            .collect()
            .await
            .map_err(|_| ForwardError::Failed)?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ForwardError::Timeout(timeout))?
}

const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
];

/// Where the time to a response's first byte goes.
pub struct FirstByte {
    pub histogram: prometheus::Histogram,
    /// When the client's request arrived.
    pub started: std::time::Instant,
}

/// Turns a worker's response into the client's: same status and headers (minus hop-by-hop
/// ones), plus `x-ownerserve-worker`, with the body relayed frame by frame. `activity`
/// keeps the session busy until the body is done; `first_byte` times its first frame.
pub fn relay(
    resp: Response<Incoming>,
    worker: &Worker,
    in_flight: InFlight,
    activity: Option<Activity>,
    first_byte: Option<FirstByte>,
) -> Response<Body> {
    let (mut parts, incoming) = resp.into_parts();
    for h in HOP_BY_HOP {
        parts.headers.remove(h);
    }
    parts.headers.remove("keep-alive");
    if let Ok(v) = HeaderValue::from_str(&worker.spec.name) {
        parts.headers.insert("x-ownerserve-worker", v);
    }
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = RelayBody {
        inner: incoming,
        sse,
        worker: worker.spec.name.clone(),
        failed: false,
        in_flight,
        _activity: activity,
        first_byte,
    };
    Response::from_parts(parts, Body::new(body))
}

/// A worker's response body on its way to the client. If the worker dies mid-stream, an SSE
/// client gets a final error event and `[DONE]` instead of a silently cut stream; other
/// clients see the connection fail. Holds the worker's in-flight count until done.
struct RelayBody {
    inner: Incoming,
    sse: bool,
    worker: String,
    failed: bool,
    in_flight: InFlight,
    _activity: Option<Activity>,
    first_byte: Option<FirstByte>,
}

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            self.in_flight.prefill_done();
            if let Some(f) = self.first_byte.take() {
                f.histogram.observe(f.started.elapsed().as_secs_f64());
            }
        }
        match polled {
            Poll::Ready(Some(Err(e))) if self.sse => {
                tracing::warn!(worker = %self.worker, error = %e, "worker failed mid-stream");
                self.failed = true;
                let err = ApiError::UpstreamUnreachable {
                    worker: self.worker.clone(),
                };
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(err.sse_event())))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}
