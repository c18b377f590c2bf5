//! HTTP requests by route (axum's matched path, so bounded), status and executed action,
//! and their duration until the response body ended (a stream's last chunk included).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use prometheus::{Histogram, HistogramVec, IntCounterVec, Registry};

use crate::exposition::{counter_vec, histogram_vec, LATENCY_BUCKETS};

/// Set by a handler in a response's extensions: what the request executed (the proxy's
/// plan action), for the `action` label.
#[derive(Debug, Clone, Copy)]
pub struct Executed(pub &'static str);

/// Request counters and durations.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
}

impl HttpMetrics {
    /// Registers the HTTP metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            requests: counter_vec(
                registry,
                "ownerserve_http_requests_total",
                "HTTP requests answered, by route, status and the action a proxied step executed (none otherwise).",
                &["route", "status", "action"],
            )?,
            duration: histogram_vec(
                registry,
                "ownerserve_http_request_duration_seconds",
                "Time from a request's arrival until its response body ended, by route.",
                &["route"],
                LATENCY_BUCKETS,
            )?,
        })
    }

    /// Counts an answered request and returns the histogram its duration goes to.
    pub fn answered(&self, route: &str, status: &str, action: Option<&str>) -> Histogram {
        let action = action.unwrap_or("none");
        self.requests
            .with_label_values(&[route, status, action])
            .inc();
        self.duration.with_label_values(&[route])
    }
}

/// A response body that records its request's duration when it ends or is dropped.
pub struct TimedBody {
    inner: Body,
    histogram: Histogram,
    started: Instant,
    observed: bool,
}

impl TimedBody {
    /// Wraps `inner`; the request started at `started`.
    pub fn new(inner: Body, histogram: Histogram, started: Instant) -> Self {
        Self {
            inner,
            histogram,
            started,
            observed: false,
        }
    }

    fn observe(&mut self) {
        if !self.observed {
            self.observed = true;
            self.histogram.observe(self.started.elapsed().as_secs_f64());
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.observe();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        self.observe();
    }
}
