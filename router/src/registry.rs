//! The router's view of its workers: identity, health, the models each serves and the
//! requests in flight there. Shared by handlers, the health checker and the admin API.
//!
//! Configured workers are numbered in configuration order; workers found at run time
//! (Kubernetes discovery) join with an id every replica derives alike from their pod, so
//! replicas sharing a directory name a worker the same. A worker that goes away is
//! retired: drained, down and out of the listings, its tasks stopped, its id not reused (a
//! pod that comes back has a new UID, so a new id). Past `MAX_RETIRED` retired workers the
//! oldest are dropped, so pods that come and go do not pile up in memory.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use ownerserve_planner::ids::{EngineKind, Role, WorkerId};
use ownerserve_planner::kv_release::DecodeAges;
use ownerserve_planner::policy::{EngineLoad, PrefillCharge, WorkerView};
use ownerserve_shim::engines::protocol;

use crate::config::WorkerSpec;

/// One worker and its live state.
#[derive(Debug)]
pub struct Worker {
    pub id: WorkerId,
    pub spec: WorkerSpec,
    healthy: AtomicBool,
    /// An operator drains it: no new work, its sessions move off on their next step.
    draining: AtomicBool,
    consecutive_failures: AtomicU32,
    in_flight: AtomicU32,
    /// When the worker last answered a proxied request or sent a frame of one, in ms
    /// since `clock` (0: never). Passive health: a worker that is serving is up, whatever
    /// a slow probe says.
    last_progress_ms: AtomicU64,
    /// The origin of `last_progress_ms`, shared by every worker of the registry.
    clock: Instant,
    active_blocks: AtomicU64,
    active_prefill_tokens: AtomicU64,
    /// Of those, the tokens it computes itself (`WorkerView::active_compute_tokens`).
    active_compute_tokens: AtomicU64,
    /// Steps decoding there whose prefill leg or move's copy still runs
    /// (`WorkerView::legs_heading`).
    legs_heading: AtomicU32,
    models: RwLock<Arc<[ServedModel]>>,
    load: Mutex<Option<EngineLoad>>,
    /// KV capacity in tokens, as the engine reports it in its metrics (0: not reported).
    reported_kv_tokens: AtomicU64,
    /// The streams decoding there: how long they have decoded tells the planner how soon
    /// their KV is released (`WorkerView::decode_ages`).
    decodes: Mutex<Decodes>,
    /// Fires when the worker is retired (its pod went away): its probe, scrape and event
    /// tasks end.
    retired: CancellationToken,
}

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
    fn new(id: WorkerId, spec: WorkerSpec, clock: Instant) -> Self {
        Self {
            id,
            spec,
            healthy: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            consecutive_failures: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            last_progress_ms: AtomicU64::new(0),
            clock,
            active_blocks: AtomicU64::new(0),
            active_prefill_tokens: AtomicU64::new(0),
            active_compute_tokens: AtomicU64::new(0),
            legs_heading: AtomicU32::new(0),
            models: RwLock::new(Arc::from(Vec::new())),
            load: Mutex::new(None),
            reported_kv_tokens: AtomicU64::new(0),
            decodes: Mutex::new(Decodes::default()),
            retired: CancellationToken::new(),
        }
    }

    /// Whether the worker went away for good (its pod was deleted).
    pub fn is_retired(&self) -> bool {
        self.retired.is_cancelled()
    }

    /// Fires when the worker is retired.
    pub fn retired(&self) -> &CancellationToken {
        &self.retired
    }

    /// Whether the last health checks passed.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether an operator is draining it.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts or ends a drain; returns the previous state.
    pub fn set_draining(&self, draining: bool) -> bool {
        let was = self.draining.swap(draining, Ordering::Relaxed);
        if was != draining {
            tracing::info!(worker = %self.spec.name, draining, "drain changed");
        }
        was
    }

    /// Requests this router has sent there that have not finished.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Models the worker reported in `/v1/models`.
    pub fn models(&self) -> Arc<[ServedModel]> {
        self.models
            .read()
            .map_or_else(|e| e.into_inner().clone(), |m| m.clone())
    }

    fn serves(&self, model: &str) -> bool {
        self.models().iter().any(|m| m.id == model)
    }

    /// Records a passed health check and the models the worker serves.
    pub fn mark_healthy(&self, models: Vec<ServedModel>) {
        let mut guard = self.models.write().unwrap_or_else(|e| e.into_inner());
        *guard = models.into();
        drop(guard);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if !self.healthy.swap(true, Ordering::Relaxed) {
            tracing::info!(worker = %self.spec.name, "worker is healthy");
        }
    }

    /// Records a failed check; after `threshold` in a row the worker is marked down. Until
    /// then it is suspect: still routed to, with the failures shown in the admin API.
    pub fn record_failure(&self, threshold: u32, why: &str) {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold {
            self.mark_down(why);
        } else if self.is_healthy() {
            tracing::info!(worker = %self.spec.name, failures = n, reason = why, "worker is suspect");
        }
    }

    /// Failed checks in a row (0 after any success).
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Passive health: the worker answered a proxied request or sent a frame of one. Its
    /// failed checks so far are forgiven (a worker that serves is up); it does not bring a
    /// worker that is down back up, which only its health probe does.
    pub fn record_progress(&self) {
        let now = u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        // 0 means "never": the first millisecond counts as the second.
        self.last_progress_ms.store(now.max(1), Ordering::Relaxed);
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the worker made progress on a proxied request within the last `window`.
    pub fn progressed_within(&self, window: Duration) -> bool {
        let last = self.last_progress_ms.load(Ordering::Relaxed);
        let now = self.clock.elapsed().as_millis();
        last != 0 && now.saturating_sub(u128::from(last)) <= window.as_millis()
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

    /// Marks the worker down at once (a refused connection needs no second opinion).
    pub fn mark_down(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(worker = %self.spec.name, reason = why, "worker is down");
        }
    }

    /// The engine's last scraped load.
    pub fn load(&self) -> Option<EngineLoad> {
        *self.load.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a scraped load (`None`: the scrape failed).
    pub fn set_load(&self, load: Option<EngineLoad>) {
        *self.load.lock().unwrap_or_else(|e| e.into_inner()) = load;
    }

    /// The policy's view of it now, with no cached blocks (the caller looks those up).
    pub fn view(&self) -> WorkerView {
        WorkerView {
            id: self.id,
            role: self.spec.role,
            healthy: self.is_healthy(),
            draining: self.is_draining(),
            in_flight: self.in_flight(),
            active_blocks: self.active_blocks(),
            active_prefill_tokens: self.active_prefill_tokens.load(Ordering::Relaxed),
            active_compute_tokens: self.active_compute_tokens.load(Ordering::Relaxed),
            legs_heading: self.legs_heading.load(Ordering::Relaxed),
            cached_blocks: 0,
            host_cached_blocks: 0,
            pulls_kv: protocol(self.spec.engine).pulls_kv(),
            prefill_decodes: protocol(self.spec.engine).prefill_role_decodes(),
            decode_leg_at_dispatch: protocol(self.spec.engine).decode_leg_at_dispatch(),
            load: self.load(),
            // Counted only for a policy that reads them (`Registry::candidates`).
            decode_ages: DecodeAges::default(),
            parked_returns_per_s: 0.0,
        }
    }

    /// KV held by the streams decoding there, by how long they have decoded, in the
    /// planner's time (`time_scale` times the wall clock's).
    pub fn decode_ages(&self, time_scale: f64) -> DecodeAges {
        self.decodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ages(Instant::now(), time_scale)
    }

    /// KV blocks of requests in flight there (the router's prediction).
    pub fn active_blocks(&self) -> u64 {
        self.active_blocks.load(Ordering::Relaxed)
    }

    /// Counts a prefill pending here (`WorkerView::active_prefill_tokens` and
    /// `active_compute_tokens`).
    fn charge(&self, c: PrefillCharge) {
        self.active_prefill_tokens
            .fetch_add(c.tokens, Ordering::Relaxed);
        self.active_compute_tokens
            .fetch_add(c.computed, Ordering::Relaxed);
    }

    /// Stops counting a prefill [`Worker::charge`] counted.
    fn discharge(&self, c: PrefillCharge) {
        self.active_prefill_tokens
            .fetch_sub(c.tokens, Ordering::Relaxed);
        self.active_compute_tokens
            .fetch_sub(c.computed, Ordering::Relaxed);
    }

    /// Counts a request of `prompt_tokens` as in flight, holding `blocks` of KV and
    /// `prefill` still to prefill, until the guard drops.
    pub fn start_request(
        self: &Arc<Self>,
        blocks: u64,
        prefill: PrefillCharge,
        prompt_tokens: u64,
    ) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.active_blocks.fetch_add(blocks, Ordering::Relaxed);
        self.charge(prefill);
        InFlight {
            worker: self.clone(),
            blocks,
            prefill,
            heading: false,
            prompt_tokens,
            decode: None,
        }
    }
}

