//! Trace-driven evaluation: trace readers, workload generators, the virtual-time simulator
//! that drives the same policies and engine model as the live stack, and reports.
//!
//! # Layout
//! - [`workload`]: trace readers (Mooncake, Azure, our agentic JSONL, which closed-loop
//!   workloads are also written in), generators (coding-agent sessions, repo swarms, long
//!   gaps, forked rollouts, long-doc QA), arrivals and scaling; [`scenario`]: the named
//!   workloads the commands select.
//! - [`sim`]: the trace-driven simulator, in virtual time, over the simulated engine's pure
//!   scheduler (`ownerserve_shim::sim`, without its `io` feature) and every policy; with
//!   `simulate --pooled`, the pooled relaxation of a hybrid fleet (`sim/pooled.rs`).
//! - [`bound`]: a per-step lower bound on TTFT; [`oracle`]: a clairvoyant heuristic.
//! - [`report`] and [`plot`]: Markdown tables, capacity searches, the evaluation matrix's
//!   per-row acceptance checks (`report::matrix`), each policy at its best fleet shape
//!   (`report::best_shape`) and its goodput there (`report::best_goodput`), every step's placement as CSV
//!   (`report::steps_csv`, for diagnosing a policy) and PNG charts;
//!   [`progress`]: progress bars; [`console`]: printed lines.
//! - [`commands`]: `ownerserve simulate`, `report` and `replay`.
//! - `replay` (feature `replay`): the live replay client, which drives a running router
//!   over HTTP; [`agreement`]: how a replay and a simulation of one workload agree.
//! - `examples/eval_cli.rs`: `simulate` and `report` without the router, a release binary
//!   that builds in minutes for iterating on the simulator.
#![forbid(unsafe_code)]

pub mod agreement;
pub mod bound;
pub mod commands;
pub mod console;
pub mod oracle;
pub mod plot;
pub mod progress;
#[cfg(feature = "replay")]
pub mod replay;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;
