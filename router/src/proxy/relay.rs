//! Relay: a worker's response on its way back to the client. Status and headers are
//! copied (minus hop-by-hop ones) with `x-ownerserve-worker` added, and the body is relayed
//! frame by frame; the relay holds the worker's in-flight count and the session's
//! activity until the body is done, and times the first frame and, for a stream that
//! ends well, its decode (first frame to end).

use ownerserve_shim::openai::Endpoint;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, HeaderName, HeaderValue, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::api::headers;
use crate::error::ApiError;
use crate::fleet::registry::{InFlight, Worker};
use crate::ownership::sessions::Activity;
use crate::proxy::receipt::Check;

const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
];

/// Where a stream that ended well reports how long it decoded: from its first frame (the
/// engine's first token) to its last.
pub type Decoded = Box<dyn FnOnce(Duration) + Send>;

/// Where the time to a response's first byte goes, and its decode time.
pub struct FirstByte {
    pub histogram: prometheus::Histogram,
    /// When the client's request arrived.
    pub started: Instant,
    /// Told the decode time of a streamed (SSE) response that ends without a failure. A
    /// response that is not streamed arrives whole after its decode, so its frames time
    /// nothing and it reports nothing; nor does one the client leaves.
    pub decoded: Option<Decoded>,
}

/// What reads a worker's answer as it passes: the session's activity (kept busy until the
/// body is done, told how it ended), the time to its first frame, the route receipt.
#[derive(Default)]
pub struct Watchers {
    pub activity: Option<Activity>,
    pub first_byte: Option<FirstByte>,
    pub check: Option<Check>,
}

/// How long a body may stay silent, and what a silent worker costs it.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// Longest wait for a body's first frame (a stream's first token comes after the
    /// engine queued and prefilled the prompt).
    pub first: Duration,
    /// Longest gap between two frames after that.
    pub idle: Duration,
    /// Failed health checks that mark a worker down; a silent stream counts as one.
    pub failure_threshold: u32,
}

/// Turns a worker's response into the client's: same status and headers (minus hop-by-hop
/// ones), plus `x-ownerserve-worker`, with the body relayed frame by frame. `activity`
/// keeps the session busy until the body is done; `first_byte` times its first frame. A
/// worker silent for `patience.first` before its first frame or `patience.idle` between
/// two ends the body (an SSE client gets an error event and `[DONE]`) and counts as a
/// failed health check.
///
/// The body is hyper's in the router, any body of bytes in the fuzz target (scripted
/// frames in memory).
pub fn relay<B>(
    resp: Response<B>,
    worker: &Arc<Worker>,
    in_flight: InFlight,
    watchers: Watchers,
    patience: Patience,
    endpoint: Endpoint,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    let Watchers {
        activity,
        first_byte,
        check,
    } = watchers;
    let (mut parts, incoming) = resp.into_parts();
    for h in HOP_BY_HOP {
        parts.headers.remove(h);
    }
    parts.headers.remove("keep-alive");
    if let Ok(v) = HeaderValue::from_str(&worker.spec.name) {
        parts.headers.insert(headers::WORKER, v);
    }
    if let Some(v) = check.as_ref().and_then(Check::header) {
        parts.headers.insert(headers::RECEIPT, v);
    }
    // A receipt written into the body changes its length.
    let rewrites = check.as_ref().is_some_and(Check::rewrites_body);
    if rewrites {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    // An error answer keeps no promise and breaks none.
    let check = check.filter(|_| parts.status.is_success());
    // Passive health: an answer that is not a server error shows the worker serving.
    if !parts.status.is_server_error() {
        worker.record_progress();
    }
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = RelayBody {
        inner: incoming,
        sse,
        worker: worker.clone(),
        failed: false,
        in_flight,
        activity,
        first_byte,
        decoding: None,
        patience,
        silent_after: tokio::time::Instant::now() + patience.first,
        idle: None,
        endpoint,
        check,
        rewrites,
    };
    Response::from_parts(parts, Body::new(body))
}

/// A worker's response body on its way to the client. If the worker dies mid-stream, an SSE
/// client gets a final error event and `[DONE]` instead of a silently cut stream; other
/// clients see the connection fail. Holds the worker's in-flight count until done.
struct RelayBody<B> {
    inner: B,
    sse: bool,
    worker: Arc<Worker>,
    failed: bool,
    in_flight: InFlight,
    /// The session's activity: read for how the response ended, dropped when it has.
    activity: Option<Activity>,
    first_byte: Option<FirstByte>,
    /// A stream's first frame and where its decode time goes once it ends.
    decoding: Option<(Instant, Decoded)>,
    patience: Patience,
    /// When the worker's silence ends the body: `patience.first` after the relay began,
    /// then `patience.idle` after each frame.
    silent_after: tokio::time::Instant,
    /// The timer for `silent_after`, made only once the body has to wait (a whole answer
    /// that is ready at once, the common case, never touches the timer wheel).
    idle: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The API whose error event ends a failed stream.
    endpoint: Endpoint,
    /// The step's route receipt, checked against the engine's report in the answer.
    check: Option<Check>,
    /// The receipt is written into the body: its length is not the worker's.
    rewrites: bool,
}

/// Why a relayed body ended early (a non-SSE client sees its connection fail).
#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("{0}")]
    Worker(String),
    #[error("worker {0} sent nothing for {1:?} mid-body")]
    Silent(String, Duration),
}

