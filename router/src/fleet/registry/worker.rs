//! One worker: what it is (its spec, the models it serves, its KV capacity) and the
//! policy's view of it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::{EngineLoad, WorkerView};
use ownerserve_planner::step::{self, Decodes, Ledger, WorkerFacts};
use ownerserve_shim::engines::protocol;

use super::ledger::DECODE_AGES_FOR;
use crate::config::WorkerSpec;

/// One worker and its live state.
#[derive(Debug)]
pub struct Worker {
    pub id: WorkerId,
    pub spec: WorkerSpec,
    pub(super) healthy: AtomicBool,
    /// An operator drains it: no new work, its sessions move off on their next step.
    pub(super) draining: AtomicBool,
    pub(super) consecutive_failures: AtomicU32,
    /// When the worker last answered a proxied request or sent a frame of one, in ms
    /// since `clock` (0: never). Passive health: a worker that is serving is up, whatever
    /// a slow probe says.
    pub(super) last_progress_ms: AtomicU64,
    /// When the worker last became healthy, in ms since `clock`: its warm-up starts there.
    pub(super) up_since_ms: AtomicU64,
    /// A worker of the router's starting fleet is warm when it first comes up (the router
    /// is new, not the worker); one added later, or back after being down, warms up.
    pub(super) warm_at_first_up: AtomicBool,
    /// The origin of `last_progress_ms` and of the decodes' times, shared by every worker
    /// of the registry.
    pub(super) clock: Instant,
    /// The requests this router has in flight there (the planner's canonical ledger).
    pub(super) ledger: Ledger,
    models: RwLock<Arc<[ServedModel]>>,
    load: Mutex<Option<EngineLoad>>,
    /// KV capacity in tokens, as the engine reports it in its metrics (0: not reported).
    reported_kv_tokens: AtomicU64,
    /// The streams decoding there: how long they have decoded tells the planner how soon
    /// their KV is released (`WorkerView::decode_ages`).
    pub(super) decodes: Mutex<Decodes>,
    /// Fires when the worker is retired (its pod went away): its probe, scrape and event
    /// tasks end.
    pub(super) retired: CancellationToken,
    /// Share of its recent checked route receipts whose engine report diverged from the
    /// promise (missed or surplus), in thousandths, an average over about the last eight.
    receipt_divergence: AtomicU32,
    /// Its answered steps by receipt outcome ([`RECEIPT_OUTCOMES`]), then the cached tokens
    /// promised and reported on the checked ones (read into metrics at scrape time).
    receipts: [AtomicU64; RECEIPT_OUTCOMES.len() + 2],
}

/// What an engine's reported cached tokens said of a route receipt's promise
/// (`proxy::receipt::Outcome`, in this order).
pub const RECEIPT_OUTCOMES: [&str; 5] = ["kept", "missed", "surplus", "unreported", "unchecked"];

/// A model a worker serves, as its `/v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ServedModel {
    /// The name clients put in `"model"`.
    pub id: String,
    /// The engine's context limit for it (vLLM and SGLang list it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
    /// The base model of a LoRA adapter (vLLM lists adapters with their `parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl From<&str> for ServedModel {
    fn from(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            max_model_len: None,
            parent: None,
        }
    }
}

impl Worker {
    pub(super) fn new(id: WorkerId, spec: WorkerSpec, clock: Instant, starting: bool) -> Self {
        Self {
            id,
            spec,
            healthy: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            consecutive_failures: AtomicU32::new(0),
            last_progress_ms: AtomicU64::new(0),
            up_since_ms: AtomicU64::new(0),
            warm_at_first_up: AtomicBool::new(starting),
            clock,
            ledger: Ledger::default(),
            models: RwLock::new(Arc::from(Vec::new())),
            load: Mutex::new(None),
            reported_kv_tokens: AtomicU64::new(0),
            decodes: Mutex::new(Decodes::new(DECODE_AGES_FOR.as_secs_f64())),
            retired: CancellationToken::new(),
            receipt_divergence: AtomicU32::new(0),
            receipts: Default::default(),
        }
    }

