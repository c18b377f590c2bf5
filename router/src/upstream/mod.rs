//! Talking to workers: one pool of HTTP/1.1 connections ([`pool`], over the hand-written
//! wire of [`http1`]), the streaming forward of a client's
//! request, and small calls that read a bounded answer (health, metrics, prefill legs,
//! KV copies). [`EngineCalls`] is the seam the dispatch stage calls engines through, so
//! its legs can be tested against a fake engine.

pub mod http1;
pub mod pool;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};

use crate::error::ApiError;
use crate::fleet::registry::Worker;
use pool::{Pooled, SendError};

/// The pooled client every worker call goes through.
pub type HttpClient = pool::Pool;

/// Sends `req`. A request the connection's close cut off before any answer came back (an
/// engine closing an idle keep-alive connection just as the router wrote on it: the
/// engine read nothing) is sent once more, on another connection.
async fn request(
    client: &HttpClient,
    build: impl Fn() -> Request<Bytes>,
) -> Result<Response<Pooled>, SendError> {
    // Built again for the one retry rather than cloned ahead for it (~0.3 µs a request).
    match client.send(build()).await {
        Err(e) if e.closed_before_answer() => client.send(build()).await,
        other => other,
    }
}

/// A request with `method`, `uri`, `headers` (a later one replacing an earlier one of the
/// same name) and `body` (shared, not copied).
fn built(
    method: &Method,
    uri: &Uri,
    headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>,
    body: &Bytes,
) -> Request<Bytes> {
    let mut req = Request::new(body.clone());
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri.clone();
    // Inserted, not appended: a later header of the same name replaces an earlier one.
    let out = req.headers_mut();
    for (name, value) in headers {
        out.insert(name, value);
    }
    req
}

/// The URI of `path` on the worker at `base_url`.
fn worker_uri(base_url: &str, path: &str) -> Result<Uri, ForwardError> {
    let mut url = String::with_capacity(base_url.len() + path.len());
    url.push_str(base_url);
    url.push_str(path);
    Uri::try_from(url).map_err(|_| ForwardError::Failed)
}

/// Builds the client: a short connect timeout so a dead worker fails fast.
pub fn client(connect_timeout: Duration) -> HttpClient {
    pool::Pool::new(connect_timeout)
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
    /// The session's owner changed since this router read it (a migration's flip was
    /// refused for a stale epoch): nothing was sent; plan the step again on a fresh view.
    #[error("the session's owner changed while the step was planned")]
    StaleView,
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
            ForwardError::StaleView => ApiError::RouterBusy {
                why: "the session's owner kept changing while the step was planned",
            },
        }
    }
}

/// Headers copied from the client's request to the worker. Not `Authorization`: a client's
/// key is for the router (the engines get `router.engine_api_key`).
/// Anthropic's version and beta headers pass through to engines serving `/v1/messages`;
/// the request id goes to every leg. Names made at compile time: parsing them on each
/// request cost ~0.5 µs.
const FORWARDED: [HeaderName; 4] = [
    header::ACCEPT,
    HeaderName::from_static("anthropic-version"),
    HeaderName::from_static("anthropic-beta"),
    HeaderName::from_static("x-request-id"),
];

/// GETs `path` on a worker and reads a small body (health checks, model lists).
pub async fn get_small(
    client: &HttpClient,
    base_url: &str,
    path: &str,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    get_small_as(client, base_url, path, None, timeout).await
}

/// [`get_small`] with `authorization` (the engine API key, for its `/v1` routes).
pub async fn get_small_as(
    client: &HttpClient,
    base_url: &str,
    path: &str,
    authorization: Option<&HeaderValue>,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    get_bounded_as(
        client,
        base_url,
        path,
        authorization,
        SMALL_ANSWER_BYTES,
        timeout,
    )
    .await
}

/// [`get_small_as`] for an answer of up to `limit` bytes (a peer router's copy of its KV
/// index).
pub async fn get_bounded_as(
    client: &HttpClient,
    base_url: &str,
    path: &str,
    authorization: Option<&HeaderValue>,
    limit: usize,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    let uri = worker_uri(base_url, path)?;
    let body = Bytes::new();
    let build = || {
        let auth = authorization.map(|a| (header::AUTHORIZATION, a.clone()));
        built(&Method::GET, &uri, auth, &body)
    };
    send_bounded(client, build, limit, timeout).await
}

