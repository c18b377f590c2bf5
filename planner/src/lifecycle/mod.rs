//! What to do with a parked session's KV while its tool call runs, priced like every other
//! action in seconds of a step's critical path (background work weighted by how much it
//! takes from other requests).
//!
//! Between two steps of an agent, the engine's LRU decides alone: under load a session
//! away for a 40 s test run comes back to find its prefix evicted and prefills it again.
//! The owner knows more: the predicted gap and its spread ([`gap`]), the session's context,
//! the owner's KV pressure and what the engine lets it do ([`Levers`]). For each parked
//! session [`decide`] prices four courses:
//!
//! - **keep** it in HBM: pinned where the engine can hold a session's KV, else kept warm
//!   by touches (a one-token request on the prefix, which moves its blocks to the young
//!   end of the LRU). It costs what the held tokens displace of others' cache while under
//!   pressure, plus the touches;
//! - **offload** it to the owner's host tier (DRAM): a device-to-host copy in the
//!   background, then a restore timed to land before the predicted return; a return that
//!   beats the restore waits for it (the request waits, not the batch);
//! - **prefetch** it by recomputing just before the predicted return (an engine with no
//!   host tier): the compute moves off the returning step's critical path;
//! - **let go**: the LRU decides; a return after an eviction pays the prefill in full.
//!
//! A session that ends (closed by its client, its lease lapsed) is released: its pins and
//! its records go ([`parked`]). The state machine of a session's KV, which the router and
//! the simulator drive from these decisions and the engines' events, is [`parked`]; the
//! record each keeps per parked session (decisions revised as the load changes, touches
//! and bring-backs scheduled) is [`session`].

pub mod admission;
pub mod gap;
pub mod parked;
pub mod session;

use serde::Serialize;

use crate::roofline::{prefill_pairs, Roofline, StepFigures};
use crate::spec::ModelSpec;

pub use admission::{admission_room, admits};
pub use gap::{Ending, EndingGaps, GapEstimate, GapStats};
pub use parked::{Effect, KvPlace, ParkedKv, Returned};
pub use session::{SessionLife, EVICTED_BELOW, REVISE_MS};

/// How an engine can hold one session's KV in HBM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Retention {
    /// Not at all: only its LRU decides (a touch still refreshes it).
    Touch,
    /// The engine keeps the session's KV ahead of unreferenced cache until the router
    /// releases it (SGLang's session radix cache, the sim engine's pins).
    Hold,
}

/// What an engine lets the router do with a session's KV (its engine protocol says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Levers {
    /// Orders its waiting queue by a request's priority.
    pub priority: bool,
    pub retention: Retention,
    /// Has a host tier the router can offload to and restore from.
    pub host_tier: bool,
}

/// A session waiting on a tool, as its owner sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parked {
    /// The session's KV on its owner, tokens.
    pub context_tokens: u64,
    pub gap: GapEstimate,
    /// Seconds since its last response ended.
    pub idle_s: f64,
    /// The chance it comes back at all (the fraction of parked sessions that did).
    pub p_return: f64,
    /// Its KV is still in the owner's HBM (else evicted already: it cannot be kept, only
    /// brought back or let go).
    pub resident: bool,
}

/// The owner's KV, now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwnerKv {
    pub levers: Levers,
    pub capacity_tokens: u64,
    /// Fraction of HBM KV in use by running requests (the scraped usage, folded).
    pub usage: f64,
    /// New KV written per second (prompts computed and tokens decoded): how fast the LRU
    /// turns over.
    pub churn_tokens_per_s: f64,
    /// Host-tier room, tokens (0 without a host tier).
    pub host_free_tokens: u64,
    /// Tokens of the owner's other parked sessions kept (or brought back) in HBM now.
    pub kept_tokens: u64,
}

/// Seconds each course's work takes for this session on its owner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// Prefill of the whole context (the roofline's chunked prefill on the owner).
    pub recompute_s: f64,
    /// Host-to-device copy of the context over PCIe.
    pub restore_s: f64,
    /// Device-to-host copy of the context over PCIe.
    pub offload_s: f64,
    /// One touch: a step's overhead with one new token.
    pub touch_s: f64,
}

impl Prices {
    /// The prices of a session of `tokens` on a worker: `roofline` and `model` price its
    /// prefill in chunks of `chunk` tokens (nothing else running) and a touch as a
    /// one-token step; `pcie_bytes_per_s` its copies to and from the host tier.
    pub fn of(
        roofline: &Roofline,
        model: &ModelSpec,
        tokens: u64,
        chunk: u64,
        pcie_bytes_per_s: f64,
    ) -> Self {
        let f = StepFigures::of(model);
        let copy_s = if pcie_bytes_per_s > 0.0 {
            tokens as f64 * model.kv_bytes_per_token() / pcie_bytes_per_s
        } else {
            f64::INFINITY
        };
        Self {
            recompute_s: roofline.chunked_prefill_s(
                &f,
                tokens,
                prefill_pairs(tokens, 0),
                0,
                0,
                0,
                chunk,
            ),
            restore_s: copy_s,
            offload_s: copy_s,
            touch_s: roofline.prefill_step_s(&f, 1, tokens, tokens),
        }
    }
}

