//! Everything that touches an engine.
//!
//! # Layout
//! - [`openai`]: OpenAI request parsing and validation (shared by the router and the
//!   simulated engine) and the response/chunk wire types.
//! - [`kv_events`]: vLLM/SGLang KV-event codecs; with `io`, the ZMQ publisher and
//!   subscriber and the Redis fan-out.
//! - [`load_metrics`]: engine `/metrics` read into a load, by the engines' metric names.
//! - `hf_tokenizer` (feature `hf`): a model's own `tokenizer.json` and chat template, so
//!   the router's tokens (and block hashes) are the engine's.
//! - [`engines`]: one file per engine kind: its protocol (`EngineProtocol`: probe,
//!   metric names, self-report, step budget, leg pairing, KV pull and drop) and its
//!   dispatch adapters, how it runs one leg of a plan (vLLM NIXL, SGLang bootstrap).
//! - [`sim`]: the simulated GPU engine behind `ownerserve sim-worker`: a pure scheduler
//!   core (continuous batching, chunked prefill, paged prefix cache with an optional
//!   host-DRAM tier, roofline timing) and
//!   a thin HTTP/tokio shell that speaks vLLM's OpenAI API and `/metrics`.
//!
//! The `io` feature (on by default) gates everything that opens a socket or runs a task;
//! without it the crate is pure, and `eval` uses it that way.
#![forbid(unsafe_code)]

pub mod engines;
#[cfg(feature = "hf")]
pub mod hf_tokenizer;
pub mod kv_events;
pub mod load_metrics;
pub mod openai;
pub mod sim;
