//! Claim: a session's owner is decided by the directory, not by the router that saw the
//! request. A step planned on a worker that is not its session's owner in the router's
//! copy of the directory (a new session, a demoted one, or one whose owner cannot serve:
//! drained, down) commits `SetDecodeOwner` for the planned worker before anything is
//! dispatched: compare-and-set on the owner's epoch when it moves off one, on absence when
//! there is none (the directory then grants it only while no live owner holds the
//! session). If the session changed meanwhile, the claim is asked again on absence. If
//! another router won (`Held`), this step goes to the winner's worker instead, never to a
//! second owner. A fork commits its child session (fenced by the parent's epoch) the same
//! way. A step that stays on its owner adds no round trip (its record stays
//! batched in `ownership_sync`), and a migration commits its own flip once the KV is
//! copied (`dispatch`) when this process dispatches it; the endpoint picker, which only
//! answers where the gateway sends the request, claims a migration like any other move.
//!
//! A claim that takes a session off an owner (a known session) holds its step's answer
//! until the read lease has run out after the commit (`settle_move`), as a migration's flip
//! does, so no router still reading its copy as current sends the next step to the owner
//! it left.
//!
//! The claim waits `ownership_claim_timeout` at most (a directory electing a leader); past
//! it the step goes where it was planned, unrecorded (no epoch fences it there: the one it
//! was planned against is the previous owner's, `dispatch::Dispatcher::prepare`), and is
//! counted.

use ownerserve_ownership::ids::{Epoch, SessionId};
use ownerserve_ownership::node::Lookup;
use ownerserve_ownership::{Command, Outcome, Rejection};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::{Decision, Dispatch};

use tokio::time::Instant;

use super::identity::Identity;
use crate::ownership::ownership_sync::owner_claim;
use crate::server::state::AppState;

/// How a step's ownership was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The step stays on its session's owner (or migrates, or has no session, or the
    /// policy reads no directory): nothing to claim.
    Unclaimed,
    /// This router's claim committed: the planned worker owns the session at `epoch`.
    Won(Epoch),
    /// Another router's worker owns it: the step goes there.
    Lost { owner: WorkerId, epoch: Epoch },
    /// The directory did not answer in time or refused the claim; the step goes where it
    /// was planned.
    Failed,
}

impl Settled {
    /// The metrics label.
    pub fn name(self) -> &'static str {
        match self {
            Settled::Unclaimed => "unclaimed",
            Settled::Won(_) => "won",
            Settled::Lost { .. } => "lost",
            Settled::Failed => "failed",
        }
    }
}

/// Claims the session for `decision`'s worker if that is not its owner, and answers how it
/// went, the lookup the step is dispatched under (the won or winning owner and epoch), and,
/// when the claim took the session off an owner, the moment its first step's answer may
/// reach the client (`settle_until`). A migration is left to its dispatch (`dispatches`),
/// which flips the owner after the KV copy; without one (the endpoint picker) it is claimed
/// here like any move.
pub async fn settle(
    st: &AppState,
    id: &Identity<'_>,
    lookup: &Lookup,
    decision: &Decision,
    dispatches: bool,
) -> (Settled, Lookup, Option<Instant>) {
    let (Some(sync), Some(session)) = (&st.ownership, id.session) else {
        return (Settled::Unclaimed, *lookup, None);
    };
    if !st.policy.needs().directory || !lookup.consulted {
        return (Settled::Unclaimed, *lookup, None);
    }
    if let Some(child) = &id.child {
        // The parent keeps its owner and epoch; the fork is fenced as its child
        // (`fork_fence`) once the child is committed, else as the parent.
        return (
            fork(st, session, child, lookup, decision).await,
            *lookup,
            None,
        );
    }
    let migrates = dispatches && matches!(decision.dispatch, Dispatch::Migrate { .. });
    let needed = !migrates && lookup.owner != Some(decision.worker);
    if !needed {
        return (Settled::Unclaimed, *lookup, None);
    }
    let Some(lease) = sync.lease_of(decision.worker) else {
        return (Settled::Failed, *lookup, None);
    };
    let claim = |expect_epoch| owner_claim(session, lease, expect_epoch);
    // Moving off an owner: CAS on its epoch; without one: CAS on absence.
    let expect = lookup.owner.and(lookup.epoch);
    let client = sync.client();
    // Whether the directory held the session under another epoch than none (the claim may
    // take it off an owner some router still reads as live).
    let mut known = lookup.epoch.is_some();
    let answered = tokio::time::timeout(st.cfg.ownership_claim_timeout, async {
        match client.write(claim(expect)).await {
            // The session moved on since the replica read it: take it only if no live
            // owner holds it, else learn who does.
            Ok(Outcome::Rejected(Rejection::StaleEpoch { .. })) if expect.is_some() => {
                known = true;
                client.write(claim(None)).await
            }
            other => other,
        }
    })
    .await;
    let settled = match answered {
        Ok(Ok(Outcome::Owned { epoch, .. })) => Settled::Won(epoch),
        Ok(Ok(Outcome::Held { owner })) => Settled::Lost {
            owner: WorkerId(owner.worker.0),
            epoch: owner.epoch,
        },
        Ok(other) => {
            tracing::debug!(?other, session, "session claim refused");
            Settled::Failed
        }
        Err(_) => {
            tracing::debug!(session, "session claim timed out");
            Settled::Failed
        }
    };
    st.metrics.claim(settled.name());
    let settle_until = (matches!(settled, Settled::Won(_)) && known)
        .then(|| settle_move(st))
        .flatten();
    let mut settled_lookup = *lookup;
    match settled {
        Settled::Won(epoch) => {
            settled_lookup.owner = Some(decision.worker);
            settled_lookup.epoch = Some(epoch);
        }
        Settled::Lost { owner, epoch } => {
            settled_lookup.owner = Some(owner);
            settled_lookup.epoch = Some(epoch);
        }
        Settled::Unclaimed | Settled::Failed => {}
    }
    (settled, settled_lookup, settle_until)
}

