//! Pure core of OwnerServe: everything here is deterministic, does no IO and reads no clock.
//!
//! # Layout
//! - [`ids`]: worker identity, roles and engine kinds shared by every crate.
//! - [`hash`]: Dynamo-compatible rolling block hashes (xxh3, seed 1337), and a prompt's
//!   hashes extended from its session's previous prompt ([`hash::HashedPrompt`]).
//! - [`tokenizer`]: the built-in approximate tokenizer and chat template, shared by the
//!   router and the simulated engine so prefixes match exactly in the embedded stack;
//!   [`tokenized`]: a tokenized text with restart points, re-tokenized only past where a
//!   new text differs.
//! - [`spec`]: model and GPU presets (TOML in `configs/`) and the figures derived from them;
//!   [`kv_state`]: what a prefix's KV holds per model kind (sealed, tail, window).
//! - [`roofline`]: step-time model (prefill compute-bound, decode memory-bound).
//! - [`ewma`]: smoothed observations (prefill calibration, tool-call gaps and the idle
//!   lease they imply).
//! - [`lifecycle`]: what a session parked on a tool call does with its KV (keep, offload,
//!   prefetch, let go), priced from its lognormal gaps and its owner's KV within the share
//!   of it kept sessions may hold; the KV's state machine and the per-session record the
//!   router and the simulator both keep; session admission (`lifecycle::admission`).
//! - [`kv_index`]: which worker holds which KV block chain, per tier, and prefix matching.
//! - [`kv_release`]: how fast a worker's running decodes release their KV (the observed
//!   decode lifetimes and the ages of the decodes running there).
//! - [`plan`]: the cost planner: step classes, the five actions priced on every worker
//!   (pair), and the chosen plan with its cost breakdown; each worker is priced as the
//!   step will find it when admitted there (`plan/admission.rs`: the wait for KV on a full
//!   worker, the share of a cached prefix that survives the wait), and the decode the
//!   placement commits the step to is priced at the decoder's batch (`plan/decode.rs`).
//! - [`policy`]: the `Policy` trait every routing policy and baseline implements, and
//!   those policies (the planner's `ownerserve` among them, and the peers' routers at their
//!   own defaults: `dynamo_kv`, `dynamo_disagg`, `llm_d`, `smg_cache_aware`).
//! - [`step`]: **canonical, copies forbidden**: the one step assembly (the
//!   `RouteRequest`, the workers' views completed with what a policy reads) and the one
//!   in-flight ledger (requests, KV blocks, pending prefill, legs heading, decode ages).
//!   The router, the trace simulator and the oracle all use these; a shell that
//!   re-implements any of them measures something other than the router.
#![forbid(unsafe_code)]

pub mod ewma;
pub mod hash;
pub mod ids;
pub mod kv_index;
pub mod kv_release;
pub mod kv_state;
pub mod lifecycle;
pub mod plan;
pub mod policy;
pub mod roofline;
pub mod spec;
pub mod step;
pub mod tokenized;
pub mod tokenizer;
