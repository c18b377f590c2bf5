//! Routing policies. Every policy (OwnerServe's planner and each baseline) implements
//! [`Policy`], so the live router and the trace simulator share one implementation.
//! Policies are pure: no IO, no clock; state they keep (a cursor, an RNG) is their own.

mod colocated;
mod conditional_pd;
mod cost_choice;
mod dynamo_disagg;
mod dynamo_kv;
mod kv_aware;
mod least_loaded;
mod llm_d;
mod ownerserve;
mod prefill_workers_decode;
mod rng;
mod round_robin;
mod session_affinity;
mod smg_cache_aware;
mod static_pd;

pub use colocated::Colocated;
pub use conditional_pd::{ConditionalPd, ConditionalPdConfig};
pub use dynamo_disagg::{DynamoDisagg, DynamoDisaggConfig};
pub use dynamo_kv::{DynamoKv, DynamoKvConfig};
pub use kv_aware::{BusyThresholds, KvAware, KvAwareConfig};
pub use least_loaded::LeastLoaded;
pub use llm_d::{LlmD, LlmDConfig};
pub use ownerserve::{OwnerServe, OwnerServeConfig};
pub use prefill_workers_decode::{
    smallest_decoder_pool, PrefillWorkersDecode, PrefillWorkersDecodeError,
};
pub use rng::SplitMix64;
pub use round_robin::RoundRobin;
pub use session_affinity::SessionAffinity;
pub use smg_cache_aware::{SmgCacheAware, SmgCacheAwareConfig};
pub use static_pd::StaticPd;

use crate::ids::{Role, WorkerId};
use crate::kv_release::DecodeAges;
use crate::plan::{Action, ArtifactView, Plan};

/// Load an engine reports in its `/metrics` (vLLM or SGLang gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests being executed.
    pub running: f64,
    /// Requests queued.
    pub waiting: f64,
    /// KV-cache occupancy, 0..1.
    pub kv_usage: f64,
    /// KV tokens the worker can take without evicting a cached prefix: its capacity (as
    /// the engine reports it, or configured) minus the blocks the KV index says it holds.
    /// `None` while its capacity is unknown.
    pub kv_room_tokens: Option<u64>,
    /// KV tokens not held by running sequences (capacity × (1 − `kv_usage`)): what a new
    /// sequence can take, evicting cached prefixes if it must, before the engine preempts
    /// a running one. `None` while its capacity is unknown.
    pub kv_free_tokens: Option<u64>,
    /// KV tokens the engine's pool holds in all (configured or reported). `None` while
    /// unknown.
    pub kv_capacity_tokens: Option<u64>,
}

