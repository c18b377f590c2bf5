//! The idle-session sweep: a session idle past its lease (derived from its predicted
//! tool-call gap) is demoted in the directory, keeping its sealed prefix artifact, and its
//! owner drops the unsealed tail from HBM. An engine with a host-DRAM tier offloads the
//! dropped tail there instead of losing it (the sim engine's `drop`; vLLM's offloading
//! connector holds evicted blocks the same way), and its `BlockStored` events with medium
//! CPU tell the KV index. Its next step is planned as a resume: `tail_recompute` where the
//! artifact is (restoring the tail from host memory when that beats recomputing it), or a
//! fetch or recompute elsewhere.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use ownerserve_ownership::ids::SessionId;
use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::ids::EngineKind;
use ownerserve_shim::engines::sim::{DropRequest, DROP_PATH};

use crate::sessions::{now_ms, Lapsed};
use crate::state::AppState;

/// How often the sweep runs.
const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// Sweeps until `cancel` fires, wherever the sweep waits (a hung directory must not hold
/// up shutdown).
pub async fn run(st: Arc<AppState>, cancel: CancellationToken) {
    let sweep = async {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            for lapsed in st.sessions.lapsed(now_ms()) {
                demote(&st, lapsed).await;
            }
        }
    };
    tokio::select! {
        () = cancel.cancelled() => {}
        () = sweep => {}
    }
}

async fn demote(st: &AppState, l: Lapsed) {
    let Some(sync) = &st.ownership else { return };
    let Some(lookup) = st
        .sources()
        .directory
        .map(|d| d.lookup(Some(&l.session), &[], st.kv.block_size() as u64))
    else {
        return;
    };
    // Only a session still owned by the worker that last served it (no one moved it since).
    let (Some(owner), Some(epoch)) = (lookup.owner, lookup.epoch) else {
        return;
    };
    if owner != l.owner {
        return;
    }
    let command = Command::DemoteSession {
        session: SessionId(l.session.clone()),
        epoch,
    };
    match sync.client().write(command).await {
        Ok(Outcome::Released) => {}
        other => {
            tracing::debug!(session = %l.session, ?other, "demotion not applied");
            return;
        }
    }
    st.metrics.demoted();
    tracing::debug!(session = %l.session, tail_blocks = l.tail.len(), "idle session demoted");
    let Some(w) = st.registry.get(owner) else {
        return;
    };
    // Only the sim engine can drop named blocks; other engines evict the tail by LRU.
    if l.tail.is_empty() || w.spec.engine != EngineKind::Sim {
        return;
    }
    let drop = DropRequest {
        block_hashes: l.tail,
        session: Some(l.session),
        epoch: Some(epoch.0),
    };
    let body = Bytes::from(serde_json::to_vec(&drop).unwrap_or_default());
    if let Err(e) = st
        .engines
        .post(&w.spec.base_url, DROP_PATH, &[], body)
        .await
    {
        tracing::warn!(worker = %w.spec.name, error = %e, "demoted session's tail not dropped");
    }
}
