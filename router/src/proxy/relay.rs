//! Relay: a worker's response on its way back to the client. Status and headers are
//! copied (minus hop-by-hop ones) with `x-ownerserve-worker` added, and the body is relayed
//! frame by frame; the relay holds the worker's in-flight count and the session's
//! activity until the body is done, and times the first frame.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

use crate::error::ApiError;
use crate::headers;
use crate::registry::{InFlight, Worker};
use crate::sessions::Activity;

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
        parts.headers.insert(headers::WORKER, v);
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