/// A fork starts its child session on `decision`'s worker, committed before dispatch and
/// fenced by the parent's epoch; a retried fork whose child exists claims nothing.
async fn fork(
    st: &AppState,
    parent: &str,
    child: &str,
    lookup: &Lookup,
    decision: &Decision,
) -> Settled {
    let (Some(sync), Some(parent_epoch)) = (&st.ownership, lookup.epoch) else {
        return Settled::Unclaimed;
    };
    let Some(lease) = sync.lease_of(decision.worker) else {
        return Settled::Failed;
    };
    let command = Command::Fork {
        parent: SessionId(parent.to_owned()),
        child: SessionId(child.to_owned()),
        lease,
        parent_epoch,
    };
    let answered =
        tokio::time::timeout(st.cfg.ownership_claim_timeout, sync.client().write(command)).await;
    let settled = match answered {
        Ok(Ok(Outcome::Owned { epoch, .. })) => Settled::Won(epoch),
        Ok(Ok(Outcome::Rejected(Rejection::SessionExists(_)))) => return Settled::Unclaimed,
        other => {
            tracing::debug!(?other, parent, child, "fork not committed");
            Settled::Failed
        }
    };
    st.metrics.claim(settled.name());
    settled
}

/// A fork whose child session was committed: the child and its epoch, which the fork's
/// request is fenced as (the worker generates for the child, not for the parent).
pub fn fork_fence<'a>(id: &'a Identity<'_>, settled: Settled) -> Option<(&'a str, Epoch)> {
    match (&id.child, settled) {
        (Some(child), Settled::Won(epoch)) => Some((child.as_str(), epoch)),
        _ => None,
    }
}

/// Where a claimed step goes, and under which lookup: to the winner's worker when another
/// router's claim won and that worker can serve (healthy, not draining, not failed for
/// this step); else as planned, under the lookup it was planned with (a winner that cannot
/// serve lends the step no epoch).
pub fn route(
    st: &AppState,
    (settled, claimed): (Settled, Lookup),
    planned: &Lookup,
    decision: Decision,
    failed: &[WorkerId],
) -> (Decision, Lookup) {
    match settled {
        Settled::Lost { owner, .. } if owner == decision.worker => (decision, claimed),
        Settled::Lost { owner, .. }
            if !failed.contains(&owner)
                && st
                    .registry
                    .get(owner)
                    .is_some_and(|w| w.is_healthy() && !w.is_draining()) =>
        {
            (Decision::single(owner), claimed)
        }
        Settled::Lost { .. } => (decision, *planned),
        _ => (decision, claimed),
    }
}

/// A move of a session off an owner committed just now: its first step's answer reaches
/// the client only once the other routers' read lease has run out, so none of them still
/// sends the session's next step to the owner it left
/// (`ownerserve_ownership::node::read_lease`). The step itself runs meanwhile (a prefill on
/// the new owner usually takes longer). `None`: no router reads this directory but this one.
pub fn settle_move(st: &AppState) -> Option<Instant> {
    let lease = st.ownership.as_ref()?.client().read_lease();
    if lease.is_zero() {
        return None;
    }
    st.metrics.move_settled();
    Some(Instant::now() + lease)
}

/// Brings the router's copy of the directory up to the leader's commit index before a
/// step is planned on it: `always` (a step found its view stale), or when the copy holds
/// no read sent within its read lease (this router was idle, paused, or cut off). Bounded;
/// a copy that cannot catch up is read as it is.
pub async fn catch_up(st: &AppState, always: bool) {
    if let Some(sync) = &st.ownership {
        if always || !sync.client().fresh() {
            sync.client().catch_up().await;
        }
    }
}
