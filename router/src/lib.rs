//! The OwnerServe router: an OpenAI-compatible proxy that plans every agent step with the
//! cost planner and the ownership directory, and its operator API.
//!
//! # Layout
//! - [`config`]: TOML + env + flags, validated before any socket opens.
//! - [`api`]: the client API's endpoints, one table (path, method, hot, disaggregable,
//!   error shape, SSE error event, stored) every route, the endpoint picker and the error
//!   mapping read, and the routes built from it.
//! - [`state`]: what every handler and stage reads; [`server`]: builds it, starts the
//!   router's tasks, and serves its routes; [`error`] maps every error to
//!   HTTP (its bodies built by `ownerserve_edge`, which also guards the operator API with
//!   bearer tokens and gives each request its id); [`headers`] names every header a
//!   client sends or gets.
//! - [`proxy`]: the request path, one stage per file (ingress → identity → view → plan →
//!   dispatch → relay → feedback); [`explain`] answers `/admin/v1/plan/explain` through
//!   the same stages without dispatching.
//! - [`prompt`]: the prompt on the router's side: each model's tokenizer (its own, its
//!   engine's `/tokenize`, or the built-in one), block hashes, each session's last prompt
//!   and a long prompt's computation, one per input at a time.
//! - [`admission`]: per-model slots and a bounded queue in front of the request path;
//!   `client_gate`: `/v1`'s API keys and per-key rate limits, before a body is read.
//! - [`response_owners`]: which worker holds each stored Responses answer: recorded in the
//!   directory as it is relayed, with this router's own records in front.
//! - [`registry`] and `health`: the workers and their health; `discovery` (feature
//!   `kubernetes`): workers found from the Kubernetes API joining and leaving it at run
//!   time, each with its probe and scrape tasks (`worker_tasks`).
//! - [`kv`]: the KV index, its event subscribers, load scrapers and expiry;
//!   `engine_report`: what each engine reports about itself, read once at startup (its
//!   KV block size, SGLang's step budget); `step_budget`: the engines' step budgets the
//!   planner prices prefills in.
//! - [`upstream`]: the pooled client and the streaming relay to and from workers;
//!   `busy_poll`: the runtime kept polling its sockets for a short window after each
//!   request's activity, instead of parking.
//! - [`up`]: the whole stack in one process; [`ha_directory`]: `up --ha`'s directory, a
//!   3-node Raft cluster of child processes; [`scratch_dir`]: the never-reused temp folder
//!   of a directory kept only while its process runs.
//! - `ownership_sync`: what the router records in the ownership directory (the node and
//!   its clients are `ownerserve_ownership::node`'s) and the workers' leases there (one per
//!   worker, shared by every router); `replica_admin`: the operator view of a remote
//!   cluster from this router's live replica.
//! - [`metrics`]: the router's Prometheus metrics; [`logging`] text or JSON logs.
//! - [`ctl`]: `ownerserve ctl`, the operator API from the command line.
//! - `epp` (feature `kubernetes`): `ownerserve epp`, the Gateway API Inference Extension
//!   endpoint picker (Envoy ext_proc), planning through the proxy's own stages.
#![forbid(unsafe_code)]
// Every function of the request path fits on a screen (issue 14); the threshold is in
// clippy.toml.
#![warn(clippy::too_many_lines)]

pub mod admission;
pub mod api;
mod busy_poll;
mod client_gate;
pub mod config;
pub mod ctl;
mod demotion;
#[cfg(feature = "kubernetes")]
pub mod discovery;
mod engine_report;
#[cfg(feature = "kubernetes")]
pub mod epp;
pub mod error;
pub mod explain;
pub mod ha_directory;
pub mod headers;
mod health;
pub mod kv;
pub mod logging;
pub mod metrics;
mod ownership_sync;
pub mod prompt;
pub mod proxy;
pub mod registry;
mod replica_admin;
pub mod response_owners;
pub mod scratch_dir;
pub mod server;
mod sessions;
pub mod state;
mod step_budget;
pub mod up;
pub mod upstream;
mod worker_tasks;
