//! The OwnerServe router: an OpenAI-compatible proxy that plans every agent step with the
//! cost planner and the ownership directory, and its operator API. This file only wires;
//! the modules are grouped by who they serve.
//!
//! # Layout
//! - [`proxy`]: the request path, one stage per file (ingress → identity → view → plan →
//!   claim → dispatch → relay → feedback), with the admission in front of it
//!   ([`proxy::admission`]: per-model slots and a queue ordered by class, returning step
//!   and deadline; [`proxy::tenant_budget`]: tenants' fleet-wide token and session
//!   budgets) and the busy polling after a request's activity.
//! - [`prompt`]: the prompt on the router's side: the tokenizer each model uses, the
//!   engines' `/tokenize` client, each session's last prompt, one computation per long
//!   input at a time, block hashes.
//! - [`api`]: what clients and operators call: the one table of the client API's
//!   endpoints and the routes built from it, `/v1`'s API keys, rate limits and tenants,
//!   the header names, `/admin/v1/plan/explain` (the proxy's stages without dispatching).
//! - [`fleet`]: the workers: membership and health ([`fleet::registry`]), Kubernetes
//!   discovery (feature `kubernetes`), what each engine reports about itself and its step
//!   budget, the KV index with its event subscribers and load scrapers ([`fleet::kv`]).
//! - [`ownership`]: what the router records in the ownership directory and the workers'
//!   leases, idle sessions and their demotion, stored responses' owners, the operator view
//!   of a remote cluster (the directory itself is `ownerserve_ownership`'s).
//! - [`upstream`]: the pooled HTTP/1.1 client and the streaming relay to and from workers.
//! - [`server`]: builds the shared state ([`server::state`]), starts the router's tasks
//!   and serves its routes; [`error`] maps every error to HTTP (bodies built by
//!   `ownerserve_edge`).
//! - [`ops`]: running it: `up` (the whole stack in one process, `up --ha`'s directory
//!   cluster, their temp folders), Prometheus metrics, logs.
//! - [`config`]: TOML + env + flags, validated before any socket opens.
//! - [`ctl`]: `ownerserve ctl`, the operator API from the command line.
//! - `epp` (feature `kubernetes`): `ownerserve epp`, the Gateway API Inference Extension
//!   endpoint picker (Envoy ext_proc), planning through the proxy's own stages.
#![forbid(unsafe_code)]
// Every function of the request path fits on a screen (issue 14); the threshold is in
// clippy.toml.
#![warn(clippy::too_many_lines)]

pub mod api;
pub mod config;
pub mod ctl;
#[cfg(feature = "kubernetes")]
pub mod epp;
pub mod error;
pub mod fleet;
pub mod ops;
pub mod ownership;
pub mod prompt;
pub mod proxy;
pub mod server;
pub mod upstream;
