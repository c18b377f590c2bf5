//! The engine actor: one tokio task owns the [`Scheduler`], takes submissions from HTTP
//! handlers, runs steps back to back while there is work, and sleeps each step's simulated
//! duration scaled to wall-clock time. Outputs go back to each request over its channel;
//! a closed channel (client gone) aborts that request's sequences.
//!
//! KV transfer goes through the actor too, so it sees the cache exactly as the scheduler
//! does: reads for a pull, inserts of received blocks (atomically with the request that
//! needs them), drops, and the pins of prefill legs with their leases ([`super::lease`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use ownerserve_planner::hash::prompt_hashes;

use super::config::{SimConfig, TimeMode};
use super::lease::Leases;
use super::metrics::EngineMetrics;
use super::scheduler::{
    AdmitError, CacheEvent, CacheUpdate, CachedRun, NewSeq, Scheduler, SeqId, StepOutput,
};
use crate::kv_events::wire::{WireBatch, WireEvent};
use crate::openai::response::FinishReason;

/// One sequence (choice) of a submitted request.
#[derive(Debug, Clone)]
pub struct SeqRequest {
    /// Index of the choice in the response.
    pub choice: u32,
    pub prompt: Arc<[u32]>,
    pub max_tokens: u32,
    pub eos_after: Option<u32>,
    pub stop: Arc<[String]>,
    pub stream_seed: u64,
    /// Keep the cached prefix from eviction until admitted (its KV was just received).
    pub hold_prefix: bool,
    /// Prefill leg: when this sequence finishes, pin its prompt's full blocks under this
    /// request id for the decode leg to pull.
    pub pin_for: Option<String>,
    /// vLLM's request priority (`X-Vllm-Priority`): lower runs sooner.
    pub priority: i32,
}

/// KV received for a request, to cache before its sequences are queued.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Received {
    /// The prompt's block hashes up to the last one received.
    pub chain: Vec<u64>,
    /// Index in `chain` of the first received block (the blocks before were local).
    pub from: usize,
    /// Tokens of `chain[from..]`, `block_size` per block.
    pub tokens: Vec<u32>,
}

/// What the engine tells a request about one of its choices.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// First scheduled: how many prompt tokens came from the prefix cache.
    Admitted { choice: u32, cached_tokens: u32 },
    /// A generated token's text (possibly empty while held back for stop strings).
    Token {
        choice: u32,
        text: String,
        finish: Option<FinishReason>,
    },
    /// The engine cannot run this choice.
    Rejected { choice: u32, error: AdmitError },
    /// The choice finished and its prompt's full blocks are pinned for a decode leg; sent
    /// just before the finishing token.
    Pinned { choice: u32, block_ids: Vec<u32> },
}

enum Command {
    Submit {
        seqs: Vec<SeqRequest>,
        received: Option<Received>,
        events: mpsc::UnboundedSender<SeqEvent>,
    },
    ResetPrefixCache(oneshot::Sender<bool>),
    CachedPrefix(Vec<u64>, oneshot::Sender<usize>),
    ServePull {
        request_id: Option<String>,
        hashes: Vec<u64>,
        done: oneshot::Sender<CachedRun>,
    },
    Insert {
        parent: Option<u64>,
        hashes: Vec<u64>,
        tokens: Vec<u32>,
        done: oneshot::Sender<usize>,
    },
    Drop(Vec<u64>, oneshot::Sender<usize>),
}

/// Handle HTTP handlers use to submit work and read metrics.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Command>,
    metrics: Arc<Mutex<EngineMetrics>>,
}

/// The engine is gone (shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the engine is shutting down")]
pub struct EngineClosed;

impl EngineHandle {
    /// Queues a request's sequences; events arrive on the returned receiver.
    pub fn submit(
        &self,
        seqs: Vec<SeqRequest>,
    ) -> Result<mpsc::UnboundedReceiver<SeqEvent>, EngineClosed> {
        self.submit_with(seqs, None)
    }

