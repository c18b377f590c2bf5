//! Safety invariants of a directory state, each a check that lists its violations. The
//! property tests run them after every command; a replica could run them after a snapshot.

use crate::ids::Key;
use crate::state::{Directory, Owner};

/// One broken invariant, described for a test failure message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

fn owner_consistent(
    d: &Directory,
    key: &Key,
    owner: &Owner,
    epoch: crate::ids::Epoch,
    out: &mut Vec<Violation>,
) {
    match d.leases.get(&owner.lease) {
        None => out.push(Violation(format!(
            "{key:?} owned through missing lease {:?}",
            owner.lease
        ))),
        Some(l) => {
            if l.worker != owner.worker {
                out.push(Violation(format!(
                    "{key:?} owner {} but lease is {}'s",
                    owner.worker, l.worker
                )));
            }
            if !l.keys.contains(key) {
                out.push(Violation(format!(
                    "{key:?} not attached to its owner's lease"
                )));
            }
        }
    }
    if owner.epoch != epoch {
        out.push(Violation(format!(
            "{key:?} owner epoch {:?} != key epoch {epoch:?}",
            owner.epoch
        )));
    }
}

/// Every owner is backed by its lease, every lease attachment by an owner, each key is
/// attached to at most one lease (so at most one owner), ref counts equal the live
/// sessions built on each artifact, and every stored response not lost is held under an
/// existing lease of its worker.
pub fn check(d: &Directory) -> Vec<Violation> {
    let mut out = Vec::new();
    for (k, a) in &d.artifacts {
        if let Some(o) = &a.owner {
            owner_consistent(d, &Key::Prefix(*k), o, a.epoch, &mut out);
        }
        let refs = d.sessions.values().filter(|s| s.prefix == Some(*k)).count() as u32;
        if refs != a.ref_count {
            out.push(Violation(format!(
                "{k:?} ref_count {} but {refs} sessions use it",
                a.ref_count
            )));
        }
    }
    for (id, s) in &d.sessions {
        if let Some(o) = &s.owner {
            owner_consistent(d, &Key::Session(id.clone()), o, s.epoch, &mut out);
        }
        if let Some(p) = s.prefix.filter(|p| !d.artifacts.contains_key(p)) {
            out.push(Violation(format!("{id:?} built on missing {p:?}")));
        }
    }
    // A record waiting for its lapsed worker is held by no lease.
    for (id, r) in d
        .responses
        .iter()
        .filter(|(_, r)| !r.lost && r.lapsed_until_ms.is_none())
    {
        if d.leases.get(&r.lease).is_none_or(|l| l.worker != r.worker) {
            out.push(Violation(format!(
                "response {id} held by {} under {:?}, not its lease",
                r.worker, r.lease
            )));
        }
    }
    let mut seen = std::collections::BTreeMap::new();
    for (lid, l) in &d.leases {
        for key in &l.keys {
            if let Some(other) = seen.insert(key.clone(), *lid) {
                out.push(Violation(format!(
                    "{key:?} attached to {other:?} and {lid:?}"
                )));
            }
            let owned_here = match key {
                Key::Prefix(p) => d.artifacts.get(p).and_then(|a| a.owner),
                Key::Session(s) => d.sessions.get(s).and_then(|s| s.owner),
            }
            .is_some_and(|o| o.lease == *lid);
            if !owned_here {
                out.push(Violation(format!(
                    "{key:?} attached to {lid:?} which does not own it"
                )));
            }
        }
    }
    out
}
