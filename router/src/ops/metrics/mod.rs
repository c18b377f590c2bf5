//! The router's Prometheus metrics (`GET /metrics`, `ownerserve_*`), registered into the
//! one registry of its process.
//!
//! - [`proxy`]: what the router decides and moves: plans, planner cost terms, fallbacks,
//!   owner hits, KV bytes moved, queue time and time to first token.
//! - [`fleet`]: the workers as the router sees them (health, in-flight, scraped load and
//!   KV usage, KV events and gaps, the KV index and its HBM duplication), read at scrape
//!   time.
//! - [`scrape`]: the router's `/metrics` and `/metrics/targets` handlers.
//!
//! Requests by route, status and action are counted by `ownerserve_edge::http_metrics`
//! (every server); the embedded directory's metrics are `ownerserve_ownership::node`'s.
//! Labels are bounded: routes, actions, classes, cost terms, commands and worker names
//! (the fleet is fixed by config); never sessions, prefixes or request ids.

pub mod admission;
pub mod fleet;
pub mod lifecycle;
pub mod proxy;
pub mod scrape;
