//! The cost of one candidate, term by term.

use serde::Serialize;

use super::Weights;

/// `C = T_queue + T_compute + T_network + T_restore + λ·M_hbm + μ·I_decode + T_evict +
/// ν·D_queue + ρ·D_decode (+ H_migrate) (+ κ·R_dup for a fork's copy) (+ T_host)
/// (+ T_hold for a move off the owner)`, with each
/// term kept so the explain output can show why a candidate won or lost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostTerms {
    /// Wait before the compute worker starts, seconds.
    pub queue_s: f64,
    /// Prefill or recompute time, seconds.
    pub compute_s: f64,
    /// Transfer time between workers, link latency included, seconds.
    pub network_s: f64,
    /// Writing transferred KV into the target's cache, seconds.
    pub restore_s: f64,
    /// HBM the action duplicates (a second copy of state another worker holds), bytes.
    pub hbm_bytes: f64,
    /// Decode-seconds stalled by a prefill on a worker that is decoding.
    pub interference_s: f64,
    /// Prefill someone will redo because the decode worker must evict cached prefixes to
    /// hold this step's KV (the prompt tokens it lacks beyond its free room), or preempt
    /// running sequences (the prompt's tokens beyond what running sequences leave free),
    /// at its own prefill rate, seconds; 0 while it has room or its capacity is unknown.
    pub evict_s: f64,
    /// Prefill-seconds this step's compute adds to the waits of the prefills that will
    /// queue behind it on its compute worker (compute × `PlanWorker::later_arrivals`: the
    /// prefills queued there now and the parked sessions' returns during it); weighted
    /// by ν. A worker whose backlog keeps growing charges more for each step it takes,
    /// which is what lets its queue drain instead of setting the tail.
    pub queue_delay_s: f64,
    /// The recompute value of the copy of the prefix a fork's branch makes its decode worker
    /// hold (κ applied; 0 on the prefix owner and for steps that are not forks), seconds.
    pub duplicate_s: f64,
    /// Hysteresis charged on a migration off an owner that could keep the session,
    /// seconds (`Weights::migrate_hysteresis` times its transfer, raised by the migration
    /// budget's shadow price when one is set); 0 for other actions.
    pub hysteresis_s: f64,
    /// Copying the prompt's host-cached tokens back into HBM over PCIe, seconds (0 when
    /// recomputing them is cheaper, or the worker holds none in host memory).
    pub host_restore_s: f64,
    /// Decode-seconds of the step's expected decode on its decode worker, its own and what
    /// it adds to the sequences running there (`decode.rs`); weighted by ρ.
    pub decode_s: f64,
    /// How long the step's answer waits past its own work because it moves the session off
    /// its owner: the router holds a move's first answer until its read lease has run out
    /// (`PlanInput::move_hold_s`), less the queue, compute and transfer the step takes
    /// meanwhile, seconds; 0 for a step that stays, and wherever no hold is set.
    pub move_hold_s: f64,
    /// The weighted sum, seconds.
    pub total: f64,
}

impl CostTerms {
    /// Terms with their weighted total.
    pub fn new(
        weights: Weights,
        queue_s: f64,
        compute_s: f64,
        network_s: f64,
        restore_s: f64,
        hbm_bytes: f64,
        interference_s: f64,
    ) -> Self {
        let total = queue_s
            + compute_s
            + network_s
            + restore_s
            + weights.lambda_s_per_gb * hbm_bytes / 1e9
            + weights.mu * interference_s;
        Self {
            queue_s,
            compute_s,
            network_s,
            restore_s,
            hbm_bytes,
            interference_s,
            evict_s: 0.0,
            queue_delay_s: 0.0,
            hysteresis_s: 0.0,
            duplicate_s: 0.0,
            host_restore_s: 0.0,
            decode_s: 0.0,
            move_hold_s: 0.0,
            total,
        }
    }

    /// The same terms with `s` seconds of restore from host memory added to the total.
    pub fn with_host_restore(mut self, s: f64) -> Self {
        self.host_restore_s = s;
        self.total += s;
        self
    }

    /// The same terms with the wait of a move's answer for a hold of `hold_s` seconds from
    /// now: what of it the step's queue, compute and transfer do not already take.
    pub fn with_move_hold(mut self, hold_s: f64) -> Self {
        let busy_s = self.queue_s + self.compute_s + self.network_s + self.restore_s;
        let wait_s = (hold_s - busy_s).max(0.0);
        self.move_hold_s = wait_s;
        self.total += wait_s;
        self
    }

    /// The same terms with `decode_s` decode-seconds on the decode worker added, at ρ.
    pub fn with_decode(mut self, weights: Weights, decode_s: f64) -> Self {
        self.decode_s = decode_s;
        self.total += weights.rho * decode_s;
        self
    }

    /// The same terms with the eviction `evict_s` seconds added to the total.
    pub fn with_eviction(mut self, evict_s: f64) -> Self {
        self.evict_s = evict_s;
        self.total += evict_s;
        self
    }

    /// The same terms with `queue_delay_s` seconds of delay to later prefills added, at ν.
    pub fn with_queue_delay(mut self, weights: Weights, queue_delay_s: f64) -> Self {
        self.queue_delay_s = queue_delay_s;
        self.total += weights.nu * queue_delay_s;
        self
    }

    /// The same terms with a remote prefill's decode leg waiting `wait_s` behind the
    /// decoder's queue after its KV arrives (added to `queue_s`).
    pub fn with_decode_leg_wait(mut self, wait_s: f64) -> Self {
        self.queue_s += wait_s;
        self.total += wait_s;
        self
    }

    /// The same terms with `duplicate_s` seconds of duplicate value added to the total.
    pub fn with_duplicate(mut self, duplicate_s: f64) -> Self {
        self.duplicate_s = duplicate_s;
        self.total += duplicate_s;
        self
    }

    /// The same terms with a migration's hysteresis added to the total: `hysteresis` times
    /// its copy (`Pricing::hysteresis`).
    pub fn with_hysteresis(mut self, hysteresis: f64) -> Self {
        let h = hysteresis_s(self.network_s + self.restore_s, hysteresis);
        self.hysteresis_s = h;
        self.total += h;
        self
    }
}

/// The hysteresis a move pays on a copy of `copy_s` seconds: `multiple` times the copy.
/// A move that copies nothing pays none, however high the multiple: once the migration
/// budget is spent its shadow price is infinite, and 0 × ∞ would be NaN, a total every
/// comparison loses, so the move would win every step (every session piled onto one
/// worker: Llama SWE-smith ×200 on `8h` with the budget at 0 ran at p99 TTFT 148 s).
pub fn hysteresis_s(copy_s: f64, multiple: f64) -> f64 {
    if copy_s > 0.0 {
        copy_s * multiple
    } else {
        0.0
    }
}
