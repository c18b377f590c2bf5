//! One simulated worker: the live sim engine's [`Scheduler`] stepped in virtual time,
//! plus what the router counts about it, in the router's own ledger
//! ([`ownerserve_planner::step`]: requests in flight, blocks and prefill tokens it sent
//! there, the decodes' ages). The live engine actor steps, sleeps the step's duration,
//! delivers; here a step's end is an event at `start + duration`.

use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::policy::{EngineLoad, WorkerView};
use ownerserve_planner::roofline::Roofline;
use ownerserve_planner::step::{self, Decodes, Ledger, WorkerFacts};
use ownerserve_shim::sim::config::SimConfig;
use ownerserve_shim::sim::kv_transfer::{block_bytes, LinkModel};
use ownerserve_shim::sim::scheduler::{Scheduler, StepOutput};

/// A worker's engine and the router's counters for it.
pub(crate) struct Engine {
    pub sched: Scheduler,
    pub role: Role,
    /// The link this worker pulls KV over.
    pub link: LinkModel,
    /// When its NIC has sent every copy queued on it (virtual s): copies it serves to its
    /// peers share it, one after another.
    pub nic_free_s: f64,
    /// KV bytes of one block.
    pub block_bytes: u64,
    /// A step is under way; its output lands at its end.
    pub stepping: Option<StepOutput>,
    pub next_seq: u64,
    /// What the router has in flight here (requests, their KV blocks and pending prefill,
    /// remote prefills, fetches and moves decoding here whose KV has not arrived).
    pub ledger: Ledger,
    /// Virtual seconds spent in steps.
    pub busy_s: f64,
    /// Running sequences preempted so far.
    pub preempted: u64,
    /// Requests decoding here (first token seen, not finished), as the router's relay
    /// knows them: their ages go in the view (`WorkerView::decode_ages`), counted exact
    /// at every step (no window: virtual time costs nothing to read).
    pub decodes: Decodes,
    /// The engine's roofline as the router is told it (the lifecycle prices a recompute
    /// and a touch with it): its preset, whatever a perturbed engine really does.
    pub roofline: Roofline,
    /// Its engine can pull KV from a peer (`Cluster::peer_pulls`).
    pub pulls_kv: bool,
}

impl Engine {
    /// `priority`: vLLM's priority scheduling policy (for the lifecycle's marks);
    /// `believed`: its roofline as the router is told it.
    pub fn new(cfg: &SimConfig, role: Role, priority: bool, believed: Roofline) -> Self {
        let mut sched_cfg = cfg.scheduler.clone();
        // The simulator tracks residency (duplicate factor) from cache changes.
        sched_cfg.emit_cache_events = true;
        sched_cfg.priority_scheduling |= priority;
        Self {
            sched: Scheduler::new(sched_cfg, cfg.model.clone(), cfg.roofline.clone()),
            role,
            link: cfg.transfer.link,
            nic_free_s: 0.0,
            block_bytes: block_bytes(&cfg.model, cfg.scheduler.block_size),
            stepping: None,
            next_seq: 0,
            ledger: Ledger::default(),
            busy_s: 0.0,
            preempted: 0,
            decodes: Decodes::new(0.0),
            roofline: believed,
            pulls_kv: true,
        }
    }

    /// What the router sees of this worker (`step::worker_view`): its exact load as a
    /// scrape would report it and the ledger's counts; the rest is added by
    /// `step::complete_views`.
    pub fn view(&self, id: usize) -> WorkerView {
        let block = u64::from(self.sched.config().block_size);
        let pool = self.sched.pool();
        let facts = WorkerFacts {
            id: WorkerId(id as u32),
            role: self.role,
            healthy: true,
            draining: false,
            pulls_kv: self.pulls_kv,
            prefill_decodes: true,
            // The simulator runs a remote prefill as vLLM's two-step: the decode leg is
            // submitted when the KV arrives (`sim::run`).
            decode_leg_at_dispatch: false,
        };
        let load = EngineLoad {
            running: self.sched.num_running() as f64,
            waiting: self.sched.num_waiting() as f64,
            kv_usage: pool.usage(),
            kv_free_tokens: Some(pool.num_free() as u64 * block),
            kv_capacity_tokens: Some(pool.capacity() as u64 * block),
            kv_room_tokens: Some((pool.capacity() - pool.holding()) as u64 * block),
        };
        let mut view = step::worker_view(facts, Some(load), &self.ledger);
        // As the router folds in what it sends between two scrapes (`proxy::view`); the
        // pool's own holding stands for the router's KV index.
        step::predict_kv_usage(
            &mut view,
            block,
            pool.capacity() as u64 * block,
            pool.holding() as u64 * block,
        );
        view
    }
}