/// What the router knows about one worker when it routes a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerView {
    pub id: WorkerId,
    pub role: Role,
    pub healthy: bool,
    /// An operator is draining it: no new work, but its KV can still be read.
    pub draining: bool,
    /// Requests the router has sent there that have not finished.
    pub in_flight: u32,
    /// KV blocks of the requests in flight there (the router's own prediction).
    pub active_blocks: u64,
    /// Prompt tokens sent there whose prefill has not finished (no first byte yet), less
    /// what each held when it was sent: the KV they will allocate there (Dynamo's count).
    pub active_prefill_tokens: u64,
    /// Of those, the tokens the worker will compute itself (`PrefillCharge::of`):
    /// what a move, a fetch or a remote prefill's leg brings it is KV to hold, not a
    /// prefill to queue behind. Only the cost planner reads it (its compute queue).
    pub active_compute_tokens: u64,
    /// Steps dispatched here that reach its queue only once KV arrives: remote prefills'
    /// decode legs (their prefill legs run elsewhere) and moves whose copy is under way
    /// (and, in the simulator, fetches: the router sends a fetch to the engine at once, so
    /// the engine's own queue holds it). A prefill planned here now would run ahead of
    /// them. Only the cost planner reads it.
    pub legs_heading: u32,
    /// Leading blocks of this request's prompt the worker holds in GPU memory.
    pub cached_blocks: u32,
    /// Blocks right after those the worker holds in its host-DRAM KV tier (restorable, not
    /// HBM): only the cost planner prices them; the peers' routers count HBM only.
    pub host_cached_blocks: u32,
    /// Its engine can pull a sealed prefix from a peer worker and serve one to a peer (the
    /// simulated engine's `/kv/fetch`). vLLM's NIXL connector and SGLang move KV only from
    /// a prefill leg to its decode leg, so a fetch or migration there recomputes instead.
    pub pulls_kv: bool,
    /// Its engine serves whole requests even in the prefill role (vLLM's NIXL instances,
    /// the simulated engine; not SGLang's `--disaggregation-mode prefill` servers), so the
    /// cost planner may decode there when its config allows it
    /// (`OwnerServeConfig::prefill_workers_decode`). The peers' routers keep their sources'
    /// roles and never read it.
    pub prefill_decodes: bool,
    /// Its engine takes a remote prefill's decode leg when the prefill leg is sent, and
    /// the leg keeps its place in its queue from then on (SGLang); else the leg reaches it
    /// only after the prefill and joins the back of its queue then
    /// (`EngineProtocol::decode_leg_at_dispatch` in the shim). Only the cost planner reads it.
    pub decode_leg_at_dispatch: bool,
    /// The engine's last scraped load, if any.
    pub load: Option<EngineLoad>,
    /// KV held by the requests the router sent there that are decoding (first token
    /// seen), by how long they have decoded: how soon that KV is released
    /// (`kv_release`). Only the cost planner reads it.
    pub decode_ages: DecodeAges,
    /// Steps per second the sessions parked there (it decoded their last step, they are
    /// between steps and their idle lease has not lapsed) are expected to send: the sum
    /// of 1 / each one's predicted gap. They come back to their owner, so a prefill there
    /// delays those that return while it runs. Only the cost planner reads it.
    pub parked_returns_per_s: f64,
}

impl WorkerView {
    /// A view with no load and no cached blocks.
    pub fn idle(id: WorkerId, role: Role) -> Self {
        Self {
            id,
            role,
            healthy: true,
            draining: false,
            in_flight: 0,
            active_blocks: 0,
            active_prefill_tokens: 0,
            active_compute_tokens: 0,
            legs_heading: 0,
            cached_blocks: 0,
            host_cached_blocks: 0,
            pulls_kv: true,
            prefill_decodes: false,
            decode_leg_at_dispatch: false,
            load: None,
            decode_ages: DecodeAges::default(),
            parked_returns_per_s: 0.0,
        }
    }

    /// Whether new work may go there.
    pub fn takes_work(&self) -> bool {
        self.healthy && !self.draining
    }

    /// Whether a prefill of `prompt_tokens` sent there now starts at once and alone:
    /// nothing the router sent is still prefilling, the engine has nothing waiting, its
    /// free KV (when known) holds the prompt, and on a prefill worker nothing runs (its
    /// running sequences are other prefills, whose chunks would share every step). Only
    /// such a prefill's time measures the worker's prefill rate; one that waited or shared
    /// measures the others too (`Policy::observe_prefill`).
    pub fn starts_prefill_now(&self, prompt_tokens: u64) -> bool {
        self.active_prefill_tokens == 0
            && self.load.is_none_or(|l| {
                l.waiting <= 0.0
                    && (self.role != Role::Prefill || l.running <= 0.0)
                    && l.kv_free_tokens.is_none_or(|f| f >= prompt_tokens)
            })
    }

    /// Sequences running there: the engine's gauge once scraped, else the router's count.
    pub fn decoding(&self) -> u64 {
        self.load
            .map_or(u64::from(self.in_flight), |l| l.running.max(0.0) as u64)
    }
}