    /// Caches `received` KV, then queues the sequences, in one step of the actor so the
    /// blocks cannot be evicted in between.
    pub fn submit_with(
        &self,
        seqs: Vec<SeqRequest>,
        received: Option<Received>,
    ) -> Result<mpsc::UnboundedReceiver<SeqEvent>, EngineClosed> {
        let (events, rx) = mpsc::unbounded_channel();
        self.tx
            .send(Command::Submit {
                seqs,
                received,
                events,
            })
            .map_err(|_| EngineClosed)?;
        Ok(rx)
    }

    /// How many leading hashes of a chain are cached.
    pub async fn cached_prefix(&self, hashes: Vec<u64>) -> Result<usize, EngineClosed> {
        self.ask(|tx| Command::CachedPrefix(hashes, tx)).await
    }

    /// Serves a pull: the leading cached blocks of `hashes` with their content; ends the
    /// lease of `request_id`, if any.
    pub async fn serve_pull(
        &self,
        request_id: Option<String>,
        hashes: Vec<u64>,
    ) -> Result<CachedRun, EngineClosed> {
        self.ask(|done| Command::ServePull {
            request_id,
            hashes,
            done,
        })
        .await
    }

    /// Caches received blocks; returns how many leading ones are now cached.
    pub async fn insert(
        &self,
        parent: Option<u64>,
        hashes: Vec<u64>,
        tokens: Vec<u32>,
    ) -> Result<usize, EngineClosed> {
        self.ask(|done| Command::Insert {
            parent,
            hashes,
            tokens,
            done,
        })
        .await
    }

    /// Evicts the blocks of `hashes` no request holds; returns how many.
    pub async fn drop_blocks(&self, hashes: Vec<u64>) -> Result<usize, EngineClosed> {
        self.ask(|tx| Command::Drop(hashes, tx)).await
    }

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, EngineClosed> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(command(tx)).map_err(|_| EngineClosed)?;
        rx.await.map_err(|_| EngineClosed)
    }

    /// Drops the prefix cache if no request holds blocks; returns whether it did.
    pub async fn reset_prefix_cache(&self) -> Result<bool, EngineClosed> {
        self.ask(Command::ResetPrefixCache).await
    }

    /// Current metrics (a short lock; the actor updates them once per step).
    pub fn metrics(&self) -> MutexGuard<'_, EngineMetrics> {
        lock(&self.metrics)
    }
}

fn lock(m: &Mutex<EngineMetrics>) -> MutexGuard<'_, EngineMetrics> {
    // A panic while holding the lock cannot leave metrics inconsistent enough to matter.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Maps simulated time to wall-clock time.
struct Clock {
    mode: TimeMode,
    start: Instant,
}

impl Clock {
    /// Simulated now for an engine that was idle until this moment.
    fn idle_now(&self, now_s: f64) -> f64 {
        match self.mode {
            TimeMode::Scaled(scale) => now_s.max(self.start.elapsed().as_secs_f64() * scale),
            TimeMode::Instant => now_s,
        }
    }

    async fn wait_until(&self, now_s: f64) {
        match self.mode {
            TimeMode::Scaled(scale) => {
                let wall = std::time::Duration::from_secs_f64(now_s / scale);
                tokio::time::sleep_until(self.start + wall).await;
            }
            // Let handlers run between steps even when no time passes.
            TimeMode::Instant => tokio::task::yield_now().await,
        }
    }
}

struct Route {
    events: mpsc::UnboundedSender<SeqEvent>,
    choice: u32,
    prompt_len: usize,
    /// Prompt tokens served from the cache at admission.
    cached_tokens: u32,
    /// Prefill leg: the request id to pin the prompt's blocks under, and the prompt.
    pin: Option<(String, Arc<[u32]>)>,
    arrival_s: f64,
    last_token_s: Option<f64>,
}

