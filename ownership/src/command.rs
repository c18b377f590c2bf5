//! Commands to the directory. The leader stamps `now_ms` into each entry just before
//! proposing it; apply folds it into a monotonic clock and never reads its own.

use serde::{Deserialize, Serialize};

use crate::ids::{ClientId, Epoch, LeaseId, PrefixKey, SessionId, Tier, WorkerId};
use crate::version::{TooNew, Version};

/// A command with its timestamp and, for retries, its idempotency key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Leader wall-clock time in milliseconds when the entry was proposed.
    pub now_ms: u64,
    /// `(client, seq)`: a retried command with the same pair gets the first outcome back.
    pub client: Option<(ClientId, u64)>,
    pub command: Command,
}

/// What a sealed prefix artifact covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactSpec {
    /// The artifact this one extends, if any.
    pub parent: Option<PrefixKey>,
    /// Blocks `[start, end)` of the prefix this artifact seals.
    pub blocks: (u32, u32),
    /// KV layout (e.g. "gqa-bf16", "mla-fp8").
    pub kv_type: String,
    pub size_bytes: u64,
    /// The chain's block hashes at the block counts of [`checkpoint_blocks`]`(blocks.1)`,
    /// in that order: what lets a lookup bound how much of a prompt any artifact's chain
    /// shares (`ArtifactMap`). Empty from a writer that does not send them; such an
    /// artifact is then probed for every prompt long enough to hold it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<u64>,
}

/// The block counts a chain of `end` blocks is checkpointed at: 1, 2, 3, 4, 6, 8, 12, 16,
/// 24, … (powers of two and one and a half times them), up to `end`. A prompt that shares
/// fewer than `p` blocks with every checkpointed chain shares fewer than the next count
/// too, so the counts found bound the shared length within a factor of 1.5.
pub fn checkpoint_blocks(end: u32) -> impl Iterator<Item = u32> {
    (0..32u32)
        .flat_map(|k| {
            let p = 1u64 << k;
            [p, p + p / 2]
        })
        .skip(1) // 1 + 1/2 rounds down to 1, already there
        .take_while(move |&p| p <= u64::from(end))
        .map(|p| p as u32)
}

/// The checkpoints of a chain whose block hashes are `hashes` (the whole chain from its
/// first block), for an [`ArtifactSpec`] ending at its last block.
pub fn checkpoints_of(hashes: &[u64]) -> Vec<u64> {
    let n = u32::try_from(hashes.len()).unwrap_or(u32::MAX);
    checkpoint_blocks(n)
        .map(|p| hashes[p as usize - 1])
        .collect()
}

/// Everything the directory can be asked to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A worker's lease, valid `ttl_ms` from now.
    GrantLease { worker: WorkerId, ttl_ms: u64 },
    /// Renews a lease, and with it every key attached to it.
    KeepAlive { lease: LeaseId },
    /// Ends a lease now (operator, or worker shutdown), cascading like an expiry.
    RevokeLease { lease: LeaseId },
    /// Claims ownership of a sealed prefix artifact for `lease`'s worker. With
    /// `expect_epoch`, only if the key's current epoch is that one (CAS).
    Claim {
        key: PrefixKey,
        lease: LeaseId,
        spec: ArtifactSpec,
        expect_epoch: Option<Epoch>,
    },
    /// Seals `key` after `spec.parent`, owned by the parent's owner: fenced by the parent's
    /// epoch.
    Extend {
        key: PrefixKey,
        spec: ArtifactSpec,
        parent_epoch: Epoch,
    },
    /// Gives up ownership (the copies stay as read-only replicas).
    Release { key: PrefixKey, epoch: Epoch },
    /// Forgets a prefix artifact nothing uses: removed only if its epoch is still `epoch`,
    /// no session is built on it (`ref_count` 0) and the directory's clock says it was
    /// last accessed at least `idle_ms` ago; detached from its owner's lease if it has
    /// one. A later claim of the same prefix creates it afresh. Needs version 3
    /// (`Version::RETENTION`).
    ForgetArtifact {
        key: PrefixKey,
        epoch: Epoch,
        idle_ms: u64,
    },
    /// Registers a read-only copy of an artifact on `worker`.
    ReplicateReadOnly {
        key: PrefixKey,
        worker: WorkerId,
        tier: Tier,
    },
    /// Moves ownership to `to_lease`'s worker, which must already hold a copy (the owner
    /// flips only once the KV is in place); CAS on the current epoch.
    Migrate {
        key: PrefixKey,
        from_epoch: Epoch,
        to_lease: LeaseId,
    },
    /// Makes `lease`'s worker the session's decode owner, on top of `prefix`.
    SetDecodeOwner {
        session: SessionId,
        lease: LeaseId,
        prefix: Option<PrefixKey>,
        tail_tokens: u32,
        predicted_tool_gap_ms: Option<u64>,
        expect_epoch: Option<Epoch>,
    },
    /// Starts `child` as a copy-on-write branch of `parent` (sharing its prefix artifact),
    /// decoded by `lease`'s worker; fenced by the parent's epoch.
    Fork {
        parent: SessionId,
        child: SessionId,
        lease: LeaseId,
        parent_epoch: Epoch,
    },
    /// Ends a session, dropping its reference to its prefix.
    EndSession { session: SessionId, epoch: Epoch },
    /// Demotes an idle session whose idle lease lapsed: it loses its decode owner (the
    /// owner drops its tail) but keeps its prefix artifact, so a resume recomputes only
    /// the tail where the artifact is. Fenced by its epoch, and with `idle_ms` by its
    /// last write: refused if any router wrote the session within that many ms. A router
    /// sees only the steps sent to it; another may be serving the session.
    DemoteSession {
        session: SessionId,
        epoch: Epoch,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idle_ms: Option<u64>,
    },
    /// Pins (or unpins) a session to its decode owner: while pinned, it is not moved to
    /// another worker (expiry of its owner still moves or ends it). Fenced by its epoch.
    PinSession {
        session: SessionId,
        epoch: Epoch,
        pinned: bool,
    },
    /// Names a session's place among its harness's agents: the conversation's `root`
    /// session and the `parent` agent that spawned it (Claude Code's sub-agents, Codex
    /// threads, OpenCode child sessions). Labels only, for the operator's view: they move
    /// no owner. Unknown sessions are refused.
    LabelSession {
        session: SessionId,
        root: Option<SessionId>,
        parent: Option<SessionId>,
    },
    /// Records that `lease`'s worker stored the response `id` (OpenAI Responses,
    /// `store: true`) for `ttl_ms` from now: its follow-ups, reads and cancels go there.
    /// When the worker's last lease ends, the record is marked lost (kept until it
    /// expires). At most `response_map::MAX_RESPONSES` are kept.
    RecordResponse {
        id: String,
        lease: LeaseId,
        ttl_ms: u64,
    },
    /// Takes `tokens` from `tenant`'s fleet-wide bucket of `per_minute` tokens a minute
    /// (`tenant_budgets`): granted while the bucket is above zero.
    SpendTokens {
        tenant: String,
        tokens: u64,
        per_minute: u64,
    },
    /// Holds `session`'s place among `tenant`'s live sessions (at most `max`) for `ttl_ms`.
    HoldTenantSession {
        tenant: String,
        session: SessionId,
        max: u32,
        ttl_ms: u64,
    },
    /// Gives up `session`'s place among `tenant`'s live sessions.
    ReleaseTenantSession { tenant: String, session: SessionId },
    /// Raises the rules the directory applies to `version` (`crate::version`): committed
    /// by the leader once every member runs a release that knows them.
    SetVersion { version: Version },
    /// Advances time: expires leases past their TTL plus grace and cascades, and drops
    /// expired response records.
    Tick,
    /// Several commands in one entry (one Raft round trip, one fsync), applied in order;
    /// each gets its own epoch. At most [`MAX_BATCH`] commands; batches do not nest.
    Batch { commands: Vec<Command> },
}