/// What a policy knows about the request being routed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteRequest<'a> {
    /// The `model` the client asked for; candidates already serve it.
    pub model: &'a str,
    /// Prompt length in tokens (0 when the router did not tokenize).
    pub prompt_tokens: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// The session the request belongs to, if the client named one.
    pub session: Option<&'a str>,
    /// Router time in milliseconds (policies never read a clock).
    pub now_ms: u64,
    /// The session's decode owner in the directory, if it has one.
    pub decode_owner: Option<WorkerId>,
    /// The prompt's longest sealed artifact in the directory, and its owner.
    pub artifact: Option<ArtifactView>,
    /// Choices requested (`n`; 0 is read as 1).
    pub samples: u32,
    /// The client marked the request as a fork of its session.
    pub fork: bool,
}

impl RouteRequest<'_> {
    /// Blocks the prompt occupies.
    pub fn prompt_blocks(&self) -> u64 {
        u64::from(self.prompt_tokens).div_ceil(u64::from(self.block_size.max(1)))
    }
}

/// How a decision is carried out across workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// The whole request runs on the decision's worker.
    Single,
    /// `prefill` runs the prefill and the decision's worker pulls the KV, then decodes.
    Disaggregated { prefill: WorkerId },
    /// The decision's worker pulls the first `tokens` prompt tokens' sealed KV from
    /// `source`, prefills the rest and decodes.
    Fetch { source: WorkerId, tokens: u64 },
    /// The session moves from `source` to the decision's worker: its KV is copied there
    /// first, the directory flips the owner, then the request runs there.
    Migrate { source: WorkerId, tokens: u64 },
}

/// Where a request goes, and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The worker that decodes (and streams the response).
    pub worker: WorkerId,
    pub dispatch: Dispatch,
    /// The cost planner's full plan, for policies that plan.
    pub plan: Option<Box<Plan>>,
}

impl Decision {
    /// The whole request on `worker`.
    pub fn single(worker: WorkerId) -> Self {
        Self {
            worker,
            dispatch: Dispatch::Single,
            plan: None,
        }
    }

    /// The planner action this decision amounts to (baselines included), for metrics.
    pub fn action(&self) -> Action {
        match (&self.plan, self.dispatch) {
            (Some(p), _) => p.chosen.action,
            (None, Dispatch::Single) => Action::Colocate,
            (None, Dispatch::Disaggregated { .. }) => Action::RemotePrefill,
            (None, Dispatch::Fetch { .. }) => Action::ArtifactFetch,
            (None, Dispatch::Migrate { .. }) => Action::Migrate,
        }
    }
}

/// Prompt tokens a shell (the router, the simulator) counts against a worker while a
/// request's prefill is pending there: `WorkerView::active_prefill_tokens` and
/// `WorkerView::active_compute_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefillCharge {
    /// KV the prompt will allocate there: what the worker did not hold when it was sent.
    pub tokens: u64,
    /// Of it, tokens the worker computes itself.
    pub computed: u64,
}

impl PrefillCharge {
    /// `tokens` the worker computes all of (a leg or request no plan says more about).
    pub fn computed(tokens: u64) -> Self {
        Self {
            tokens,
            computed: tokens,
        }
    }

    /// What `decision`'s worker is charged for a `prompt` of which it holds the first
    /// `cached` tokens: it computes none for a remote prefill's decode leg (its KV comes
    /// from the prefill worker), only what a fetch or move does not bring, else all it
    /// lacks; everything it receives still takes its KV.
    pub fn of(decision: &Decision, prompt: u64, cached: u64) -> Self {
        let tokens = prompt.saturating_sub(cached);
        let brought = match decision.dispatch {
            Dispatch::Single => 0,
            Dispatch::Disaggregated { .. } => prompt,
            Dispatch::Fetch { tokens, .. } | Dispatch::Migrate { tokens, .. } => tokens,
        };
        Self {
            tokens,
            computed: prompt.saturating_sub(cached.max(brought)),
        }
    }

