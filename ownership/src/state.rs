//! The directory's state. Everything is in ordered maps so snapshots are canonical and
//! iteration (for example, expiry) is deterministic on every replica.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::artifact_map::{Artifact, ArtifactMap, Location};
use crate::outcome::Outcome;
pub use crate::response_map::{ResponseMap, StoredResponse};
pub use crate::tenant_budgets::TenantBudget;

pub use crate::ids::Owner;
use crate::ids::{ClientId, Epoch, Key, LeaseId, PrefixKey, SessionId, WorkerId};
use crate::version::Version;

/// A worker's lease and the keys it keeps alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub worker: WorkerId,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    pub keys: BTreeSet<Key>,
}

/// An agent session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub owner: Option<Owner>,
    pub epoch: Epoch,
    pub prefix: Option<PrefixKey>,
    pub tail_tokens: u32,
    pub parent: Option<SessionId>,
    pub predicted_tool_gap_ms: Option<u64>,
    pub last_access_ms: u64,
    /// Operator pin: the session stays on its decode owner.
    #[serde(default)]
    pub pinned: bool,
    /// The conversation's root session, when the harness named one other than this
    /// session (`LabelSession`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<SessionId>,
    /// The agent that spawned this one, as the harness named it (not a fork's parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_parent: Option<SessionId>,
}

/// The directory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Directory {
    /// High-water mark of leader-stamped time.
    pub now_ms: u64,
    /// Slack added to every expiry, covering clock offset between successive leaders.
    pub grace_ms: u64,
    pub leases: BTreeMap<LeaseId, Lease>,
    pub artifacts: ArtifactMap,
    pub sessions: BTreeMap<SessionId, Session>,
    /// Last `(seq, outcome)` per client, for idempotent retries.
    pub dedup: BTreeMap<ClientId, (u64, Outcome)>,
    /// Log index of the last applied entry.
    pub applied: u64,
    /// Ownership changes so far (replicated, so every node reports the same totals).
    #[serde(default)]
    pub stats: DirectoryStats,
    /// Stored responses (OpenAI Responses, `store: true`) and the worker holding each.
    #[serde(default)]
    pub responses: ResponseMap,
    /// Tenants' fleet-wide budgets: tokens per minute and live sessions.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantBudget>,
    /// Sessions whose owner's lease lapsed with nothing else holding them: each keeps its
    /// record, unowned, and goes back to its worker if that worker is granted a lease again
    /// before `until_ms` and nobody claimed it meanwhile (a busy host, not a dead worker);
    /// past it, the session ends (`Tick`).
    #[serde(default)]
    pub lapsed: BTreeMap<SessionId, LapsedOwner>,
    /// The rules `apply` follows (`crate::version`); a state written by 0.1.0 has none and
    /// follows version 1's.
    #[serde(default = "Version::first")]
    pub version: Version,
}

/// The worker a session's lapsed lease belonged to, and until when it may take it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LapsedOwner {
    pub worker: WorkerId,
    pub until_ms: u64,
}

/// Counts of ownership changes, kept by `apply` for the operator's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryStats {
    /// Sessions forked off a parent.
    pub forks: u64,
    /// Prefix artifacts whose owner moved to another worker (`Migrate`).
    pub prefix_migrations: u64,
    /// Sessions whose decode owner moved from one worker to another.
    pub session_moves: u64,
    /// Leases that expired (`Tick`).
    pub lease_expiries: u64,
    /// Leases revoked by an operator or a worker.
    pub lease_revocations: u64,
}

impl Directory {
    /// An empty directory with `grace_ms` of expiry slack, following this release's rules.
    pub fn new(grace_ms: u64) -> Self {
        Self {
            grace_ms,
            ..Self::default()
        }
    }

    /// The earliest time (ms) at which a `Tick` would change something: a lease's end
    /// (grace included), a stored response's expiry or a lapsed owner's last chance.
    /// `None` when nothing can expire.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        let lease = self
            .leases
            .values()
            .map(|l| l.expires_at_ms + self.grace_ms)
            .min();
        let lapsed = self.lapsed.values().map(|l| l.until_ms).min();
        [lease, self.responses.first_expiry_ms(), lapsed]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether a lease exists and has not expired (grace included) at the current time.
    pub fn lease_live(&self, lease: LeaseId) -> bool {
        self.leases
            .get(&lease)
            .is_some_and(|l| l.expires_at_ms + self.grace_ms > self.now_ms)
    }
}