impl<B: http_body::Body> RelayBody<B> {
    /// Times a frame: the first one (the engine's first token) ends the time to first byte
    /// and, on a stream, starts its decode time.
    fn timed_frame(&mut self) {
        if let Some(f) = self.first_byte.take() {
            f.histogram.observe(f.started.elapsed().as_secs_f64());
            if self.sse {
                self.in_flight.decoding();
                self.decoding = f.decoded.map(|d| (Instant::now(), d));
            }
        }
    }

    /// Reports the decode time of a stream that has ended without failing, and checks
    /// the receipt of any answer that has.
    fn decode_ended(&mut self) {
        if let Some((first, decoded)) = self.decoding.take().filter(|_| !self.failed) {
            decoded(first.elapsed());
        }
        if let Some(check) = self.check.take().filter(|_| !self.failed) {
            check.ended();
        }
    }

    /// Whether the worker has been silent past `silent_after` (else the timer wakes `cx`
    /// when it will have been).
    fn silence_over(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = self.silent_after;
        let idle = self
            .idle
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if idle.deadline() != deadline {
            idle.as_mut().reset(deadline);
        }
        idle.as_mut().poll(cx).is_ready()
    }

    /// Ends the body: an SSE client gets `err` as an event and `[DONE]`.
    fn fail(
        &mut self,
        err: ApiError,
        cause: RelayError,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        self.failed = true;
        if self.sse {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(
                err.sse_event_for(self.endpoint),
            )))))
        } else {
            Poll::Ready(Some(Err(cause)))
        }
    }
}

