//! Trace-driven evaluation: trace readers, workload generators, the virtual-time simulator
//! that drives the same policies and engine model as the live stack, and reports.
//!
//! Nothing lives here yet: the evaluation lands with issue 6. The crate exists now so the
//! workspace has the agreed shape (`eval → {planner, workers-shim}`).
#![forbid(unsafe_code)]

pub mod agreement;
pub mod oracle;
pub mod plot;
pub mod progress;
pub mod replay;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;
