//! The router's view of its workers: identity, health, the models each serves and the
//! requests in flight there. Shared by handlers, the health checker and the admin API.
//!
//! Configured workers are numbered in configuration order; workers found at run time
//! (Kubernetes discovery) join with an id every replica derives alike from their pod, so
//! replicas sharing a directory name a worker the same. A worker that goes away is
//! retired: drained, down and out of the listings, its tasks stopped, its id not reused (a
//! pod that comes back has a new UID, so a new id). Past `MAX_RETIRED` retired workers the
//! oldest are dropped, so pods that come and go do not pile up in memory.
//!
//! One file per concern: membership (this file: who the workers are, joining and
//! retiring, which serve a model), `worker` (one worker and its view), `health`
//! (active and passive checks, drains), `ledger` (the load ledger: requests in flight,
//! their prefill and KV, the decodes' ages) and `listing` (the admin API's rows, workers
//! named in plan reasons).

mod health;
mod ledger;
mod listing;
mod worker;

use std::sync::{Arc, RwLock};
use std::time::Instant;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::WorkerView;

use crate::config::WorkerSpec;

pub use ledger::InFlight;
pub use listing::{LoadInfo, WorkerInfo};
pub use worker::{ServedModel, Worker, RECEIPT_OUTCOMES};

/// Whether a model can be served right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelAvailability {
    /// At least one healthy worker serves it.
    Available,
    /// Known to some worker that is down, or possibly served by a worker that has never
    /// answered: retry later.
    Unavailable,
    /// Every worker has reported its models and none serves it.
    Unknown,
}

/// All workers: the configured ones in configuration order (`WorkerId` is the index),
/// then those found at run time.
#[derive(Debug)]
pub struct Registry {
    fleet: RwLock<Arc<Fleet>>,
    clock: Instant,
}

/// One snapshot of the workers: in the order they joined, and by id.
#[derive(Debug, Default)]
pub struct Fleet {
    workers: Vec<Arc<Worker>>,
    by_id: std::collections::HashMap<WorkerId, usize>,
}

impl std::ops::Deref for Fleet {
    type Target = [Arc<Worker>];
    fn deref(&self) -> &[Arc<Worker>] {
        &self.workers
    }
}

impl<'a> IntoIterator for &'a Fleet {
    type Item = &'a Arc<Worker>;
    type IntoIter = std::slice::Iter<'a, Arc<Worker>>;
    fn into_iter(self) -> Self::IntoIter {
        self.workers.iter()
    }
}

/// Retired workers kept (listed nowhere, found by id) before the oldest are dropped.
pub const MAX_RETIRED: usize = 256;

/// Why a worker could not join.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinError {
    #[error("worker id {0:?} is taken (by `{1}`)")]
    IdTaken(WorkerId, String),
}

impl Registry {
    /// Workers from their specs, all unhealthy until their first health check.
    pub fn new(specs: Vec<WorkerSpec>) -> Self {
        let clock = Instant::now();
        let mut fleet = Fleet::default();
        for (i, spec) in specs.into_iter().enumerate() {
            let id = WorkerId(i as u32);
            fleet.by_id.insert(id, fleet.workers.len());
            fleet
                .workers
                .push(Arc::new(Worker::new(id, spec, clock, true)));
        }
        Self {
            fleet: RwLock::new(Arc::new(fleet)),
            clock,
        }
    }

    /// Every worker (a snapshot: workers that join later are not in it), retired ones
    /// included.
    pub fn all(&self) -> Arc<Fleet> {
        self.fleet
            .read()
            .map_or_else(|e| e.into_inner().clone(), |f| f.clone())
    }

    /// A worker by id.
    pub fn get(&self, id: WorkerId) -> Option<Arc<Worker>> {
        let fleet = self.all();
        fleet.by_id.get(&id).map(|&i| fleet.workers[i].clone())
    }

    /// Adds a worker found at run time under `id` (unhealthy until its first check).
    pub fn join(&self, id: WorkerId, spec: WorkerSpec) -> Result<Arc<Worker>, JoinError> {
        let mut guard = self.fleet.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = guard.by_id.get(&id) {
            return Err(JoinError::IdTaken(id, guard.workers[i].spec.name.clone()));
        }
        let worker = Arc::new(Worker::new(id, spec, self.clock, false));
        let mut workers = guard.workers.clone();
        let mut by_id = guard.by_id.clone();
        by_id.insert(id, workers.len());
        workers.push(worker.clone());
        *guard = Arc::new(Fleet { workers, by_id });
        tracing::info!(worker = %worker.spec.name, url = %worker.spec.base_url, "worker joined");
        Ok(worker)
    }

    /// Retires a worker that went away: drained (the existing drain path: the planner
    /// hands its sessions to another worker on their next step) and down (its KV cannot
    /// be read), out of the listings, its tasks stopped. Its id is never reused.
    pub fn retire(&self, id: WorkerId) {
        let Some(w) = self.get(id) else { return };
        w.set_draining(true);
        w.mark_down("gone");
        w.retired.cancel();
        tracing::info!(worker = %w.spec.name, "worker retired");
        self.forget_retired();
    }

