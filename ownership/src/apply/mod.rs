//! `Directory::apply`: the deterministic transition. It folds the entry's leader timestamp
//! into the monotonic clock, answers retried `(client, seq)` pairs from the dedup table,
//! dispatches to the handlers (`leases`, `artifacts`, `sessions`, `responses`, `tenants` submodules), and gives every
//! owner change an epoch derived from its log position ([`Epoch::of`]). A command newer
//! than the directory's version (`crate::version`) is refused, and `SetVersion` raises it.

mod artifacts;
mod leases;
mod responses;
mod sessions;
mod stats;
mod tenants;

use crate::command::{Command, Envelope, MAX_BATCH};
use crate::ids::{Epoch, Key, LeaseId, WorkerId};
use crate::state::Directory;
use crate::version::Version;

pub use crate::outcome::{Outcome, Rejection};

impl Directory {
    /// Applies the entry at log `index` (strictly increasing across calls).
    pub fn apply(&mut self, index: u64, env: &Envelope) -> Outcome {
        self.applied = index;
        self.now_ms = self.now_ms.max(env.now_ms);
        if let Some((client, seq)) = env.client {
            if let Some((last, outcome)) = self.dedup.get(&client) {
                if seq == *last {
                    return outcome.clone();
                }
                if seq < *last {
                    return Rejection::StaleRetry {
                        given: seq,
                        last: *last,
                    }
                    .into();
                }
            }
        }
        let outcome = match &env.command {
            Command::Batch { commands } => {
                if commands.len() > MAX_BATCH
                    || commands.iter().any(|c| matches!(c, Command::Batch { .. }))
                {
                    Rejection::BadBatch { max: MAX_BATCH }.into()
                } else {
                    let outcomes = commands
                        .iter()
                        .enumerate()
                        .map(|(i, c)| self.apply_one(Epoch::of(index, i), c))
                        .collect();
                    Outcome::Batch { outcomes }
                }
            }
            command => self.apply_one(Epoch::of(index, 0), command),
        };
        if let Some((client, seq)) = env.client {
            self.dedup.insert(client, (seq, outcome.clone()));
        }
        outcome
    }

    /// Applies one (non-batch) command; `epoch` is its position in the log. Counts what it
    /// changed in [`Directory::stats`].
    fn apply_one(&mut self, epoch: Epoch, command: &Command) -> Outcome {
        let before = self.owner_worker(command);
        let outcome = self.run_one(epoch, command);
        let after = self.owner_worker(command);
        self.stats.count(command, &outcome, before, after);
        outcome
    }

    fn run_one(&mut self, epoch: Epoch, command: &Command) -> Outcome {
        let needs = command.needs();
        if needs > self.version {
            return Rejection::NeedsVersion {
                needs,
                runs: self.version,
            }
            .into();
        }
        match command {
            Command::GrantLease { worker, ttl_ms } => {
                self.grant(LeaseId(epoch.0), *worker, *ttl_ms)
            }
            Command::KeepAlive { lease } => self.keep_alive(*lease),
            Command::RevokeLease { lease } => self.revoke(*lease, epoch),
            Command::Tick => self.tick(epoch),
            Command::Claim {
                key,
                lease,
                spec,
                expect_epoch,
            } => self.claim(*key, *lease, spec, *expect_epoch, epoch),
            Command::Extend {
                key,
                spec,
                parent_epoch,
            } => self.extend(*key, spec, *parent_epoch, epoch),
            Command::Release { key, epoch: given } => self.release(*key, *given, epoch),
            Command::ForgetArtifact {
                key,
                epoch: given,
                idle_ms,
            } => self.forget(*key, *given, *idle_ms),
            Command::ReplicateReadOnly { key, worker, tier } => {
                self.replicate(*key, *worker, *tier)
            }
            Command::Migrate {
                key,
                from_epoch,
                to_lease,
            } => self.migrate(*key, *from_epoch, *to_lease, epoch),
            Command::SetDecodeOwner {
                session,
                lease,
                prefix,
                tail_tokens,
                predicted_tool_gap_ms,
                expect_epoch,
            } => self.set_decode_owner(
                session,
                *lease,
                *prefix,
                *tail_tokens,
                *predicted_tool_gap_ms,
                *expect_epoch,
                epoch,
            ),
            Command::Fork {
                parent,
                child,
                lease,
                parent_epoch,
            } => self.fork(parent, child, *lease, *parent_epoch, epoch),
            Command::EndSession {
                session,
                epoch: given,
            } => self.end_session(session, *given),
            Command::PinSession {
                session,
                epoch: given,
                pinned,
            } => self.pin_session(session, *given, *pinned),
            Command::DemoteSession {
                session,
                epoch: given,
                idle_ms,
            } => self.demote_session(session, *given, *idle_ms),
            Command::LabelSession {
                session,
                root,
                parent,
            } => self.label_session(session, root.as_ref(), parent.as_ref()),
            Command::RecordResponse { id, lease, ttl_ms } => {
                self.record_response(id, *lease, *ttl_ms)
            }
            Command::SpendTokens {
                tenant,
                tokens,
                per_minute,
            } => self.spend_tokens(tenant, *tokens, *per_minute),
            Command::HoldTenantSession {
                tenant,
                session,
                max,
                ttl_ms,
            } => self.hold_tenant_session(tenant, session, *max, *ttl_ms),
            Command::ReleaseTenantSession { tenant, session } => {
                self.release_tenant_session(tenant, session)
            }
            Command::SetVersion { version } => self.set_version(*version),
            Command::Batch { .. } => Rejection::BadBatch { max: MAX_BATCH }.into(),
        }
    }

    /// Raises the rules to `version` (never lowers them). The node's shell stops before it
    /// applies a version newer than this release knows (`Command::check_known_version`),
    /// so here one always is known.
    fn set_version(&mut self, version: Version) -> Outcome {
        self.version = self.version.max(version.min(Version::CURRENT));
        Outcome::VersionSet {
            version: self.version,
        }
    }

    /// The live lease's worker, or why there is none.
    fn live_lease(&self, lease: LeaseId) -> Result<WorkerId, Rejection> {
        match self.leases.get(&lease) {
            None => Err(Rejection::UnknownLease(lease)),
            Some(_) if !self.lease_live(lease) => Err(Rejection::LeaseExpired(lease)),
            Some(l) => Ok(l.worker),
        }
    }

    fn attach(&mut self, lease: LeaseId, key: Key) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.insert(key);
        }
    }

    fn detach(&mut self, lease: LeaseId, key: &Key) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests;
