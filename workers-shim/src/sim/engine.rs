//! The engine actor: one tokio task owns the [`Scheduler`], takes submissions from HTTP
//! handlers, runs steps back to back while there is work, and sleeps each step's simulated
//! duration scaled to wall-clock time. Outputs go back to each request over its channel;
//! a closed channel (client gone) aborts that request's sequences.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{SimConfig, TimeMode};
use super::metrics::EngineMetrics;
use super::scheduler::{AdmitError, CacheEvent, NewSeq, Scheduler, SeqId, StepOutput};
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
}

enum Command {
    Submit {
        seqs: Vec<SeqRequest>,
        events: mpsc::UnboundedSender<SeqEvent>,
    },
    ResetPrefixCache(oneshot::Sender<bool>),
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
        let (events, rx) = mpsc::unbounded_channel();
        self.tx
            .send(Command::Submit { seqs, events })
            .map_err(|_| EngineClosed)?;
        Ok(rx)
    }

    /// Drops the prefix cache if no request holds blocks; returns whether it did.
    pub async fn reset_prefix_cache(&self) -> Result<bool, EngineClosed> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::ResetPrefixCache(tx))
            .map_err(|_| EngineClosed)?;
        rx.await.map_err(|_| EngineClosed)
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
}

impl Actor {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>, cancel: CancellationToken) {
        loop {
            if self.scheduler.is_idle() {
                tokio::select! {
                    cmd = rx.recv() => match cmd {
                        Some(cmd) => {
                            self.now_s = self.clock.idle_now(self.now_s);
                            self.handle(cmd);
                        }
                        None => return,
                    },
                    () = cancel.cancelled() => return,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                self.handle(cmd);
            }
            if self.scheduler.is_idle() {
                continue;
            }
            let out = self.scheduler.step(self.now_s);
            self.now_s += out.duration_s();
            tokio::select! {
                () = self.clock.wait_until(self.now_s) => {}
                () = cancel.cancelled() => return,
            }
            self.deliver(out);
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit { seqs, events } => self.accept(seqs, &events),
            Command::ResetPrefixCache(done) => {
                let cleared = self.scheduler.reset_prefix_cache();
                let ok = cleared.is_some();
                self.publish(cleared.into_iter().collect());
                let _ = done.send(ok);
            }
        }
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
                    medium: Some("GPU".to_owned()),
                    group_idx: None,
                    kv_cache_spec_kind: None,
                },
                CacheEvent::Removed { hashes } => WireEvent::BlockRemoved {
                    block_hashes: hashes,
                    medium: Some("GPU".to_owned()),
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

    fn accept(&mut self, seqs: Vec<SeqRequest>, events: &mpsc::UnboundedSender<SeqEvent>) {
        for req in seqs {
            let id = SeqId(self.next_seq);
            self.next_seq += 1;
            let added = self.scheduler.add(NewSeq {
                id,
                prompt: req.prompt.clone(),
                max_tokens: req.max_tokens,
                eos_after: req.eos_after,
                stop: req.stop,
                stream_seed: req.stream_seed,
                arrival_s: self.now_s,
            });
            match added {
                Ok(()) => {
                    self.routes.insert(
                        id,
                        Route {
                            events: events.clone(),
                            choice: req.choice,
                            prompt_len: req.prompt.len(),
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
    }

    fn deliver(&mut self, mut out: StepOutput) {
        self.publish(std::mem::take(&mut out.cache_events));
        let now = self.now_s;
        let mut m = lock(&self.metrics);
        m.num_preemptions += u64::from(out.preempted);
        let mut gone = Vec::new();
        for a in &out.admitted {
            let Some(route) = self.routes.get(&a.seq) else {
                continue;
            };
            m.prefix_cache_queries += route.prompt_len as u64;
            m.prefix_cache_hits += u64::from(a.cached_tokens);
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
            m.generation_tokens += 1;
            match route.last_token_s {
                None => m.time_to_first_token.observe(now - route.arrival_s),
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
        for id in gone {
            self.scheduler.abort(id);
            self.routes.remove(&id);
        }
        m.num_requests_running = self.scheduler.num_running();
        m.num_requests_waiting = self.scheduler.num_waiting();
        m.kv_cache_usage_perc = self.scheduler.pool().usage();
    }
}
