//! Identities in the directory. All are newtypes so a lease id cannot be passed as an epoch.

use serde::{Deserialize, Serialize};

pub use ownerserve_planner::ids::WorkerId;
pub use ownerserve_planner::kv_index::Tier;

/// A lease: the log index of the entry that granted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

/// A fencing token: the log index of the entry that last changed a key's owner. Strictly
/// increasing per key; writes carrying an older one are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Epoch(pub u64);

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
