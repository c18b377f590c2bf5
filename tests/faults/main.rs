//! The fault tests: directory clusters and the whole topology as separate processes under
//! kill -9 / restart and SIGSTOP / SIGCONT, with recorded histories checked afterwards
//! (linearizability, no two owners, every request answered). A binary of their own, so
//! cargo runs them after `tests/e2e`, never beside its timing-sensitive tests.
//!
//! Run one area: `cargo test -p ownerserve-router --test faults e2e_ha::`; a chaos
//! campaign: `cargo test -p ownerserve-router --test faults chaos -- --nocapture` (the
//! variables are in `chaos.rs`).
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]

#[path = "../common/mod.rs"]
mod common;

mod chaos;
mod e2e_backup;
mod e2e_directory;
mod e2e_ha;
mod e2e_lagging;
mod e2e_linearizability;
mod e2e_read_lease;
mod e2e_router_restart;
mod e2e_upgrade;