/// How long a worker's decode ages, counted once, serve the views that follow: the bins
/// are a quarter second wide at the finest, and recounting every stream for every
/// candidate of every request would cost a walk over thousands of streams per request.
const DECODE_AGES_FOR: Duration = Duration::from_millis(50);

/// The streams decoding on a worker (first frame relayed, not ended): since when, and the
/// prompt tokens whose KV each holds (what the router knows of it; the tokens decoded
/// since are few beside an agent's prompt). Ended slots are reused.
#[derive(Debug, Default)]
struct Decodes {
    slots: Vec<Option<(Instant, u64)>>,
    free: Vec<usize>,
    /// The ages as last counted: when, in which time scale; streams that started or
    /// ended since are added or taken out as of that moment.
    counted: Option<(Instant, f64, DecodeAges)>,
}

impl Decodes {
    /// The ages at `now` in the planner's time (`time_scale`), counted anew at most every
    /// `DECODE_AGES_FOR`.
    fn ages(&mut self, now: Instant, time_scale: f64) -> DecodeAges {
        if let Some((at, scale, ages)) = self.counted {
            if scale == time_scale && now.saturating_duration_since(at) < DECODE_AGES_FOR {
                return ages;
            }
        }
        let mut ages = DecodeAges::default();
        for (since, tokens) in self.slots.iter().flatten() {
            ages.add(
                now.saturating_duration_since(*since).as_secs_f64() * time_scale,
                *tokens,
            );
        }
        self.counted = Some((now, time_scale, ages));
        ages
    }

