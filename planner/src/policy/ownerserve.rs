//! `ownerserve`: the cost planner as a routing policy. It turns the router's view of the
//! workers and the directory's view of the session into a [`PlanInput`], plans, and maps
//! the chosen candidate onto a [`Dispatch`]. Observed prefill times calibrate the roofline
//! of each kind of worker (an EWMA of observed over the preset's time, from prefills that
//! started at once).

use std::collections::{BTreeMap, HashMap};

use super::{
    smallest_decoder_pool, Decision, Dispatch, Policy, PolicyError, PrefillWorkersDecode,
    RouteRequest, WorkerView,
};
use crate::ewma::{Ewma, PrefillCalibration};
use crate::ids::WorkerId;
use crate::kv_release::DecodeLifetimes;
use crate::plan::{
    plan, Action, ArtifactView, ClassThresholds, Link, Links, MigrationBudget, Plan, PlanInput,
    PlanWorker, StepBudget, Weights,
};
use crate::roofline::{prefill_pairs, Efficiency, Roofline, StepFigures};
use crate::spec::{GpuSpec, ModelSpec, SpecError};

/// What the planner prices plans with.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnerServeConfig {
    /// The model every request is priced as unless `models` names its served model.
    pub model: ModelSpec,
    /// Specs per served model name (the request's `model`), for fleets serving several
    /// models or a model that is not the default.
    pub models: BTreeMap<String, ModelSpec>,
    /// Every worker's roofline unless overridden in `rooflines`.
    pub roofline: Roofline,
    /// Workers whose GPUs differ from the default.
    pub rooflines: BTreeMap<WorkerId, Roofline>,
    /// Every worker's engine step budget (`max_num_batched_tokens`, and vLLM's
    /// `long_prefill_token_threshold`) unless overridden in `worker_step_budgets`: the
    /// chunks its prefills run in (`PlanWorker::step_budget`).
    pub step_budget: StepBudget,
    /// Workers whose engines cut prefills differently.
    pub worker_step_budgets: BTreeMap<WorkerId, StepBudget>,
    pub links: Links,
    pub weights: Weights,
    pub thresholds: ClassThresholds,
    /// Host-to-GPU bandwidth of every worker's host-DRAM KV tier, bytes per second (the
    /// GPU preset's `pcie_gbs`): what restoring a host-cached prefix costs.
    pub pcie_bytes_per_s: f64,
    /// When sessions may decode on prefill workers whose engine serves whole requests
    /// (`WorkerView::prefill_decodes`): a P/D fleet's prefill GPUs, idle between
    /// prefills, then also hold decodes when the cost says so, priced like a hybrid
    /// worker's (their running prefill legs counted as stalled decodes). By default
    /// ([`PrefillWorkersDecode::Auto`]) only where the worker's KV pool is sized for
    /// decoding: an operator who split the fleet may have sized its prefill instances for
    /// prefill only.
    pub prefill_workers_decode: PrefillWorkersDecode,
    /// Seconds a move's first answer is held (`PlanInput::move_hold_s`): the router's read
    /// lease on a remote directory; 0 elsewhere and in the simulator.
    pub move_hold_s: f64,
}

impl OwnerServeConfig {
    /// Built-in presets, the GPU's own link figure and default weights.
    pub fn from_presets(model: &str, gpu: &str, gpus: u32) -> Result<Self, SpecError> {
        let model = ModelSpec::preset(model)?;
        let gpu = GpuSpec::preset(gpu)?;
        Ok(Self {
            model,
            models: BTreeMap::new(),
            roofline: Roofline::new(&gpu, gpus.max(1), Efficiency::default()),
            rooflines: BTreeMap::new(),
            step_budget: StepBudget::engine_default(&gpu),
            worker_step_budgets: BTreeMap::new(),
            links: Links {
                default: Link {
                    bytes_per_s: gpu.link_gbs * 1e9,
                    latency_s: 20e-6,
                },
                pairs: BTreeMap::new(),
            },
            weights: Weights::default(),
            thresholds: ClassThresholds::default(),
            pcie_bytes_per_s: gpu.pcie_gbs * 1e9,
            prefill_workers_decode: PrefillWorkersDecode::default(),
            move_hold_s: 0.0,
        })
    }

    /// The spec a request for served model `served` is priced with.
    pub fn model_for(&self, served: &str) -> &ModelSpec {
        self.models.get(served).unwrap_or(&self.model)
    }

    /// The roofline of `worker`.
    pub fn roofline_of(&self, worker: WorkerId) -> &Roofline {
        self.rooflines.get(&worker).unwrap_or(&self.roofline)
    }

    /// How `worker`'s engine cuts prefills into steps.
    pub fn step_budget_of(&self, worker: WorkerId) -> StepBudget {
        self.worker_step_budgets
            .get(&worker)
            .copied()
            .unwrap_or(self.step_budget)
    }
}

