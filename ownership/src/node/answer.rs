//! The node's error answers, shared by its directory API and its operator API: built by
//! `ownerserve_edge` (as every server's are), and a 421 that names the leader.
//!
//! Their body is `{"error": {"message", "type": "directory_error"}, ...extra}`: no `param`
//! or `code` keys (a directory's clients read `message` and the extra fields, such as
//! `leader_id` and `leader_addr`).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use ownerserve_edge::error_body::ErrorBody;

use super::Node;
use crate::raft::NodeId;

/// The directory's error answer; `extra` fields sit beside `error`.
pub fn error(status: StatusCode, message: String, extra: serde_json::Value) -> Response {
    body(status, &message, extra).response()
}

fn body(status: StatusCode, message: &str, extra: serde_json::Value) -> ErrorBody<'_> {
    ErrorBody {
        status,
        message,
        kind: "directory_error",
        code: None,
        extra: match extra {
            serde_json::Value::Object(fields) => fields,
            _ => Default::default(),
        },
    }
}

/// A 421 naming the leader this node knows (`null`s when it knows none).
pub fn forward(n: &Node, leader: Option<NodeId>) -> Response {
    let addr = leader.and_then(|l| n.nodes.get(&l)).map(|b| b.addr.clone());
    error(
        StatusCode::MISDIRECTED_REQUEST,
        "not the leader".into(),
        json!({"leader_id": leader, "leader_addr": addr}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_error_has_no_param_or_code_and_names_the_leader_beside_it() {
        let b = body(
            StatusCode::MISDIRECTED_REQUEST,
            "not the leader",
            json!({"leader_id": 2, "leader_addr": "127.0.0.1:7002"}),
        );
        let v: serde_json::Value = serde_json::from_slice(&b.json()).unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "not the leader", "type": "directory_error"},
                   "leader_id": 2, "leader_addr": "127.0.0.1:7002"})
        );
        let v: serde_json::Value =
            serde_json::from_slice(&body(StatusCode::NOT_FOUND, "no lease 7", json!({})).json())
                .unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "no lease 7", "type": "directory_error"}})
        );
    }
}
