//! Trace-driven evaluation: trace readers, workload generators, the virtual-time simulator
//! that drives the same policies and engine model as the live stack, and reports.
#![forbid(unsafe_code)]

pub mod agreement;
pub mod bound;
pub mod oracle;
pub mod plot;
pub mod progress;
pub mod replay;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod workload;