/// The planner behind the [`Policy`] trait.
#[derive(Debug, Clone)]
pub struct OwnerServe {
    cfg: OwnerServeConfig,
    /// Observed prefill speed per roofline (`OwnerServe::calibration_of`).
    calibration: Vec<(Roofline, PrefillCalibration)>,
    /// Observed decode lifetime per worker (`Policy::observe_decode`).
    decode_lifetime: HashMap<WorkerId, Ewma>,
    /// Every worker's observed decode lifetimes, as a distribution: their shape says how
    /// soon decodes of a given age end (`kv_release`).
    lifetimes: DecodeLifetimes,
    /// KV bytes of the prompts routed so far and of the migrations chosen for them: what
    /// `Weights::migration_budget` is measured against (`OwnerServe::migration_budget`).
    prompt_kv_bytes: f64,
    migrated_bytes: f64,
}

/// Weight of a new decode-lifetime sample in its EWMA.
const DECODE_LIFETIME_ALPHA: f64 = 0.1;

impl OwnerServe {
    pub fn new(cfg: OwnerServeConfig) -> Self {
        Self {
            cfg,
            calibration: Vec::new(),
            decode_lifetime: HashMap::new(),
            lifetimes: DecodeLifetimes::default(),
            prompt_kv_bytes: 0.0,
            migrated_bytes: 0.0,
        }
    }

    /// What is left of the migration budget for a step of `prompt_kv_bytes`: its share of
    /// every prompt routed so far and this one, less what migrations already moved.
    fn migration_budget(&self, prompt_kv_bytes: f64) -> MigrationBudget {
        MigrationBudget::of(
            self.cfg.weights.migration_budget,
            self.prompt_kv_bytes + prompt_kv_bytes,
            self.migrated_bytes,
        )
    }

    /// The planner's figures.
    pub fn config(&self) -> &OwnerServeConfig {
        &self.cfg
    }

    /// What the prefills observed on workers with `roofline` taught: one calibration per
    /// kind of worker, not per worker. A prefill's time depends on the batch it shares
    /// steps with as much as on the worker, so one sample says little; per worker, a
    /// worker that happened to serve few prefills that started at once kept its first
    /// few samples for good (on 8 identical Qwen3 hybrids the scales stood at 2.0–4.8
    /// for a whole run, and the cheaper-looking workers drew moves).
    fn calibration_of(&self, roofline: &Roofline) -> Option<&PrefillCalibration> {
        self.calibration
            .iter()
            .find(|(r, _)| r == roofline)
            .map(|(_, c)| c)
    }

    /// The planner's view of `w` for a step of `prompt` tokens: its roofline,
    /// calibration, queue, decode batch and how fast its KV is released.
    /// `smallest_decoder_pool` is the fleet's ([`smallest_decoder_pool`]), for whether a
    /// prefill worker may decode.
    fn plan_worker(
        &self,
        w: &WorkerView,
        model: &ModelSpec,
        block_size: u32,
        prompt: u64,
        smallest_decoder_pool: Option<u64>,
    ) -> PlanWorker {
        let roofline = self.cfg.roofline_of(w.id).clone();
        // Prefills the engine has queued (its gauge once scraped; else none known), and
        // the decode legs of remote prefills that will join them once their prefill
        // legs end: a step computed here delays those too. (Without them, a move planned
        // onto a decoder while a remote prefill's leg ran elsewhere looked free to take
        // it, and the leg then waited behind that move's prefill: on the Mooncake trace
        // on 2p6d, a 16.7K-token step planned at 0.7 s took 5.9 s behind a 76K-token one.)
        let queued = w.load.map_or(0, |l| l.waiting.max(0.0) as u64) + u64::from(w.legs_heading);
        let prefill_scale = self
            .calibration_of(&roofline)
            .map_or(1.0, PrefillCalibration::scale);
        let mut planned = PlanWorker {
            id: w.id,
            role: w.role,
            healthy: w.healthy,
            draining: w.draining,
            queue_s: 0.0,
            roofline,
            step_budget: self.cfg.step_budget_of(w.id),
            decoding: w.decoding(),
            queued,
            cached_tokens: u64::from(w.cached_blocks) * u64::from(block_size),
            host_cached_tokens: u64::from(w.host_cached_blocks) * u64::from(block_size),
            pulls_kv: w.pulls_kv,
            prefill_decodes: self
                .cfg
                .prefill_workers_decode
                .allows(w, smallest_decoder_pool),
            decode_leg_at_dispatch: w.decode_leg_at_dispatch,
            pcie_bytes_per_s: self.cfg.pcie_bytes_per_s,
            prefill_scale,
            kv_room_tokens: w.load.and_then(|l| l.kv_room_tokens),
            kv_free_tokens: w.load.and_then(|l| l.kv_free_tokens),
            kv_capacity_tokens: w.load.and_then(|l| l.kv_capacity_tokens),
            waiting_tokens: w.active_prefill_tokens,
            decode_lifetime_s: self.decode_lifetime.get(&w.id).and_then(Ewma::value),
            kv_release_per_s: self.kv_release_per_s(w, prompt),
            parked_returns_per_s: w.parked_returns_per_s,
        };
        // The queued prompts are prefilled as this step's is priced: chunked beside the
        // decodes running there, at the calibrated rate. What moves, fetches and remote
        // prefills bring there is KV, not compute.
        planned.queue_s = queue_s(&planned, model, w.active_compute_tokens, queued) * prefill_scale;
        planned
    }

