//! The release sweep. A session idle past its lease (derived from its predicted tool-call
//! gap) is demoted in the directory, keeping its sealed prefix artifact, and its owner
//! drops the unsealed tail from HBM. An engine with a host-DRAM tier offloads the
//! dropped tail there instead of losing it (the sim engine's `drop`; vLLM's offloading
//! connector holds evicted blocks the same way), and its `BlockStored` events with medium
//! CPU tell the KV index. Its next step is planned as a resume: `tail_recompute` where the
//! artifact is (restoring the tail from host memory when that beats recomputing it), or a
//! fetch or recompute elsewhere. The router drops the session's kept prompts then.
//!
//! A session its client closed is over: its kept prompts are dropped at once
//! (`PromptHasher::forget_session`) and it is ended in the directory ([`super::closing`]),
//! its owner dropping its tail the same way.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use ownerserve_ownership::ids::{Epoch, SessionId};
use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::ids::WorkerId;
use ownerserve_shim::engines::{self, sim::DropRequest};

use crate::ownership::closing::Closing;
use crate::ownership::sessions::{now_ms, Lapsed};
use crate::server::state::AppState;

/// How often the sweep runs.
const SWEEP_EVERY: Duration = Duration::from_millis(200);

/// Most of a lease the directory's idle check leaves out. This router's own record of the
/// session's last step is batched and committed after the step ends, so the directory's
/// last write can trail the moment this router saw the session go idle; the window it
/// checks is the lease less this (or less half the lease, if that is shorter).
const RECORD_SLACK_MS: u64 = 1_000;

/// How long the directory must have seen no write of a session this router finds idle
/// past `lease_ms`: its lease, less the time this router's own last record may trail its
/// idle clock. Another router serving the session writes it at every step, well within.
fn idle_window_ms(lease_ms: u64) -> u64 {
    lease_ms - RECORD_SLACK_MS.min(lease_ms / 2)
}

/// Sweeps until `cancel` fires, wherever the sweep waits (a hung directory must not hold
/// up shutdown).
pub async fn run(st: Arc<AppState>, cancel: CancellationToken) {
    let sweep = async {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        let mut closing = Closing::default();
        loop {
            every.tick().await;
            // Closed by their clients first: they asked for it.
            for closed in st.sessions.take_closed() {
                st.prompts.forget_session(&closed.session);
                if st.ownership.is_some() {
                    closing.watch(closed, now_ms());
                }
            }
            end_closed(&st, &mut closing).await;
            // A lapsed session's prompts go too: it may come back, and then its first step
            // reuses the shared start of its prompt and tokenizes the rest (~1 ms for an
            // 85 KB agent prompt), where kept they would fill the cache with sessions that
            // mostly never return.
            for lapsed in st.sessions.lapsed(now_ms()) {
                st.prompts.forget_session(&lapsed.session);
                demote(&st, lapsed).await;
            }
        }
    };
    tokio::select! {
        () = cancel.cancelled() => {}
        () = sweep => {}
    }
}

/// Ends the closed sessions the directory (this router's replica) still shows.
async fn end_closed(st: &AppState, closing: &mut Closing) {
    let Some(sync) = &st.ownership else { return };
    let Some(directory) = st.sources().directory else {
        return;
    };
    let block = st.kv.block_size() as u64;
    let due = closing.due(
        now_ms(),
        |session| st.sessions.tracks(session),
        |session| {
            let lookup = directory.lookup(Some(session), &[], block);
            (lookup.owner, lookup.epoch)
        },
    );
    for command in due {
        let Command::EndSession { session, epoch } = &command else {
            continue;
        };
        let (session, epoch) = (session.0.clone(), *epoch);
        match sync.client().write(command).await {
            Ok(Outcome::SessionEnded) => {}
            other => {
                tracing::debug!(%session, ?other, "closed session not ended");
                continue;
            }
        }
        st.metrics.session_ended();
        tracing::debug!(%session, "closed session ended");
        if let Some((owner, tail)) = closing.ended(&session, epoch) {
            drop_tail(st, owner, session, epoch, tail).await;
        }
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
        idle_ms: Some(idle_window_ms(l.lease_ms)),
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
    drop_tail(st, owner, l.session, epoch, l.tail).await;
}

/// Has `owner` drop `session`'s unsealed `tail` (its blocks past the sealed prefix), once
/// the directory no longer has it decoded there.
async fn drop_tail(st: &AppState, owner: WorkerId, session: String, epoch: Epoch, tail: Vec<u64>) {
    let Some(w) = st.registry.get(owner) else {
        return;
    };
    // Only an engine that drops named blocks (the sim engine) is told to; the others
    // evict the tail by LRU.
    let Some(drop_path) = engines::protocol(w.spec.engine).drop_path() else {
        return;
    };
    if tail.is_empty() {
        return;
    }
    let drop = DropRequest {
        block_hashes: tail,
        session: Some(session),
        epoch: Some(epoch.0),
    };
    let body = Bytes::from(serde_json::to_vec(&drop).unwrap_or_default());
    if let Err(e) = st
        .engines
        .post(&w.spec.base_url, drop_path, &[], body)
        .await
    {
        tracing::warn!(worker = %w.spec.name, error = %e, "demoted session's tail not dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_window_is_the_lease_less_a_record_s_lag() {
        assert_eq!(idle_window_ms(600_000), 599_000);
        assert_eq!(idle_window_ms(5_000), 4_000);
        assert_eq!(idle_window_ms(1_500), 750);
        assert_eq!(idle_window_ms(0), 0);
    }
}
