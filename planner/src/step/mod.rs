//! The step: what a policy is shown for one request, and what a shell counts against
//! each worker while the request runs.
//!
//! **These helpers are canonical.** The router (`router/src/proxy/view.rs`,
//! `router/src/registry/`), the trace simulator (`eval/src/sim/`) and the oracle build a
//! step's [`RouteRequest`] and complete its [`WorkerView`]s only here, and keep their
//! in-flight counts only in a [`Ledger`] (with a request's share of them in its
//! [`Charged`]) and their decodes' ages only in [`Decodes`]. A copy of any of them in a
//! shell is forbidden (as Dynamo's kv-router forbids copies of its canonical helpers):
//! what the simulator measures must be what the router runs. A shell supplies only what
//! differs by where it runs: its sources (the router's KV index and directory client, the
//! simulator's exact scheduler state) through [`ViewSources`], and its clock as a number.
//!
//! - [`route_request`]: the one place a `RouteRequest` is built (tests aside).
//! - [`worker_view`] and [`complete_views`]: a worker's view, then the sources a policy
//!   reads ([`Needs`]) filled in; [`predict_kv_usage`] folds what is in flight into a
//!   scraped load.
//! - [`Ledger`]: per-worker counters (requests in flight, their KV blocks, pending
//!   prefill and compute tokens, legs heading there), lock-free.
//! - [`Decodes`]: the streams decoding on a worker and their ages, time in seconds.
//! - [`hold_back_warming`]: the warm-up share of a worker just up (the simulator's fleets
//!   do not change, so only the router calls it).

mod decodes;
mod ledger;
mod warmup;

pub use decodes::Decodes;
pub use ledger::{Charged, Ledger};
pub use warmup::hold_back_warming;

use crate::ids::{Role, WorkerId};
use crate::kv_release::DecodeAges;
use crate::plan::ArtifactView;
use crate::policy::{EngineLoad, Policy, RouteRequest, WorkerView};

/// Which sources a policy reads (the others are not paid for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Match the prompt against the KV index.
    pub prefix_match: bool,
    /// Read the session's owner and the owned prefix from the directory.
    pub directory: bool,
    /// Count how long the streams decoding on each worker have decoded.
    pub decode_ages: bool,
}

impl Needs {
    /// Everything (a dry run explains the planner whatever routing uses).
    pub const ALL: Needs = Needs {
        prefix_match: true,
        directory: true,
        decode_ages: true,
    };

    /// What `policy` reads.
    pub fn of(policy: &dyn Policy) -> Self {
        Self {
            prefix_match: policy.needs_prefix_match(),
            directory: policy.needs_directory(),
            decode_ages: policy.needs_decode_ages(),
        }
    }
}

/// What a step is, before any source is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepInput<'a> {
    /// The model the client asked for.
    pub model: &'a str,
    pub prompt_tokens: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// The session the step belongs to, if it has one.
    pub session: Option<&'a str>,
    /// The shell's time in milliseconds (the router's clock, the simulator's virtual one).
    pub now_ms: u64,
    /// Choices requested.
    pub samples: u32,
    /// The client marked the step a fork of its session.
    pub fork: bool,
}

/// What the directory said of a step: its session's owner and the prompt's longest owned
/// prefix.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Owned {
    pub owner: Option<WorkerId>,
    pub artifact: Option<ArtifactView>,
}

/// The step's request to the policy: what the directory said only if the policy reads
/// the directory.
pub fn route_request<'a>(step: StepInput<'a>, owned: Owned, needs: Needs) -> RouteRequest<'a> {
    let owned = if needs.directory {
        owned
    } else {
        Owned::default()
    };
    RouteRequest {
        model: step.model,
        prompt_tokens: step.prompt_tokens,
        block_size: step.block_size,
        session: step.session,
        now_ms: step.now_ms,
        decode_owner: owned.owner,
        artifact: owned.artifact,
        samples: step.samples,
        fork: step.fork,
    }
}

