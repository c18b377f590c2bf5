//! Keeps the directory in step with the fleet, off the request path: a lease per worker,
//! renewed while the worker is healthy (so a dead worker's ownership expires on its own),
//! and, for every routed request, a claim of its prompt's prefix and the session's decode
//! owner for the worker that served it. Records are batched into one `Batch` entry per
//! flush, so the proxy never waits for a Raft round trip.
//!
//! This file is the handle the proxy records through; `commands` builds the directory
//! commands of a record, `leases` picks and renews the workers' leases, `flush` is the
//! task that batches records into the directory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ownerserve_ownership::ids::{Epoch, LeaseId, PrefixKey};
use ownerserve_ownership::node::DirectoryClient;
use ownerserve_planner::hash::HashedPrompt;
use ownerserve_planner::ids::WorkerId;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::fleet::registry::Registry;
use flush::run;
use leases::lease_to_write;

mod commands;
mod flush;
mod leases;
#[cfg(test)]
mod tests;

pub use commands::owner_claim;

/// Most records queued for the sync task. While the directory is down the task waits on
/// it and the queue fills; past this, records are dropped and counted, so an outage costs
/// ownership records, never the router's memory (each record holds a prompt's tokens).
pub const MAX_QUEUED: usize = 4096;

/// One routed request to record.
pub struct Routed {
    pub worker: WorkerId,
    pub session: Option<String>,
    /// The session's root session and parent agent, as its harness named them.
    pub root: Option<String>,
    pub parent: Option<String>,
    /// The prompt as the identity stage tokenized and hashed it.
    pub prompt: Arc<HashedPrompt>,
    pub effects: Effects,
}

/// What a plan changes in the directory besides recording the serving worker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    /// The plan moves the session: set its owner only if its epoch is still this one.
    pub expect_epoch: Option<Epoch>,
    /// The worker fetched this artifact: register its read-only copy.
    pub replicate: Option<PrefixKey>,
    /// The request forks its session into this child, fenced by the parent's epoch.
    pub fork: Option<(String, Epoch)>,
    /// The session's predicted tool-call gap.
    pub predicted_gap_ms: Option<u64>,
}

/// Timings of the sync, and where it counts what it drops.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    pub lease_ttl: Duration,
    pub flush_every: Duration,
    pub block_size: usize,
    /// Records dropped for lack of room (`ownerserve_ownership_records_dropped_total`).
    pub dropped: prometheus::IntCounter,
}

/// Each worker's current directory lease.
type Leases = Arc<Mutex<HashMap<WorkerId, LeaseId>>>;

/// Handle the proxy records routed requests through (never blocks).
#[derive(Clone)]
pub struct OwnershipSync {
    tx: mpsc::Sender<Routed>,
    leases: Leases,
    client: Arc<dyn DirectoryClient>,
    /// Records dropped because the queue was full (`ownerserve_ownership_records_dropped_total`).
    dropped: prometheus::IntCounter,
}

impl OwnershipSync {
    /// Queues a record for the directory, or drops and counts it when the sync is
    /// [`MAX_QUEUED`] records behind.
    pub fn record(&self, routed: Routed) {
        if self.tx.try_send(routed).is_err() {
            self.dropped.inc();
        }
    }

    /// The worker's directory lease: the shared one (the lowest live one in the local copy
    /// of the directory, which every router renews), else the one this router renews, so a
    /// router that has not renewed yet can still claim for the worker.
    pub fn lease_of(&self, worker: WorkerId) -> Option<LeaseId> {
        let own = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&worker)
            .copied();
        lease_to_write(&*self.client, worker, own)
    }

    /// The directory, for commands that must commit before the request goes on (a
    /// migration's owner flip) and for lookups.
    pub fn client(&self) -> &Arc<dyn DirectoryClient> {
        &self.client
    }

    /// Starts the sync task.
    pub fn spawn(
        client: Arc<dyn DirectoryClient>,
        registry: Arc<Registry>,
        s: SyncSettings,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(MAX_QUEUED);
        let leases = Leases::default();
        let dropped = s.dropped.clone();
        let sync = run(client.clone(), registry, s, rx, leases.clone());
        // Cancelled wherever it waits: a hung directory must not hold up shutdown.
        tracker.spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = sync => {}
            }
        });
        Self {
            tx,
            leases,
            client,
            dropped,
        }
    }
}
