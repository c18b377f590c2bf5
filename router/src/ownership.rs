//! What the router does with the ownership directory: what it records there and the
//! workers' leases (`ownership_sync`), idle sessions and the returns they will send
//! (`sessions`), their demotion and the ending of those their clients closed (`demotion`,
//! `closing`), the removal of what the directory keeps that nothing uses (`retention`),
//! and the operator view of a remote cluster from this router's replica
//! (`replica_admin`). The directory itself is `ownerserve_ownership`'s.

pub(crate) mod closing;
pub(crate) mod demotion;
pub(crate) mod lifecycle;
pub(crate) mod ownership_sync;
pub(crate) mod replica_admin;
pub(crate) mod retention;
pub(crate) mod session_life;
pub(crate) mod sessions;