/// Starts the engine actor on the current runtime; it stops when `cancel` fires or every
/// handle is dropped. Cache changes go to `kv_events` as wire batches, if given.
pub fn spawn(
    cfg: &SimConfig,
    kv_events: Option<mpsc::UnboundedSender<WireBatch>>,
    cancel: CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
) -> EngineHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let metrics = Arc::new(Mutex::new(EngineMetrics::new(
        cfg.scheduler.num_blocks,
        cfg.scheduler.block_size,
    )));
    let actor = Actor {
        scheduler: Scheduler::new(
            cfg.scheduler.clone(),
            cfg.model.clone(),
            cfg.roofline.clone(),
        ),
        clock: Clock {
            mode: cfg.time,
            start: Instant::now(),
        },
        metrics: metrics.clone(),
        routes: HashMap::new(),
        next_seq: 0,
        now_s: 0.0,
        kv_events,
        block_size: cfg.scheduler.block_size,
        hash_seed: cfg.scheduler.hash_seed,
        leases: Leases::new(cfg.transfer.kv_lease),
    };
    tracker.spawn(actor.run(rx, cancel));
    EngineHandle { tx, metrics }
}

struct Actor {
    scheduler: Scheduler,
    clock: Clock,
    metrics: Arc<Mutex<EngineMetrics>>,
    routes: HashMap<SeqId, Route>,
    next_seq: u64,
    now_s: f64,
    kv_events: Option<mpsc::UnboundedSender<WireBatch>>,
    block_size: u32,
    hash_seed: u64,
    leases: Leases,
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>, cancel: CancellationToken) {
        loop {
            if self.scheduler.is_idle() {
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        Some(cmd) => {
                            self.now_s = self.clock.idle_now(self.now_s);
                            self.expire_leases();
                            self.handle(cmd);
                        }
                        None => return,
                    },
                    () = cancel.cancelled() => return,
                }
            }
            self.expire_leases();
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            if self.scheduler.is_idle() {
                continue;
            }
            let out = self.scheduler.step(self.now_s);
            self.now_s += out.duration_s();
            if out.time.is_none() {
                // Nothing to compute until a restore lands: wait for it (not a busy loop).
                if let Some(until) = out.idle_until_s {
                    self.now_s = self.now_s.max(until);
                }
            }
            tokio::select! {
                () = self.clock.wait_until(self.now_s) => {}
                () = cancel.cancelled() => return,
            }
            self.deliver(out);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                seqs,
                received,
                events,
            } => self.accept(seqs, received, &events),
            Command::ResetPrefixCache(done) => {
                let cleared = self.scheduler.reset_prefix_cache();
                let ok = cleared.is_some();
                self.publish(cleared.into_iter().collect());
                let _ = done.send(ok);
            }
            Command::CachedPrefix(hashes, done) => {
                let _ = done.send(self.scheduler.cached_prefix(&hashes));
            }
            Command::ServePull {
                request_id,
                hashes,
                done,
            } => {
                let run = self.scheduler.read_cached(&hashes);
                if let Some(blocks) = request_id.and_then(|id| self.leases.take(&id)) {
                    self.scheduler.unpin(&blocks);
                }
                let _ = done.send(run);
            }
            Command::Insert {
                parent,
                hashes,
                tokens,
                done,
            } => {
                let update = self.scheduler.insert_cached(parent, &hashes, &tokens);
                let _ = done.send(self.apply(update));
            }
            Command::Drop(hashes, done) => {
                let update = self.scheduler.drop_cached(&hashes);
                let _ = done.send(self.apply(update));
            }
        }
        self.update_gauges();
    }

    /// Publishes a cache update's events; returns its block count.
    fn apply(&mut self, update: CacheUpdate) -> usize {
        self.publish(update.events);
        update.blocks
    }

    fn lease_now(&self) -> Duration {
        self.clock.start.elapsed()
    }

    fn expire_leases(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        let freed = self.leases.expire(self.lease_now());
        if !freed.is_empty() {
            tracing::debug!(blocks = freed.len(), "kv lease expired");
            self.scheduler.unpin(&freed);
        }
    }

    /// Pins a finished prefill leg's prompt blocks under its request id.
    fn pin_prompt(&mut self, request_id: String, prompt: &[u32]) -> Vec<u32> {
        let hashes = prompt_hashes(prompt, self.block_size as usize, self.hash_seed);
        let blocks = self.scheduler.pin(&hashes);
        let ids = blocks.iter().map(|b| b.index()).collect();
        let now = self.lease_now();
        if let Some(old) = self.leases.grant(request_id, blocks, now) {
            self.scheduler.unpin(&old);
        }
        ids
    }

    fn update_gauges(&self) {
        let mut m = lock(&self.metrics);
        m.num_requests_running = self.scheduler.num_running();
        m.num_requests_waiting = self.scheduler.num_waiting();
        m.kv_cache_usage_perc = self.scheduler.pool().usage();
    }

    /// Sends cache changes to the publisher as one batch.
    fn publish(&self, changes: Vec<CacheEvent>) {
        let Some(tx) = &self.kv_events else { return };
        if changes.is_empty() {
            return;
        }
        let events = changes
            .into_iter()
            .map(|c| match c {
                CacheEvent::Stored {
                    hashes,
                    parent,
                    tokens,
                } => WireEvent::BlockStored {
                    block_hashes: hashes,
                    parent_block_hash: parent,
                    token_ids: tokens,
                    block_size: self.block_size,
                    lora_name: None,
                    extra_keys: None,
                    medium: Some("GPU".to_owned()),
                    group_idx: None,
                    kv_cache_spec_kind: None,
                },
                CacheEvent::Removed { hashes } => WireEvent::BlockRemoved {
                    block_hashes: hashes,
                    medium: Some("GPU".to_owned()),
                    group_idx: None,
                },
                // vLLM's CPU offloading connector names the blocks only (no parent, no
                // tokens): they are copies of GPU blocks announced before.
                CacheEvent::HostStored { hashes } => WireEvent::BlockStored {
                    block_hashes: hashes,
                    parent_block_hash: None,
                    token_ids: Vec::new(),
                    block_size: self.block_size,
                    lora_name: None,
                    extra_keys: None,
                    medium: Some("CPU".to_owned()),
                    group_idx: None,
                    kv_cache_spec_kind: None,
                },
                CacheEvent::HostRemoved { hashes } => WireEvent::BlockRemoved {
                    block_hashes: hashes,
                    medium: Some("CPU".to_owned()),
                    group_idx: None,
                },
                CacheEvent::Cleared => WireEvent::AllBlocksCleared,
            })
            .collect();
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let _ = tx.send(WireBatch {
            ts,
            events,
            dp_rank: Some(0),
        });
    }

    fn accept(
        &mut self,
        seqs: Vec<SeqRequest>,
        received: Option<Received>,
        events: &mpsc::UnboundedSender<SeqEvent>,
    ) {
        // The local part of the prefix stays pinned while the received part is inserted
        // after it and the sequences take their holds.
        let mut local = Vec::new();
        if let Some(r) = &received {
            let from = r.from.min(r.chain.len());
            local = self.scheduler.pin(&r.chain[..from]);
            let parent = from.checked_sub(1).map(|i| r.chain[i]);
            let update = self
                .scheduler
                .insert_cached(parent, &r.chain[from..], &r.tokens);
            self.apply(update);
        }
        for req in seqs {
            let id = SeqId(self.next_seq);
            self.next_seq += 1;
            let spec = NewSeq {
                id,
                prompt: req.prompt.clone(),
                max_tokens: req.max_tokens,
                eos_after: req.eos_after,
                stop: req.stop,
                stream_seed: req.stream_seed,
                arrival_s: self.now_s,
                priority: req.priority,
            };
            let added = if req.hold_prefix {
                self.scheduler.add_holding_prefix(spec)
            } else {
                self.scheduler.add(spec)
            };
            match added {
                Ok(()) => {
                    self.routes.insert(
                        id,
                        Route {
                            events: events.clone(),
                            choice: req.choice,
                            prompt_len: req.prompt.len(),
                            cached_tokens: 0,
                            pin: req.pin_for.map(|r| (r, req.prompt.clone())),
                            arrival_s: self.now_s,
                            last_token_s: None,
                        },
                    );
                }
                Err(error) => {
                    let _ = events.send(SeqEvent::Rejected {
                        choice: req.choice,
                        error,
                    });
                }
            }
        }
        self.scheduler.unpin(&local);
    }

    fn deliver(&mut self, mut out: StepOutput) {
        self.publish(std::mem::take(&mut out.cache_events));
        let now = self.now_s;
        let metrics = self.metrics.clone();
        let mut m = lock(&metrics);
        m.num_preemptions += u64::from(out.preempted);
        m.kv.host_restored_tokens += out.restored_tokens;
        m.kv.host_restore_seconds += out.restore_s;
        let mut gone = Vec::new();
        // vLLM's `iteration_tokens_total`: per step that produced tokens, the prompt tokens
        // computed for the requests whose first token it produced, and the tokens produced.
        let produced = !out.tokens.is_empty();
        let mut iteration = out.tokens.len() as u64;
        for a in &out.admitted {
            let Some(route) = self.routes.get_mut(&a.seq) else {
                continue;
            };
            route.cached_tokens = a.cached_tokens;
            m.prefix_cache_queries += route.prompt_len as u64;
            m.prefix_cache_hits += u64::from(a.cached_tokens);
            m.kv.prefill_cached_tokens += u64::from(a.cached_tokens);
            m.kv.prefill_computed_tokens +=
                (route.prompt_len as u64).saturating_sub(u64::from(a.cached_tokens));
            m.request_queue_time.observe(a.queue_s);
            let event = SeqEvent::Admitted {
                choice: route.choice,
                cached_tokens: a.cached_tokens,
            };
            if route.events.send(event).is_err() {
                gone.push(a.seq);
            }
        }
        for t in out.tokens {
            let Some(route) = self.routes.get_mut(&t.seq) else {
                continue;
            };
            if t.finish.is_some() {
                if let Some((request_id, prompt)) = route.pin.take() {
                    let (choice, events) = (route.choice, route.events.clone());
                    let block_ids = self.pin_prompt(request_id, &prompt);
                    let _ = events.send(SeqEvent::Pinned { choice, block_ids });
                }
            }
            let Some(route) = self.routes.get_mut(&t.seq) else {
                continue;
            };
            m.generation_tokens += 1;
            match route.last_token_s {
                None => {
                    m.time_to_first_token.observe(now - route.arrival_s);
                    iteration +=
                        (route.prompt_len as u64).saturating_sub(u64::from(route.cached_tokens));
                }
                Some(last) => m.inter_token_latency.observe(now - last),
            }
            route.last_token_s = Some(now);
            let finish = t.finish;
            let sent = route.events.send(SeqEvent::Token {
                choice: route.choice,
                text: t.text,
                finish,
            });
            if let Some(reason) = finish {
                m.finished(reason);
                m.prompt_tokens += route.prompt_len as u64;
                m.e2e_request_latency.observe(now - route.arrival_s);
                self.routes.remove(&t.seq);
            } else if sent.is_err() {
                gone.push(t.seq);
            }
        }
        if produced {
            m.iteration_tokens.observe(iteration as f64);
        }
        drop(m);
        for id in gone {
            self.scheduler.abort(id);
            self.routes.remove(&id);
        }
        self.update_gauges();
    }
}
