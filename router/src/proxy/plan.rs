//! Plan: the routing policy's decision for a step. The policy is one mutable object shared
//! by every request (it keeps round-robin counters, calibration and sampling state), so
//! it sits behind a mutex that is held only for the pure `choose` call (and the feedback
//! calls that update its calibration).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::Plan;
use ownerserve_planner::policy::{Decision, Policy, PolicyError, RouteRequest, WorkerView};

use super::relay::Decoded;
use super::view::Needs;
use crate::error::ApiError;

/// The router's routing policy.
pub struct RoutingPolicy {
    /// Shared with the relays of responses still streaming (`decode_observer`).
    policy: Arc<Mutex<Box<dyn Policy>>>,
    needs: Needs,
}

impl RoutingPolicy {
    pub fn new(policy: Box<dyn Policy>) -> Self {
        let needs = Needs::of(policy.as_ref());
        Self {
            policy: Arc::new(Mutex::new(policy)),
            needs,
        }
    }

    /// The sources the policy reads.
    pub fn needs(&self) -> Needs {
        self.needs
    }

    fn lock(&self) -> MutexGuard<'_, Box<dyn Policy>> {
        lock(&self.policy)
    }

    /// The policy's decision among `candidates`, or the client's error when there is none.
    pub fn choose(
        &self,
        route: &RouteRequest<'_>,
        candidates: &[WorkerView],
    ) -> Result<Decision, ApiError> {
        self.lock()
            .choose(route, candidates)
            .map_err(|e| no_decision(e, route.model))
    }

    /// The policy's cost plan for `route`, every candidate listed (`None` when the policy
    /// has no cost planner).
    pub fn explain(
        &self,
        route: &RouteRequest<'_>,
        candidates: &[WorkerView],
    ) -> Option<Result<Plan, PolicyError>> {
        self.lock().explain(route, candidates)
    }

    /// Feeds an observed prefill back to the policy's calibration.
    pub fn observe_prefill(&self, worker: WorkerId, predicted_s: f64, observed_s: f64) {
        self.lock().observe_prefill(worker, predicted_s, observed_s);
    }

    /// Where a response decoded on `worker` reports how long it decoded (its first frame
    /// to its end, wall-clock): fed to the policy as `time_scale` times that
    /// (`Policy::observe_decode`, the decode lifetime the admission model waits on), as
    /// the simulator feeds it from its requests.
    pub fn decode_observer(&self, worker: WorkerId, time_scale: f64) -> Decoded {
        let policy = Arc::clone(&self.policy);
        Box::new(move |decoded: Duration| {
            lock(&policy).observe_decode(worker, decoded.as_secs_f64() * time_scale);
        })
    }
}

fn lock(policy: &Mutex<Box<dyn Policy>>) -> MutexGuard<'_, Box<dyn Policy>> {
    policy.lock().unwrap_or_else(|e| e.into_inner())
}

/// The client's error when no worker can take a step.
pub fn no_decision(e: PolicyError, model: &str) -> ApiError {
    let model = model.to_owned();
    match e {
        PolicyError::AllBusy => ApiError::AllBusy { model },
        PolicyError::NoHealthyWorker => ApiError::NoHealthyWorker { model },
    }
}