    /// A decode's age in the last count's time scale, as of that count.
    fn counted_age(at: Instant, scale: f64, since: Instant) -> f64 {
        at.saturating_duration_since(since).as_secs_f64() * scale
    }

    fn start(&mut self, since: Instant, tokens: u64) -> usize {
        if let Some((at, scale, ages)) = &mut self.counted {
            ages.add(Self::counted_age(*at, *scale, since), tokens);
        }
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some((since, tokens));
                slot
            }
            None => {
                self.slots.push(Some((since, tokens)));
                self.slots.len() - 1
            }
        }
    }

    fn end(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            if let Some((since, tokens)) = s.take() {
                if let Some((at, scale, ages)) = &mut self.counted {
                    ages.remove(Self::counted_age(*at, *scale, since), tokens);
                }
                self.free.push(slot);
            }
        }
    }
}

/// A request in flight at a worker; undoes its accounting when dropped (response done,
/// client gone or worker failed).
#[derive(Debug)]
pub struct InFlight {
    worker: Arc<Worker>,
    blocks: u64,
    prefill: PrefillCharge,
    /// Counted in its worker's `legs_heading`.
    heading: bool,
    prompt_tokens: u64,
    /// Its slot among the worker's decodes, once its stream decodes.
    decode: Option<usize>,
}

