//! The directory's operator API (`/admin/v1`, bearer-token auth): owners, leases with their
//! remaining TTL and attached keys, sessions and their fork trees; revoking a lease,
//! transferring or releasing a session (CAS on its current epoch); cluster status,
//! learners and membership; a backup (the whole state as a snapshot file, admin token
//! only); and the OpenAPI document. Reads are linearizable: a follower forwards a read to
//! the leader (once) and relays its answer.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use openraft::error::RaftError;
use openraft::BasicNode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::ids::{LeaseId, PrefixKey, SessionId};
use crate::raft::NodeId;
use crate::state::{Artifact, Lease, Session};
use crate::{Command, Directory};

use super::answer::{error, forward};
use super::Node;
use ownerserve_edge::auth::{self, Tokens};

/// The operator API, its OpenAPI document included.
pub fn routes(node: Arc<Node>, tokens: Arc<Tokens>) -> Router {
    let document = Router::new()
        .route("/admin/v1/openapi.json", get(openapi))
        .route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            auth::require,
        ));
    embedded_routes(node, tokens).merge(document)
}

/// The operator API without its OpenAPI document: for a process that embeds the node and
/// serves its own document at `/admin/v1/openapi.json`, naming these routes too (the
/// router's `docs/openapi.json`).
pub fn embedded_routes(node: Arc<Node>, tokens: Arc<Tokens>) -> Router {
    Router::new()
        .route("/admin/v1/owners", get(owners))
        .route("/admin/v1/owners/{key}", get(owner))
        .route("/admin/v1/leases", get(leases))
        .route("/admin/v1/leases/{id}", get(lease).delete(revoke))
        .route("/admin/v1/sessions", get(sessions))
        .route("/admin/v1/sessions/{id}", get(session))
        .route("/admin/v1/sessions/{id}/pin", post(pin_session))
        .route("/admin/v1/sessions/{id}/release", post(release_session))
        .route("/admin/v1/sessions/{id}/transfer", post(transfer_session))
        .route("/admin/v1/cluster", get(cluster))
        .route("/admin/v1/cluster/learners", post(add_learner))
        .route("/admin/v1/cluster/membership", post(change_membership))
        .route("/admin/v1/snapshot", get(snapshot))
        .route_layer(axum::middleware::from_fn_with_state(
            node.clone(),
            forward_reads,
        ))
        .route_layer(axum::middleware::from_fn_with_state(tokens, auth::require))
        .with_state(node)
}

/// Biggest 421 body read for the leader's address.
const MISDIRECTED_BODY_LIMIT: usize = 64 * 1024;

/// Middleware: a read that this node, a follower, answers 421 goes once to the leader
/// the 421 names, with the caller's token, and the leader's answer is relayed. Writes
/// keep their 421 (the client retries them at the leader itself).
async fn forward_reads(
    State(n): State<Arc<Node>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let is_read = req.method() == axum::http::Method::GET;
    let forwarded = req.headers().contains_key(super::api::FORWARDED);
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let authorization = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .cloned();
    let resp = next.run(req).await;
    if !is_read || forwarded || resp.status() != StatusCode::MISDIRECTED_REQUEST {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MISDIRECTED_BODY_LIMIT).await else {
        return error(StatusCode::BAD_GATEWAY, "unreadable 421".into(), json!({}));
    };
    let leader = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["leader_addr"].as_str().map(str::to_owned));
    let Some(addr) = leader else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    let mut get = n
        .forwarder
        .get(format!("http://{addr}{path}"))
        .header(super::api::FORWARDED, "1");
    if let Some(a) = authorization.as_ref().and_then(|a| a.to_str().ok()) {
        get = get.header(reqwest::header::AUTHORIZATION, a);
    }
    match get.send().await {
        Ok(r) => {
            let status =
                StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            match r.bytes().await {
                Ok(body) => (
                    status,
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    body,
                )
                    .into_response(),
                Err(_) => Response::from_parts(parts, axum::body::Body::from(bytes)),
            }
        }
        Err(_) => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

/// Runs `f` on the state after a linearizable read barrier; `None` is a 404 for `what`.
async fn read(n: &Node, what: &str, f: impl FnOnce(&Directory) -> Option<Value>) -> Response {
    match n.read_barrier().await {
        Ok(()) => match n.machine.read(|s| f(&s.directory)) {
            Some(v) => Json(v).into_response(),
            None => error(StatusCode::NOT_FOUND, format!("no {what}"), json!({})),
        },
        Err(RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
            forward(n, f.leader_id)
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), json!({})),
    }
}

