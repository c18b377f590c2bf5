//! A starting router's copy of a peer router's KV index (`router.kv.peers`).
//!
//! An engine replays only its recent event batches (vLLM keeps 10,000), so a router that
//! starts beside long-running engines learns only the blocks stored since; a block stored
//! under an older one names a parent it never saw, and is refused. In a rolling upgrade
//! that is every long agent session's chain. A peer router that has followed the engines
//! all along holds those chains: before its subscribers start, a new router takes each
//! event-fed worker's holds from the first peer that answers
//! (`GET /admin/v1/kv/workers/{name}/copy`, the peer's [`WorkerCopy`]), with the stream
//! position they end with, and its subscriber resumes the engine's stream there. A copy
//! whose position the engine's replay no longer reaches is dropped by the subscriber as a
//! new engine's would be, so a stale copy costs nothing it would not have lost anyway.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::HeaderValue;
use serde::Serialize;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::WorkerCopy;

use ownerserve_shim::kv_events::shared_index::SharedIndex;

use super::registry::Registry;
use crate::upstream::{get_bounded_as, HttpClient};

/// Longest wait for one peer's copy of one worker.
const COPY_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of a copy's JSON per hold at most (five numbers, the longest 20 digits each, and
/// their keys), and room for the rest.
const BYTES_PER_HOLD: usize = 160;
const COPY_SLACK_BYTES: usize = 1 << 20;

/// What a worker's index was copied from, for `/admin/v1/kv`.
#[derive(Debug, Clone, Serialize)]
pub struct CopiedFrom {
    pub peer: String,
    pub holds: usize,
    /// The stream position the copy ended with.
    pub seq: u64,
}

/// Copies taken at startup, per worker.
#[derive(Debug, Default)]
pub struct Copies(Mutex<HashMap<WorkerId, CopiedFrom>>);

impl Copies {
    pub fn of(&self, worker: WorkerId) -> Option<CopiedFrom> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&worker)
            .cloned()
    }

    /// Whether `worker`'s blocks were copied (on the request path: no clone).
    pub fn contains(&self, worker: WorkerId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&worker)
    }

    fn record(&self, worker: WorkerId, from: CopiedFrom) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(worker, from);
    }
}

/// Takes each event-fed worker's holds into `index` from the first of `peers` that has
/// them (recording it in `copies`), calling them with this router's admin `token`
/// (replicas share their tokens). Call it before the subscribers start. A peer that
/// refuses or sends what cannot be taken is logged and the next one asked (one that does
/// not answer at all is skipped from then on); a worker no peer answers for is left to its
/// engine's replay.
pub async fn copy_from_peers(
    index: &SharedIndex,
    copies: &Copies,
    registry: &Registry,
    peers: &[String],
    client: &HttpClient,
    token: &str,
    max_blocks: usize,
) {
    if peers.is_empty() {
        return;
    }
    let auth = HeaderValue::from_str(&format!("Bearer {token}")).ok();
    // Every tier of every block, at the index's limit.
    let limit = max_blocks
        .saturating_mul(3 * BYTES_PER_HOLD)
        .saturating_add(COPY_SLACK_BYTES);
    // A peer that did not answer at all (down, still starting, hung) is not asked again:
    // the router's start waits at most one timeout per peer.
    let mut silent: Vec<&String> = Vec::new();
    for w in registry.all().iter().filter(|w| w.spec.kv_events.is_some()) {
        let path = format!("/admin/v1/kv/workers/{}/copy", w.spec.name);
        for peer in peers {
            if silent.contains(&peer) {
                continue;
            }
            let copy = match get_bounded_as(client, peer, &path, auth.as_ref(), limit, COPY_TIMEOUT)
                .await
            {
                Ok((status, body)) if status.is_success() => {
                    serde_json::from_slice::<WorkerCopy>(&body).map_err(|e| e.to_string())
                }
                Ok((status, _)) => Err(format!("answered {status}")),
                Err(e) => {
                    silent.push(peer);
                    Err(e.to_string())
                }
            };
            let taken = copy.and_then(|c| {
                let taken = index.lock().take_copy(w.id, &c);
                taken
                    .map(|n| (n, c.position.seq))
                    .map_err(|e| e.to_string())
            });
            match taken {
                Ok((holds, seq)) => {
                    tracing::info!(worker = %w.spec.name, %peer, holds, seq, "kv index: copied the worker's blocks from a peer router");
                    copies.record(
                        w.id,
                        CopiedFrom {
                            peer: peer.clone(),
                            holds,
                            seq,
                        },
                    );
                    break;
                }
                Err(error) => {
                    tracing::warn!(worker = %w.spec.name, %peer, %error, "kv index: no copy from this peer");
                }
            }
        }
    }
}