/// POSTs a JSON body with `headers` to `path` on a worker and reads its (small) answer:
/// prefill legs and the sim's KV endpoints.
async fn post_small(
    client: &HttpClient,
    base_url: &str,
    path: &str,
    headers: &[(HeaderName, HeaderValue)],
    body: Bytes,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    let uri = worker_uri(base_url, path)?;
    let build = || {
        let json = (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let extra = headers.iter().map(|(n, v)| (n.clone(), v.clone()));
        built(
            &Method::POST,
            &uri,
            std::iter::once(json).chain(extra),
            &body,
        )
    };
    send_bounded(client, build, SMALL_ANSWER_BYTES, timeout).await
}

/// The most a small answer may hold.
const SMALL_ANSWER_BYTES: usize = 1 << 20;

async fn send_bounded(
    client: &HttpClient,
    build: impl Fn() -> Request<Bytes>,
    limit: usize,
    timeout: Duration,
) -> Result<(hyper::StatusCode, Bytes), ForwardError> {
    let read = async {
        let resp = request(client, build).await.map_err(|e| {
            if e.is_connect() {
                ForwardError::Connect
            } else {
                ForwardError::Failed
            }
        })?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), limit)
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

/// A boxed future, so [`EngineCalls`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An engine's small answer: status and a bounded body.
pub type SmallAnswer = (hyper::StatusCode, Bytes);

/// The calls the dispatch stage makes to engines before the decode worker's request: a
/// prefill leg, a KV copy, a drop. Each reads a small answer within the request timeout.
pub trait EngineCalls: Send + Sync {
    /// POSTs a JSON `body` with `headers` to `path` on the engine at `base_url`.
    fn post<'a>(
        &'a self,
        base_url: &'a str,
        path: &'a str,
        headers: &'a [(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> BoxFuture<'a, Result<SmallAnswer, ForwardError>>;
}

/// The pooled client with the router's request timeout.
#[derive(Clone)]
pub struct Upstream {
    pub client: HttpClient,
    /// How long a worker has to send response headers (or a whole small answer).
    pub timeout: Duration,
}

impl Upstream {
    /// Sends `body` to `path` on `worker` and waits for the response headers. `extra`
    /// headers (request id, session, epoch) are set on top of the client's forwarded ones.
    pub async fn forward(
        &self,
        worker: &Worker,
        path: &str,
        headers: &HeaderMap,
        extra: &[(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> Result<Response<Pooled>, ForwardError> {
        let uri = worker_uri(&worker.spec.base_url, path)?;
        let build = || {
            let json = (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            let forwarded = FORWARDED.into_iter().filter_map(|name| {
                let value = headers.get(&name)?.clone();
                Some((name, value))
            });
            let extra = extra.iter().map(|(n, v)| (n.clone(), v.clone()));
            built(
                &Method::POST,
                &uri,
                std::iter::once(json).chain(forwarded).chain(extra),
                &body,
            )
        };
        match tokio::time::timeout(self.timeout, request(&self.client, build)).await {
            Err(_) => Err(ForwardError::Timeout(self.timeout)),
            Ok(Err(e)) if e.is_connect() => Err(ForwardError::Connect),
            Ok(Err(_)) => Err(ForwardError::Failed),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
}

impl EngineCalls for Upstream {
    fn post<'a>(
        &'a self,
        base_url: &'a str,
        path: &'a str,
        headers: &'a [(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> BoxFuture<'a, Result<SmallAnswer, ForwardError>> {
        Box::pin(post_small(
            &self.client,
            base_url,
            path,
            headers,
            body,
            self.timeout,
        ))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// An engine that reads its first connection's request and closes it unanswered (its
    /// keep-alive ran out), then answers on the next connection; `answer_again` false: it
    /// closes that one unanswered too. It runs as long as the returned set is kept.
    async fn closing_engine(answer_again: bool) -> (String, tokio::task::JoinSet<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("has an address");
        let mut engine = tokio::task::JoinSet::new();
        engine.spawn(async move {
            for n in 0.. {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                if n > 0 && answer_again {
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                }
            }
        });
        (format!("http://{addr}"), engine)
    }

    #[tokio::test]
    async fn a_request_cut_off_before_any_answer_is_sent_once_more() {
        let client = client(Duration::from_secs(1));
        let (url, _engine) = closing_engine(true).await;
        let (status, body) = get_small(&client, &url, "/health", Duration::from_secs(5))
            .await
            .expect("answered on the second connection");
        assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
        // Only once: an engine that never answers is a failure, not a loop.
        let (url, _engine) = closing_engine(false).await;
        let failed = get_small(&client, &url, "/health", Duration::from_secs(5)).await;
        assert!(matches!(failed, Err(ForwardError::Failed)), "{failed:?}");
    }
}
