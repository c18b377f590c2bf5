//! The directory commands that record a routed request: its prefix claim, the session's
//! owner and labels, and the owner claim committed before a step is dispatched.

use super::Routed;
use ownerserve_ownership::command::{checkpoints_of, ArtifactSpec};
use ownerserve_ownership::ids::{
    Epoch, LeaseId, PrefixKey, SessionId, Tier, WorkerId as DirWorkerId,
};
use ownerserve_ownership::Command;
use ownerserve_planner::ids::WorkerId;

pub(super) fn dir_worker(w: WorkerId) -> DirWorkerId {
    DirWorkerId(w.0)
}

/// The commands recording one routed request, given the serving worker's lease.
pub(super) fn commands_for(r: &Routed, lease: LeaseId, block_size: usize) -> Vec<Command> {
    let (tokens, hashes) = (&r.prompt.tokenized.tokens, &r.prompt.hashes);
    let prefix = hashes.last().map(|&h| PrefixKey(h));
    let mut out = Vec::new();
    if let Some(key) = r.effects.replicate {
        out.push(Command::ReplicateReadOnly {
            key,
            worker: dir_worker(r.worker),
            tier: Tier::Gpu,
        });
    }
    if let Some(key) = prefix {
        out.push(Command::Claim {
            key,
            lease,
            spec: ArtifactSpec {
                parent: None,
                blocks: (0, hashes.len() as u32),
                kv_type: "kv".into(),
                size_bytes: 0,
                checkpoints: checkpoints_of(hashes),
            },
            expect_epoch: None,
        });
    }
    match (&r.session, &r.effects.fork) {
        (Some(parent), Some((child, parent_epoch))) => out.push(Command::Fork {
            parent: SessionId(parent.clone()),
            child: SessionId(child.clone()),
            lease,
            parent_epoch: *parent_epoch,
        }),
        (Some(session), _) => out.push(Command::SetDecodeOwner {
            session: SessionId(session.clone()),
            lease,
            prefix,
            tail_tokens: (tokens.len() % block_size.max(1)) as u32,
            predicted_tool_gap_ms: r.effects.predicted_gap_ms,
            expect_epoch: r.effects.expect_epoch,
        }),
        (None, _) => {}
    }
    if let Some(label) = label(r) {
        out.push(label);
    }
    out
}

/// The labels of a session step whose harness named a root other than the session, or
/// a parent agent (a sub-agent): for the operator's view of the directory.
pub(super) fn label(r: &Routed) -> Option<Command> {
    let session = r.session.as_deref().filter(|_| r.effects.fork.is_none())?;
    let other_root = r.root.as_deref().filter(|root| *root != session);
    if other_root.is_none() && r.parent.is_none() {
        return None;
    }
    Some(Command::LabelSession {
        session: SessionId(session.to_owned()),
        root: other_root.map(|s| SessionId(s.to_owned())),
        parent: r.parent.as_deref().map(|s| SessionId(s.to_owned())),
    })
}

/// A session's owner claim for `lease`'s worker, committed before a step is dispatched:
/// CAS on `expect_epoch` (`None`: on the absence of a live owner). The step's record,
/// batched later, fills in its prefix and tail.
pub fn owner_claim(session: &str, lease: LeaseId, expect_epoch: Option<Epoch>) -> Command {
    Command::SetDecodeOwner {
        session: SessionId(session.to_owned()),
        lease,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch,
    }
}