    /// How fast `w`'s running decodes release KV, worked out only when a step of
    /// `prompt` tokens would wait for it (the prompts queued there and it need more than
    /// is free): the admission model is the only reader.
    fn kv_release_per_s(&self, w: &WorkerView, prompt: u64) -> Option<f64> {
        let load = w.load?;
        let (free, capacity) = (load.kv_free_tokens?, load.kv_capacity_tokens?);
        if w.active_prefill_tokens + prompt <= free {
            return None;
        }
        self.lifetimes
            .release_per_s(&w.decode_ages, capacity.saturating_sub(free))
    }

    /// Plans `req` over `workers` as routing does, without deciding anything: dominated
    /// remote prefills are left out of the candidates.
    pub fn plan(
        &self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Plan, PolicyError> {
        self.plan_listing(req, workers, false)
    }

    /// Plans `req` over `workers` listing every candidate, dominated ones included (the
    /// explain API). It chooses what [`OwnerServe::plan`] chooses.
    pub fn explain_plan(
        &self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Plan, PolicyError> {
        self.plan_listing(req, workers, true)
    }

    fn plan_listing(
        &self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
        exhaustive: bool,
    ) -> Result<Plan, PolicyError> {
        let block_size = req.block_size.max(1);
        let model = self.cfg.model_for(req.model);
        let (prompt, decoder_pool) = (u64::from(req.prompt_tokens), smallest_decoder_pool(workers));
        // The returns of sessions parked on a worker are priced only for a step with no
        // decode owner: a new tenant there delays them. A step of a session that decodes
        // somewhere is one of those returns itself; priced for every step, the term drew
        // sessions off their owners to dodge their neighbours (held out: KV moved +55%,
        // p99 TTFT worse in 16 of 27 runs; EVALUATION.md, sixteenth pass).
        let new_tenant = req.decode_owner.is_none();
        let plan_workers: Vec<PlanWorker> = workers
            .iter()
            .map(|w| {
                let mut p = self.plan_worker(w, model, block_size, prompt, decoder_pool);
                if !new_tenant {
                    p.parked_returns_per_s = 0.0;
                }
                p
            })
            .collect();
        let input = PlanInput {
            model,
            block_size,
            prompt_tokens: prompt,
            decode_owner: req.decode_owner,
            artifact: longest_copy(req.artifact, &plan_workers),
            workers: &plan_workers,
            links: &self.cfg.links,
            weights: self.cfg.weights,
            samples: req.samples.max(1),
            fork: req.fork,
            thresholds: self.cfg.thresholds,
            exhaustive,
            migration_budget: self.migration_budget(prompt_kv_bytes(model, prompt)),
            move_hold_s: self.cfg.move_hold_s,
        };
        plan(&input).map_err(|_| PolicyError::NoHealthyWorker)
    }
}

/// The prefix copy a step can fetch or move to: the directory's sealed artifact, or the
/// longest prefix of the prompt any healthy worker holds in HBM (the KV index) when that
/// one is longer. Another session's identical context (a shared repository, the same
/// tool output) is a peer's prefix the directory never filed under this session; fetching
/// it at link speed beats recomputing it, and without it the only choices for a long
/// prompt are recompute on the owner or on a prefill worker. Ties keep the directory's
/// artifact, then the first worker.
pub fn longest_copy(
    artifact: Option<ArtifactView>,
    workers: &[PlanWorker],
) -> Option<ArtifactView> {
    let known = artifact.map_or(0, |a| a.tokens);
    let mut best: Option<&PlanWorker> = None;
    for w in workers.iter().filter(|w| w.healthy) {
        if w.cached_tokens > best.map_or(known, |b| b.cached_tokens) {
            best = Some(w);
        }
    }
    best.map_or(artifact, |w| {
        Some(ArtifactView {
            owner: w.id,
            tokens: w.cached_tokens,
        })
    })
}

/// Predicted wait before a new prefill starts on `w`, which has `waiting` prompt tokens
/// sent there and not prefilled yet, in about `queued` prompts (at least one), at the
/// preset's rate: their compute, each prompt attending only to itself, chunked beside the
/// decodes running there ([`PlanWorker::preset_prefill_s`]). (Pricing the backlog as one
/// prompt of all its tokens counted the attention of prompts to each other and overstated
/// a long queue by up to 2×, which made busy workers look busier than they are.)
pub fn queue_s(w: &PlanWorker, model: &ModelSpec, waiting: u64, queued: u64) -> f64 {
    if waiting == 0 {
        return 0.0;
    }
    let prompts = queued.clamp(1, waiting);
    let each = waiting / prompts;
    let pairs = prefill_pairs(each, 0) * prompts + prefill_pairs(waiting - each * prompts, 0);
    w.preset_prefill_s(&StepFigures::of(model), waiting, pairs, 0)
}

/// KV bytes of a prompt of `tokens` tokens of `model`.
fn prompt_kv_bytes(model: &ModelSpec, tokens: u64) -> f64 {
    model.kv_bytes_per_token() * tokens as f64
}

/// The dispatch that carries out a plan.
pub fn dispatch_of(p: &Plan) -> Dispatch {
    let c = &p.chosen;
    match (c.action, c.source) {
        (Action::RemotePrefill, _) => Dispatch::Disaggregated {
            prefill: c.compute_on,
        },
        (Action::ArtifactFetch, Some(source)) => Dispatch::Fetch {
            source,
            tokens: c.reused_tokens,
        },
        (Action::Migrate, Some(source)) => Dispatch::Migrate {
            source,
            tokens: c.reused_tokens,
        },
        _ => Dispatch::Single,
    }
}

impl Policy for OwnerServe {
    fn name(&self) -> &'static str {
        "ownerserve"
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let p = self.plan(req, workers)?;
        self.prompt_kv_bytes +=
            prompt_kv_bytes(self.cfg.model_for(req.model), u64::from(req.prompt_tokens));
        if p.chosen.action == Action::Migrate {
            self.migrated_bytes += p.chosen.network_bytes;
        }
        Ok(Decision {
            worker: p.chosen.decode_on,
            dispatch: dispatch_of(&p),
            plan: Some(Box::new(p)),
        })
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn needs_directory(&self) -> bool {
        true
    }

    fn needs_decode_ages(&self) -> bool {
        true
    }

    fn observe_prefill(&mut self, worker: WorkerId, predicted_s: f64, observed_s: f64) {
        let roofline = self.cfg.roofline_of(worker);
        match self.calibration.iter_mut().find(|(r, _)| r == roofline) {
            Some((_, c)) => c.observe(predicted_s, observed_s),
            None => {
                let mut c = PrefillCalibration::default();
                c.observe(predicted_s, observed_s);
                self.calibration.push((roofline.clone(), c));
            }
        }
    }

    fn observe_decode(&mut self, worker: WorkerId, decode_s: f64) {
        if decode_s > 0.0 {
            self.lifetimes.observe(decode_s);
            self.decode_lifetime
                .entry(worker)
                .or_insert_with(|| Ewma::new(DECODE_LIFETIME_ALPHA))
                .observe(decode_s);
        }
    }

    fn explain(
        &self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Option<Result<Plan, PolicyError>> {
        Some(self.explain_plan(req, workers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Role;
    use crate::policy::{EngineLoad, PrefillCharge};

    fn policy() -> OwnerServe {
        OwnerServe::new(OwnerServeConfig::from_presets("llama-3.1-8b", "h100", 1).unwrap())
    }

    fn req(tokens: u32) -> RouteRequest<'static> {
        RouteRequest {
            model: "m",
            prompt_tokens: tokens,
            block_size: 16,
            samples: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_small_turn_stays_on_the_owner_that_holds_the_session() {
        let mut p = policy();
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView {
                cached_blocks: 500,
                host_cached_blocks: 0,
                pulls_kv: true,
                ..WorkerView::idle(WorkerId(1), Role::Decode)
            },
            WorkerView::idle(WorkerId(2), Role::Decode),
        ];
        let r = RouteRequest {
            decode_owner: Some(WorkerId(1)),
            ..req(8_020)
        };
        let d = p.choose(&r, &ws).unwrap();
        assert_eq!(d.worker, WorkerId(1));
        assert_eq!(d.dispatch, Dispatch::Single);
        assert_eq!(d.action(), Action::Colocate);
    }

    #[test]
    fn a_new_session_avoids_the_worker_its_parked_sessions_will_return_to() {
        let mut p = policy();
        let parked = |id: u32, returns: f64| WorkerView {
            parked_returns_per_s: returns,
            ..WorkerView::idle(WorkerId(id), Role::Hybrid)
        };
        // Both idle: without the parked session's return, the first would win the tie.
        let ws = [parked(0, 0.125), parked(1, 0.0)];
        let plan = p.plan(&req(30_000), &ws).unwrap();
        assert_eq!(plan.chosen.decode_on, WorkerId(1));
        let on_0 = plan.candidates.iter().find(|c| c.decode_on == WorkerId(0));
        let delay = on_0.unwrap().cost.queue_delay_s;
        let compute = on_0.unwrap().cost.compute_s;
        assert!(
            (delay - compute * compute * 0.125).abs() < 1e-9,
            "{delay} {compute}"
        );
        // A session that decodes on worker 0 stays there however many return to it.
        let ws = [
            WorkerView {
                cached_blocks: 1_800,
                ..parked(0, 50.0)
            },
            parked(1, 0.0),
        ];
        let r = RouteRequest {
            decode_owner: Some(WorkerId(0)),
            ..req(30_000)
        };
        let d = p.choose(&r, &ws).unwrap();
        assert_eq!((d.worker, d.action()), (WorkerId(0), Action::Colocate));
    }

    #[test]
    fn a_long_new_prompt_over_busy_decoders_is_prefilled_remotely() {
        let mut p = policy();
        let busy = Some(EngineLoad {
            running: 64.0,
            ..EngineLoad::default()
        });
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView {
                load: busy,
                ..WorkerView::idle(WorkerId(1), Role::Decode)
            },
        ];
        let d = p.choose(&req(16_000), &ws).unwrap();
        assert_eq!(
            d.dispatch,
            Dispatch::Disaggregated {
                prefill: WorkerId(0)
            }
        );
        assert_eq!(d.worker, WorkerId(1));
    }

    #[test]
    fn explaining_lists_every_pair_and_chooses_as_routing_does() {
        let p = policy();
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView::idle(WorkerId(1), Role::Prefill),
            WorkerView::idle(WorkerId(2), Role::Decode),
            WorkerView::idle(WorkerId(3), Role::Decode),
        ];
        let routed = p.plan(&req(16_000), &ws).unwrap();
        let explained = p.explain_plan(&req(16_000), &ws).unwrap();
        assert_eq!(routed.chosen, explained.chosen);
        let remote = |p: &Plan| {
            p.candidates
                .iter()
                .filter(|c| c.action == Action::RemotePrefill)
                .count()
        };
        assert_eq!((remote(&routed), remote(&explained)), (2, 4));
    }

    #[test]
    fn a_planned_prefill_leg_charges_its_worker_only_what_it_computes() {
        let p = policy();
        // The prefill worker holds the first 4,096 tokens of the 16K prompt.
        let ws = [
            WorkerView {
                cached_blocks: 256,
                ..WorkerView::idle(WorkerId(0), Role::Prefill)
            },
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        // The remote prefill as chosen (a fetch of the 4,096 tokens is cheaper here).
        let mut plan = p.explain_plan(&req(16_000), &ws).unwrap();
        plan.chosen = plan
            .candidates
            .iter()
            .find(|c| c.action == Action::RemotePrefill && c.compute_on == WorkerId(0))
            .cloned()
            .unwrap();
        let d = Decision {
            worker: WorkerId(1),
            dispatch: dispatch_of(&plan),
            plan: Some(Box::new(plan)),
        };
        assert_eq!(
            d.dispatch,
            Dispatch::Disaggregated {
                prefill: WorkerId(0)
            }
        );
        let leg = PrefillCharge::prefill_leg(&d, 16_000);
        assert_eq!((leg.tokens, leg.computed), (16_000, 16_000 - 4_096));
        assert_eq!(PrefillCharge::of(&d, 16_000, 0).computed, 0);
    }

    /// A policy whose worker 3 has GPUs of another kind (two per worker).
    fn policy_with_other_worker_3() -> OwnerServe {
        let mut cfg = OwnerServeConfig::from_presets("llama-3.1-8b", "h100", 1).unwrap();
        let h100 = GpuSpec::preset("h100").unwrap();
        cfg.rooflines
            .insert(WorkerId(3), Roofline::new(&h100, 2, Efficiency::default()));
        OwnerServe::new(cfg)
    }

    /// The prefill scale the planner applies to `w`.
    fn scale(p: &OwnerServe, w: &WorkerView) -> f64 {
        p.plan_worker(w, &p.cfg.model, 16, 0, None).prefill_scale
    }

    #[test]
    fn workers_of_one_kind_share_what_their_prefills_taught() {
        let mut p = policy_with_other_worker_3();
        let w = |id| WorkerView::idle(WorkerId(id), Role::Prefill);
        for _ in 0..50 {
            p.observe_prefill(WorkerId(1), 0.1, 0.3);
        }
        // Worker 2 never ran a timed prefill: it is the same kind of worker as 1.
        assert!((scale(&p, &w(1)) - 3.0).abs() < 1e-6);
        assert_eq!(scale(&p, &w(2)), scale(&p, &w(1)));
        // Worker 3's GPUs differ: what 1 taught says nothing about it.
        assert_eq!(scale(&p, &w(3)), 1.0);
        p.observe_prefill(WorkerId(3), 0.1, 0.05);
        assert!((scale(&p, &w(3)) - 0.5).abs() < 1e-9);
        assert!((scale(&p, &w(1)) - 3.0).abs() < 1e-6);
    }

    #[test]
    fn fed_the_presets_time_the_calibration_settles_at_the_observed_ratio() {
        // A prefill worker that really takes 3× the preset's time. Each observation is
        // compared with the preset's time the plan reports; compared with the calibrated
        // time instead, the scale settled at √3.
        let mut p = policy();
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        let on_prefill = |p: &OwnerServe| {
            let plan = p.explain_plan(&req(16_000), &ws).unwrap();
            plan.candidates
                .into_iter()
                .find(|c| c.action == Action::RemotePrefill && c.compute_on == WorkerId(0))
                .unwrap()
        };
        for _ in 0..60 {
            let c = on_prefill(&p);
            p.observe_prefill(WorkerId(0), c.preset_compute_s, 3.0 * c.preset_compute_s);
        }
        let c = on_prefill(&p);
        let ratio = c.cost.compute_s / c.preset_compute_s;
        assert!((ratio - 3.0).abs() < 1e-3, "{ratio}");
    }

    #[test]
    fn prompts_queued_on_a_worker_wait_at_its_calibrated_rate() {
        let mut p = policy();
        let w = WorkerView {
            active_prefill_tokens: 40_000,
            active_compute_tokens: 40_000,
            load: Some(EngineLoad {
                waiting: 4.0,
                ..EngineLoad::default()
            }),
            ..WorkerView::idle(WorkerId(0), Role::Prefill)
        };
        let m = p.cfg.model.clone();
        let preset = p.plan_worker(&w, &m, 16, 0, None).queue_s;
        assert!(preset > 0.0);
        for _ in 0..50 {
            p.observe_prefill(WorkerId(0), 0.1, 0.2);
        }
        let calibrated = p.plan_worker(&w, &m, 16, 0, None).queue_s;
        assert!(
            (calibrated / preset - 2.0).abs() < 1e-6,
            "{preset} {calibrated}"
        );
    }

    #[test]
    fn explaining_uses_what_calibration_learned() {
        // Workers of two kinds: what one's prefills teach moves routing to the other.
        let mut p = policy_with_other_worker_3();
        let ws = [
            WorkerView::idle(WorkerId(2), Role::Decode),
            WorkerView::idle(WorkerId(3), Role::Decode),
        ];
        let first = p.choose(&req(16_000), &ws).unwrap().worker;
        // The first choice turns out to prefill ten times slower than predicted.
        for _ in 0..50 {
            p.observe_prefill(first, 0.1, 1.0);
        }
        let routed = p.choose(&req(16_000), &ws).unwrap().worker;
        assert_ne!(routed, first, "calibration moves routing");
        let explained = Policy::explain(&p, &req(16_000), &ws).unwrap().unwrap();
        assert_eq!(explained.chosen.decode_on, routed);
    }

    #[test]
    fn a_draining_owner_hands_its_session_over() {
        let mut p = policy();
        let ws = [
            WorkerView {
                cached_blocks: 500,
                host_cached_blocks: 0,
                pulls_kv: true,
                draining: true,
                ..WorkerView::idle(WorkerId(1), Role::Decode)
            },
            WorkerView::idle(WorkerId(2), Role::Decode),
        ];
        let r = RouteRequest {
            decode_owner: Some(WorkerId(1)),
            artifact: Some(ArtifactView {
                owner: WorkerId(1),
                tokens: 8_000,
            }),
            ..req(8_020)
        };
        let d = p.choose(&r, &ws).unwrap();
        assert_eq!(d.worker, WorkerId(2));
        assert!(
            matches!(d.dispatch, Dispatch::Migrate { source: WorkerId(1), tokens } if tokens >= 8_000),
            "{d:?}"
        );
    }

    /// A session whose owner is swamped moves while the budget allows; once migrations
    /// have moved their share of the prompts routed, the same step stays, and explain
    /// lists no move. A draining owner still hands its session over.
    #[test]
    fn migrations_stop_at_their_share_of_the_prompts_routed() {
        let ws = [
            WorkerView {
                cached_blocks: 500,
                pulls_kv: true,
                active_prefill_tokens: 400_000,
                active_compute_tokens: 400_000,
                ..WorkerView::idle(WorkerId(1), Role::Decode)
            },
            WorkerView::idle(WorkerId(2), Role::Decode),
        ];
        let r = RouteRequest {
            decode_owner: Some(WorkerId(1)),
            ..req(8_020)
        };
        let with_budget = |budget: f64| {
            let mut cfg = OwnerServeConfig::from_presets("llama-3.1-8b", "h100", 1).unwrap();
            cfg.weights.migration_budget = budget;
            OwnerServe::new(cfg)
        };
        let mut free = with_budget(f64::INFINITY);
        assert_eq!(free.choose(&r, &ws).unwrap().action(), Action::Migrate);

        // Room for one 8,000-token move after ~21 prompts of 8,020 tokens at 5%.
        let mut capped = with_budget(0.05);
        let small = req(8_020);
        for _ in 0..20 {
            capped
                .choose(&small, &[WorkerView::idle(WorkerId(2), Role::Decode)])
                .unwrap();
        }
        let spent = |d: &Decision| d.plan.as_ref().unwrap().migration_budget_spent;
        let moved = capped.choose(&r, &ws).unwrap();
        assert_eq!(moved.action(), Action::Migrate);
        assert_eq!(spent(&moved), 0.0, "nothing moved before it");
        let after = capped.choose(&r, &ws).unwrap();
        assert_ne!(after.action(), Action::Migrate);
        assert!(spent(&after) > 0.9, "the plan reports the budget spent");
        let explained = Policy::explain(&capped, &r, &ws).unwrap().unwrap();
        assert!(explained
            .candidates
            .iter()
            .all(|c| c.action != Action::Migrate));

        let draining = [
            WorkerView {
                draining: true,
                ..ws[0]
            },
            ws[1],
        ];
        let mut none = with_budget(0.0);
        assert_eq!(
            none.choose(&r, &draining).unwrap().action(),
            Action::Migrate
        );
    }

    #[test]
    fn a_long_prompt_a_peer_holds_is_fetched_not_recomputed() {
        let p = policy();
        let busy = Some(EngineLoad {
            running: 20.0,
            ..EngineLoad::default()
        });
        // The session's owner holds its system prompt; another decoder holds 48K tokens of
        // this prompt from another session that read the same repository.
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView {
                cached_blocks: 60,
                host_cached_blocks: 0,
                pulls_kv: true,
                load: busy,
                ..WorkerView::idle(WorkerId(1), Role::Decode)
            },
            WorkerView {
                cached_blocks: 3_000,
                host_cached_blocks: 0,
                pulls_kv: true,
                load: busy,
                ..WorkerView::idle(WorkerId(2), Role::Decode)
            },
        ];
        let r = RouteRequest {
            decode_owner: Some(WorkerId(1)),
            ..req(52_000)
        };
        let plan = p.plan(&r, &ws).unwrap();
        let fetch = plan
            .candidates
            .iter()
            .find(|c| c.action == Action::ArtifactFetch && c.source == Some(WorkerId(2)))
            .expect("a fetch from the peer that holds the prefix");
        assert!(fetch.reused_tokens >= 48_000, "{fetch:?}");
        let ttft = |c: &crate::plan::Candidate| {
            c.cost.queue_s + c.cost.compute_s + c.cost.network_s + c.cost.restore_s
        };
        let remote = plan
            .candidates
            .iter()
            .find(|c| c.action == Action::RemotePrefill)
            .unwrap();
        assert!(ttft(fetch) < 0.2 * ttft(remote), "{fetch:?} vs {remote:?}");
        // Where decode stalls are priced low against a step's own wait, it is chosen.
        let mut cfg = p.config().clone();
        cfg.weights.mu = 0.02;
        let d = OwnerServe::new(cfg).choose(&r, &ws).unwrap();
        assert!(
            matches!(d.dispatch, Dispatch::Fetch { source: WorkerId(2), tokens } if tokens >= 48_000)
                || (d.worker == WorkerId(2) && d.action() == Action::TailRecompute),
            "{d:?}"
        );
    }

    #[test]
    fn the_longest_copy_is_the_directory_s_unless_a_worker_holds_more() {
        let p = policy();
        let view = |id: u32, blocks: u32| {
            let v = WorkerView {
                cached_blocks: blocks,
                host_cached_blocks: 0,
                pulls_kv: true,
                ..WorkerView::idle(WorkerId(id), Role::Decode)
            };
            p.plan_worker(&v, &p.config().model, 16, 0, None)
        };
        let dir = Some(ArtifactView {
            owner: WorkerId(1),
            tokens: 1_600,
        });
        let ws = [view(1, 100), view(2, 100)];
        assert_eq!(longest_copy(dir, &ws), dir);
        let ws = [view(1, 100), view(2, 101), view(3, 101)];
        assert_eq!(
            longest_copy(dir, &ws),
            Some(ArtifactView {
                owner: WorkerId(2),
                tokens: 1_616
            })
        );
        assert_eq!(longest_copy(None, &[view(1, 0)]), None);
        let mut sick = view(4, 500);
        sick.healthy = false;
        assert_eq!(longest_copy(dir, &[sick]), dir);
    }

    #[test]
    fn a_queue_of_several_prompts_waits_less_than_one_prompt_of_all_their_tokens() {
        let p = policy();
        let m = &p.config().model;
        let w = p.plan_worker(&WorkerView::idle(WorkerId(0), Role::Decode), m, 16, 0, None);
        let one = queue_s(&w, m, 64_000, 1);
        let eight = queue_s(&w, m, 64_000, 8);
        assert!(eight < one, "{eight} vs {one}");
        // Linear work is the same; only the attention across prompts is gone.
        assert!(eight > 0.5 * one, "{eight} vs {one}");
        assert_eq!(queue_s(&w, m, 0, 3), 0.0);
        // More prompts than tokens cannot happen; it is clamped, not a panic.
        assert!(queue_s(&w, m, 2, 10) > 0.0);
    }

    #[test]
    fn the_engine_queue_is_what_the_planner_sees_queued() {
        let p = policy();
        let view = WorkerView {
            active_prefill_tokens: 20_000,
            active_compute_tokens: 20_000,
            load: Some(EngineLoad {
                waiting: 4.0,
                running: 9.0,
                ..EngineLoad::default()
            }),
            ..WorkerView::idle(WorkerId(3), Role::Decode)
        };
        let w = p.plan_worker(&view, &p.config().model, 16, 0, None);
        assert_eq!((w.queued, w.decoding), (4, 9));
        assert!(w.queue_s > 0.0);
        // Remote prefills whose decode legs head there join that queue soon: what a step
        // computed there delays counts them (ν·D_queue).
        let view = WorkerView {
            legs_heading: 2,
            ..view
        };
        assert_eq!(
            p.plan_worker(&view, &p.config().model, 16, 0, None).queued,
            6
        );
    }

    #[test]
    fn kv_a_worker_receives_is_no_prefill_to_queue_behind_but_still_takes_its_memory() {
        // 50K tokens sent there, all of them moved in (a migration, a remote prefill's
        // decode leg): nothing to compute ahead of the next step, 50K of KV to allocate.
        let p = policy();
        let m = p.config().model.clone();
        let mut view = WorkerView {
            active_prefill_tokens: 50_000,
            active_compute_tokens: 0,
            load: Some(EngineLoad {
                waiting: 1.0,
                ..EngineLoad::default()
            }),
            ..WorkerView::idle(WorkerId(3), Role::Decode)
        };
        let w = p.plan_worker(&view, &m, 16, 0, None);
        assert_eq!((w.queue_s, w.waiting_tokens), (0.0, 50_000));
        // Computed there, the same tokens are a queue.
        view.active_compute_tokens = 50_000;
        assert!(p.plan_worker(&view, &m, 16, 0, None).queue_s > 1.0);
    }

    #[test]
    fn observed_decodes_set_the_lifetime_the_memory_wait_uses() {
        let mut p = policy();
        let v = WorkerView::idle(WorkerId(2), Role::Decode);
        let m = p.config().model.clone();
        assert_eq!(p.plan_worker(&v, &m, 16, 0, None).decode_lifetime_s, None);
        p.observe_decode(WorkerId(2), 8.0);
        p.observe_decode(WorkerId(2), 0.0);
        p.observe_decode(WorkerId(2), 18.0);
        let w = p.plan_worker(&v, &m, 16, 0, None);
        assert!((w.decode_lifetime_s.unwrap() - 9.0).abs() < 1e-9, "{w:?}");
        assert_eq!(
            p.plan_worker(
                &WorkerView::idle(WorkerId(3), Role::Decode),
                &m,
                16,
                0,
                None
            )
            .decode_lifetime_s,
            None
        );
    }

    /// A decoder whose 100K-token pool is full, every token held by decodes of `age_s`.
    fn full_decoder(id: u32, age_s: f64) -> WorkerView {
        let mut decode_ages = crate::kv_release::DecodeAges::default();
        decode_ages.add(age_s, 100_000);
        WorkerView {
            load: Some(EngineLoad {
                running: 8.0,
                kv_usage: 1.0,
                kv_free_tokens: Some(0),
                kv_capacity_tokens: Some(100_000),
                kv_room_tokens: Some(0),
                ..EngineLoad::default()
            }),
            decode_ages,
            ..WorkerView::idle(WorkerId(id), Role::Decode)
        }
    }

    #[test]
    fn a_full_decoder_held_by_old_decodes_of_a_heavy_tail_waits_longer() {
        let mut p = policy();
        // Four in five decodes end within 2 s, one runs 70 s: on both workers alike.
        for _ in 0..20 {
            for l in [1.5, 1.5, 2.0, 2.0, 70.0] {
                p.observe_decode(WorkerId(1), l);
                p.observe_decode(WorkerId(2), l);
            }
        }
        let m = p.config().model.clone();
        let young = p.plan_worker(&full_decoder(1, 0.5), &m, 16, 10_000, None);
        let old = p.plan_worker(&full_decoder(2, 20.0), &m, 16, 10_000, None);
        let (fast, slow) = (
            young.kv_release_per_s.unwrap(),
            old.kv_release_per_s.unwrap(),
        );
        assert!(fast > 5.0 * slow, "young {fast} old {slow}");
        // A step that fits the free KV waits for none: no rate is worked out.
        let roomy = WorkerView {
            load: Some(EngineLoad {
                kv_free_tokens: Some(50_000),
                ..full_decoder(1, 0.5).load.unwrap()
            }),
            ..full_decoder(1, 0.5)
        };
        assert_eq!(
            p.plan_worker(&roomy, &m, 16, 10_000, None).kv_release_per_s,
            None
        );
        // The step goes where the KV frees first, whichever worker that is.
        let d = p
            .choose(&req(10_000), &[full_decoder(1, 0.5), full_decoder(2, 20.0)])
            .unwrap();
        assert_eq!(d.worker, WorkerId(1));
        let d = p
            .choose(&req(10_000), &[full_decoder(1, 20.0), full_decoder(2, 0.5)])
            .unwrap();
        assert_eq!(d.worker, WorkerId(2));
    }

    #[test]
    fn observed_slow_prefills_make_a_worker_look_slower() {
        let mut p = policy();
        let ws = [WorkerView::idle(WorkerId(0), Role::Hybrid)];
        let before = p.plan(&req(4_000), &ws).unwrap().chosen.cost.compute_s;
        for _ in 0..50 {
            p.observe_prefill(WorkerId(0), 0.1, 0.3);
        }
        let after = p.plan(&req(4_000), &ws).unwrap().chosen.cost.compute_s;
        assert!(after > 2.5 * before, "{before} -> {after}");
    }
}
