//! Identities in the directory. All are newtypes so a lease id cannot be passed as an epoch.

use serde::{Deserialize, Serialize};

pub use ownerserve_planner::ids::WorkerId;
pub use ownerserve_planner::kv_index::Tier;

/// A lease: the [`Epoch::of`] number of the command that granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

/// A fencing token: derived from the log position of the command that last changed a key's
/// owner, so it is unique and strictly increasing per key; writes carrying an older one are
/// refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Epoch(pub u64);

impl Epoch {
    /// Epochs each log entry spans: one per command of the largest batch
    /// ([`crate::command::MAX_BATCH`] is this).
    pub const PER_ENTRY: usize = 4096;

    /// The epoch of command `position` in the entry at log `index`:
    /// `index × 4096 + position` (a lone command is position 0).
    pub fn of(index: u64, position: usize) -> Epoch {
        Epoch(index.saturating_mul(Self::PER_ENTRY as u64) + position as u64)
    }
}

/// A sealed prefix artifact, keyed by the chain hash of its last block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrefixKey(pub u64);

/// An agent session (the router's `x-session-id`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionId(pub String);

/// A directory client (a router replica), for idempotent retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClientId(pub u64);

/// Something a lease keeps alive: dropping the lease drops its hold on each.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Key {
    Prefix(PrefixKey),
    Session(SessionId),
}

/// Who owns a key, and under which fencing epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub worker: WorkerId,
    pub lease: LeaseId,
    pub epoch: Epoch,
}
