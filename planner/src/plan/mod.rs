//! The cost planner: for one agent step, price every candidate action on every worker
//! that could run it and pick the cheapest (MISSION.md, B2):
//! `C = T_queue + T_compute + T_network + T_restore + λ·M_hbm + μ·I_decode + T_evict +
//! ν·D_queue + ρ·D_decode (+ κ·R_dup)` (`cost.rs`), where `I_decode` is the marginal stall of the
//! decodes running beside the prefill (`interference.rs`), `D_queue` the delay its compute
//! adds to the prefills that will queue behind it (those queued now and, for a new
//! session, the returns of the sessions parked there) and `D_decode` the decode the placement
//! commits to: its own at the decoder's batch, plus what it adds to the sequences running
//! there (`decode.rs`). `R_dup` is the recompute value of the second copy
//! of a shared prefix a fork's branch holds off the prefix owner.
//!
//! A worker with a host-DRAM KV tier splits the prompt into HBM-cached, host-cached,
//! fetchable-from-a-peer and to-compute tokens, and each segment takes its cheapest way in:
//! restore over PCIe or recompute the host-cached part, fetch or recompute the artifact's
//! (`candidates.rs`, `T_host`).
//!
//! A fetch copies the directory's artifact only as far as its owner still caches it. A move
//! copies the owner's prefix, or recomputes it on an idle target where that takes less than
//! the copy (a slow link). Moves are capped by a migration budget, priced
//! increasingly as it is spent (`migration_budget.rs`).
//!
//! Every worker is priced as the step will find it when admitted there (`admission.rs`):
//! its queue is the longer of the compute queue and the wait for the KV its running
//! sequences hold, and its cached prefix counts only as much as survives that wait.
//!
//! Pure: everything the planner knows (workers' load and caches, the directory's owners,
//! links) comes in a [`PlanInput`]; the result is a [`Plan`] that says what to do, what
//! changes in the directory, every candidate's cost terms, and why.

mod admission;
mod candidates;
mod classify;
mod cost;
mod decode;
mod interference;
mod migration_budget;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ids::{Role, WorkerId};
use crate::roofline::{Roofline, StepFigures};
use crate::spec::ModelSpec;

pub use admission::{admission, admitted_view, Admission};
pub use classify::{classify, ClassThresholds, StepClass, StepFacts};
pub use cost::CostTerms;
pub use interference::{engine_default_chunk_tokens, marginal_interference_s, StepBudget};
pub use migration_budget::MigrationBudget;

/// The five things the planner can do with a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Prefill the new tokens on the session's decode owner and decode there.
    Colocate,
    /// Prefill on a prefill-capable worker, ship the KV to the decode worker.
    RemotePrefill,
    /// The chosen worker pulls the sealed prefix from its owner, prefills only the rest.
    ArtifactFetch,
    /// Decode where the sealed prefix already is; recompute the tail and window there.
    TailRecompute,
    /// Move the session and its KV to another worker; the owner flips once it is there.
    Migrate,
}

impl Action {
    /// Every action, for metrics that list them all.
    pub const ALL: [Action; 5] = [
        Action::Colocate,
        Action::RemotePrefill,
        Action::ArtifactFetch,
        Action::TailRecompute,
        Action::Migrate,
    ];

    /// The action's name in plans, metrics and the explain API.
    pub fn name(self) -> &'static str {
        match self {
            Action::Colocate => "colocate",
            Action::RemotePrefill => "remote_prefill",
            Action::ArtifactFetch => "artifact_fetch",
            Action::TailRecompute => "tail_recompute",
            Action::Migrate => "migrate",
        }
    }
}

