//! One simulated worker: the live sim engine's [`Scheduler`] stepped in virtual time,
//! plus what the router counts about it (requests in flight, blocks and prefill tokens it
//! sent there). The live engine actor steps, sleeps the step's duration, delivers; here a
//! step's end is an event at `start + duration`.

use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::kv_release::DecodeAges;
use ownerserve_planner::policy::{EngineLoad, PrefillCharge, WorkerView};
use ownerserve_shim::sim::config::SimConfig;
use ownerserve_shim::sim::kv_transfer::{block_bytes, LinkModel};
use ownerserve_shim::sim::scheduler::{Scheduler, StepOutput};

/// A worker's engine and the router's counters for it.
pub(crate) struct Engine {
    pub sched: Scheduler,
    pub role: Role,
    /// The link this worker pulls KV over.
    pub link: LinkModel,
    /// KV bytes of one block.
    pub block_bytes: u64,
    /// A step is under way; its output lands at its end.
    pub stepping: Option<StepOutput>,
    pub next_seq: u64,
    pub in_flight: u32,
    pub active_blocks: u64,
    pub active_prefill_tokens: u64,
    /// Of those, the tokens it will compute itself (`WorkerView::active_compute_tokens`).
    pub active_compute_tokens: u64,
    /// Remote prefills, fetches and moves decoding here whose KV has not arrived
    /// (`WorkerView::legs_heading`).
    pub legs_heading: u32,
    /// Virtual seconds spent in steps.
    pub busy_s: f64,
    /// Running sequences preempted so far.
    pub preempted: u64,
    /// Requests decoding here (first token seen, not finished), as the router's relay
    /// knows them: their ages go in the view (`WorkerView::decode_ages`).
    pub decoding: Vec<usize>,
}

impl Engine {
    pub fn new(cfg: &SimConfig, role: Role) -> Self {
        let mut sched_cfg = cfg.scheduler.clone();
        // The simulator tracks residency (duplicate factor) from cache changes.
        sched_cfg.emit_cache_events = true;
        Self {
            sched: Scheduler::new(sched_cfg, cfg.model.clone(), cfg.roofline.clone()),
            role,
            link: cfg.transfer.link,
            block_bytes: block_bytes(&cfg.model, cfg.scheduler.block_size),
            stepping: None,
            next_seq: 0,
            in_flight: 0,
            active_blocks: 0,
            active_prefill_tokens: 0,
            active_compute_tokens: 0,
            legs_heading: 0,
            busy_s: 0.0,
            preempted: 0,
            decoding: Vec::new(),
        }
    }

    /// Counts a prefill pending here, as the router does from dispatch to first token.
    pub fn charge(&mut self, c: PrefillCharge) {
        self.active_prefill_tokens += c.tokens;
        self.active_compute_tokens += c.computed;
    }

    /// Stops counting a prefill [`Engine::charge`] counted.
    pub fn discharge(&mut self, c: PrefillCharge) {
        self.active_prefill_tokens = self.active_prefill_tokens.saturating_sub(c.tokens);
        self.active_compute_tokens = self.active_compute_tokens.saturating_sub(c.computed);
    }

    /// What the router sees of this worker for a prompt whose blocks hash to `hashes`,
    /// its decodes' ages not counted (`Run` adds them: it holds the requests).
    pub fn view(&self, id: usize, hashes: Option<&[u64]>) -> WorkerView {
        WorkerView {
            id: WorkerId(id as u32),
            role: self.role,
            healthy: true,
            draining: false,
            in_flight: self.in_flight,
            active_blocks: self.active_blocks,
            active_prefill_tokens: self.active_prefill_tokens,
            active_compute_tokens: self.active_compute_tokens,
            legs_heading: self.legs_heading,
            cached_blocks: hashes.map_or(0, |h| self.sched.cached_prefix(h) as u32),
            host_cached_blocks: hashes.map_or(0, |h| self.sched.host_cached_prefix(h) as u32),
            pulls_kv: true,
            prefill_decodes: true,
            // The simulator runs a remote prefill as vLLM's two-step: the decode leg is
            // submitted when the KV arrives (`sim::run`).
            decode_leg_at_dispatch: false,
            load: Some(EngineLoad {
                running: self.sched.num_running() as f64,
                waiting: self.sched.num_waiting() as f64,
                kv_usage: self.sched.pool().usage(),
                kv_free_tokens: Some(
                    self.sched.pool().num_free() as u64 * u64::from(self.sched.config().block_size),
                ),
                kv_capacity_tokens: Some(
                    self.sched.pool().capacity() as u64 * u64::from(self.sched.config().block_size),
                ),
                kv_room_tokens: Some(
                    (self.sched.pool().capacity() - self.sched.pool().holding()) as u64
                        * u64::from(self.sched.config().block_size),
                ),
            }),
            decode_ages: DecodeAges::default(),
            parked_returns_per_s: 0.0,
        }
    }
}
