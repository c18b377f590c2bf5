//! A [`KvIndex`] behind a lock, fed by subscribers and read by the router's policies.

use std::sync::{Mutex, MutexGuard};

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::{KvEvent, KvIndex, KvIndexConfig, StreamPosition};

use super::subscriber::EventSink;

/// The index every subscriber of one router writes into.
#[derive(Debug)]
pub struct SharedIndex {
    index: Mutex<KvIndex>,
}

impl SharedIndex {
    pub fn new(cfg: KvIndexConfig) -> Self {
        Self {
            index: Mutex::new(KvIndex::new(cfg)),
        }
    }

    /// Locks the index (held for microseconds: one event batch or one match).
    pub fn lock(&self) -> MutexGuard<'_, KvIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl EventSink for SharedIndex {
    fn apply(&self, worker: WorkerId, events: Vec<KvEvent>) -> usize {
        apply_events(&mut self.lock(), worker, &events)
    }

    fn apply_at(&self, worker: WorkerId, events: Vec<KvEvent>, at: StreamPosition) -> usize {
        let mut ix = self.lock();
        let refused = apply_events(&mut ix, worker, &events);
        ix.set_position(worker, at);
        refused
    }

    fn position(&self, worker: WorkerId) -> Option<StreamPosition> {
        self.lock().position(worker)
    }

    fn reset(&self, worker: WorkerId) {
        self.lock().clear_worker(worker);
    }
}

/// Applies `events` of `worker` to `ix`; returns how many it refused.
fn apply_events(ix: &mut KvIndex, worker: WorkerId, events: &[KvEvent]) -> usize {
    let mut refused = 0;
    for ev in events {
        if let Err(e) = ix.apply(worker, ev) {
            tracing::debug!(%worker, error = %e, "kv index: event rejected");
            refused += 1;
        }
    }
    refused
}