/// One worker as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanWorker {
    pub id: WorkerId,
    pub role: Role,
    /// Reachable: it can serve, and send the KV it holds.
    pub healthy: bool,
    /// Being drained by an operator: it takes no new work but can still send its KV.
    pub draining: bool,
    pub roofline: Roofline,
    /// How its engine cuts a prefill into steps (`max_num_batched_tokens`, SGLang's
    /// `chunked_prefill_size`, vLLM's `long_prefill_token_threshold`): the chunks a prefill
    /// there runs in, each shared with the decodes running there (`interference.rs`).
    pub step_budget: StepBudget,
    /// Predicted wait before a new prefill starts there, seconds.
    pub queue_s: f64,
    /// Sequences running there now: on a worker that decodes, a prefill there stalls each
    /// of them (`interference.rs`); a prefill worker's are prefill legs.
    pub decoding: u64,
    /// Prefills waiting there now (the engine's queue, and the decode legs of remote
    /// prefills headed there): the steps that arrived while its backlog built up, so
    /// about as many as will arrive behind this step's compute before the backlog clears
    /// (Little's law), each of which then waits for it.
    pub queued: u64,
    /// Leading tokens of this step's prompt the worker holds in GPU memory (KV index).
    pub cached_tokens: u64,
    /// Prompt tokens right after `cached_tokens` the worker holds in its host-DRAM KV tier
    /// (KV index holds with medium CPU): restorable over PCIe instead of recomputed. 0 on
    /// a worker without a host tier, and then no price changes.
    pub host_cached_tokens: u64,
    /// It can pull a sealed prefix from a peer and serve one (`WorkerView::pulls_kv`):
    /// a fetch needs it on both ends; a migration without it recomputes on the target.
    pub pulls_kv: bool,
    /// A prefill worker that may also decode (`WorkerView::prefill_decodes`).
    pub prefill_decodes: bool,
    /// A remote prefill's decode leg holds its place in this decoder's queue from
    /// dispatch (`WorkerView::decode_leg_at_dispatch`); else it joins the queue when the
    /// prefill ends (`candidates::decode_leg_wait_s`).
    pub decode_leg_at_dispatch: bool,
    /// Host-to-GPU bandwidth its restores run at, bytes per second (the GPU preset's
    /// `pcie_gbs`).
    pub pcie_bytes_per_s: f64,
    /// Observed prefill time over the preset's (`ewma::PrefillCalibration::scale`).
    pub prefill_scale: f64,
    /// KV tokens it can take without evicting a cached prefix (`EngineLoad::kv_room_tokens`);
    /// `None` when unknown (no memory term then).
    pub kv_room_tokens: Option<u64>,
    /// KV tokens not held by running sequences (`EngineLoad::kv_free_tokens`): past them,
    /// a step's KV preempts someone running there. `None` when unknown.
    pub kv_free_tokens: Option<u64>,
    /// KV tokens the worker's pool holds in all (`EngineLoad::kv_capacity_tokens`); `None`
    /// when unknown (no memory wait then, `admission.rs`).
    pub kv_capacity_tokens: Option<u64>,
    /// Prompt tokens sent there and not prefilled yet (the router's count): the KV the
    /// prompts queued ahead of a step will allocate before it.
    pub waiting_tokens: u64,
    /// Observed seconds a sequence decoding there holds its KV (first to last token, an
    /// EWMA); `None` until observed (no memory wait then, `admission.rs`).
    pub decode_lifetime_s: Option<f64>,
    /// KV tokens per second its running decodes release, from their ages and the
    /// observed lifetimes (`kv_release`); `None` when unknown or not needed (the
    /// admission model then takes them to release what they hold over one
    /// `decode_lifetime_s`).
    pub kv_release_per_s: Option<f64>,
    /// Steps per second the sessions parked there are expected to send
    /// (`WorkerView::parked_returns_per_s`): those arriving while a prefill computes
    /// there queue behind it, as the prefills queued now do.
    pub parked_returns_per_s: f64,
}

impl PlanWorker {
    /// Whether new work may go there.
    pub fn takes_work(&self) -> bool {
        self.healthy && !self.draining
    }

    /// Whether a session may decode there: a decode or hybrid worker, or a prefill worker
    /// allowed to decode too.
    pub fn decodes(&self) -> bool {
        self.role.serves_full_requests() || (self.role == Role::Prefill && self.prefill_decodes)
    }

    /// The sequences running here that a prefill here stalls
    /// (`interference::stalled_decodes`).
    pub fn stalled_decodes(&self) -> u64 {
        interference::stalled_decodes(self.decodes(), self.decoding)
    }

    /// Prompt tokens a new prefill here computes per step ([`StepBudget::prefill_chunk`]):
    /// beside the decodes it stalls, and the sequences running or queued here.
    pub fn prefill_chunk(&self) -> u64 {
        self.step_budget
            .prefill_chunk(self.stalled_decodes(), self.decoding + self.queued)
    }

