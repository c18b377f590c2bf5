//! A router's operator view of a remote directory cluster, read from its live replica
//! (`ownerserve_ownership::node::Replica`), so every router answers the same:
//!
//! - `GET /admin/v1/cluster`: each node's Raft status (members, leader, term, indexes) and
//!   this router's replica: the index it has applied, how far behind the leader's clock
//!   its last entry was, whether it follows a node now;
//! - `GET /admin/v1/sessions/{id}`: the session as this router's replica holds it, with the
//!   index it read at; `?linearizable=true` first commits a read index through the leader
//!   and waits (5 s at most) until the replica has applied it.
//!
//! With the directory embedded, the node's own operator API serves these paths instead.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{json, Value};

use ownerserve_edge::auth::{self, Tokens};
use ownerserve_edge::error_body::ErrorBody;
use ownerserve_ownership::node::admin::session_view;
use ownerserve_ownership::node::client::CATCH_UP;
use ownerserve_ownership::node::{Remote, Replica};

use crate::server::route_table::{admin_route, admin_router, AdminRoute};

pub fn routes(remote: Arc<Remote>, tokens: Arc<Tokens>) -> Router {
    admin_router(table())
        .route_layer(axum::middleware::from_fn_with_state(tokens, auth::require))
        .with_state(remote)
}

/// The routes: each once, for [`routes`] and for the test of `docs/openapi.json`.
pub(crate) fn table() -> [AdminRoute<Arc<Remote>>; 2] {
    [
        admin_route("/admin/v1/cluster", Method::GET, cluster),
        admin_route("/admin/v1/sessions/{id}", Method::GET, session),
    ]
}

/// The replica's state, for `/admin/v1/cluster` and `ctl cluster`.
pub fn replica_status(r: &Replica) -> Value {
    let (entries, reconnects) = r.counts();
    let stamp = r.last_stamp_ms();
    let lag_ms = (stamp > 0).then(|| ownerserve_ownership::node::unix_ms().saturating_sub(stamp));
    json!({
        "applied": r.applied(),
        "synced": r.synced(),
        "connected": r.connected(),
        "entries_applied": entries,
        "reconnects": reconnects,
        "last_entry_age_ms": lag_ms,
    })
}

async fn cluster(State(remote): State<Arc<Remote>>) -> Json<Value> {
    Json(json!({
        "nodes": remote.nodes().await,
        "replica": replica_status(remote.replica()),
    }))
}

async fn session(State(remote): State<Arc<Remote>>, Path(id): Path<String>, uri: Uri) -> Response {
    let linearizable = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "linearizable=true"));
    let replica = remote.replica();
    if linearizable {
        let index = match remote.read_index().await {
            Ok(i) => i,
            Err(e) => return unavailable(&format!("no read index from the directory: {e}")),
        };
        if !replica.wait_applied(index, CATCH_UP).await {
            return unavailable(&format!(
                "this router's replica did not reach index {index} within {CATCH_UP:?}"
            ));
        }
    }
    let (row, index) = replica.read(|d| (session_view(d, &id), d.applied));
    match row {
        Some(mut v) => {
            v["read_at_index"] = json!(index);
            v["linearizable"] = json!(linearizable);
            Json(v).into_response()
        }
        None => failure(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("no session {id}"),
        ),
    }
}

fn unavailable(message: &str) -> Response {
    failure(StatusCode::SERVICE_UNAVAILABLE, "directory_error", message)
}

fn failure(status: StatusCode, kind: &str, message: &str) -> Response {
    ErrorBody {
        status,
        message,
        kind,
        code: None,
        extra: serde_json::Map::new(),
    }
    .response()
}