    /// What a remote prefill's leg of `prompt` tokens charges its prefill worker: the
    /// whole prompt's KV, of which it computes what the plan found it lacks (all of it
    /// when no plan says).
    pub fn prefill_leg(decision: &Decision, prompt: u64) -> Self {
        Self {
            tokens: prompt,
            computed: decision
                .plan
                .as_ref()
                .map_or(prompt, |p| prompt.saturating_sub(p.chosen.reused_tokens)),
        }
    }
}

/// Why a policy could not place a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("no healthy worker can serve this request")]
    NoHealthyWorker,
    /// Every candidate is past a busy threshold: the client should retry later.
    #[error("every worker is busy")]
    AllBusy,
}

/// A routing policy.
pub trait Policy: Send {
    /// The name `--policy` selects it by.
    fn name(&self) -> &'static str;

    /// Picks a worker among `workers` (the candidates serving the request's model).
    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError>;

    /// Whether the policy needs the prompt tokenized and matched against the KV index.
    fn needs_prefix_match(&self) -> bool {
        false
    }

    /// Whether the policy reads the directory (session owner, owned prefixes).
    fn needs_directory(&self) -> bool {
        false
    }

    /// Whether the policy reads how long the requests decoding on each worker have
    /// decoded (`WorkerView::decode_ages`); the shells count them only then.
    fn needs_decode_ages(&self) -> bool {
        false
    }

    /// Feeds back an observed prefill: `predicted_s` was the roofline preset's compute
    /// time on `worker` (`Candidate::preset_compute_s`), `observed_s` what it took. Only a
    /// prefill that started at once (`WorkerView::starts_prefill_now`) is fed back.
    /// Policies that calibrate keep an EWMA.
    fn observe_prefill(&mut self, _worker: WorkerId, _predicted_s: f64, _observed_s: f64) {}

    /// Feeds back a finished request: its sequences decoded on `worker` for `decode_s`
    /// seconds (first to last token), holding their KV. Policies that model the wait for
    /// KV (`plan::admission`) keep an EWMA per worker and the lifetimes' distribution
    /// (`kv_release`).
    fn observe_decode(&mut self, _worker: WorkerId, _decode_s: f64) {}

    /// The cost plan this policy would make for `req`, every candidate listed, without
    /// deciding anything (the explain API); `None` for policies without a cost planner.
    fn explain(
        &self,
        _req: &RouteRequest<'_>,
        _workers: &[WorkerView],
    ) -> Option<Result<crate::plan::Plan, PolicyError>> {
        None
    }
}

/// Names accepted by [`by_name`].
pub const POLICY_NAMES: &[&str] = &[
    "ownerserve",
    "round_robin",
    "least_loaded",
    "kv_aware",
    "session_affinity",
    "static_pd",
    "colocated",
    "conditional_pd",
    "dynamo_kv",
    "dynamo_disagg",
    "llm_d",
    "smg_cache_aware",
];

/// Policies the router still accepts but the evaluation no longer compares against:
/// - `colocated` and `conditional_pd` prefer the worker caching the longest prefix before
///   load, so on workloads whose sessions share a system prompt every session piles onto
///   one worker (a straw man); `dynamo_kv` and `dynamo_disagg` are the load-aware rules
///   they approximated.
/// - `kv_aware` is Dynamo's cost as first written; `dynamo_kv` is the same cost with the
///   current flags (overlap credit, prefill-load scale) and makes the same choices at the
///   defaults.
pub const RETIRED_FROM_EVALUATION: &[&str] = &["colocated", "conditional_pd", "kv_aware"];

/// A policy that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownPolicy {
    #[error("unknown policy `{0}` (available: ownerserve, round_robin, least_loaded, kv_aware, session_affinity, static_pd, colocated, conditional_pd, dynamo_kv, dynamo_disagg, llm_d, smg_cache_aware)")]
    Name(String),
    #[error("policy `ownerserve` needs the planner's model and GPU settings")]
    NoPlanner,
}

