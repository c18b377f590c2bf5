//! The ownership directory: one authoritative owner per long-lived KV prefix (MISSION.md
//! "Ownership rules"), with worker leases, fencing epochs and copy-on-write fork refs.
//!
//! # Layout
//! - [`ids`]: lease, epoch, prefix-key, session and client identities.
//! - [`command`]: what can be asked of the directory ([`Envelope`] = command + leader
//!   timestamp + optional idempotency key).
//! - [`state`]: the directory's state, serialisable as a snapshot; [`artifact_map`]: its
//!   prefix artifacts, with the index a lookup probes (where they end, their chains'
//!   checkpoints); [`response_map`]: stored responses (OpenAI Responses, `store: true`)
//!   and the worker holding each, with their expiry order; [`tenant_budgets`]: tenants'
//!   fleet-wide tokens-per-minute buckets and live sessions.
//! - [`apply`]: the deterministic transition `Directory::apply(index, &Envelope) -> Outcome`;
//!   [`outcome`]: what it answers, rejections included.
//! - [`version`]: which rules `apply` follows, raised through the log once every node
//!   knows the new ones (rolling upgrades).
//! - [`invariants`]: checks over a state (one owner per key, consistent lease attachments,
//!   fork ref counts), used by the property tests.
//!
//! The state machine is pure: it reads no clock (time is the leader's stamp in each
//! entry, folded into a monotonic `now`), does no IO, and every owner change takes an
//! epoch derived from its log position (index × 4096 + position in a batch), the fencing
//! token every later write must present.
//!
//! Around it, behind features: `raft`, the openraft shell (redb log, snapshots, the HTTP
//! network client); `node`, a whole directory node (Raft RPC server, directory and
//! operator API, metrics, `ownerserve directory`) and the clients a router reaches it with.
#![forbid(unsafe_code)]

pub mod apply;
pub mod artifact_map;
pub mod command;
pub mod ids;
pub mod invariants;
pub mod outcome;
pub mod response_map;
pub mod state;
pub mod tenant_budgets;
pub mod version;

#[cfg(feature = "raft")]
pub mod raft;

#[cfg(feature = "node")]
pub mod node;

pub use command::{Command, Envelope};
pub use outcome::{Outcome, Rejection};
pub use state::Directory;
