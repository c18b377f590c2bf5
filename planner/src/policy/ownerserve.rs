//! `ownerserve`: the cost planner as a routing policy. It turns the router's view of the
//! workers and the directory's view of the session into a [`PlanInput`], plans, and maps
//! the chosen candidate onto a [`Dispatch`]. Observed prefill times calibrate each worker's
//! roofline (an EWMA of observed over predicted).

use std::collections::{BTreeMap, HashMap};

use super::{Decision, Dispatch, Policy, PolicyError, RouteRequest, WorkerView};
use crate::ewma::PrefillCalibration;
use crate::ids::WorkerId;
use crate::plan::{
    plan, Action, ClassThresholds, Link, Links, Plan, PlanInput, PlanWorker, Weights,
};
use crate::roofline::{prefill_pairs, Efficiency, Roofline, StepWork};
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
    pub links: Links,
    pub weights: Weights,
    pub thresholds: ClassThresholds,
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
            links: Links {
                default: Link {
                    bytes_per_s: gpu.link_gbs * 1e9,
                    latency_s: 20e-6,
                },
                pairs: BTreeMap::new(),
            },
            weights: Weights::default(),
            thresholds: ClassThresholds::default(),
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
}

/// The planner behind the [`Policy`] trait.
#[derive(Debug, Clone)]
pub struct OwnerServe {
    cfg: OwnerServeConfig,
    calibration: HashMap<WorkerId, PrefillCalibration>,
}

impl OwnerServe {
    pub fn new(cfg: OwnerServeConfig) -> Self {
        Self {
            cfg,
            calibration: HashMap::new(),
        }
    }

    /// The planner's figures.
    pub fn config(&self) -> &OwnerServeConfig {
        &self.cfg
    }

    /// The planner's view of `w`: its roofline, calibration, queue and decode batch.
    fn plan_worker(&self, w: &WorkerView, model: &ModelSpec, block_size: u32) -> PlanWorker {
        let roofline = self.cfg.roofline_of(w.id).clone();
        // Prompt tokens sent there and not prefilled yet are the queue ahead of this step.
        let waiting = w.active_prefill_tokens;
        let queue_s = if waiting == 0 {
            0.0
        } else {
            let work = StepWork {
                prefill_tokens: waiting,
                prefill_attention_pairs: prefill_pairs(waiting, 0),
                ..StepWork::default()
            };
            roofline.step_time(model, &work).total_s
        };
        PlanWorker {
            id: w.id,
            role: w.role,
            healthy: w.healthy,
            draining: w.draining,
            roofline,
            queue_s,
            decoding: w.decoding(),
            cached_tokens: u64::from(w.cached_blocks) * u64::from(block_size),
            prefill_scale: self.calibration.get(&w.id).map_or(1.0, |c| c.scale()),
            kv_room_tokens: w.load.and_then(|l| l.kv_room_tokens),
        }
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
        let plan_workers: Vec<PlanWorker> = workers
            .iter()
            .map(|w| self.plan_worker(w, model, block_size))
            .collect();
        let input = PlanInput {
            model,
            block_size,
            prompt_tokens: u64::from(req.prompt_tokens),
            decode_owner: req.decode_owner,
            artifact: req.artifact,
            workers: &plan_workers,
            links: &self.cfg.links,
            weights: self.cfg.weights,
            samples: req.samples.max(1),
            fork: req.fork,
            thresholds: self.cfg.thresholds,
            exhaustive,
        };
        plan(&input).map_err(|_| PolicyError::NoHealthyWorker)
    }
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

    fn observe_prefill(&mut self, worker: WorkerId, predicted_s: f64, observed_s: f64) {
        self.calibration
            .entry(worker)
            .or_default()
            .observe(predicted_s, observed_s);
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
    use crate::plan::ArtifactView;
    use crate::policy::EngineLoad;

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
    fn explaining_uses_what_calibration_learned() {
        let mut p = policy();
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
