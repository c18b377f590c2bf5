//! The client API the router serves: [`endpoints`], the one table of its endpoints (path,
//! method, hot or not, disaggregable, error shape, SSE error event, stored or not) that the
//! routes, the hot front, the endpoint picker and the error mapping all read; [`routes`],
//! axum's routes built from that table.

pub(crate) mod client_gate;
pub mod explain;
pub mod headers;

pub mod endpoints;
pub mod routes;

pub use endpoints::{ApiEndpoint, ErrorShape, Serves, SseError, ENDPOINTS};
