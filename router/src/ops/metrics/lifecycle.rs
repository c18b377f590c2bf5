//! The KV lifecycle of parked sessions (`ownerserve_planner::lifecycle`): what was decided
//! for each when it parked, what the router asked the engines to do, and what each
//! returning step found: kept in HBM, restored or prefetched on time or late, or
//! recomputed after its gap.

use prometheus::{IntCounterVec, Registry};

use ownerserve_edge::exposition::counter_vec;
use ownerserve_planner::lifecycle::{Effect, Hold, Returned};

/// The lifecycle's counters.
#[derive(Debug, Clone)]
pub struct LifecycleMetrics {
    decisions: IntCounterVec,
    actions: IntCounterVec,
    returns: IntCounterVec,
    admission: IntCounterVec,
}

impl LifecycleMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            decisions: counter_vec(
                registry,
                "ownerserve_kv_lifecycle_decisions_total",
                "Parked sessions' KV lifecycle decisions, by course (keep, offload, prefetch, let_go).",
                &["hold"],
            )?,
            actions: counter_vec(
                registry,
                "ownerserve_kv_lifecycle_actions_total",
                "What the lifecycle asked engines to do for parked sessions (touch, recompute, restore, offload, pin, unpin), by result (ok, failed, unsupported).",
                &["action", "result"],
            )?,
            returns: counter_vec(
                registry,
                "ownerserve_kv_lifecycle_returns_total",
                "Returning steps of parked sessions, by the course decided and where their KV was found (hbm: kept or brought back in time; host; gone: recomputed after the gap), and whether a restore or prefetch was still running (late).",
                &["hold", "found", "late"],
            )?,
            admission: counter_vec(
                registry,
                "ownerserve_session_admission_total",
                "New sessions' first steps under session admission, by outcome (admitted at once; held, then admitted; timed_out: sent after the longest wait without room).",
                &["outcome"],
            )?,
        })
    }

    pub fn decided(&self, hold: Hold) {
        self.decisions.with_label_values(&[hold.name()]).inc();
    }

    pub fn acted(&self, effect: Effect, result: &str) {
        self.actions
            .with_label_values(&[effect.name(), result])
            .inc();
    }

    pub fn admission(&self, outcome: &str) {
        self.admission.with_label_values(&[outcome]).inc();
    }

    pub fn returned(&self, hold: Hold, r: Returned) {
        let found = r.found.name();
        let late = if r.late { "true" } else { "false" };
        self.returns
            .with_label_values(&[hold.name(), found, late])
            .inc();
    }
}
