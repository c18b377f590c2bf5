//! The client API the router serves: [`endpoints`], the one table of its endpoints (path,
//! method, hot or not, disaggregable, error shape, SSE error event, stored or not) that the
//! routes, the hot front, the endpoint picker and the error mapping all read; [`routes`],
//! axum's routes built from that table. Generation on every surface (chat, completions,
//! Messages, Responses) is proxied by [`crate::proxy`]; what a surface serves beyond it has
//! one module each: [`messages`] (count_tokens), [`responses`] (stored answers and their
//! owners), [`models`], and the operators' [`explain`].

pub(crate) mod client_gate;
pub mod explain;
pub mod headers;
pub mod messages;
pub mod models;
pub mod responses;

pub mod endpoints;
pub mod routes;
pub mod tenants;

pub use endpoints::{ApiEndpoint, ErrorShape, Serves, SseError, ENDPOINTS};
