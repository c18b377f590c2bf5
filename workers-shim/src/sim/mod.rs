//! The simulated GPU engine (`ownerserve sim-worker`).
//!
//! A real HTTP server that behaves like a vLLM worker. The pure core, which the trace
//! simulator (`eval`) drives too, is [`scheduler`] (continuous batching, chunked prefill,
//! [`block_pool`] prefix cache over an optional [`host_tier`] of host DRAM that HBM
//! evictions offload to and prompts restore from, roofline timing) with its [`config`], the [`kv_transfer`]
//! wire shapes and link model, [`lease`], [`filler`] text and the [`metrics`] exposition.
//! With the `io` feature: `engine` is the tokio actor that owns the scheduler and turns
//! step durations into (scaled) sleeps, and `server` speaks the OpenAI API and `/metrics`.
//!
//! Engines move KV between each other over HTTP, as vLLM's NIXL connector does over its
//! side channel: `kv_client` pulls, `kv_routes` serves pull, fetch and drop, [`lease`]
//! keeps a prefill leg's blocks pinned for its decode leg, and `fence` refuses requests
//! from a stale ownership epoch (all `io`).
//!
//! The coding agents' APIs (Anthropic Messages, OpenAI Responses) run through the same
//! engine; `agent_wire` shapes their answers and `response_store` keeps Responses answers
//! for follow-ups, `GET` and `cancel` (both `io`).

#[cfg(feature = "io")]
mod agent_wire;
pub mod block_pool;
pub mod config;
#[cfg(feature = "io")]
pub mod engine;
#[cfg(feature = "io")]
pub mod fence;
pub mod filler;
pub mod host_tier;
#[cfg(feature = "io")]
mod http_error;
#[cfg(feature = "io")]
pub mod kv_client;
#[cfg(feature = "io")]
pub mod kv_routes;
pub mod kv_transfer;
pub mod lease;
pub mod metrics;
#[cfg(feature = "io")]
mod respond;
#[cfg(feature = "io")]
mod response_store;
pub mod scheduler;
#[cfg(feature = "io")]
pub mod server;
#[cfg(feature = "io")]
pub(crate) mod state;
