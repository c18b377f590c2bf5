//! The directory API (`/directory/v1`): commands (a follower forwards a write to the
//! leader once), the linearizable state, and the cluster's Raft status.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::error::{ClientWriteError, RaftError};
use serde::Deserialize;
use serde_json::json;

use crate::ids::ClientId;
use crate::Command;

use super::answer::{error, forward};
use super::Node;

pub fn routes(node: Arc<Node>) -> Router {
    Router::new()
        .route("/directory/v1/commands", post(command))
        .route("/directory/v1/state", get(state))
        .route("/directory/v1/cluster", get(cluster))
        .route("/directory/v1/watch", get(super::watch::watch))
        .with_state(node)
}

#[derive(Deserialize)]
struct CommandRequest {
    #[serde(default)]
    client: Option<(ClientId, u64)>,
    command: Command,
}

/// Marks a write already forwarded once, so a stale leader view cannot bounce it around.
pub(super) const FORWARDED: &str = "x-ownerserve-forwarded";

async fn command(
    State(n): State<Arc<Node>>,
    headers: axum::http::HeaderMap,
    Json(req): Json<CommandRequest>,
) -> Response {
    // A command of a newer version than the directory runs: the leader refuses it rather
    // than propose it, since a member of an older release could not decode its entry
    // (`upgrade`).
    if let Some(outcome) = n.held(&req.command).await {
        return Json(json!({"outcome": outcome, "log_index": null})).into_response();
    }
    let body = json!({"client": req.client, "command": req.command});
    match n.propose(req.command, req.client).await {
        Ok(resp) => {
            Json(json!({"outcome": resp.data, "log_index": resp.log_id.index})).into_response()
        }
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            let leader = f
                .leader_id
                .and_then(|l| n.nodes.get(&l))
                .map(|b| b.addr.clone());
            match leader {
                // Forward once to the leader and relay its answer; the client's (client, seq)
                // makes a retry of the same command safe if this hop fails midway.
                Some(addr) if !headers.contains_key(FORWARDED) => {
                    let sent = n
                        .forwarder
                        .post(format!("http://{addr}/directory/v1/commands"))
                        .header(FORWARDED, "1")
                        .json(&body)
                        .send()
                        .await;
                    match sent {
                        Ok(r) => {
                            let status = StatusCode::from_u16(r.status().as_u16())
                                .unwrap_or(StatusCode::BAD_GATEWAY);
                            let v: serde_json::Value = r.json().await.unwrap_or_default();
                            (status, Json(v)).into_response()
                        }
                        Err(_) => forward(&n, f.leader_id),
                    }
                }
                _ => forward(&n, f.leader_id),
            }
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), json!({})),
    }
}

async fn state(State(n): State<Arc<Node>>) -> Response {
    match n.read_barrier().await {
        Ok(()) => n.machine.read(|s| {
            Json(json!({"directory": s.directory, "last_applied": s.last_applied})).into_response()
        }),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => forward(&n, f.leader_id),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), json!({})),
    }
}

async fn cluster(State(n): State<Arc<Node>>) -> Response {
    let m = n.raft.metrics().borrow().clone();
    Json(json!({
        "id": n.id,
        "leader": m.current_leader,
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "last_applied": m.last_applied.map(|l| l.index),
        "members": m.membership_config.membership().voter_ids().collect::<Vec<_>>(),
        "state": format!("{:?}", m.state),
        "release": env!("CARGO_PKG_VERSION"),
        "version": n.versions(),
    }))
    .into_response()
}