async fn propose(n: &Node, command: Command) -> Response {
    match n.propose(command, None).await {
        Ok(resp) => {
            Json(json!({"outcome": resp.data, "log_index": resp.log_id.index})).into_response()
        }
        Err(RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
            forward(n, f.leader_id)
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), json!({})),
    }
}

fn owner_row(k: &PrefixKey, a: &Artifact) -> Value {
    json!({"key": k.0, "owner": a.owner, "epoch": a.epoch, "parent": a.parent,
           "blocks": a.blocks, "locations": a.locations, "ref_count": a.ref_count,
           "needs_recompute": a.needs_recompute})
}

fn lease_row(d: &Directory, id: &LeaseId, l: &Lease) -> Value {
    let remaining = (l.expires_at_ms + d.grace_ms).saturating_sub(d.now_ms);
    json!({"id": id.0, "worker": l.worker, "ttl_ms": l.ttl_ms,
           "remaining_ms": remaining, "keys": l.keys})
}

/// One session as the operator API shows it (owner, epoch, prefix, forks, ...), or `None`
/// when `d` has no such session: what a router answers from its replica too.
pub fn session_view(d: &Directory, id: &str) -> Option<Value> {
    let id = SessionId(id.to_owned());
    d.sessions.get(&id).map(|s| session_row(d, &id, s))
}

fn session_row(d: &Directory, id: &SessionId, s: &Session) -> Value {
    let forks: Vec<&str> = d
        .sessions
        .iter()
        .filter(|(_, c)| c.parent.as_ref() == Some(id))
        .map(|(c, _)| c.0.as_str())
        .collect();
    let root = s.root.as_ref().unwrap_or(id);
    json!({"id": id.0, "owner": s.owner, "epoch": s.epoch, "prefix": s.prefix,
           "tail_tokens": s.tail_tokens, "parent": s.parent, "forks": forks,
           "root": root, "agent_parent": s.agent_parent,
           "pinned": s.pinned, "predicted_tool_gap_ms": s.predicted_tool_gap_ms})
}

async fn owners(State(n): State<Arc<Node>>) -> Response {
    read(&n, "owners", |d| {
        Some(
            json!({"owners": d.artifacts.iter().map(|(k, a)| owner_row(k, a)).collect::<Vec<_>>()}),
        )
    })
    .await
}

async fn owner(State(n): State<Arc<Node>>, Path(key): Path<u64>) -> Response {
    read(&n, &format!("prefix {key}"), |d| {
        d.artifacts
            .get(&PrefixKey(key))
            .map(|a| owner_row(&PrefixKey(key), a))
    })
    .await
}

async fn leases(State(n): State<Arc<Node>>) -> Response {
    read(&n, "leases", |d| {
        let rows: Vec<Value> = d.leases.iter().map(|(id, l)| lease_row(d, id, l)).collect();
        Some(json!({"leases": rows, "now_ms": d.now_ms}))
    })
    .await
}

async fn lease(State(n): State<Arc<Node>>, Path(id): Path<u64>) -> Response {
    read(&n, &format!("lease {id}"), |d| {
        d.leases
            .get(&LeaseId(id))
            .map(|l| lease_row(d, &LeaseId(id), l))
    })
    .await
}

