//! The ownership directory as the simulator keeps it: each session's decode owner and each
//! claimed prefix's owner, updated the way the live router records a routed step (claim the
//! prompt's prefix if unowned, set the session's owner, move the prefix on a migration,
//! drop the owner on demotion). Lookups answer what `Lookup::read` answers live.

use std::collections::HashMap;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::ArtifactView;

/// Session owners and prefix owners.
#[derive(Debug, Default)]
pub(crate) struct SimDirectory {
    sessions: HashMap<String, Option<WorkerId>>,
    prefixes: HashMap<u64, WorkerId>,
}

/// What the directory says about one step.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Found {
    pub owner: Option<WorkerId>,
    pub artifact: Option<ArtifactView>,
    /// Key (last block hash) of the artifact found.
    pub artifact_key: Option<u64>,
}

impl SimDirectory {
    /// The session's owner and the prompt's longest owned prefix.
    pub fn lookup(&self, session: Option<&str>, hashes: &[u64], block: u64) -> Found {
        let owner = session.and_then(|s| self.sessions.get(s).copied().flatten());
        let found = hashes
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, h)| self.prefixes.get(h).map(|&w| (i, *h, w)));
        Found {
            owner,
            artifact: found.map(|(i, _, w)| ArtifactView {
                owner: w,
                tokens: (i as u64 + 1) * block,
            }),
            artifact_key: found.map(|(_, h, _)| h),
        }
    }

    /// Records a routed step: the prompt's prefix is claimed (kept by its first owner) and
    /// the session decodes on `worker`.
    pub fn record(&mut self, session: Option<&str>, hashes: &[u64], worker: WorkerId) {
        if let Some(&last) = hashes.last() {
            self.prefixes.entry(last).or_insert(worker);
        }
        if let Some(s) = session {
            self.sessions.insert(s.to_owned(), Some(worker));
        }
    }

    /// A migration moved the prefix `key` to `worker`.
    pub fn move_prefix(&mut self, key: u64, worker: WorkerId) {
        self.prefixes.insert(key, worker);
    }

    /// The session lost its owner (idle lease lapsed); its prefix stays claimed.
    pub fn demote(&mut self, session: &str) {
        if let Some(o) = self.sessions.get_mut(session) {
            *o = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_owned_prefix_is_found_and_claims_keep_their_first_owner() {
        let mut d = SimDirectory::default();
        d.record(Some("s"), &[1, 2, 3], WorkerId(0));
        d.record(Some("t"), &[1, 2, 3], WorkerId(1));
        let f = d.lookup(Some("s"), &[1, 2, 3, 4], 16);
        assert_eq!(f.owner, Some(WorkerId(0)));
        let a = f.artifact.expect("artifact");
        assert_eq!((a.owner, a.tokens), (WorkerId(0), 48));
        d.move_prefix(3, WorkerId(1));
        d.demote("s");
        let f = d.lookup(Some("s"), &[1, 2, 3], 16);
        assert_eq!(f.owner, None);
        assert_eq!(f.artifact.map(|a| a.owner), Some(WorkerId(1)));
        assert!(d.lookup(None, &[7], 16).artifact.is_none());
    }
}
