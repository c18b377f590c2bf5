//! Pure core of OwnerServe: everything here is deterministic, does no IO and reads no clock.
//!
//! # Layout
//! - [`ids`]: worker identity, roles and engine kinds shared by every crate.
//! - [`hash`]: Dynamo-compatible rolling block hashes (xxh3, seed 1337).
//! - [`tokenizer`]: the built-in approximate tokenizer and chat template, shared by the
//!   router and the simulated engine so prefixes match exactly in the embedded stack.
//! - [`spec`]: model and GPU presets (TOML in `configs/`) and the figures derived from them.
//! - [`roofline`]: step-time model (prefill compute-bound, decode memory-bound).
//! - [`kv_index`]: which worker holds which KV block chain, per tier, and prefix matching.
//! - [`policy`]: the `Policy` trait every routing policy and baseline implements.
#![forbid(unsafe_code)]

pub mod ewma;
pub mod hash;
pub mod ids;
pub mod kv_index;
pub mod kv_state;
pub mod plan;
pub mod policy;
pub mod roofline;
pub mod spec;
pub mod tokenized;
pub mod tokenizer;