async fn revoke(State(n): State<Arc<Node>>, Path(id): Path<u64>) -> Response {
    propose(&n, Command::RevokeLease { lease: LeaseId(id) }).await
}

async fn sessions(State(n): State<Arc<Node>>) -> Response {
    read(&n, "sessions", |d| {
        Some(json!({"sessions": d.sessions.iter().map(|(id, s)| session_row(d, id, s)).collect::<Vec<_>>()}))
    })
    .await
}

async fn session(State(n): State<Arc<Node>>, Path(id): Path<String>) -> Response {
    let id = SessionId(id);
    read(&n, &format!("session {}", id.0), |d| {
        d.sessions.get(&id).map(|s| session_row(d, &id, s))
    })
    .await
}

#[derive(Deserialize)]
struct Pin {
    pinned: bool,
}

async fn pin_session(
    State(n): State<Arc<Node>>,
    Path(id): Path<String>,
    Json(p): Json<Pin>,
) -> Response {
    let id = SessionId(id);
    match session_now(&n, &id).await {
        Ok((epoch, _, _)) => {
            propose(
                &n,
                Command::PinSession {
                    session: id,
                    epoch,
                    pinned: p.pinned,
                },
            )
            .await
        }
        Err(r) => r,
    }
}

/// The session's current epoch, prefix and tail, read linearizably.
async fn session_now(
    n: &Node,
    id: &SessionId,
) -> Result<(crate::ids::Epoch, Option<crate::ids::PrefixKey>, u32), Response> {
    if n.read_barrier().await.is_err() {
        return Err(forward(n, n.raft.current_leader().await));
    }
    n.machine
        .read(|s| {
            s.directory
                .sessions
                .get(id)
                .map(|x| (x.epoch, x.prefix, x.tail_tokens))
        })
        .ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                format!("no session {}", id.0),
                json!({}),
            )
        })
}

async fn release_session(State(n): State<Arc<Node>>, Path(id): Path<String>) -> Response {
    let id = SessionId(id);
    match session_now(&n, &id).await {
        Ok((epoch, _, _)) => propose(&n, Command::EndSession { session: id, epoch }).await,
        Err(r) => r,
    }
}

#[derive(Deserialize)]
struct Transfer {
    lease: u64,
}

async fn transfer_session(
    State(n): State<Arc<Node>>,
    Path(id): Path<String>,
    Json(t): Json<Transfer>,
) -> Response {
    let id = SessionId(id);
    match session_now(&n, &id).await {
        // CAS on the epoch just read: a concurrent change makes this a clean refusal.
        Ok((epoch, prefix, tail_tokens)) => {
            propose(
                &n,
                Command::SetDecodeOwner {
                    session: id,
                    lease: LeaseId(t.lease),
                    prefix,
                    tail_tokens,
                    predicted_tool_gap_ms: None,
                    expect_epoch: Some(epoch),
                },
            )
            .await
        }
        Err(r) => r,
    }
}

async fn cluster(State(n): State<Arc<Node>>) -> Response {
    let m = n.raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    Json(json!({
        "id": n.id,
        "state": format!("{:?}", m.state),
        "leader": m.current_leader,
        "term": m.current_term,
        "last_log_index": m.last_log_index,
        "committed": m.last_applied.map(|l| l.index),
        "applied": m.last_applied.map(|l| l.index),
        "voters": membership.voter_ids().collect::<Vec<_>>(),
        "learners": membership.learner_ids().collect::<Vec<_>>(),
        "release": env!("CARGO_PKG_VERSION"),
        "version": n.versions(),
    }))
    .into_response()
}

