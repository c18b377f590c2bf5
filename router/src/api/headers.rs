//! Every header name the router reads from a client or sets for one. Headers the engines
//! read or set (`x-ownerserve-session`, `-epoch`, `-kv-received-bytes`) are in
//! `ownerserve_shim::engines`; `x-request-id` is in `ownerserve_edge::request_id`.

use axum::http::HeaderName;

/// Request: the agent session a step belongs to.
pub const SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");
/// Request: the step forks its session (`1`/`true`, or the child session's name).
pub const FORK: HeaderName = HeaderName::from_static("x-ownerserve-fork");
/// Response: the worker that served the request.
pub const WORKER: HeaderName = HeaderName::from_static("x-ownerserve-worker");
/// Response: the session's ownership epoch the step ran under (sessions with an owner).
pub const EPOCH: HeaderName = HeaderName::from_static("x-ownerserve-epoch");
