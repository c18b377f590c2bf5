//! What every OwnerServe HTTP server (the router, a directory node) does at its edge.
//!
//! # Layout
//! - [`error_body`]: the one builder of error answers (OpenAI's shape, status headers,
//!   the SSE form); [`anthropic_errors`] rewrites them in Anthropic's shape on
//!   `/v1/messages`.
//! - [`auth`]: bearer tokens with read and admin scopes for `/admin/v1`.
//! - [`api_keys`]: the client API's keys (`/v1`), never passed on to an engine;
//!   [`rate_limit`]: token buckets, one per key.
//! - [`request_id`]: the `X-Request-Id` kept or made; [`tracked`]: the one layer that
//!   gives each request its id, JSON error shape and [`http_metrics`], and puts
//!   it in [`request_scope`] for its log lines.
//! - [`exposition`]: the Prometheus text exposition and registration helpers;
//!   [`runtime_metrics`]: the runtime's live tasks, read at scrape time.
//! - [`process`]: printed lines, binding a listener, signals into a cancellation.
//! - [`serve`]: serving an app over HTTP/1 with connection limits and timeouts.
//!
//! It knows nothing of the proxy or the directory: both build on it.
#![forbid(unsafe_code)]

pub mod anthropic_errors;
pub mod api_keys;
pub mod auth;
pub mod error_body;
pub mod exposition;
pub mod http_metrics;
pub mod process;
pub mod rate_limit;
pub mod request_id;
pub mod request_scope;
pub mod runtime_metrics;
pub mod serve;
pub mod tracked;
