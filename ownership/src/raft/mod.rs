//! The replicated shell around [`Directory`]: openraft 0.9 with a redb log
//! ([`log_store`]), the state machine and its snapshots ([`state_machine`]), the format of
//! both and the snapshot file that backups are too ([`mod@format`]), a node's data folder made
//! from a backup ([`restore`]), the entries it applied lately for the routers that follow
//! it ([`feed`]), and an HTTP transport client ([`network`]). The HTTP server side is the `node` feature's
//! (`node::rpc`, mounted by every directory node).
//!
//! Entries carry an [`Envelope`] whose `now_ms` the leader stamps just
//! before proposing; applying folds it into the directory's monotonic clock, so replicas
//! and replays never read their own clocks.

// openraft's storage traits return `StorageError` (224 bytes) by value; our helpers that
// build it must too.
#![allow(clippy::result_large_err, reason = "the error type is openraft's")]

pub mod feed;
pub mod format;
pub mod log_store;
pub mod network;
pub mod restore;
pub mod state_machine;

use std::io::Cursor;

#[cfg(doc)]
use crate::Directory;

use crate::{Envelope, Outcome};

openraft::declare_raft_types!(
    /// openraft types of the directory: entries are envelopes, responses outcomes
    /// (`None` for blank and membership entries).
    pub TypeConfig:
        D = Envelope,
        R = Option<Outcome>,
);

/// A directory node's id.
pub type NodeId = u64;

/// The openraft handle of a directory node.
pub type Raft = openraft::Raft<TypeConfig>;

/// Wraps any error into openraft's storage error for `subject`.
pub(crate) fn io_err<E: std::error::Error + 'static>(
    make: fn(openraft::AnyError) -> openraft::StorageIOError<NodeId>,
    e: &E,
) -> openraft::StorageError<NodeId> {
    make(openraft::AnyError::new(e)).into()
}
