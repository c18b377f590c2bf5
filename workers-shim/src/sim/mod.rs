//! The simulated GPU engine (`ownerserve sim-worker`).
//!
//! A real HTTP server that behaves like a vLLM worker. The pure core is [`scheduler`]
//! (continuous batching, chunked prefill, [`block_pool`] prefix cache, roofline timing);
//! [`engine`] is the tokio actor that owns it and turns step durations into (scaled)
//! sleeps; [`server`] speaks the OpenAI API and `/metrics` ([`metrics`]).

pub mod block_pool;
pub mod config;
pub mod engine;
pub mod filler;
pub mod metrics;
pub mod scheduler;
pub mod server;