/// How much work off the critical path counts against a step on it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LifecycleWeights {
    /// A second of GPU compute spent in the background (a prefetch, touches) against a
    /// second of a returning step's TTFT.
    pub background: f64,
    /// A second of PCIe copy in the background.
    pub copy: f64,
    /// Usage below which holding KV displaces nothing (the pool has free blocks).
    pub pressure_from: f64,
    /// The quantile of the remaining gap a restore or prefetch aims to beat.
    pub prefetch_quantile: f64,
}

impl Default for LifecycleWeights {
    fn default() -> Self {
        Self {
            background: 0.5,
            copy: 0.1,
            pressure_from: 0.5,
            prefetch_quantile: 0.1,
        }
    }
}

/// Where a parked session's KV waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Hold {
    Keep,
    Offload,
    Prefetch,
    LetGo,
}

impl Hold {
    pub const ALL: [Hold; 4] = [Hold::Keep, Hold::Offload, Hold::Prefetch, Hold::LetGo];

    pub fn name(self) -> &'static str {
        match self {
            Hold::Keep => "keep",
            Hold::Offload => "offload",
            Hold::Prefetch => "prefetch",
            Hold::LetGo => "let_go",
        }
    }
}

/// The decision for one parked session.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lifecycle {
    pub hold: Hold,
    /// Seconds from now to start the restore (offload) or the recompute (prefetch).
    pub bring_back_in_s: Option<f64>,
    /// Seconds between touches that keep it warm on an engine without pins: from the
    /// start (keep) or once it is brought back (offload, prefetch).
    pub touch_every_s: Option<f64>,
    /// Expected cost of each course, seconds, in [`Hold::ALL`]'s order (infinite where
    /// the engine or the host tier cannot).
    pub costs: [f64; 4],
}

/// At most this share of an owner's evictable pool (what running requests do not hold)
/// holds its kept parked sessions; the rest is the LRU's. Each session's decision sees only
/// itself: without a bound, as many were kept as each found worth it, touches kept the pool
/// full of them, and every other session's return recomputed (on the real Claude Code
/// sessions the lifecycle recomputed twice what the LRU alone did).
pub const KEPT_SHARE: f64 = 0.5;

/// Touches per eviction horizon for a session kept warm: the horizon is a mean (new KV comes
/// in bursts, and a touch takes a while to run under load); with a touch every half of it
/// the real vLLM engine evicted half of a kept session in one of four runs
/// (`scripts/real_vllm/suite.py`, step 5).
const TOUCHES_PER_HORIZON: f64 = 4.0;

/// New KV written on a worker per second (what turns its LRU over), as a smoothed rate of a
/// monotonic count of computed tokens (`step::Ledger::computed_total`) sampled over time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Churn {
    last: Option<(u64, f64)>,
    rate: Option<f64>,
}

impl Churn {
    /// Weight of a new interval's rate.
    const ALPHA: f64 = 0.2;
    /// Shorter intervals are not sampled (a rate over nothing).
    const MIN_INTERVAL_S: f64 = 0.05;

    /// Samples `total` computed tokens at `now_s`; the smoothed rate, tokens per second
    /// (its first interval's rate seeds it; 0 before any interval).
    pub fn sample(&mut self, total: u64, now_s: f64) -> f64 {
        match self.last {
            Some((then_total, then_s)) if now_s - then_s >= Self::MIN_INTERVAL_S => {
                let r = total.saturating_sub(then_total) as f64 / (now_s - then_s);
                let rate = self.rate.get_or_insert(r);
                *rate += Self::ALPHA * (r - *rate);
                self.last = Some((total, now_s));
            }
            Some(_) => {}
            None => self.last = Some((total, now_s)),
        }
        self.rate()
    }

    /// The smoothed rate, tokens per second (0 before any interval).
    pub fn rate(&self) -> f64 {
        self.rate.unwrap_or(0.0)
    }
}

/// The chance a parked session comes back at all, from how many did and how many lapsed
/// or were closed instead (Laplace's rule: even odds before anything was seen).
pub fn p_return(came_back: u64, ended: u64) -> f64 {
    (came_back as f64 + 1.0) / ((came_back + ended) as f64 + 2.0)
}

/// Seconds until the owner's LRU evicts a block nobody touches: the evictable pool (what
/// running requests do not hold) turned over by the churn.
pub fn eviction_horizon_s(kv: &OwnerKv) -> f64 {
    let evictable = kv.capacity_tokens as f64 * (1.0 - kv.usage.clamp(0.0, 1.0));
    if kv.churn_tokens_per_s <= 0.0 {
        return f64::INFINITY;
    }
    evictable / kv.churn_tokens_per_s
}