    /// KV tokens held by the sequences running here (capacity minus free); 0 when unknown.
    pub fn running_kv_tokens(&self) -> u64 {
        match (self.kv_capacity_tokens, self.kv_free_tokens) {
            (Some(c), Some(f)) => c.saturating_sub(f),
            _ => 0,
        }
    }

    /// Prefills expected to wait behind a prefill of `compute_s` seconds here: those
    /// queued now (about as many as will arrive behind it before the backlog clears, by
    /// Little's law) and the steps of sessions parked here that return while it runs.
    pub fn later_arrivals(&self, compute_s: f64) -> f64 {
        self.queued as f64 + self.parked_returns_per_s * compute_s
    }

    /// Expected seconds until the engine step under way here ends, which a prompt sent now
    /// waits for before its first chunk: half a step of the decodes running here (0 when
    /// none run). Why it is priced apart: it is paid once per prompt whatever its size.
    /// Within the calibration's factor it was not: a prefill of a few thousand tokens
    /// beside twenty decodes took 1.85× its price (median, Llama SWE-smith ×275 on `8h`),
    /// and that factor then priced 34K-token prompts at twice what they took.
    pub fn step_under_way_s(&self, figures: &StepFigures<'_>) -> f64 {
        0.5 * decode::decode_step_s(self, figures, 0, 0)
    }

    /// At most [`Self::preset_prefill_s`] of `tokens` tokens with `pairs` attention pairs
    /// here, whatever their context (`Roofline::chunked_prefill_floor_s`).
    pub fn preset_prefill_floor_s(
        &self,
        figures: &StepFigures<'_>,
        tokens: u64,
        pairs: u64,
    ) -> f64 {
        self.roofline
            .chunked_prefill_floor_s(figures, tokens, pairs, self.prefill_chunk())
    }

    /// Seconds a prefill of `tokens` tokens (`pairs` attention pairs over `context` cached
    /// tokens) takes here at the preset's rate: chunked, each chunk's step shared with the
    /// decodes running here (`Roofline::chunked_prefill_s`).
    pub fn preset_prefill_s(
        &self,
        figures: &StepFigures<'_>,
        tokens: u64,
        pairs: u64,
        context: u64,
    ) -> f64 {
        self.roofline.chunked_prefill_s(
            figures,
            tokens,
            pairs,
            context,
            self.stalled_decodes(),
            self.running_kv_tokens(),
            self.prefill_chunk(),
        )
    }
}

/// Transfer figures between two workers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Link {
    pub bytes_per_s: f64,
    pub latency_s: f64,
}

/// Links between workers: one default, and overrides per ordered pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Links {
    pub default: Link,
    pub pairs: BTreeMap<(WorkerId, WorkerId), Link>,
}

impl Links {
    /// The link data takes from `from` to `to`.
    pub fn get(&self, from: WorkerId, to: WorkerId) -> Link {
        self.pairs.get(&(from, to)).copied().unwrap_or(self.default)
    }
}

