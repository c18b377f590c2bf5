//! `Directory::apply`: the deterministic transition. It folds the entry's leader timestamp
//! into the monotonic clock, answers retried `(client, seq)` pairs from the dedup table,
//! dispatches to the handlers (`leases`, `artifacts`, `sessions` submodules), and gives every
//! owner change an epoch derived from its log position ([`Epoch::of`]).

mod artifacts;
mod leases;
mod sessions;
mod stats;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Envelope, MAX_BATCH};
use crate::ids::{Epoch, Key, LeaseId, PrefixKey, SessionId, WorkerId};
use crate::state::{Directory, Owner};

/// The result of applying a command (rejections included, so retries see them too).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    LeaseGranted {
        lease: LeaseId,
        expires_at_ms: u64,
    },
    LeaseRenewed {
        expires_at_ms: u64,
    },
    /// A lease ended (revoked or expired); these keys lost their owner.
    LeaseEnded {
        dropped: Vec<Key>,
    },
    /// The caller's worker owns the key under this epoch (new or unchanged).
    Owned {
        worker: WorkerId,
        epoch: Epoch,
    },
    /// Someone else owns the key: the caller's copy is only a replica.
    Held {
        owner: Owner,
    },
    Released,
    Replicated,
    SessionEnded,
    Ticked {
        expired: Vec<LeaseId>,
    },
    /// One outcome per command of a batch, in order.
    Batch {
        outcomes: Vec<Outcome>,
    },
    Rejected(Rejection),
}

/// Why a command was refused. `StaleEpoch` is the fencing refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("unknown lease {0:?}")]
    UnknownLease(LeaseId),
    #[error("lease {0:?} has expired")]
    LeaseExpired(LeaseId),
    #[error("unknown prefix {0:?}")]
    UnknownPrefix(PrefixKey),
    #[error("unknown session {0:?}")]
    UnknownSession(SessionId),
    #[error("session {0:?} already exists")]
    SessionExists(SessionId),
    #[error("stale epoch {given:?}; the current one is {current:?}")]
    StaleEpoch { current: Epoch, given: Epoch },
    #[error("{worker} holds no copy of {key:?} yet")]
    NotReady { key: PrefixKey, worker: WorkerId },
    #[error("{0:?} has no owner")]
    NoOwner(PrefixKey),
    #[error("retry of an older command (seq {given}, last {last})")]
    StaleRetry { given: u64, last: u64 },
    #[error("a batch holds at most {max} commands and no batches")]
    BadBatch { max: usize },
    #[error("session {0:?} is pinned to its worker")]
    Pinned(SessionId),
}

impl Rejection {
    /// The refusal's name in metrics (`snake_case`, one per variant).
    pub fn name(&self) -> &'static str {
        match self {
            Rejection::UnknownLease(_) => "unknown_lease",
            Rejection::LeaseExpired(_) => "lease_expired",
            Rejection::UnknownPrefix(_) => "unknown_prefix",
            Rejection::UnknownSession(_) => "unknown_session",
            Rejection::SessionExists(_) => "session_exists",
            Rejection::StaleEpoch { .. } => "stale_epoch",
            Rejection::NotReady { .. } => "not_ready",
            Rejection::NoOwner(_) => "no_owner",
            Rejection::StaleRetry { .. } => "stale_retry",
            Rejection::BadBatch { .. } => "bad_batch",
            Rejection::Pinned(_) => "pinned",
        }
    }

    /// The caller acted on an outdated view (fencing) and should refresh, not retry.
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            Rejection::StaleEpoch { .. } | Rejection::StaleRetry { .. }
        )
    }
}

impl From<Rejection> for Outcome {
    fn from(r: Rejection) -> Self {
        Outcome::Rejected(r)
    }
}

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
            } => self.demote_session(session, *given),
            Command::Batch { .. } => Rejection::BadBatch { max: MAX_BATCH }.into(),
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