impl InFlight {
    /// The first byte came back: the prefill is over (Dynamo's `mark_prefill_completed`).
    pub fn prefill_done(&mut self) {
        self.worker.discharge(std::mem::take(&mut self.prefill));
    }

    /// Its prefill runs on another worker, or its KV is being copied here: it reaches
    /// this worker's queue once that leg is done ([`InFlight::leg_arrived`]).
    pub fn leg_heading(&mut self) {
        if !self.heading {
            self.heading = true;
            self.worker.legs_heading.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The prefill leg or copy is over (or there was none): the request is this worker's
    /// now.
    pub fn leg_arrived(&mut self) {
        if std::mem::take(&mut self.heading) {
            self.worker.legs_heading.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Counts `prefill` instead of what the request was started with, before it is sent
    /// (a fetch or move that fell back computes what it was to receive).
    pub fn recharge(&mut self, prefill: PrefillCharge) {
        // Added before the old is taken away, so the counts never dip below zero.
        self.worker.charge(prefill);
        self.worker
            .discharge(std::mem::replace(&mut self.prefill, prefill));
    }

    /// Its stream's first frame came: it decodes from now on, holding its prompt's KV.
    pub fn decoding(&mut self) {
        if self.decode.is_none() {
            let mut decodes = self
                .worker
                .decodes
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.decode = Some(decodes.start(Instant::now(), self.prompt_tokens));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.prefill_done();
        self.leg_arrived();
        let w = &self.worker;
        if let Some(slot) = self.decode.take() {
            w.decodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .end(slot);
        }
        w.in_flight.fetch_sub(1, Ordering::Relaxed);
        w.active_blocks.fetch_sub(self.blocks, Ordering::Relaxed);
    }
}

/// Whether a model can be served right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelAvailability {
    /// At least one healthy worker serves it.
    Available,
    /// Known to some worker that is down, or possibly served by a worker that has never
    /// answered: retry later.
    Unavailable,
    /// Every worker has reported its models and none serves it.
    Unknown,
}

/// All workers: the configured ones in configuration order (`WorkerId` is the index),
/// then those found at run time.
#[derive(Debug)]
pub struct Registry {
    fleet: RwLock<Arc<Fleet>>,
    clock: Instant,
}

/// One snapshot of the workers: in the order they joined, and by id.
#[derive(Debug, Default)]
pub struct Fleet {
    workers: Vec<Arc<Worker>>,
    by_id: std::collections::HashMap<WorkerId, usize>,
}

impl std::ops::Deref for Fleet {
    type Target = [Arc<Worker>];
    fn deref(&self) -> &[Arc<Worker>] {
        &self.workers
    }
}

impl<'a> IntoIterator for &'a Fleet {
    type Item = &'a Arc<Worker>;
    type IntoIter = std::slice::Iter<'a, Arc<Worker>>;
    fn into_iter(self) -> Self::IntoIter {
        self.workers.iter()
    }
}

/// Retired workers kept (listed nowhere, found by id) before the oldest are dropped.
pub const MAX_RETIRED: usize = 256;

/// Why a worker could not join.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinError {
    #[error("worker id {0:?} is taken (by `{1}`)")]
    IdTaken(WorkerId, String),
}

impl Registry {
    /// Workers from their specs, all unhealthy until their first health check.
    pub fn new(specs: Vec<WorkerSpec>) -> Self {
        let clock = Instant::now();
        let mut fleet = Fleet::default();
        for (i, spec) in specs.into_iter().enumerate() {
            let id = WorkerId(i as u32);
            fleet.by_id.insert(id, fleet.workers.len());
            fleet.workers.push(Arc::new(Worker::new(id, spec, clock)));
        }
        Self {
            fleet: RwLock::new(Arc::new(fleet)),
            clock,
        }
    }

    /// Every worker (a snapshot: workers that join later are not in it), retired ones
    /// included.
    pub fn all(&self) -> Arc<Fleet> {
        self.fleet
            .read()
            .map_or_else(|e| e.into_inner().clone(), |f| f.clone())
    }

    /// A worker by id.
    pub fn get(&self, id: WorkerId) -> Option<Arc<Worker>> {
        let fleet = self.all();
        fleet.by_id.get(&id).map(|&i| fleet.workers[i].clone())
    }

    /// Adds a worker found at run time under `id` (unhealthy until its first check).
    pub fn join(&self, id: WorkerId, spec: WorkerSpec) -> Result<Arc<Worker>, JoinError> {
        let mut guard = self.fleet.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = guard.by_id.get(&id) {
            return Err(JoinError::IdTaken(id, guard.workers[i].spec.name.clone()));
        }
        let worker = Arc::new(Worker::new(id, spec, self.clock));
        let mut workers = guard.workers.clone();
        let mut by_id = guard.by_id.clone();
        by_id.insert(id, workers.len());
        workers.push(worker.clone());
        *guard = Arc::new(Fleet { workers, by_id });
        tracing::info!(worker = %worker.spec.name, url = %worker.spec.base_url, "worker joined");
        Ok(worker)
    }

    /// Retires a worker that went away: drained (the existing drain path: the planner
    /// hands its sessions to another worker on their next step) and down (its KV cannot
    /// be read), out of the listings, its tasks stopped. Its id is never reused.
    pub fn retire(&self, id: WorkerId) {
        let Some(w) = self.get(id) else { return };
        w.set_draining(true);
        w.mark_down("gone");
        w.retired.cancel();
        tracing::info!(worker = %w.spec.name, "worker retired");
        self.forget_retired();
    }

    /// Drops the oldest retired workers past [`MAX_RETIRED`], so a fleet whose pods come
    /// and go for months does not keep every one it has seen (requests still running on
    /// one hold their own handle).
    fn forget_retired(&self) {
        let mut guard = self.fleet.write().unwrap_or_else(|e| e.into_inner());
        let retired = guard.workers.iter().filter(|w| w.is_retired()).count();
        let Some(mut excess) = retired.checked_sub(MAX_RETIRED).filter(|&n| n > 0) else {
            return;
        };
        let mut workers = Vec::with_capacity(guard.workers.len() - excess);
        for w in &guard.workers {
            if excess > 0 && w.is_retired() {
                excess -= 1;
                continue;
            }
            workers.push(w.clone());
        }
        let by_id = workers.iter().enumerate().map(|(i, w)| (w.id, i)).collect();
        *guard = Arc::new(Fleet { workers, by_id });
    }

    /// A live (not retired) worker by its name.
    pub fn by_name(&self, name: &str) -> Option<Arc<Worker>> {
        self.all()
            .iter()
            .find(|w| w.spec.name == name && !w.is_retired())
            .cloned()
    }

    /// Whether `model` can be served now.
    pub fn availability(&self, model: &str) -> ModelAvailability {
        let mut maybe = false;
        for w in self.all().iter() {
            if w.serves(model) && w.is_healthy() {
                return ModelAvailability::Available;
            }
            maybe |= w.serves(model) || w.models().is_empty();
        }
        if maybe {
            ModelAvailability::Unavailable
        } else {
            ModelAvailability::Unknown
        }
    }

    /// Policy views of the workers that serve `model`, minus `excluded` ones (workers that
    /// already failed this request); with their decodes' ages in the planner's time when
    /// `ages_time_scale` is given (`Worker::decode_ages`).
    pub fn candidates(
        &self,
        model: &str,
        excluded: &[WorkerId],
        ages_time_scale: Option<f64>,
    ) -> Vec<WorkerView> {
        self.all()
            .iter()
            .filter(|w| w.serves(model) && !excluded.contains(&w.id))
            .map(|w| {
                let mut v = w.view();
                if let Some(scale) = ages_time_scale {
                    v.decode_ages = w.decode_ages(scale);
                }
                v
            })
            .collect()
    }

    /// Healthy workers serving `model`.
    pub fn healthy_serving(&self, model: &str) -> usize {
        self.all()
            .iter()
            .filter(|w| w.is_healthy() && w.serves(model))
            .count()
    }

    /// Distinct models served by healthy workers, in first-seen order.
    pub fn healthy_models(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for w in self.all().iter().filter(|w| w.is_healthy()) {
            for m in w.models().iter() {
                if !out.contains(&m.id) {
                    out.push(m.id.clone());
                }
            }
        }
        out
    }

    /// How healthy workers list `model`: the smallest context limit any of them states,
    /// and the base model if it is a LoRA adapter.
    pub fn served(&self, model: &str) -> Option<ServedModel> {
        let mut out: Option<ServedModel> = None;
        for w in self.all().iter().filter(|w| w.is_healthy()) {
            for m in w.models().iter().filter(|m| m.id == model) {
                let o = out.get_or_insert_with(|| m.clone());
                o.max_model_len = match (o.max_model_len, m.max_model_len) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                o.parent = o.parent.take().or_else(|| m.parent.clone());
            }
        }
        out
    }

    /// `text` (a plan's reason, written by the planner, which knows workers only by id)
    /// with each worker id (`w0`, `w1`, ...) replaced by the worker's configured name.
    pub fn name_workers(&self, text: &str) -> String {
        let fleet = self.all();
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find('w') {
            let (before, from) = rest.split_at(at);
            out.push_str(before);
            let digits = from[1..].bytes().take_while(u8::is_ascii_digit).count();
            let word_start = !out.ends_with(|c: char| c.is_alphanumeric() || c == '_');
            let word_end =
                !from[1 + digits..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
            let worker = from[1..1 + digits]
                .parse::<u32>()
                .ok()
                .filter(|_| digits > 0 && word_start && word_end)
                .and_then(|i| fleet.by_id.get(&WorkerId(i)).map(|&at| &fleet.workers[at]));
            match worker {
                Some(w) => out.push_str(&w.spec.name),
                None => out.push_str(&from[..1 + digits]),
            }
            rest = &from[1 + digits..];
        }
        out.push_str(rest);
        out
    }

    /// The admin API's view of every worker that is not retired.
    pub fn describe(&self) -> Vec<WorkerInfo> {
        self.all()
            .iter()
            .filter(|w| !w.is_retired())
            .map(|w| WorkerInfo {
                id: w.spec.name.clone(),
                url: w.spec.base_url.clone(),
                role: w.spec.role,
                engine: w.spec.engine,
                healthy: w.is_healthy(),
                suspect: w.is_healthy() && w.consecutive_failures() > 0,
                consecutive_failures: w.consecutive_failures(),
                draining: w.is_draining(),
                in_flight: w.in_flight(),
                active_blocks: w.active_blocks(),
                kv_capacity_tokens: w.kv_capacity_tokens(),
                kv_capacity_source: if w.spec.kv_capacity_tokens.is_some() {
                    "configured"
                } else if w.reported_kv_tokens().is_some() {
                    "engine"
                } else {
                    "unknown"
                },
                load: w.load().map(|l| LoadInfo {
                    running: l.running,
                    waiting: l.waiting,
                    kv_usage: l.kv_usage,
                }),
                kv_events: w.spec.kv_events.clone(),
                models: w.models().to_vec(),
            })
            .collect()
    }
}

/// One row of `GET /admin/v1/workers`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub url: String,
    pub role: Role,
    pub engine: EngineKind,
    pub healthy: bool,
    /// Up, but its last checks or proxied requests failed (fewer than the threshold).
    pub suspect: bool,
    pub consecutive_failures: u32,
    pub draining: bool,
    pub in_flight: u32,
    pub active_blocks: u64,
    /// KV capacity in tokens (`kv_capacity_source` says where it came from).
    pub kv_capacity_tokens: Option<u64>,
    /// `configured` (the worker's `kv_capacity_tokens`), `engine` (its metrics) or
    /// `unknown`.
    pub kv_capacity_source: &'static str,
    pub load: Option<LoadInfo>,
    pub kv_events: Option<String>,
    pub models: Vec<ServedModel>,
}

/// The scraped load of a worker.
#[derive(Debug, Clone, Serialize)]
pub struct LoadInfo {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        let spec =
            |name: &str, role| WorkerSpec::new(name, "http://127.0.0.1:1", role, EngineKind::Sim);
        Registry::new(vec![spec("a", Role::Decode), spec("b", Role::Hybrid)])
    }

    #[test]
    fn availability_follows_health_and_models() {
        let r = registry();
        assert_eq!(
            r.availability("m"),
            ModelAvailability::Unavailable,
            "nobody answered yet"
        );
        r.all()[1].mark_healthy(vec!["other".into()]);
        r.all()[0].mark_healthy(vec!["m".into()]);
        assert_eq!(r.availability("x"), ModelAvailability::Unknown);
        assert_eq!(r.availability("m"), ModelAvailability::Available);
        r.all()[0].record_failure(2, "test");
        assert_eq!(
            r.availability("m"),
            ModelAvailability::Available,
            "one failure is tolerated"
        );
        r.all()[0].record_failure(2, "test");
        assert_eq!(r.availability("m"), ModelAvailability::Unavailable);
        assert_eq!(r.healthy_models(), vec!["other".to_owned()]);
    }

    #[test]
    fn retired_workers_are_kept_up_to_a_bound_the_oldest_dropped_first() {
        let r = registry();
        let spec = |i: u32| {
            WorkerSpec::new(
                &format!("pod-{i}"),
                "http://127.0.0.1:1",
                Role::Hybrid,
                EngineKind::Sim,
            )
        };
        let n = MAX_RETIRED as u32 + 10;
        for i in 0..n {
            let id = WorkerId(1_000 + i);
            r.join(id, spec(i)).unwrap();
            r.retire(id);
        }
        let fleet = r.all();
        assert_eq!(
            fleet.workers.len(),
            2 + MAX_RETIRED,
            "the static two and the bound"
        );
        assert!(
            r.get(WorkerId(1_000)).is_none(),
            "the oldest retired one is gone"
        );
        assert!(r
            .get(WorkerId(1_000 + n - 1))
            .is_some_and(|w| w.is_retired()));
        assert!(r.get(WorkerId(0)).is_some_and(|w| !w.is_retired()));
    }

    #[test]
    fn plan_reasons_name_workers_by_their_configured_names() {
        let r = registry();
        assert_eq!(
            r.name_workers("colocate: on w1: prefill; 1.00 ms vs 2.00 ms for remote_prefill on w0"),
            "colocate: on b: prefill; 1.00 ms vs 2.00 ms for remote_prefill on a"
        );
        assert_eq!(
            r.name_workers("w7 w1x aw1 w"),
            "w7 w1x aw1 w",
            "not a worker of ours"
        );
    }

    #[test]
    fn passive_health_forgives_failures_and_expires() {
        let r = registry();
        let w = &r.all()[0];
        w.mark_healthy(vec!["m".into()]);
        assert!(
            !w.progressed_within(Duration::from_secs(60)),
            "never served"
        );
        w.record_failure(2, "slow probe");
        assert_eq!(w.consecutive_failures(), 1);
        assert!(w.is_healthy(), "suspect, not down");
        w.record_progress();
        assert_eq!(w.consecutive_failures(), 0, "a served request forgives");
        assert!(w.progressed_within(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!w.progressed_within(Duration::from_millis(10)));
        w.mark_down("refused");
        w.record_progress();
        assert!(!w.is_healthy(), "only a probe brings a worker back");
    }

    #[test]
    fn configured_capacity_overrides_the_engines() {
        let mut spec = WorkerSpec::new("a", "http://127.0.0.1:1", Role::Hybrid, EngineKind::Sglang);
        let r = Registry::new(vec![spec.clone()]);
        assert_eq!(r.all()[0].kv_capacity_tokens(), None);
        r.all()[0].set_reported_kv_tokens(Some(16_384));
        assert_eq!(r.all()[0].kv_capacity_tokens(), Some(16_384));
        assert_eq!(r.describe()[0].kv_capacity_source, "engine");
        spec.kv_capacity_tokens = Some(4096);
        let r = Registry::new(vec![spec]);
        r.all()[0].set_reported_kv_tokens(Some(16_384));
        assert_eq!(r.all()[0].kv_capacity_tokens(), Some(4096));
        assert_eq!(r.describe()[0].kv_capacity_source, "configured");
    }

    #[test]
    fn decode_ages_are_counted_once_per_window_and_kept_true_as_streams_come_and_go() {
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        let mut d = Decodes::default();
        let old = d.start(t0, 100);
        let at_10s = d.ages(later(10_000), 1.0);
        let mut expected = DecodeAges::default();
        expected.add(10.0, 100);
        assert_eq!(at_10s, expected);
        // Within the window the count stands, with streams that start or end since.
        let young = d.start(later(10_010), 7);
        expected.add(0.0, 7);
        assert_eq!(d.ages(later(10_020), 1.0), expected);
        d.end(old);
        d.end(old);
        expected.remove(10.0, 100);
        assert_eq!(d.ages(later(10_030), 1.0), expected);
        // After it, or in another time scale, it is counted anew.
        let mut recount = DecodeAges::default();
        recount.add(4.0 * 0.02, 7);
        assert_eq!(d.ages(later(10_030), 4.0), recount);
        let mut recount = DecodeAges::default();
        recount.add(1.0, 7);
        assert_eq!(d.ages(later(11_010), 1.0), recount);
        d.end(young);
        assert_eq!(d.ages(later(11_020), 1.0).total(), 0);
    }

    #[test]
    fn in_flight_guard_counts_and_candidates_respect_exclusions() {
        let r = registry();
        for w in r.all().iter() {
            w.mark_healthy(vec!["m".into()]);
        }
        // 320 tokens of KV to allocate, 120 of them to compute (the rest moved in).
        let charge = PrefillCharge {
            tokens: 320,
            computed: 120,
        };
        let mut g = r.all()[1].start_request(10, charge, 400);
        let pending = |r: &Registry| {
            let v = &r.candidates("m", &[], None)[1];
            (v.active_prefill_tokens, v.active_compute_tokens)
        };
        assert_eq!(pending(&r), (320, 120));
        // A move that fell back computes all it lacks.
        g.recharge(PrefillCharge::computed(320));
        assert_eq!(pending(&r), (320, 320));
        g.prefill_done();
        assert_eq!(pending(&r), (0, 0));
        // A remote prefill's decode leg heads there until its prefill leg is done, or
        // the request ends first.
        let heading = |r: &Registry| r.candidates("m", &[], None)[1].legs_heading;
        let mut leg = r.all()[1].start_request(1, PrefillCharge::default(), 10);
        leg.leg_heading();
        leg.leg_heading();
        assert_eq!(heading(&r), 1);
        leg.leg_arrived();
        leg.leg_arrived();
        assert_eq!(heading(&r), 0);
        leg.leg_heading();
        drop(leg);
        assert_eq!(heading(&r), 0);
        assert_eq!(r.candidates("m", &[], None)[1].active_blocks, 10);
        assert_eq!(
            r.candidates("m", &[], None)
                .iter()
                .map(|v| v.in_flight)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 0);
        g.decoding();
        g.decoding();
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 400);
        let mut h = r.all()[1].start_request(1, PrefillCharge::default(), 50);
        h.decoding();
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 450);
        drop(g);
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 50);
        let mut k = r.all()[1].start_request(1, PrefillCharge::default(), 7);
        k.decoding();
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 57);
        drop((h, k));
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 0);
        assert_eq!(r.all()[1].in_flight(), 0);
        assert_eq!(r.all()[1].active_blocks(), 0);
        assert_eq!(r.candidates("m", &[WorkerId(0)], None).len(), 1);
        assert!(r.candidates("other", &[], None).is_empty());
    }
}