/// The prices of memory and interference, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Weights {
    /// λ: seconds charged per GB of HBM an action duplicates.
    pub lambda_s_per_gb: f64,
    /// μ: seconds charged per second a prefill stalls one running decode (the marginal
    /// stall, `interference.rs`). The default 0.1 was chosen on runs held out of the
    /// evaluation matrix (SWE-smith seeds 7 and 11 with 160 and 240 sessions on 2p6d, the
    /// coding-agent generator with seed 7 on 4p4d; the matrix uses seed 1): against 0.5 it
    /// cut p99 TTFT from 1.00 s to 0.46 s and from 1.53 s to 1.34 s for 1–2% longer
    /// sessions, and was no worse on the overloaded 240-session run.
    pub mu: f64,
    /// Hysteresis of a migration off an owner that could keep the session: its one-off
    /// transfer (network + restore) is charged `1 + migrate_hysteresis` times. A move
    /// pays off only if this step's saving repays the copy several times over; a saving
    /// from a passing queue or decode-batch difference (gone by the session's next step)
    /// does not, so sessions do not ping-pong between workers whose load fluctuates.
    /// The default 10 was chosen on SWE-smith runs held out of the evaluation (seeds 7, 11
    /// and 13, 160 and 240 sessions; the report uses seed 1 and 200): it cut migrated KV
    /// 2–4× against 3 with the same p99 TTFT and session time.
    pub migrate_hysteresis: f64,
    /// ν: seconds charged per second a step's compute delays a prefill that will queue
    /// behind it on the worker (`CostTerms::queue_delay_s`).
    pub nu: f64,
    /// κ: share of a duplicate's recompute value charged when a fork's branch would make
    /// its decode worker hold its own copy of the prefix the owner keeps serving to the
    /// other branches copy-on-write (`CostTerms::duplicate_s`). 1: a GB of HBM is worth
    /// the prefill it saves, so a branch spills off the prefix owner only when the owner's
    /// load costs more than recomputing the copy. Checked on forked seed 7 (held out of the
    /// matrix): the duplicate factor fell from 1.68–2.65 to 1.00–1.01 on 2p6d and 8h for
    /// both models at the same p99 TTFT; 0.5 chose the same. Applied to every step it
    /// helped some held-out SWE-smith runs and hurt others, so it applies to forks only.
    pub kappa: f64,
    /// ρ: seconds charged per decode-second a step's expected decode takes on its decode
    /// worker, its own and what it adds to the sequences running there
    /// (`CostTerms::decode_s`).
    pub rho: f64,
    /// Share of the KV bytes of the prompts a planner has routed that its migrations may
    /// move in all, with a shadow price past half of it (`migration_budget.rs`);
    /// `f64::INFINITY` is no budget. 0.1 by default, the share the acceptance criterion
    /// allows: held-out runs on H20s moved 11–13% without it and 6.0–6.3% with it, at a
    /// p99 TTFT as good or better on 3 of 4 rows; on the evaluation matrix it changed no
    /// criterion's tally (EVALUATION.md, twentieth pass).
    /// The budget counts from the router's start, so a run's first moves meet it nearly
    /// spent.
    pub migration_budget: f64,
}

/// ρ's default, 0.1: chosen on runs held out of the evaluation matrix (seed 7; the matrix
/// uses seed 1), Llama-3.1-8B SWE-smith ×200: against ρ = 0 it cut mean session E2E from
/// 186 s to 174 s and p99 TTFT from 2.41 s to 0.81 s on 2p6d, and E2E from 171 s to 154 s
/// on 8h. 0.05 gained less; 0.2 gained no more E2E, had a worse p99 on 2p6d (1.75 s) and
/// moved more KV; ρ = 1 migrated 1.8 TB where 0.1 moved 0.34 TB on 8h (each step's decode
/// saving then outweighs a copy). Weighed again once the migration budget bounded the
/// moves (EVALUATION.md, twenty-first pass): 0.3 shortened held-out sessions by up to 4%,
/// but spread shared prefixes over more decoders, breaking the duplicate-factor criterion
/// (≤ 1.1) on 12 of the matrix's 30 rows (forked Qwen3 1.6, long-doc 1.12–1.21).
pub const RHO: f64 = 0.1;

impl Default for Weights {
    fn default() -> Self {
        Self {
            lambda_s_per_gb: 0.01,
            mu: 0.1,
            migrate_hysteresis: 10.0,
            nu: 1.0,
            kappa: 1.0,
            rho: RHO,
            migration_budget: 0.1,
        }
    }
}

/// The sealed prefix artifact the directory knows for this step's prompt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ArtifactView {
    pub owner: WorkerId,
    /// Leading prompt tokens it covers (sealed, so a multiple of the seal unit).
    pub tokens: u64,
}

/// Everything one planning decision depends on.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    pub model: &'a ModelSpec,
    pub block_size: u32,
    pub prompt_tokens: u64,
    /// The session's decode owner, from the directory (`None` for a new session).
    pub decode_owner: Option<WorkerId>,
    /// The longest sealed artifact of the prompt and its owner, from the directory.
    pub artifact: Option<ArtifactView>,
    pub workers: &'a [PlanWorker],
    pub links: &'a Links,
    pub weights: Weights,
    /// Choices requested (`n`).
    pub samples: u32,
    /// The client marked the request as a fork of its session.
    pub fork: bool,
    pub thresholds: ClassThresholds,
    /// List every prefill × decode pair and every move, even where one provably cannot
    /// win. The explain API sets it so operators see every candidate; routing leaves it
    /// off, and then, with uniform links, each decoder gets only its cheapest remote
    /// prefill, and decoders and moves whose floor is no cheaper than a candidate already
    /// priced are skipped: the same choice from far fewer candidates, though the runner-up
    /// a plan's reason names is the cheapest listed one, so it may differ.
    pub exhaustive: bool,
    /// What is left of the planner's migration budget (`Weights::migration_budget`).
    pub migration_budget: MigrationBudget,
    /// Seconds the answer of a step that moves its session off its owner is held (the
    /// router's read lease on a remote directory, so no other router still sends the
    /// session to the owner it left): priced as `CostTerms::move_hold_s`. 0 where no
    /// other router reads the directory, and in the simulator.
    pub move_hold_s: f64,
}

