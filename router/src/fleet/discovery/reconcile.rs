//! Level-triggered reconcile: the workers the pods say there should be, against the
//! workers discovery has joined. A pure diff ([`diff`]) and its application to the
//! registry ([`Joined::apply`]); the watch loop calls it on every (coalesced) event and on
//! a periodic resync, always from the whole pod set, so a missed event is repaired by the
//! next pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use ownerserve_planner::ids::WorkerId;

use super::pod_worker::{PodWorker, WorkerKey};
use crate::fleet::registry::{Registry, Worker};

/// What one pass changes.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A new pod (or a pod on a new IP): a new worker.
    Join(Box<PodWorker>),
    /// Its pod is gone (or moved): drained through the existing path, then retired.
    Retire(WorkerId),
    /// Its pod turned ready (`true`: no longer drained) or not ready (`false`: drained).
    Eligible(WorkerId, bool),
}

/// A worker discovery joined: its id and whether its pod was eligible at the last pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinedWorker {
    pub id: WorkerId,
    pub eligible: bool,
}

/// The changes that take `joined` to `desired`.
pub fn diff(desired: &[PodWorker], joined: &BTreeMap<WorkerKey, JoinedWorker>) -> Vec<Change> {
    let mut out = Vec::new();
    let mut wanted = BTreeMap::new();
    for w in desired {
        wanted.insert(&w.key, w);
        match joined.get(&w.key) {
            None => out.push(Change::Join(Box::new(w.clone()))),
            Some(j) if j.id != w.id => {
                out.push(Change::Retire(j.id));
                out.push(Change::Join(Box::new(w.clone())));
            }
            Some(j) if j.eligible != w.eligible => out.push(Change::Eligible(j.id, w.eligible)),
            Some(_) => {}
        }
    }
    for (key, j) in joined {
        if !wanted.contains_key(key) {
            out.push(Change::Retire(j.id));
        }
    }
    out
}

/// The workers discovery has joined, by pod and port.
#[derive(Debug, Default)]
pub struct Joined {
    workers: BTreeMap<WorkerKey, JoinedWorker>,
}

impl Joined {
    /// Applies one pass: joins, retires and drains in `registry`; `started` is called with
    /// each worker that joined (its probe and scrape tasks).
    pub fn apply(
        &mut self,
        desired: &[PodWorker],
        registry: &Registry,
        started: &dyn Fn(&Arc<Worker>),
    ) -> usize {
        let changes = diff(desired, &self.workers);
        let n = changes.len();
        for change in changes {
            match change {
                Change::Join(w) => self.join(*w, registry, started),
                Change::Retire(id) => {
                    registry.retire(id);
                    self.workers.retain(|_, j| j.id != id);
                }
                Change::Eligible(id, eligible) => {
                    if let Some(w) = registry.get(id) {
                        w.set_draining(!eligible);
                    }
                    for j in self.workers.values_mut().filter(|j| j.id == id) {
                        j.eligible = eligible;
                    }
                }
            }
        }
        n
    }

    fn join(&mut self, w: PodWorker, registry: &Registry, started: &dyn Fn(&Arc<Worker>)) {
        let eligible = w.eligible;
        match registry.join(w.id, w.spec) {
            Ok(worker) => {
                // A pod that is not ready joins drained: no work until it turns ready.
                worker.set_draining(!eligible);
                started(&worker);
                self.workers
                    .insert(w.key, JoinedWorker { id: w.id, eligible });
            }
            Err(e) => tracing::warn!(error = %e, "discovered worker not joined"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerSpec;
    use ownerserve_planner::ids::{EngineKind, Role};

    fn pw(uid: &str, id: u32, eligible: bool) -> PodWorker {
        PodWorker {
            key: WorkerKey {
                uid: uid.into(),
                port: 8000,
            },
            id: WorkerId(id),
            spec: WorkerSpec::new(uid, "http://10.0.0.1:8000", Role::Hybrid, EngineKind::Sim),
            eligible,
        }
    }

    #[test]
    fn a_pass_joins_drains_and_retires_and_a_second_pass_changes_nothing() {
        let registry = Registry::new(vec![WorkerSpec::new(
            "static",
            "http://127.0.0.1:1",
            Role::Hybrid,
            EngineKind::Sim,
        )]);
        let mut joined = Joined::default();
        let none = |_: &Arc<Worker>| {};
        let first = [pw("a", 0x8000_0001, true), pw("b", 0x8000_0002, false)];
        assert_eq!(joined.apply(&first, &registry, &none), 2);
        assert_eq!(joined.apply(&first, &registry, &none), 0, "level-triggered");
        let b = registry.get(WorkerId(0x8000_0002)).expect("b joined");
        assert!(b.is_draining(), "not ready: joined drained");
        let second = [pw("a", 0x8000_0001, false), pw("b", 0x8000_0002, true)];
        assert_eq!(
            diff(&second, &joined.workers),
            vec![
                Change::Eligible(WorkerId(0x8000_0001), false),
                Change::Eligible(WorkerId(0x8000_0002), true)
            ]
        );
        joined.apply(&second, &registry, &none);
        assert!(!b.is_draining());
        // `a` deleted, `b` recreated under a new UID: a new worker.
        let third = [pw("b2", 0x8000_0003, true)];
        joined.apply(&third, &registry, &none);
        let a = registry
            .get(WorkerId(0x8000_0001))
            .expect("kept for its id");
        assert!(a.is_retired() && a.is_draining() && !a.is_healthy());
        let names: Vec<String> = registry.describe().into_iter().map(|w| w.id).collect();
        assert_eq!(names, vec!["static", "b2"]);
    }
}
