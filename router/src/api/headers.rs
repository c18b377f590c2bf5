//! Every header name the router reads from a client or sets for one. Headers the engines
//! read or set (`x-ownerserve-session`, `-epoch`, `-kv-received-bytes`) are in
//! `ownerserve_shim::engines`; `x-request-id` is in `ownerserve_edge::request_id`.

use axum::http::HeaderName;

/// Request: the agent session a step belongs to.
pub const SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");
/// Request: the step forks its session (`1`/`true`, or the child session's name).
pub const FORK: HeaderName = HeaderName::from_static("x-ownerserve-fork");
/// Request: what the client asks of its session's life: `close` (end it once this
/// response ends: it is ended in the directory, its KV's pins released, the prompts the
/// router kept for it dropped) or `keep-alive` (`bind`,
/// `open`; optionally `; timeout=<s>`, default 300: it does not lapse before, and its KV is
/// kept as for a session sure to return). Dynamo's `nvext.session_control` in the body
/// says the same.
pub const SESSION_CONTROL: HeaderName = HeaderName::from_static("x-ownerserve-session-control");
/// Response: the worker that served the request.
pub const WORKER: HeaderName = HeaderName::from_static("x-ownerserve-worker");
/// Response: the route receipt (`proxy::receipt`): worker, action, the cached tokens the
/// router predicted, the ownership epoch and the index mode the step was planned in.
pub const RECEIPT: HeaderName = HeaderName::from_static("x-ownerserve-receipt");
/// Response: the session's ownership epoch the step ran under (sessions with an owner).
pub const EPOCH: HeaderName = HeaderName::from_static("x-ownerserve-epoch");