impl<B> http_body::Body for RelayBody<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let mut polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &mut polled {
            // Read before the end is handled: a whole answer comes as one last frame.
            if let (Some(c), Some(data)) = (self.check.as_mut(), frame.data_ref()) {
                c.saw(data);
                if let Some(stamped) = c.stamped(data) {
                    *frame = Frame::data(stamped);
                }
            }
            self.worker.record_progress();
            self.in_flight.prefill_done();
            self.timed_frame();
            if self.inner.is_end_stream() {
                self.decode_ended();
            }
            self.silent_after = tokio::time::Instant::now() + self.patience.idle;
        }
        match polled {
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!(worker = %self.worker.spec.name, error = %e, "worker failed mid-stream");
                self.worker
                    .record_failure(self.patience.failure_threshold, "failed mid-stream");
                let err = ApiError::UpstreamUnreachable {
                    worker: self.worker.spec.name.clone(),
                };
                self.fail(err, RelayError::Worker(e.to_string()))
            }
            Poll::Pending if self.silence_over(cx) => {
                let after = if self.first_byte.is_some() {
                    self.patience.first
                } else {
                    self.patience.idle
                };
                let name = self.worker.spec.name.clone();
                tracing::warn!(worker = %name, ?after, "worker went silent mid-stream; ending it");
                self.worker
                    .record_failure(self.patience.failure_threshold, "silent mid-stream");
                let err = ApiError::UpstreamTimeout {
                    worker: name.clone(),
                    after,
                };
                self.fail(err, RelayError::Silent(name, after))
            }
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(a), Some(data)) = (self.activity.as_mut(), frame.data_ref()) {
                    a.saw(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                self.decode_ended();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse || self.rewrites {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http_body_util::BodyExt;
    use ownerserve_planner::ids::{EngineKind, Role, WorkerId};
    use ownerserve_planner::policy::PrefillCharge;

    use super::*;
    use crate::config::WorkerSpec;
    use crate::fleet::registry::Registry;

    /// A worker's body: these frames, then the end or a failure.
    struct Scripted(VecDeque<Result<Bytes, std::io::Error>>);

    impl http_body::Body for Scripted {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|r| r.map(Frame::data)))
        }
    }

    /// A worker's two-frame response (then a failure if `fails`; an SSE stream if `sse`)
    /// relayed for a request of 500 prompt tokens, its decode time reported to `decoded`:
    /// the client's body and the worker.
    fn relayed(sse: bool, fails: bool, decoded: Option<Decoded>) -> (Body, Arc<Worker>) {
        relayed_frames(
            &["data: {\"a\":1}\n\n", "data: [DONE]\n\n"],
            sse,
            fails,
            decoded,
            None,
        )
    }

    /// `relayed` with these frames, for the session whose step `activity` is.
    fn relayed_frames(
        script: &[&'static str],
        sse: bool,
        fails: bool,
        decoded: Option<Decoded>,
        activity: Option<Activity>,
    ) -> (Body, Arc<Worker>) {
        let registry = Registry::new(vec![WorkerSpec::new(
            "w0",
            "http://127.0.0.1:9",
            Role::Hybrid,
            EngineKind::Vllm,
        )]);
        let worker = registry.get(WorkerId(0)).expect("worker");
        let mut frames: VecDeque<_> = script
            .iter()
            .map(|f| Ok(Bytes::from_static(f.as_bytes())))
            .collect();
        if fails {
            frames.push_back(Err(std::io::Error::other("worker died")));
        }
        let mut resp = Response::new(Scripted(frames));
        if sse {
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
        }
        let first_byte = FirstByte {
            histogram: prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("t", "t"))
                .expect("histogram"),
            started: Instant::now(),
            decoded,
        };
        let patience = Patience {
            first: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            failure_threshold: 1_000_000,
        };
        let body = relay(
            resp,
            &worker,
            worker.start_request(1, PrefillCharge::computed(1), 500),
            Watchers {
                activity,
                first_byte: Some(first_byte),
                check: None,
            },
            patience,
            Endpoint::ChatCompletions,
        )
        .into_body();
        (body, worker)
    }

    /// How many decode times a relayed response reported.
    async fn decodes_reported(sse: bool, fails: bool) -> usize {
        let reported = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&reported);
        let (body, _worker) = relayed(
            sse,
            fails,
            Some(Box::new(move |_| {
                seen.fetch_add(1, Ordering::Relaxed);
            })),
        );
        let _ = body.collect().await;
        reported.load(Ordering::Relaxed)
    }

    /// The KV tokens the worker counts among its decodes' ages after the relayed body's
    /// first frame, and after its end.
    async fn decode_counted(sse: bool) -> (u64, u64) {
        let (mut body, worker) = relayed(sse, false, None);
        let _ = body.frame().await;
        let decoding = worker.decode_ages(1.0).total();
        let _ = body.collect().await;
        (decoding, worker.decode_ages(1.0).total())
    }

    #[tokio::test]
    async fn a_stream_counts_among_its_workers_decodes_from_its_first_frame_to_its_end() {
        assert_eq!(decode_counted(true).await, (500, 0));
        // A whole body's decode was over before it came: its age is unknown.
        assert_eq!(decode_counted(false).await, (0, 0));
    }

    #[tokio::test]
    async fn only_a_stream_that_ends_well_reports_its_decode_time() {
        assert_eq!(decodes_reported(true, false).await, 1, "a finished stream");
        assert_eq!(decodes_reported(true, true).await, 0, "a broken stream");
        // A response that is not streamed arrives whole: its frames time nothing.
        assert_eq!(decodes_reported(false, false).await, 0, "a whole body");
    }

    #[tokio::test]
    async fn the_session_learns_how_its_streamed_response_ended() {
        use crate::ownership::session_life::StepKv;
        use crate::ownership::sessions::{now_ms, Sessions};
        use ownerserve_planner::ewma::GapLease;
        use ownerserve_planner::lifecycle::GapEstimate;
        let sessions = Sessions::new(
            GapLease::new(2.0, 100, 60_000),
            GapEstimate::from_median_p90(5.0, 60.0),
        );
        let started = sessions.start("s", WorkerId(0), vec![], now_ms(), StepKv::default());
        let (body, _worker) = relayed_frames(
            &[
                "data: {\"choices\":[{\"delta\":{\"tool_calls\":[]},\"finish_reason\":null}]}\n\n",
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
                "data: [DONE]\n\n",
            ],
            true,
            false,
            None,
            Some(started.activity),
        );
        let _ = body.collect().await;
        let (rows, _, _) = sessions.lifecycle_view(10, now_ms());
        assert_eq!(rows.first().map(|r| r.ending), Some("tool_call"));
    }
}