/// What a worker is, apart from its load and what is in flight there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerFacts {
    pub id: WorkerId,
    pub role: Role,
    pub healthy: bool,
    pub draining: bool,
    /// `WorkerView::pulls_kv`.
    pub pulls_kv: bool,
    /// `WorkerView::prefill_decodes`.
    pub prefill_decodes: bool,
    /// `WorkerView::decode_leg_at_dispatch`.
    pub decode_leg_at_dispatch: bool,
}

/// A worker's view with its load and its ledger's counts; no cached blocks, decode ages
/// or parked returns yet ([`complete_views`] adds those a policy reads).
pub fn worker_view(facts: WorkerFacts, load: Option<EngineLoad>, ledger: &Ledger) -> WorkerView {
    let mut v = WorkerView {
        id: facts.id,
        role: facts.role,
        healthy: facts.healthy,
        draining: facts.draining,
        in_flight: 0,
        active_blocks: 0,
        active_prefill_tokens: 0,
        active_compute_tokens: 0,
        legs_heading: 0,
        cached_blocks: 0,
        host_cached_blocks: 0,
        pulls_kv: facts.pulls_kv,
        prefill_decodes: facts.prefill_decodes,
        decode_leg_at_dispatch: facts.decode_leg_at_dispatch,
        load,
        decode_ages: DecodeAges::default(),
        parked_returns_per_s: 0.0,
    };
    ledger.fill(&mut v);
    v
}

/// Where a shell reads what a policy may need beyond a worker's view.
pub trait ViewSources {
    /// KV held by the streams decoding on the worker of `views[at]`, by age (planner
    /// seconds).
    fn decode_ages(&mut self, at: usize, view: &WorkerView) -> DecodeAges;
    /// Sets each view's `cached_blocks` (and `host_cached_blocks` where known) for the
    /// step's prompt.
    fn fill_cached(&mut self, views: &mut [WorkerView]);
    /// Sets each view's `parked_returns_per_s`: the steps per planner second its idle
    /// sessions are expected to send.
    fn fill_parked_returns(&mut self, views: &mut [WorkerView]);
}

/// Completes `views` with what the policy reads (`needs`) from `sources`: decode ages,
/// the prompt's cached prefix on each worker, and (for a policy that reads the
/// directory) the returns each worker's parked sessions will send.
pub fn complete_views(views: &mut [WorkerView], needs: Needs, sources: &mut impl ViewSources) {
    if needs.decode_ages {
        for (at, v) in views.iter_mut().enumerate() {
            v.decode_ages = sources.decode_ages(at, v);
        }
    }
    if needs.prefix_match {
        sources.fill_cached(views);
    }
    if needs.directory {
        sources.fill_parked_returns(views);
    }
}

/// Folds a worker's KV capacity (`capacity_tokens`) into its scraped load: the busy
/// threshold sees the larger of the reported usage and what is in flight there (its
/// `active_blocks` of `block` tokens over the capacity), so a burst sent between two
/// scrapes counts at once; the planner's memory term sees the room left before a cached
/// prefix must be evicted (the capacity minus `held_tokens`, what the worker is known to
/// hold).
pub fn predict_kv_usage(v: &mut WorkerView, block: u64, capacity_tokens: u64, held_tokens: u64) {
    let Some(load) = v.load.as_mut() else {
        return;
    };
    let capacity = capacity_tokens;
    let predicted = v.active_blocks.saturating_mul(block) as f64 / capacity as f64;
    load.kv_usage = load.kv_usage.max(predicted);
    load.kv_room_tokens = Some(capacity.saturating_sub(held_tokens));
    load.kv_free_tokens = Some(((1.0 - load.kv_usage).max(0.0) * capacity as f64) as u64);
    load.kv_capacity_tokens = Some(capacity);
}

#[cfg(test)]
mod tests;
