//! What applying a command answers: an [`Outcome`], rejections included (so a retried
//! command sees the same answer), and why a command was refused ([`Rejection`]).

use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, Key, LeaseId, Owner, PrefixKey, SessionId, WorkerId};
use crate::version::Version;

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
    /// A prefix artifact was forgotten (`ForgetArtifact`).
    Forgotten,
    Replicated,
    SessionEnded,
    Ticked {
        expired: Vec<LeaseId>,
    },
    /// A stored response's holder was recorded, until `expires_at_ms`.
    ResponseRecorded {
        worker: WorkerId,
        expires_at_ms: u64,
    },
    /// A session's root and parent were recorded.
    Labelled,
    /// Tokens granted from a tenant's bucket.
    TokensGranted {
        tokens: u64,
    },
    /// The tenant's bucket is empty for `wait_ms` more.
    TokensRefused {
        wait_ms: u64,
    },
    /// The session holds a place among its tenant's `live` sessions until `until_ms`.
    SessionHeld {
        until_ms: u64,
        live: u32,
    },
    /// The tenant already has `live` sessions, its limit.
    SessionRefused {
        live: u32,
    },
    /// The directory applies the rules of `version` from this entry on.
    VersionSet {
        version: Version,
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
    #[error("a response id must be 1 to {max} bytes")]
    BadResponseId { max: usize },
    #[error("a tenant is named by 1 to {max_bytes} bytes, and at most {max_tenants} have budgets")]
    BadTenant {
        max_bytes: usize,
        max_tenants: usize,
    },
    #[error("the directory runs version {runs}; this command needs version {needs}, which it takes once every node runs a release that knows it")]
    NeedsVersion { needs: Version, runs: Version },
    #[error("session {session:?} was written {since_ms} ms ago, within the {idle_ms} ms it must be idle")]
    RecentlyWritten {
        session: SessionId,
        since_ms: u64,
        idle_ms: u64,
    },
    /// `ForgetArtifact` of an artifact sessions are still built on.
    #[error("{refs} sessions are built on {key:?}")]
    Referenced { key: PrefixKey, refs: u32 },
    /// `ForgetArtifact` of an artifact accessed within the idle window it was given.
    #[error("{key:?} was accessed {since_ms} ms ago, within the {idle_ms} ms it must be idle")]
    RecentlyAccessed {
        key: PrefixKey,
        since_ms: u64,
        idle_ms: u64,
    },
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
            Rejection::BadResponseId { .. } => "bad_response_id",
            Rejection::RecentlyWritten { .. } => "recently_written",
            Rejection::BadTenant { .. } => "bad_tenant",
            Rejection::NeedsVersion { .. } => "needs_version",
            Rejection::Referenced { .. } => "referenced",
            Rejection::RecentlyAccessed { .. } => "recently_accessed",
        }
    }

    /// The caller acted on an outdated view (fencing) and should refresh, not retry.
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            Rejection::StaleEpoch { .. }
                | Rejection::StaleRetry { .. }
                | Rejection::RecentlyWritten { .. }
                | Rejection::Referenced { .. }
                | Rejection::RecentlyAccessed { .. }
        )
    }
}

impl From<Rejection> for Outcome {
    fn from(r: Rejection) -> Self {
        Outcome::Rejected(r)
    }
}
