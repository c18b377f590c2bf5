//! The Raft RPC server (`/raft/*`): the other nodes' AppendEntries, Vote and
//! InstallSnapshot, answered by this node's openraft (the client side is
//! `crate::raft::network`); and, for fault tests only, the route that partitions this
//! node from chosen peers.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::Deserialize;

use crate::raft::{NodeId, TypeConfig};

use super::Node;

/// The largest Raft RPC body read. axum's default (2 MB) refused every `InstallSnapshot`
/// chunk past 0.6 MB of state (openraft sends up to 3 MiB a chunk, each byte a JSON number
/// of up to 4 characters) and every append of more than ~110 router-sized batches, so a
/// follower that fell that far behind never caught up, as a candidate forever (`bench
/// directory --scale`). What a peer sends is bounded by openraft's chunk size and
/// `max_payload_entries` (300 entries, each at most a directory API body), and only peers
/// holding the cluster secret reach these routes.
const MAX_RPC_BODY: usize = 1 << 30;

pub fn routes(node: Arc<Node>) -> Router {
    Router::new()
        .route("/raft/append", post(append))
        .route("/raft/vote", post(vote))
        .route("/raft/snapshot", post(snapshot))
        .layer(DefaultBodyLimit::max(MAX_RPC_BODY))
        .with_state(node)
}

async fn append(
    State(n): State<Arc<Node>>,
    Json(req): Json<AppendEntriesRequest<TypeConfig>>,
) -> Response {
    Json(n.raft.append_entries(req).await).into_response()
}

async fn vote(State(n): State<Arc<Node>>, Json(req): Json<VoteRequest<NodeId>>) -> Response {
    Json(n.raft.vote(req).await).into_response()
}

async fn snapshot(
    State(n): State<Arc<Node>>,
    Json(req): Json<InstallSnapshotRequest<TypeConfig>>,
) -> Response {
    Json(n.raft.install_snapshot(req).await).into_response()
}

#[derive(Deserialize)]
struct Partition {
    /// Peers this node stops talking to (empty: heal).
    blocked: std::collections::BTreeSet<NodeId>,
}

/// Test-only: `POST /test/v1/partition {blocked: [ids]}` (admin token).
pub fn fault_routes(node: Arc<Node>, tokens: Arc<ownerserve_edge::auth::Tokens>) -> Router {
    Router::new()
        .route("/test/v1/partition", post(partition))
        .route_layer(axum::middleware::from_fn_with_state(
            tokens,
            ownerserve_edge::auth::require,
        ))
        .with_state(node)
}

async fn partition(State(n): State<Arc<Node>>, Json(p): Json<Partition>) -> Response {
    n.faults.block(p.blocked);
    StatusCode::NO_CONTENT.into_response()
}
