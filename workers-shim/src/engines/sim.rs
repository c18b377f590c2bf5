//! OwnerServe's own KV primitives, which the simulated engine serves: a receiver copies a
//! session's sealed blocks from a source (a migration's copy), and an engine drops named
//! blocks (a migration's hand-off, a demoted session's tail). The router sends these
//! typed bodies to these paths; [`crate::sim`]'s routes decode the same types.

pub use crate::sim::kv_transfer::{DropRequest, DropResponse, FetchRequest, FetchResponse};

/// `POST`: copy `block_hashes` from a source engine into this one ([`FetchRequest`]).
pub const FETCH_PATH: &str = "/ownerserve/v1/kv/fetch";
/// `POST`: evict blocks, and with a session and epoch fence it ([`DropRequest`]).
pub const DROP_PATH: &str = "/ownerserve/v1/kv/drop";
/// `GET`: the session claims this engine's fence accepted, in order
/// (`{"accepted": [{"session", "epoch", "for", "at_unix_ms"}], "forgotten": N}`), for
/// audits against the directory's log.
pub const FENCE_ACCEPTED_PATH: &str = "/ownerserve/v1/fence/accepted";
