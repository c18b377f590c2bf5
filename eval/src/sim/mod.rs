//! The trace simulator (`ownerserve simulate`): a discrete-event run of a workload over a
//! simulated cluster in virtual time. Each worker is the live sim engine's own
//! [`Scheduler`](ownerserve_shim::sim::scheduler::Scheduler) (continuous batching, chunked
//! prefill, paged prefix cache with LRU eviction, roofline timing), KV moves over the same
//! link model, and steps are placed by the same [`Policy`] implementations the router runs.
//! Each step's request and views are assembled, and what is in flight counted, by the
//! router's own step helpers (`ownerserve_planner::step`), never a copy; with
//! [`SimOptions::lifecycle`], parked sessions' KV follows the router's own lifecycle record
//! and decision (`ownerserve_planner::lifecycle`); with [`SimOptions::admission`], new
//! sessions wait for room by the router's own rule (`lifecycle::admits`).
//! Deterministic: no clock, no thread, ties broken by event order.

mod cluster;
mod directory;
mod engine;
mod events;
mod perturb;
mod pooled;
mod residency;
mod run;
mod stats;

pub use cluster::{Cluster, ClusterError, ClusterWorker};
pub use perturb::{Perturbation, SPREAD};
pub use stats::{mean, percentile, KvBytes, Placement, RunResult, StepRecord};

use ownerserve_planner::policy::Policy;

use crate::workload::Workload;

/// Knobs of a simulation that are not the cluster's or the policy's: the router's
/// idle-session lease and calibration settings (same defaults as the router's config).
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Idle lease = factor × predicted tool gap (`router.session_lease_factor`).
    pub lease_factor: f64,
    pub lease_min_ms: u64,
    pub lease_max_ms: u64,
    /// Feed observed prefill times back to the policy (`router.planner_calibrate`).
    pub calibrate: bool,
    /// Spacing of the duplicate-factor series, virtual seconds.
    pub sample_every_s: f64,
    /// The parked sessions' KV lifecycle for `ownerserve` (`[router.sessions] lifecycle`),
    /// its engines run with vLLM's priority policy.
    pub lifecycle: bool,
    /// The lifecycle decides knowing each parked session's true return (its trace gap)
    /// or end: what a perfect gap prediction could save, a bound on deciding better.
    pub lifecycle_oracle: bool,
    /// `ownerserve` holds a new session's first step while the fleet's KV memory cannot
    /// hold its context beside the live sessions' (`[router.sessions] admission`).
    pub admission: bool,
    /// The share of the fleet's KV admission keeps for the live sessions' growth
    /// (`[router.sessions] admission_headroom`).
    pub admission_headroom: f64,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            lease_factor: 2.0,
            lease_min_ms: 5_000,
            lease_max_ms: 600_000,
            calibrate: true,
            sample_every_s: 1.0,
            lifecycle: false,
            lifecycle_oracle: false,
            admission: false,
            admission_headroom: 0.0,
        }
    }
}

/// Runs `workload` on `cluster` with `policy`; `progress` is told how many steps completed.
pub fn simulate(
    workload: &Workload,
    cluster: &Cluster,
    policy: Box<dyn Policy>,
    opts: &SimOptions,
    progress: &dyn Fn(u64),
) -> Result<RunResult, ClusterError> {
    let configs = cluster.build()?;
    let Some(first) = configs.first() else {
        return Err(ClusterError::Syntax(cluster.name.clone()));
    };
    let roles: Vec<_> = cluster.workers.iter().map(|w| w.role).collect();
    let believed = cluster
        .build_believed()?
        .into_iter()
        .map(|c| c.roofline)
        .collect();
    let mut sim = run::Sim::new(
        workload,
        first.model.clone(),
        &configs,
        &roles,
        believed,
        policy,
        opts,
    );
    sim.set_peer_pulls(cluster.peer_pulls);
    let mut result = sim.run(progress);
    result.cluster = cluster.name.clone();
    Ok(result)
}

#[cfg(test)]
mod tests;
