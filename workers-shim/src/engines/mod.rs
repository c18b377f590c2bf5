//! The engines: one file per engine kind, each with its protocol object
//! ([`EngineProtocol`]: probe path, metric names, self-report, step budget source, leg
//! pairing, KV pull and drop, prefill role) and its dispatch adapters, how it is asked to
//! run one leg of a plan. They are pure (JSON transforms of the client's body, names,
//! paths); the router does the IO (sequencing, headers, concurrency) as each engine's
//! protocol requires (WIRE_FORMATS.md §4). [`protocol()`] is the one place an
//! [`EngineKind`] is matched; everything else asks its protocol. Adding an engine:
//! docs/ARCHITECTURE.md, "Adding an engine".
//!
//! - [`vllm`]: NixlConnector's pull protocol (prefill with `do_remote_decode`, then decode
//!   with the prefill's returned `kv_transfer_params`), also spoken by our sim engine,
//!   which adds a pull of a sealed prefix from its owner ([`vllm::fetch_request`]).
//! - [`sglang`]: the bootstrap triple injected into both legs, sent concurrently, and
//!   taken out again when the pair fails and the decode worker runs the request whole.
//! - [`sim`]: OwnerServe's own KV primitives (copy a session's blocks, drop blocks),
//!   spoken by the simulated engine.
//!
//! The header names below are every `x-ownerserve-*` header an engine reads or sets.

#[cfg(test)]
mod contract;
pub mod protocol;
pub mod sglang;
pub mod sim;
pub mod vllm;

use ownerserve_planner::ids::EngineKind;

pub use protocol::{
    CapacityGauge, EngineProtocol, EngineReport, MetricNames, Pairing, StepBudgetSource,
};

/// The protocol of an engine kind.
pub fn protocol(kind: EngineKind) -> &'static dyn EngineProtocol {
    match kind {
        EngineKind::Vllm => &vllm::Vllm,
        EngineKind::Sglang => &sglang::Sglang,
        EngineKind::Sim => &sim::Sim,
    }
}

/// Every engine kind's protocol, in [`EngineKind::ALL`]'s order.
pub fn all() -> impl Iterator<Item = &'static dyn EngineProtocol> {
    EngineKind::ALL.iter().map(|&k| protocol(k))
}

/// Header naming the session a dispatched request belongs to, for epoch fencing.
pub const SESSION_HEADER: &str = "x-ownerserve-session";
/// Header carrying the directory's fencing epoch of the session's owner.
pub const EPOCH_HEADER: &str = "x-ownerserve-epoch";
/// Response header: KV bytes the engine received for this request (a transfer's size).
pub const KV_RECEIVED_BYTES_HEADER: &str = "x-ownerserve-kv-received-bytes";