impl PlanInput<'_> {
    /// Whether the step forks its session (`n > 1` or the fork header).
    pub fn is_fork(&self) -> bool {
        self.samples > 1 || self.fork
    }

    /// Whether decoding on `worker` moves the session off its owner (a fork's branch is a
    /// session of its own, so it moves nothing).
    pub fn moves_to(&self, worker: WorkerId) -> bool {
        !self.is_fork() && self.decode_owner.is_some_and(|o| o != worker)
    }

    /// The step's class, from the directory's view of the session and the KV index.
    pub fn class(&self) -> StepClass {
        let owner_cached_tokens = self
            .decode_owner
            .and_then(|d| self.workers.iter().find(|w| w.id == d && w.healthy))
            .map_or(0, |w| w.cached_tokens);
        classify(
            &StepFacts {
                prompt_tokens: self.prompt_tokens,
                session_known: self.decode_owner.is_some(),
                owner_cached_tokens,
                samples: self.samples,
                fork: self.fork,
            },
            &self.thresholds,
        )
    }
}

/// One priced candidate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub action: Action,
    /// Where the prefill (or recompute) runs.
    pub compute_on: WorkerId,
    /// Where the session decodes afterwards.
    pub decode_on: WorkerId,
    /// Where KV comes from over the network, if anywhere.
    pub source: Option<WorkerId>,
    /// Tokens computed (each of `n` samples computes the uncached part).
    pub compute_tokens: u64,
    /// Leading prompt tokens not computed: cached, received, fetched or restored.
    pub reused_tokens: u64,
    /// Of those, tokens restored from the computing worker's host-DRAM tier.
    pub restored_tokens: u64,
    /// Bytes moved between workers.
    pub network_bytes: f64,
    /// `cost.compute_s` as the roofline preset alone predicts it, before the compute
    /// worker's calibration scale: what an observed prefill is compared with
    /// (`Policy::observe_prefill`).
    pub preset_compute_s: f64,
    pub cost: CostTerms,
}

/// A change the directory must make for the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectoryChange {
    /// The session decodes on this worker from now on.
    SetDecodeOwner(WorkerId),
    /// A forked branch of the session decodes on this worker (the parent stays put).
    ForkTo(WorkerId),
    /// The worker holds a read-only copy of the sealed artifact.
    Replicate(WorkerId),
    /// Ownership of the artifact moves (CAS on its epoch, after the target has it).
    MigrateOwner { from: WorkerId, to: WorkerId },
}

/// The planner's decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub class: StepClass,
    pub chosen: Candidate,
    pub changes: Vec<DirectoryChange>,
    /// Every candidate considered, in generation order (see [`Plan::ranked`]); dominated
    /// remote prefills, and decoders and moves that cannot win, only if the input asked
    /// for an exhaustive list.
    pub candidates: Vec<Candidate>,
    /// The next cheapest candidate (an index into `candidates`), for [`Plan::reason`].
    runner_up: Option<usize>,
    /// The step's prompt tokens, for [`Plan::reason`].
    prompt_tokens: u64,
    /// Share of the migration budget spent before this step ([`MigrationBudget::spent`];
    /// 0 without a budget), for operators to see when it binds.
    pub migration_budget_spent: f64,
}

/// Why no plan exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no available worker can serve this step")]
    NoWorker,
}

impl Plan {
    /// Why the chosen candidate won, in words (for `explain` and debug logs). Written on
    /// demand: formatting it for every decision cost ~1 µs of a proxied request.
    pub fn reason(&self) -> String {
        let runner_up = self.runner_up.and_then(|i| self.candidates.get(i));
        reason(self.prompt_tokens, &self.chosen, runner_up)
    }

