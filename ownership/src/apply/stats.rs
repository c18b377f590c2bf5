//! Counting ownership changes as they are applied: forks, migrations, lease ends. Pure and
//! deterministic like the rest of `apply`, so every replica holds the same totals.

use super::Outcome;
use crate::command::Command;
use crate::ids::WorkerId;
use crate::state::{Directory, DirectoryStats};

impl Directory {
    /// The worker owning what `command` may move (a prefix for `Migrate`, a session for
    /// `SetDecodeOwner`), read before and after it runs.
    pub(super) fn owner_worker(&self, command: &Command) -> Option<WorkerId> {
        match command {
            Command::Migrate { key, .. } => self.artifacts.get(key)?.owner.map(|o| o.worker),
            Command::SetDecodeOwner { session, .. } => {
                self.sessions.get(session)?.owner.map(|o| o.worker)
            }
            _ => None,
        }
    }
}

impl DirectoryStats {
    /// Counts one applied (non-batch) command; `before` and `after` are
    /// [`Directory::owner_worker`] around it.
    pub(super) fn count(
        &mut self,
        command: &Command,
        outcome: &Outcome,
        before: Option<WorkerId>,
        after: Option<WorkerId>,
    ) {
        let moved = before.is_some() && before != after;
        match (command, outcome) {
            (Command::Fork { .. }, Outcome::Owned { .. }) => self.forks += 1,
            (Command::Migrate { .. }, Outcome::Owned { .. }) if moved => {
                self.prefix_migrations += 1;
            }
            (Command::SetDecodeOwner { .. }, Outcome::Owned { .. }) if moved => {
                self.session_moves += 1;
            }
            (Command::Tick, Outcome::Ticked { expired }) => {
                self.lease_expiries += expired.len() as u64;
            }
            (Command::RevokeLease { .. }, Outcome::LeaseEnded { .. }) => {
                self.lease_revocations += 1;
            }
            _ => {}
        }
    }
}