/// Prices keep, offload, prefetch and let go for `p` on its owner and picks the cheapest.
pub fn decide(p: &Parked, kv: &OwnerKv, prices: &Prices, w: &LifecycleWeights) -> Lifecycle {
    let horizon = eviction_horizon_s(kv);
    let p_return = p.p_return.clamp(0.0, 1.0);
    let away_s = p.gap.remaining_mean_s(p.idle_s);
    // Evicted before it returns: still away after the LRU has turned over (or gone already).
    let p_evicted = if !p.resident {
        1.0
    } else if horizon.is_finite() {
        p.gap.remaining_survival(p.idle_s, horizon)
    } else {
        0.0
    };
    let let_go = p_return * p_evicted * prices.recompute_s;

    // Keep: the held tokens displace as many of others' cached tokens while the pool is
    // under pressure; each would have been hit with the chance it outlives the horizon.
    let pressure =
        ((kv.usage - w.pressure_from) / (1.0 - w.pressure_from).max(1e-9)).clamp(0.0, 1.0);
    let per_token_s = prices.recompute_s / p.context_tokens.max(1) as f64;
    let held_fraction = if horizon.is_finite() {
        (away_s / horizon).min(1.0)
    } else {
        0.0
    };
    let displaced_s = pressure * held_fraction * per_token_s * p.context_tokens as f64;
    let (keep, touch_every) = match kv.levers.retention {
        Retention::Hold => (w.background * displaced_s, None),
        Retention::Touch => {
            // A touch every quarter horizon keeps it young; a horizon longer than the gap
            // needs none.
            let every = horizon / TOUCHES_PER_HORIZON;
            let touches = if every.is_finite() && every > 0.0 {
                (away_s / every).floor()
            } else {
                0.0
            };
            (
                w.background * (displaced_s + touches * prices.touch_s),
                (touches > 0.0).then_some(every),
            )
        }
    };

    // Bring back early enough to beat all but the `prefetch_quantile` soonest returns.
    let soon = p.gap.remaining_quantile_s(p.idle_s, w.prefetch_quantile);
    let late_wait = |took: f64| {
        let start = (soon - took).max(0.0);
        // A return before the work ends waits for the rest of it (at worst all of it).
        let p_late = 1.0 - p.gap.remaining_survival(p.idle_s, start + took);
        (start, p_late * took)
    };
    // Once back in HBM it is kept until the return, at keep's rate for the time left
    // (brought back early, that is most of keep's cost again).
    let keep_per_s = if away_s > 0.0 { keep / away_s } else { 0.0 };
    let kept_after = |landed: f64| keep_per_s * (away_s - landed).max(0.0);
    let fits_host = kv.levers.host_tier && kv.host_free_tokens >= p.context_tokens;
    let (offload, restore_at) = if fits_host {
        let (start, wait) = late_wait(prices.restore_s);
        (
            w.copy * (prices.offload_s + p_return * prices.restore_s)
                + p_return * wait
                + kept_after(start + prices.restore_s),
            start,
        )
    } else {
        (f64::INFINITY, 0.0)
    };
    let (prefetch_at, prefetch_wait) = late_wait(prices.recompute_s);
    // Recomputing what was evicted (all of it at worst) runs whether or not it returns;
    // a return before it ends waits for the rest.
    let prefetch = w.background * p_evicted * prices.recompute_s
        + p_return * prefetch_wait
        + kept_after(prefetch_at + prices.recompute_s);

    // What is gone cannot be kept; what the kept share has no room for is neither kept
    // nor recomputed into HBM (an offload's restore lands just before the return).
    let room = KEPT_SHARE * kv.capacity_tokens as f64 * (1.0 - kv.usage.clamp(0.0, 1.0));
    let fits = (kv.kept_tokens + p.context_tokens) as f64 <= room;
    let keep = if p.resident && fits {
        keep
    } else {
        f64::INFINITY
    };
    let prefetch = if fits { prefetch } else { f64::INFINITY };
    let costs = [keep, offload, prefetch, let_go];
    // Acting must save something material over letting the LRU decide: 1% of the
    // prefill, at least a millisecond. Among the rest, the cheapest (ties: the first).
    let margin = (0.01 * prices.recompute_s).max(1e-3);
    let mut best = 3;
    for (i, c) in costs.iter().enumerate().take(3) {
        if *c + margin < let_go && (best == 3 || *c < costs[best]) {
            best = i;
        }
    }
    let hold = Hold::ALL[best];
    Lifecycle {
        hold,
        bring_back_in_s: match hold {
            Hold::Offload => Some(restore_at),
            Hold::Prefetch => Some(prefetch_at),
            Hold::Keep | Hold::LetGo => None,
        },
        // Kept, or once brought back, it is kept warm until the return.
        touch_every_s: if hold == Hold::LetGo {
            None
        } else {
            touch_every
        },
        costs,
    }
}

#[cfg(test)]
mod tests;
