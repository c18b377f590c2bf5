//! Dispatch adapters: how each engine is asked to run one leg of a plan. They are pure
//! JSON transforms of the client's body; the router sends the results (sequencing,
//! headers, concurrency) as each engine's protocol requires (WIRE_FORMATS.md §4).
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

pub mod sglang;
pub mod sim;
pub mod vllm;

/// Header naming the session a dispatched request belongs to, for epoch fencing.
pub const SESSION_HEADER: &str = "x-ownerserve-session";
/// Header carrying the directory's fencing epoch of the session's owner.
pub const EPOCH_HEADER: &str = "x-ownerserve-epoch";
/// Response header: KV bytes the engine received for this request (a transfer's size).
pub const KV_RECEIVED_BYTES_HEADER: &str = "x-ownerserve-kv-received-bytes";
