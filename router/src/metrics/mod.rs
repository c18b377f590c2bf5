//! Prometheus metrics (`GET /metrics`, `ownerserve_*`): one [`Registry`] per process, with
//! the pieces each process runs registered into it.
//!
//! - [`http`]: requests by route, status and action, and their duration (every server).
//! - [`proxy`]: what the router decides and moves: plans, planner cost terms, fallbacks,
//!   owner hits, KV bytes moved, queue time and time to first token.
//! - [`fleet`]: the workers as the router sees them (health, in-flight, scraped load and
//!   KV usage, KV events and gaps, the KV index and its HBM duplication), read at scrape
//!   time.
//! - [`directory`]: the ownership directory and its Raft node (gauges read at scrape time,
//!   counters kept by the replicated state machine).
//! - [`scrape`]: the router's `/metrics` and `/metrics/targets` handlers.
//!
//! Labels are bounded: routes, actions, classes, cost terms, commands and worker names
//! (the fleet is fixed by config); never sessions, prefixes or request ids.

pub mod directory;
pub mod fleet;
pub mod http;
pub mod proxy;
pub mod scrape;

use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The text exposition's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Latency buckets, seconds: 1 ms to 5 min.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// The whole exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    // Encoding only fails on a family without samples' type, which registration rules out;
    // an empty page is the honest fallback.
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::warn!(error = %e, "metrics encoding failed");
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Raises `counter` to `total`, a monotonic count kept elsewhere and read at scrape time.
pub fn sync_counter(counter: &IntCounter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

pub(crate) fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntCounterVec> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

pub(crate) fn float_counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<CounterVec> {
    let c = CounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

pub(crate) fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
) -> prometheus::Result<IntCounter> {
    let c = IntCounter::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

pub(crate) fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

pub(crate) fn int_gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

pub(crate) fn int_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
) -> prometheus::Result<IntGauge> {
    let g = IntGauge::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<Gauge> {
    let g = Gauge::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

pub(crate) fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> prometheus::Result<Histogram> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}

pub(crate) fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> prometheus::Result<HistogramVec> {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )?;
    registry.register(Box::new(h.clone()))?;
    Ok(h)
}