/// Settings of the configurable policies.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySettings {
    pub kv_aware: KvAwareConfig,
    pub conditional_pd: ConditionalPdConfig,
    pub dynamo_kv: DynamoKvConfig,
    pub dynamo_disagg: DynamoDisaggConfig,
    pub llm_d: LlmDConfig,
    pub smg_cache_aware: SmgCacheAwareConfig,
    /// The cost planner's figures; `ownerserve` cannot run without them.
    pub ownerserve: Option<OwnerServeConfig>,
    /// How long a session sticks to its worker after its last request.
    pub session_ttl_ms: u64,
    /// Seed of policies that sample.
    pub seed: u64,
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self {
            kv_aware: KvAwareConfig::default(),
            conditional_pd: ConditionalPdConfig::default(),
            dynamo_kv: DynamoKvConfig::default(),
            dynamo_disagg: DynamoDisaggConfig::default(),
            llm_d: LlmDConfig::default(),
            smg_cache_aware: SmgCacheAwareConfig::default(),
            ownerserve: None,
            session_ttl_ms: 30 * 60 * 1000,
            seed: 0x05EE_D0F0_0D5E_ED00,
        }
    }
}

/// Builds a policy from its name.
pub fn by_name(name: &str, s: &PolicySettings) -> Result<Box<dyn Policy>, UnknownPolicy> {
    match name {
        "ownerserve" => match &s.ownerserve {
            Some(c) => Ok(Box::new(OwnerServe::new(c.clone()))),
            None => Err(UnknownPolicy::NoPlanner),
        },
        "round_robin" => Ok(Box::new(RoundRobin::default())),
        "least_loaded" => Ok(Box::new(LeastLoaded::default())),
        "kv_aware" => Ok(Box::new(KvAware::new(s.kv_aware, s.seed))),
        "session_affinity" => Ok(Box::new(SessionAffinity::new(s.session_ttl_ms))),
        "static_pd" => Ok(Box::new(StaticPd::default())),
        "colocated" => Ok(Box::new(Colocated::default())),
        "conditional_pd" => Ok(Box::new(ConditionalPd::new(s.conditional_pd))),
        "dynamo_kv" => Ok(Box::new(DynamoKv::new(s.dynamo_kv, s.seed))),
        "dynamo_disagg" => Ok(Box::new(DynamoDisagg::new(s.dynamo_disagg, s.seed))),
        "llm_d" => Ok(Box::new(LlmD::new(s.llm_d))),
        "smg_cache_aware" => Ok(Box::new(SmgCacheAware::new(s.smg_cache_aware))),
        _ => Err(UnknownPolicy::Name(name.to_owned())),
    }
}

/// Candidates a plain (non-disaggregated) request may go to: healthy decode or hybrid
/// workers, or, in a fleet that has none, any healthy worker (a prefill-only engine still
/// serves whole requests).
pub(crate) fn full_request_candidates(
    workers: &[WorkerView],
) -> impl Iterator<Item = &WorkerView> + '_ {
    let any_full = workers
        .iter()
        .any(|w| w.takes_work() && w.role.serves_full_requests());
    workers
        .iter()
        .filter(move |w| w.takes_work() && (!any_full || w.role.serves_full_requests()))
}

/// The prefill workers of `workers` that take work, but `decoder` (the worker already
/// chosen to decode: a prefill leg elsewhere only).
pub(crate) fn prefill_candidates(
    workers: &[WorkerView],
    decoder: WorkerId,
) -> impl Iterator<Item = &WorkerView> + '_ {
    workers
        .iter()
        .filter(move |w| w.takes_work() && w.role == Role::Prefill && w.id != decoder)
}

/// The least loaded of `workers` by (prefill tokens queued, requests in flight); the first
/// on ties, so callers that rotate pass a rotated slice.
pub(crate) fn least_busy<'a>(
    workers: impl Iterator<Item = &'a WorkerView>,
) -> Option<&'a WorkerView> {
    workers.min_by_key(|w| (w.active_prefill_tokens, w.in_flight))
}