    /// Drops the oldest retired workers past [`MAX_RETIRED`], so a fleet whose pods come
    /// and go for months does not keep every one it has seen (requests still running on
    /// one hold their own handle).
    fn forget_retired(&self) {
        let mut guard = self.fleet.write().unwrap_or_else(|e| e.into_inner());
        let retired = guard.workers.iter().filter(|w| w.is_retired()).count();
        let Some(mut excess) = retired.checked_sub(MAX_RETIRED).filter(|&n| n > 0) else {
            return;
        };
        let mut workers = Vec::with_capacity(guard.workers.len() - excess);
        for w in &guard.workers {
            if excess > 0 && w.is_retired() {
                excess -= 1;
                continue;
            }
            workers.push(w.clone());
        }
        let by_id = workers.iter().enumerate().map(|(i, w)| (w.id, i)).collect();
        *guard = Arc::new(Fleet { workers, by_id });
    }

    /// A live (not retired) worker by its name.
    pub fn by_name(&self, name: &str) -> Option<Arc<Worker>> {
        self.all()
            .iter()
            .find(|w| w.spec.name == name && !w.is_retired())
            .cloned()
    }

    /// Whether `model` can be served now.
    pub fn availability(&self, model: &str) -> ModelAvailability {
        let mut maybe = false;
        for w in self.all().iter() {
            if w.serves(model) && w.is_healthy() {
                return ModelAvailability::Available;
            }
            maybe |= w.serves(model) || w.models().is_empty();
        }
        if maybe {
            ModelAvailability::Unavailable
        } else {
            ModelAvailability::Unknown
        }
    }

    /// The workers of `fleet` (a snapshot, [`Registry::all`]) that serve `model`, minus
    /// `excluded` ones (workers that already failed this request).
    pub fn serving<'f>(
        fleet: &'f Fleet,
        model: &str,
        excluded: &[WorkerId],
    ) -> Vec<&'f Arc<Worker>> {
        fleet
            .iter()
            .filter(|w| w.serves(model) && !excluded.contains(&w.id))
            .collect()
    }

    /// Policy views of the workers that serve `model`, minus `excluded` ones; with their
    /// decodes' ages in the planner's time when `ages_time_scale` is given
    /// (`Worker::decode_ages`).
    pub fn candidates(
        &self,
        model: &str,
        excluded: &[WorkerId],
        ages_time_scale: Option<f64>,
    ) -> Vec<WorkerView> {
        Self::serving(&self.all(), model, excluded)
            .into_iter()
            .map(|w| {
                let mut v = w.view();
                if let Some(scale) = ages_time_scale {
                    v.decode_ages = w.decode_ages(scale);
                }
                v
            })
            .collect()
    }

    /// Healthy workers serving `model`.
    pub fn healthy_serving(&self, model: &str) -> usize {
        self.all()
            .iter()
            .filter(|w| w.is_healthy() && w.serves(model))
            .count()
    }

    /// The KV capacity, tokens, of the healthy workers serving `model` whose capacity is
    /// known (configured or reported); `None` if none is.
    pub fn healthy_kv_capacity(&self, model: &str) -> Option<u64> {
        self.all()
            .iter()
            .filter(|w| w.is_healthy() && w.serves(model))
            .filter_map(|w| w.kv_capacity_tokens())
            .reduce(u64::saturating_add)
    }

    /// Distinct models served by healthy workers, in first-seen order.
    pub fn healthy_models(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for w in self.all().iter().filter(|w| w.is_healthy()) {
            for m in w.models().iter() {
                if !out.contains(&m.id) {
                    out.push(m.id.clone());
                }
            }
        }
        out
    }

    /// How healthy workers list `model`: the smallest context limit any of them states,
    /// and the base model if it is a LoRA adapter.
    pub fn served(&self, model: &str) -> Option<ServedModel> {
        let mut out: Option<ServedModel> = None;
        for w in self.all().iter().filter(|w| w.is_healthy()) {
            for m in w.models().iter().filter(|m| m.id == model) {
                let o = out.get_or_insert_with(|| m.clone());
                o.max_model_len = match (o.max_model_len, m.max_model_len) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                o.parent = o.parent.take().or_else(|| m.parent.clone());
            }
        }
        out
    }
}

#[cfg(test)]
pub(super) mod tests {
    use ownerserve_planner::ids::{EngineKind, Role};

    use super::*;

    /// A decode worker `a` and a hybrid `b`, neither checked yet.
    pub(in crate::fleet::registry) fn registry() -> Registry {
        let spec =
            |name: &str, role| WorkerSpec::new(name, "http://127.0.0.1:1", role, EngineKind::Sim);
        Registry::new(vec![spec("a", Role::Decode), spec("b", Role::Hybrid)])
    }

    #[test]
    fn retired_workers_are_kept_up_to_a_bound_the_oldest_dropped_first() {
        let r = registry();
        let spec = |i: u32| {
            WorkerSpec::new(
                &format!("pod-{i}"),
                "http://127.0.0.1:1",
                Role::Hybrid,
                EngineKind::Sim,
            )
        };
        let n = MAX_RETIRED as u32 + 10;
        for i in 0..n {
            let id = WorkerId(1_000 + i);
            r.join(id, spec(i)).unwrap();
            r.retire(id);
        }
        let fleet = r.all();
        assert_eq!(
            fleet.workers.len(),
            2 + MAX_RETIRED,
            "the static two and the bound"
        );
        assert!(
            r.get(WorkerId(1_000)).is_none(),
            "the oldest retired one is gone"
        );
        assert!(r
            .get(WorkerId(1_000 + n - 1))
            .is_some_and(|w| w.is_retired()));
        assert!(r.get(WorkerId(0)).is_some_and(|w| !w.is_retired()));
    }
}
