//! The simulated GPU engine (`ownerserve sim-worker`).
//!
//! A real HTTP server that behaves like a vLLM worker. The pure core is [`scheduler`]
//! (continuous batching, chunked prefill, [`block_pool`] prefix cache, roofline timing);
//! [`engine`] is the tokio actor that owns it and turns step durations into (scaled)
//! sleeps; [`server`] speaks the OpenAI API and `/metrics` ([`metrics`]).
//!
//! Engines move KV between each other over HTTP, as vLLM's NIXL connector does over its
//! side channel: [`kv_transfer`] holds the wire shapes and the link model, [`kv_client`]
//! pulls, [`kv_routes`] serves pull, fetch and drop, [`lease`] keeps a prefill leg's blocks
//! pinned for its decode leg, and [`fence`] refuses requests from a stale ownership epoch.

pub mod block_pool;
pub mod config;
pub mod engine;
pub mod fence;
pub mod filler;
mod http_error;
pub mod kv_client;
pub mod kv_routes;
pub mod kv_transfer;
pub mod lease;
pub mod metrics;
mod respond;
pub mod scheduler;
pub mod server;