impl Command {
    /// The command's name in metrics (`snake_case`, one per variant).
    pub fn name(&self) -> &'static str {
        match self {
            Command::GrantLease { .. } => "grant_lease",
            Command::KeepAlive { .. } => "keep_alive",
            Command::RevokeLease { .. } => "revoke_lease",
            Command::Claim { .. } => "claim",
            Command::Extend { .. } => "extend",
            Command::Release { .. } => "release",
            Command::ForgetArtifact { .. } => "forget_artifact",
            Command::ReplicateReadOnly { .. } => "replicate_read_only",
            Command::Migrate { .. } => "migrate",
            Command::SetDecodeOwner { .. } => "set_decode_owner",
            Command::Fork { .. } => "fork",
            Command::EndSession { .. } => "end_session",
            Command::DemoteSession { .. } => "demote_session",
            Command::PinSession { .. } => "pin_session",
            Command::LabelSession { .. } => "label_session",
            Command::RecordResponse { .. } => "record_response",
            Command::SpendTokens { .. } => "spend_tokens",
            Command::HoldTenantSession { .. } => "hold_tenant_session",
            Command::ReleaseTenantSession { .. } => "release_tenant_session",
            Command::SetVersion { .. } => "set_version",
            Command::Tick => "tick",
            Command::Batch { .. } => "batch",
        }
    }
}

impl Command {
    /// The directory version the command needs (`crate::version`): applied at an older one
    /// it is refused.
    pub fn needs(&self) -> Version {
        match self {
            Command::SpendTokens { .. }
            | Command::HoldTenantSession { .. }
            | Command::ReleaseTenantSession { .. } => Version::LAPSED_OWNERS_AND_TENANTS,
            Command::ForgetArtifact { .. } => Version::RETENTION,
            Command::Batch { commands } => commands
                .iter()
                .map(Command::needs)
                .max()
                .unwrap_or(Version::FIRST),
            // A cluster applies `SetVersion` before any version it names.
            _ => Version::FIRST,
        }
    }

    /// Whether this release can apply the command: it raises the directory to no version
    /// newer than [`Version::CURRENT`]. A node must not apply such an entry by older rules
    /// (it would diverge from the nodes that know them), so it stops instead.
    pub fn check_known_version(&self) -> Result<(), TooNew> {
        match self {
            Command::SetVersion { version } if *version > Version::CURRENT => Err(TooNew {
                found: *version,
                known: Version::CURRENT,
            }),
            Command::Batch { commands } => {
                commands.iter().try_for_each(Command::check_known_version)
            }
            _ => Ok(()),
        }
    }
}

/// Most commands in one [`Command::Batch`]: each takes its own epoch within its entry.
pub const MAX_BATCH: usize = crate::ids::Epoch::PER_ENTRY;