/// The session's decode owner, if it is among `workers` and takes work.
pub(crate) fn live_owner<'a>(
    req: &RouteRequest<'_>,
    workers: &'a [WorkerView],
) -> Option<&'a WorkerView> {
    let owner = req.decode_owner?;
    workers
        .iter()
        .find(|w| w.id == owner && w.takes_work() && w.role.serves_full_requests())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_starts_at_once_only_with_nothing_ahead_and_room_for_it() {
        let idle = WorkerView::idle(WorkerId(0), Role::Prefill);
        assert!(idle.starts_prefill_now(10_000));
        let with = |load: EngineLoad| WorkerView {
            load: Some(load),
            ..idle
        };
        let roomy = EngineLoad {
            kv_free_tokens: Some(20_000),
            ..EngineLoad::default()
        };
        assert!(with(roomy).starts_prefill_now(10_000));
        // The router's own legs still prefilling there, the engine's queue, or too
        // little free KV: the prefill would wait first.
        let sent = WorkerView {
            active_prefill_tokens: 1,
            ..with(roomy)
        };
        assert!(!sent.starts_prefill_now(10_000));
        let queued = EngineLoad {
            waiting: 1.0,
            ..roomy
        };
        assert!(!with(queued).starts_prefill_now(10_000));
        assert!(!with(roomy).starts_prefill_now(30_000));
        // Running sequences on a prefill worker are other prefills; on a worker that
        // decodes, they are the batch every prefill there shares.
        let running = EngineLoad {
            running: 3.0,
            kv_free_tokens: Some(20_000),
            ..EngineLoad::default()
        };
        assert!(!with(running).starts_prefill_now(10_000));
        let hybrid = WorkerView {
            role: Role::Hybrid,
            ..with(running)
        };
        assert!(hybrid.starts_prefill_now(10_000));
    }

    #[test]
    fn a_worker_is_charged_the_kv_it_lacks_and_computes_only_what_nothing_brings() {
        let to = |dispatch| Decision {
            worker: WorkerId(1),
            dispatch,
            plan: None,
        };
        let source = WorkerId(0);
        let charge = |tokens, computed| PrefillCharge { tokens, computed };
        // A 10K prompt of which the worker holds 2K: it takes the 8K of KV it lacks, and
        // computes what nothing brings (a move bringing less than it holds, all it lacks).
        for (dispatch, computed) in [
            (Dispatch::Single, 8_000),
            (
                Dispatch::Migrate {
                    source,
                    tokens: 9_000,
                },
                1_000,
            ),
            (
                Dispatch::Fetch {
                    source,
                    tokens: 6_000,
                },
                4_000,
            ),
            (
                Dispatch::Migrate {
                    source,
                    tokens: 1_000,
                },
                8_000,
            ),
        ] {
            let got = PrefillCharge::of(&to(dispatch), 10_000, 2_000);
            assert_eq!(got, charge(8_000, computed), "{dispatch:?}");
        }
        let decode_leg = to(Dispatch::Disaggregated { prefill: source });
        assert_eq!(
            PrefillCharge::of(&decode_leg, 10_000, 2_000),
            charge(8_000, 0)
        );
        // Without a plan, the prefill worker computes its whole leg.
        assert_eq!(
            PrefillCharge::prefill_leg(&decode_leg, 10_000),
            charge(10_000, 10_000)
        );
        assert_eq!(PrefillCharge::computed(5), charge(5, 5));
    }

    #[test]
    fn every_listed_name_builds_and_reports_its_name() {
        let s = PolicySettings {
            ownerserve: Some(OwnerServeConfig::from_presets("llama-3.1-8b", "h100", 1).unwrap()),
            ..PolicySettings::default()
        };
        for name in POLICY_NAMES {
            assert_eq!(by_name(name, &s).unwrap().name(), *name);
        }
        assert_eq!(
            by_name("nope", &s).err(),
            Some(UnknownPolicy::Name("nope".to_owned()))
        );
        assert_eq!(
            by_name("ownerserve", &PolicySettings::default()).err(),
            Some(UnknownPolicy::NoPlanner)
        );
    }
}