    /// Counts an answered step's route receipt: its outcome (an index into
    /// [`RECEIPT_OUTCOMES`]) and, when its promise was checked, the tokens promised and
    /// reported (a check that diverged, missed or surplus, counts toward `degraded`).
    pub fn record_receipt(&self, outcome: usize, checked: Option<(u64, u64)>) {
        if let Some(c) = self.receipts.get(outcome) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let Some((promised, reported)) = checked else {
            return;
        };
        let n = RECEIPT_OUTCOMES.len();
        self.receipts[n].fetch_add(promised, Ordering::Relaxed);
        self.receipts[n + 1].fetch_add(reported, Ordering::Relaxed);
        let diverged = matches!(RECEIPT_OUTCOMES.get(outcome), Some(&"missed" | &"surplus"));
        let _ = self
            .receipt_divergence
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                Some(d - d / 8 + if diverged { 1000 / 8 } else { 0 })
            });
    }

    /// Its receipts so far: steps by outcome ([`RECEIPT_OUTCOMES`] order), then the
    /// promised and the reported cached tokens.
    pub fn receipts(&self) -> [u64; RECEIPT_OUTCOMES.len() + 2] {
        std::array::from_fn(|i| self.receipts[i].load(Ordering::Relaxed))
    }

    /// Whether its recent route receipts say the router's index and the engine disagree
    /// (over a fifth of them diverged).
    pub fn receipts_diverge(&self) -> bool {
        self.receipt_divergence.load(Ordering::Relaxed) > 200
    }

    /// Whether the worker went away for good (its pod was deleted).
    pub fn is_retired(&self) -> bool {
        self.retired.is_cancelled()
    }

    /// Fires when the worker is retired.
    pub fn retired(&self) -> &CancellationToken {
        &self.retired
    }

    /// Models the worker reported in `/v1/models`.
    pub fn models(&self) -> Arc<[ServedModel]> {
        self.models
            .read()
            .map_or_else(|e| e.into_inner().clone(), |m| m.clone())
    }

    /// Records the models the worker serves (its health check read them).
    pub(super) fn set_models(&self, models: Vec<ServedModel>) {
        let mut guard = self.models.write().unwrap_or_else(|e| e.into_inner());
        *guard = models.into();
    }

    pub(super) fn serves(&self, model: &str) -> bool {
        self.models().iter().any(|m| m.id == model)
    }

    /// The KV capacity (tokens) the planner and the busy threshold use: the configured
    /// `kv_capacity_tokens`, else what the engine reports, else unknown.
    pub fn kv_capacity_tokens(&self) -> Option<u64> {
        self.spec
            .kv_capacity_tokens
            .or_else(|| self.reported_kv_tokens())
    }

    /// The KV capacity (tokens) the engine reported in its metrics, if any.
    pub fn reported_kv_tokens(&self) -> Option<u64> {
        match self.reported_kv_tokens.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// Records the KV capacity the engine reports (`None`: it reports none).
    pub fn set_reported_kv_tokens(&self, tokens: Option<u64>) {
        self.reported_kv_tokens
            .store(tokens.unwrap_or(0), Ordering::Relaxed);
    }

    /// The engine's last scraped load.
    pub fn load(&self) -> Option<EngineLoad> {
        *self.load.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a scraped load (`None`: the scrape failed).
    pub fn set_load(&self, load: Option<EngineLoad>) {
        *self.load.lock().unwrap_or_else(|e| e.into_inner()) = load;
    }

    /// The policy's view of it now, with no cached blocks, decode ages or parked returns
    /// (`step::complete_views` adds those a policy reads).
    pub fn view(&self) -> WorkerView {
        let engine = protocol(self.spec.engine);
        let facts = WorkerFacts {
            id: self.id,
            role: self.spec.role,
            healthy: self.is_healthy(),
            draining: self.is_draining(),
            pulls_kv: engine.pulls_kv(),
            prefill_decodes: engine.prefill_role_decodes(),
            decode_leg_at_dispatch: engine.decode_leg_at_dispatch(),
        };
        step::worker_view(facts, self.load(), &self.ledger)
    }
}