    /// The candidates cheapest first (equal totals keep generation order), for explaining.
    pub fn ranked(&self) -> Vec<&Candidate> {
        let mut out: Vec<&Candidate> = self.candidates.iter().collect();
        out.sort_by(|a, b| a.cost.total.total_cmp(&b.cost.total));
        out
    }
}

/// Prices every candidate and picks the cheapest (ties go to the first generated, which
/// prefers staying on the decode owner). No sort: a decision is one pass over the
/// candidates, however many P × D pairs a fleet has.
pub fn plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let all = candidates::generate(input);
    let mut best: Option<(usize, &Candidate)> = None;
    let mut runner_up: Option<(usize, &Candidate)> = None;
    for (i, c) in all.iter().enumerate() {
        match best {
            // `total_cmp` ranks a NaN total above every number, so a priced term that went
            // wrong can never win the step.
            Some((_, b)) if c.cost.total.total_cmp(&b.cost.total).is_ge() => {
                if runner_up.is_none_or(|(_, r)| c.cost.total.total_cmp(&r.cost.total).is_lt()) {
                    runner_up = Some((i, c));
                }
            }
            _ => {
                runner_up = best;
                best = Some((i, c));
            }
        }
    }
    let chosen = best.map(|(_, c)| c.clone()).ok_or(PlanError::NoWorker)?;
    let changes = changes(input, &chosen);
    let runner_up = runner_up.map(|(i, _)| i);
    Ok(Plan {
        class: input.class(),
        chosen,
        changes,
        candidates: all,
        runner_up,
        prompt_tokens: input.prompt_tokens,
        migration_budget_spent: input.migration_budget.spent,
    })
}

fn changes(input: &PlanInput<'_>, c: &Candidate) -> Vec<DirectoryChange> {
    let mut out = Vec::new();
    if input.is_fork() {
        out.push(DirectoryChange::ForkTo(c.decode_on));
    } else if input.decode_owner != Some(c.decode_on) {
        out.push(DirectoryChange::SetDecodeOwner(c.decode_on));
    }
    match (c.action, input.artifact) {
        (Action::ArtifactFetch, Some(a)) if a.owner != c.decode_on => {
            out.push(DirectoryChange::Replicate(c.decode_on));
        }
        (Action::Migrate, Some(a)) if a.owner != c.decode_on => {
            out.push(DirectoryChange::MigrateOwner {
                from: a.owner,
                to: c.decode_on,
            });
        }
        _ => {}
    }
    out
}

fn reason(prompt_tokens: u64, c: &Candidate, runner_up: Option<&Candidate>) -> String {
    let what = match c.action {
        Action::Colocate => format!(
            "on {}: prefill {} new of {} tokens where the session decodes",
            c.compute_on, c.compute_tokens, prompt_tokens
        ),
        Action::RemotePrefill => format!(
            "prefill {} tokens on {}, ship {:.1} MB to {}",
            c.compute_tokens,
            c.compute_on,
            c.network_bytes / 1e6,
            c.decode_on
        ),
        Action::ArtifactFetch => format!(
            "{} fetches {:.1} MB of sealed prefix from {} and prefills {} tokens",
            c.decode_on,
            c.network_bytes / 1e6,
            c.source.map_or_else(String::new, |s| s.to_string()),
            c.compute_tokens
        ),
        Action::TailRecompute => format!(
            "decode on {}, which owns the sealed prefix; recompute {} tail/window/new tokens there",
            c.decode_on, c.compute_tokens
        ),
        Action::Migrate => format!(
            "move the session to {}: {:.1} MB from {}, {} tokens prefilled",
            c.decode_on,
            c.network_bytes / 1e6,
            c.source.map_or_else(String::new, |s| s.to_string()),
            c.compute_tokens
        ),
    };
    let name = c.action.name();
    match runner_up {
        Some(r) => format!(
            "{name}: {what}; {:.2} ms vs {:.2} ms for {} on {}",
            c.cost.total * 1e3,
            r.cost.total * 1e3,
            r.action.name(),
            r.decode_on
        ),
        None => format!("{name}: {what}; the only candidate"),
    }
}

#[cfg(test)]
mod tests;
