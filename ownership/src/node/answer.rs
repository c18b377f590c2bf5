//! The node's error answers, shared by its directory API and its operator API: built by
//! `ownerserve_edge` (as every server's are), and a 421 that names the leader.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use ownerserve_edge::error_body::ErrorBody;

use super::Node;
use crate::raft::NodeId;

/// The directory's error answer (built by `ownerserve_edge`, as every server's is); its
/// code follows the status, and `extra` fields sit beside `error`.
pub fn error(status: StatusCode, message: String, extra: serde_json::Value) -> Response {
    let code = match status {
        StatusCode::MISDIRECTED_REQUEST => "not_leader",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::BAD_REQUEST => "invalid_request",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "directory_error",
    };
    ErrorBody {
        status,
        message: &message,
        kind: "directory_error",
        param: None,
        code,
        extra: extra.as_object().cloned().unwrap_or_default(),
    }
    .response()
}

pub fn forward(n: &Node, leader: Option<NodeId>) -> Response {
    let addr = leader.and_then(|l| n.nodes.get(&l)).map(|b| b.addr.clone());
    error(
        StatusCode::MISDIRECTED_REQUEST,
        "not the leader".into(),
        json!({"leader_id": leader, "leader_addr": addr}),
    )
}
