//! The ownership directory: one owner per long-lived KV prefix, with leases, fencing epochs
//! and copy-on-write fork refs, as a pure state machine replicated with openraft.
//!
//! Nothing lives here yet: the directory lands with issue 4. The crate exists now so the
//! workspace has the agreed shape and the dependency direction (`ownership → planner`) is
//! fixed from the start.
#![forbid(unsafe_code)]