/// The state as a snapshot file's bytes, encoded on a blocking thread: seconds of CPU
/// for a large state, which the runtime's threads keep serving beside.
async fn encode_backup(n: &Arc<Node>) -> Result<Vec<u8>, String> {
    let machine = n.machine.clone();
    match tokio::task::spawn_blocking(move || machine.snapshot_file()?.to_bytes()).await {
        Ok(encoded) => encoded.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// `GET /admin/v1/snapshot` (admin token): the state as of every write acknowledged before
/// the call (a read barrier, then the state read under its lock at one index), as a
/// snapshot file (`crate::raft::format`): a backup, and what `ctl directory restore` reads.
async fn snapshot(State(n): State<Arc<Node>>) -> Response {
    match n.read_barrier().await {
        Ok(()) => match encode_backup(&n).await {
            Ok(bytes) => (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                bytes,
            )
                .into_response(),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e, json!({})),
        },
        Err(RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
            forward(&n, f.leader_id)
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), json!({})),
    }
}

#[derive(Deserialize)]
struct Learner {
    id: NodeId,
    addr: String,
}

async fn add_learner(State(n): State<Arc<Node>>, Json(l): Json<Learner>) -> Response {
    match n.raft.add_learner(l.id, BasicNode::new(l.addr), true).await {
        Ok(r) => Json(json!({"log_index": r.log_id.index})).into_response(),
        Err(RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
            forward(&n, f.leader_id)
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string(), json!({})),
    }
}

#[derive(Deserialize)]
struct Membership {
    voters: BTreeSet<NodeId>,
}

async fn change_membership(State(n): State<Arc<Node>>, Json(m): Json<Membership>) -> Response {
    match n.raft.change_membership(m.voters, false).await {
        Ok(r) => Json(json!({"log_index": r.log_id.index})).into_response(),
        Err(RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f))) => {
            forward(&n, f.leader_id)
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string(), json!({})),
    }
}

async fn openapi() -> Response {
    Json(document()).into_response()
}

/// The OpenAPI document of the operator API (what `GET /admin/v1/openapi.json` answers).
pub fn document() -> Value {
    let op = |summary: &str, scope: &str| json!({"summary": summary, "security": [{"bearer": []}], "x-scope": scope, "responses": {"200": {"description": "ok"}, "401": {"description": "no or unknown token"}, "403": {"description": "read token on a write"}, "421": {"description": "not the leader; body names it"}}});
    json!({
        "openapi": "3.0.3",
        "info": {"title": "OwnerServe directory operator API", "version": env!("CARGO_PKG_VERSION")},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/admin/v1/owners": {"get": op("Prefix artifacts with owner, epoch, locations and ref counts", "read")},
            "/admin/v1/owners/{key}": {"get": op("One prefix artifact", "read")},
            "/admin/v1/leases": {"get": op("Leases with remaining TTL and attached keys", "read")},
            "/admin/v1/leases/{id}": {"get": op("One lease", "read"), "delete": op("Revoke a lease (its keys cascade as on expiry)", "admin")},
            "/admin/v1/sessions": {"get": op("Sessions with decode owner and fork tree", "read")},
            "/admin/v1/sessions/{id}": {"get": op("One session with its forks", "read")},
            "/admin/v1/sessions/{id}/pin": {"post": op("Pin (or unpin) a session to its worker; body {pinned}", "admin")},
            "/admin/v1/sessions/{id}/release": {"post": op("End a session", "admin")},
            "/admin/v1/sessions/{id}/transfer": {"post": op("Move a session to another lease's worker; body {lease}", "admin")},
            "/admin/v1/cluster": {"get": op("Raft status: leader, term, indexes, voters, learners", "read")},
            "/admin/v1/cluster/learners": {"post": op("Add a learner; body {id, addr}", "admin")},
            "/admin/v1/cluster/membership": {"post": op("Change the voters; body {voters: [ids]}", "admin")},
            "/admin/v1/snapshot": {"get": op("A backup: the whole state as a snapshot file, as of every write acknowledged before the call", "admin")},
            "/admin/v1/openapi.json": {"get": op("This document", "read")},
        }
    })
}
