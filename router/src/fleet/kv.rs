//! KV-aware routing state: the KV index, fed by one event subscriber per worker (or, for
//! workers without events, by the router's own routing decisions with a TTL), plus the
//! tasks that keep it current: subscribers, engine-load scrapers and expiry.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::{
    IndexStats, KvIndex, KvIndexConfig, MatchScratch, EXPIRY_BATCH,
};
use ownerserve_planner::policy::WorkerView;
use ownerserve_shim::kv_events::redis_fanout::{follow, FanoutConfig, RedisPublisher};
use ownerserve_shim::kv_events::shared_index::SharedIndex;
use ownerserve_shim::kv_events::subscriber::{
    replay_gate, EventSink, Subscriber, SubscriberConfig, SubscriberStats,
};
use ownerserve_shim::load_metrics::{kv_capacity_tokens, parse_load};

use crate::config::{FanoutRole, DEFAULT_KV_BLOCK_SIZE};
use crate::fleet::engine_report::EngineReport;
use crate::fleet::kv_copy::{CopiedFrom, Copies};
use crate::fleet::registry::{Registry, Worker};
use crate::upstream::{get_small, HttpClient};

/// The router's KV view.
pub struct KvRouting {
    pub index: Arc<SharedIndex>,
    block_size: usize,
    approx_ttl_ms: u64,
    started: Instant,
    /// Event counters per worker with a subscriber.
    subscribers: std::sync::RwLock<Vec<(WorkerId, Arc<SubscriberStats>)>>,
    /// The subscribers' replays take turns (`subscriber::replay_gate`).
    replay_gate: Arc<Semaphore>,
    /// What was copied from peer routers at startup (`kv_copy`).
    pub copies: Copies,
}

impl KvRouting {
    pub fn new(cfg: KvIndexConfig, approx_ttl: Duration, registry: &Registry) -> Self {
        Self {
            index: Arc::new(SharedIndex::new(cfg)),
            block_size: cfg.block_size,
            approx_ttl_ms: approx_ttl.as_millis() as u64,
            started: Instant::now(),
            subscribers: std::sync::RwLock::new(
                registry
                    .all()
                    .iter()
                    .filter(|w| w.spec.kv_events.is_some())
                    .map(|w| (w.id, Arc::default()))
                    .collect(),
            ),
            replay_gate: replay_gate(),
            copies: Copies::default(),
        }
    }

    /// Router time for policies and TTLs.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// How `w`'s events on `endpoint` are subscribed to: named after it, its replays
    /// taking turns with the other workers'.
    fn subscriber_config(&self, w: &Worker, endpoint: String) -> SubscriberConfig {
        SubscriberConfig::new(w.id, endpoint, w.spec.kv_replay.clone(), self.block_size)
            .named(&w.spec.name)
            .gated(self.replay_gate.clone())
    }

    /// Tokens of the blocks the index says `worker` holds in GPU memory: what fills its
    /// KV cache (its host-tier holds do not).
    pub fn worker_gpu_tokens(&self, worker: WorkerId) -> u64 {
        self.index.lock().worker_gpu_blocks(worker) as u64 * self.block_size as u64
    }

    /// Fills each candidate's `cached_blocks` (HBM) and `host_cached_blocks` (host memory
    /// after them) from the index, and marks the deepest block
    /// matched as used (its chain is evicted last).
    pub fn fill_cached(&self, hashes: &[u64], candidates: &mut [WorkerView]) {
        let mut matches = Vec::new();
        {
            let mut ix = self.index.lock();
            ix.find_matches(hashes, &mut MatchScratch::default(), &mut matches);
            let depth = matches.iter().map(|m| m.any_blocks).max().unwrap_or(0) as usize;
            if let Some(&deepest) = depth.checked_sub(1).and_then(|d| hashes.get(d)) {
                ix.touch(deepest);
            }
        }
        for c in candidates {
            let m = matches.iter().find(|m| m.worker == c.id);
            c.cached_blocks = m.map_or(0, |m| m.gpu_blocks);
            // Held past its HBM prefix in host memory (medium CPU): restorable, not HBM.
            c.host_cached_blocks = m.map_or(0, |m| m.any_blocks.saturating_sub(m.gpu_blocks));
        }
    }

    /// Remembers where a request went, for workers whose engines publish no events.
    pub fn record_routed(&self, worker: &Worker, hashes: &[u64]) {
        if worker.spec.kv_events.is_none() && !hashes.is_empty() {
            let now = self.now_ms();
            self.index
                .lock()
                .insert_routed(worker.id, hashes, now, self.approx_ttl_ms);
        }
    }

    /// Drops the blocks of workers that went down (a dead engine's cache is gone; a
    /// recommendation to send work there would be wrong twice), once per down period;
    /// `forgotten` holds those dropped and not back yet. A worker's subscriber then
    /// replays its engine's history when it is reachable again.
    pub fn forget_down_workers(&self, workers: &[Arc<Worker>], forgotten: &mut HashSet<WorkerId>) {
        for w in workers {
            if w.is_healthy() {
                forgotten.remove(&w.id);
                continue;
            }
            if !forgotten.insert(w.id) {
                continue;
            }
            let dropped = {
                let mut ix = self.index.lock();
                let n = ix.worker_blocks(w.id);
                ix.clear_worker(w.id);
                n
            };
            if let Some(stats) = self.stats_of(w.id) {
                stats
                    .forgotten
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if dropped > 0 {
                tracing::info!(worker = %w.spec.name, blocks = dropped, "worker is down: its blocks left the KV index");
            }
        }
    }

    /// Each event-fed worker's subscriber counters.
    pub fn event_stats(&self) -> Vec<(WorkerId, Arc<SubscriberStats>)> {
        self.subscribers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `worker`'s subscriber counters, if its events are subscribed to.
    /// How far the index of `worker`'s cache can be trusted now: `Approximate` without an
    /// event stream (routing-derived entries), `Degraded` before its first event (or copy
    /// from a peer router), for
    /// [`DEGRADED_FOR`] after it lost, garbled, refused or could not replay events (or its
    /// subscriber restarted), or while its route receipts diverge from what its engine
    /// reports; `Exact` otherwise.
    pub fn mode_of(&self, worker: &Worker) -> IndexMode {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(s) = self.stats_of(worker.id) else {
            return IndexMode::Approximate;
        };
        let trouble = s.last_trouble_ms.load(Relaxed);
        let now = ownerserve_ownership::node::unix_ms();
        let recent = trouble > 0 && now.saturating_sub(trouble) < DEGRADED_FOR.as_millis() as u64;
        // A copy from a peer router stands for the events before it.
        let unfed = s.batches.load(Relaxed) == 0 && !self.copies.contains(worker.id);
        if unfed || recent || worker.receipts_diverge() {
            IndexMode::Degraded
        } else {
            IndexMode::Exact
        }
    }

    fn stats_of(&self, worker: WorkerId) -> Option<Arc<SubscriberStats>> {
        self.subscribers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(id, _)| *id == worker)
            .map(|(_, s)| s.clone())
    }

    /// The admin API's view.
    pub fn describe(&self, registry: &Registry) -> KvInfo {
        let ix = self.index.lock();
        KvInfo {
            block_size: self.block_size,
            blocks: ix.len(),
            digest: format!("{:016x}", ix.digest()),
            stats: ix.stats().into(),
            workers: registry
                .all()
                .iter()
                .map(|w| {
                    let events = self.stats_of(w.id).map(|s| EventCounters::from(s.as_ref()));
                    WorkerKv {
                        id: w.spec.name.clone(),
                        blocks: ix.worker_blocks(w.id),
                        digest: format!("{:016x}", ix.worker_digest(w.id)),
                        mode: if events.is_some() {
                            "events"
                        } else {
                            "approximate"
                        },
                        index: self.mode_of(w).name(),
                        events,
                        copied_from: self.copies.of(w.id),
                    }
                })
                .collect(),
        }
    }
}

/// How long a worker's index stays `degraded` after trouble on its event stream.
pub const DEGRADED_FOR: Duration = Duration::from_secs(60);

/// How far the router's index of a worker's cache can be trusted (route receipts,
/// `/admin/v1/kv`, `/admin/v1/workers`, `ctl workers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexMode {
    /// Engine events flowing in sequence.
    Exact,
    /// Events configured but none yet, or lost, garbled or not replayed within
    /// [`DEGRADED_FOR`]: the index may be behind the engine.
    Degraded,
    /// No event stream: entries derived from routing, with a TTL.
    Approximate,
}

impl IndexMode {
    pub const ALL: [IndexMode; 3] = [
        IndexMode::Exact,
        IndexMode::Degraded,
        IndexMode::Approximate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            IndexMode::Exact => "exact",
            IndexMode::Degraded => "degraded",
            IndexMode::Approximate => "approximate",
        }
    }
}

/// `GET /admin/v1/kv`.
#[derive(Debug, Serialize)]
pub struct KvInfo {
    block_size: usize,
    blocks: usize,
    /// Equal on two routers whose indexes hold the same blocks.
    digest: String,
    stats: IndexCounters,
    workers: Vec<WorkerKv>,
}

#[derive(Debug, Serialize)]
struct IndexCounters {
    blocks_stored: u64,
    blocks_removed: u64,
    events_rejected: u64,
    blocks_pruned: u64,
    blocks_expired: u64,
}

impl From<IndexStats> for IndexCounters {
    fn from(s: IndexStats) -> Self {
        Self {
            blocks_stored: s.blocks_stored,
            blocks_removed: s.blocks_removed,
            events_rejected: s.events_rejected,
            blocks_pruned: s.blocks_pruned,
            blocks_expired: s.blocks_expired,
        }
    }
}

#[derive(Debug, Serialize)]
struct WorkerKv {
    id: String,
    blocks: usize,
    /// The fingerprint of this worker's blocks alone.
    digest: String,
    mode: &'static str,
    /// `exact`, `degraded` or `approximate` ([`IndexMode`]).
    index: &'static str,
    events: Option<EventCounters>,
    /// The peer router this worker's blocks were copied from at startup, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    copied_from: Option<CopiedFrom>,
}

#[derive(Debug, Serialize)]
struct EventCounters {
    batches: u64,
    events: u64,
    malformed: u64,
    gaps: u64,
    replayed_batches: u64,
    missing_history: u64,
    restarts: u64,
}

impl From<&SubscriberStats> for EventCounters {
    fn from(s: &SubscriberStats) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        Self {
            batches: s.batches.load(Relaxed),
            events: s.events.load(Relaxed),
            malformed: s.malformed.load(Relaxed),
            gaps: s.gaps.load(Relaxed),
            replayed_batches: s.replayed_batches.load(Relaxed),
            missing_history: s.missing_history.load(Relaxed),
            restarts: s.restarts.load(Relaxed),
        }
    }
}

/// Starts the subscribers (one per worker with events), the Redis fan-out if configured,
/// and the expiry tick.
pub fn spawn(
    kv: &Arc<KvRouting>,
    registry: &Arc<Registry>,
    fanout: Option<&(FanoutConfig, FanoutRole)>,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let fleet = registry.all();
    let with_events = || fleet.iter().filter(|w| w.spec.kv_events.is_some());
    // Where the ZMQ subscribers put events: the local index, the Redis streams, or nowhere
    // (a consuming replica takes everything from the streams).
    let sink: Option<Arc<dyn EventSink>> = match fanout {
        None => Some(kv.index.clone()),
        Some((cfg, FanoutRole::Publish)) => {
            let keys = with_events()
                .map(|w| (w.id, cfg.key(&w.spec.name)))
                .collect();
            Some(Arc::new(RedisPublisher::spawn(
                cfg,
                keys,
                tracker,
                cancel.clone(),
            )?))
        }
        Some((_, FanoutRole::Consume)) => None,
    };
    if let Some((cfg, _)) = fanout {
        for w in with_events() {
            let sink: Arc<dyn EventSink> = kv.index.clone();
            let key = cfg.key(&w.spec.name);
            tracker.spawn(follow(cfg.url.clone(), key, w.id, sink, cancel.clone()));
        }
    }
    for w in with_events() {
        let (Some(sink), Some(endpoint)) = (sink.clone(), w.spec.kv_events.clone()) else {
            continue;
        };
        let Some(stats) = kv.stats_of(w.id) else {
            continue;
        };
        let cfg = kv.subscriber_config(w, endpoint);
        let (cancel, name) = (cancel.clone(), w.spec.name.clone());
        tracker.spawn(supervise(cfg, stats, sink, cancel, name, tracker.clone()));
    }
    let (kv, cancel, registry) = (kv.clone(), cancel.clone(), registry.clone());
    tracker.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut forgotten = HashSet::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    tick_index(&kv.index, kv.now_ms()).await;
                    kv.forget_down_workers(&registry.all(), &mut forgotten);
                }
                () = cancel.cancelled() => return,
            }
        }
    });
    Ok(())
}

/// The tick's work on the index: what came due, then the stale expiry entries, each in
/// batches with the lock given up and the runtime yielded between them (a full index's
/// grain held the lock for hundreds of milliseconds in one go; `KvIndex::expire_some`).
async fn tick_index(index: &SharedIndex, now_ms: u64) {
    in_lock_holds(index, |ix| {
        ix.expire_some(now_ms, EXPIRY_BATCH) == EXPIRY_BATCH
    })
    .await;
    in_lock_holds(index, |ix| ix.compact_expiries_some(1)).await;
}

/// Runs `step` on the index until it says it is done, one step per hold of the index's
/// lock, yielding to the runtime between steps so that requests are served meanwhile.
async fn in_lock_holds(index: &SharedIndex, mut step: impl FnMut(&mut KvIndex) -> bool) {
    loop {
        let more = step(&mut index.lock());
        if !more {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Runs a subscriber, restarting it if it panics: the ZMQ crate panics on a few paths
/// its authors consider unreachable, and one worker's socket must not take the router down.
async fn supervise(
    cfg: SubscriberConfig,
    stats: Arc<SubscriberStats>,
    sink: Arc<dyn EventSink>,
    cancel: CancellationToken,
    worker: String,
    tracker: TaskTracker,
) {
    while !cancel.is_cancelled() {
        let mut sub = Subscriber::with_stats(cfg.clone(), stats.clone());
        let (sink, c) = (sink.clone(), cancel.clone());
        // A separate task only to catch a panic; it ends with `cancel` like its supervisor.
        let run = tracker.spawn(async move { sub.run(sink.as_ref(), &c).await });
        if let Err(e) = run.await {
            tracing::error!(%worker, error = %e, "kv event subscriber died; restarting");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Why the router cannot pick one KV block size for its fleet.
#[derive(Debug, thiserror::Error)]
pub enum BlockSizeError {
    /// An engine reports another block size than the one configured for it.
    #[error(
        "worker {worker} uses KV blocks of {engine} tokens but {key} is {configured}: set it to {engine}, or leave it unset to learn it from the engines"
    )]
    Disagrees {
        worker: String,
        engine: usize,
        configured: usize,
        key: String,
    },
    /// Workers use different block sizes: no one hash of a prompt matches them all.
    #[error(
        "workers use different KV block sizes ({sizes}); one router hashes prompts with one block size: run one router per block size"
    )]
    Mixed { sizes: String },
}

/// The KV block size the router hashes with. Each worker's size is what its engine
/// reported at startup (`reports`: vLLM's `cache_config_info`, SGLang's `page_size`) or,
/// for an engine that was down or reported none, what is configured for it (its
/// `kv_block_size`, else `router.kv_block_size`); a configured size the engine contradicts
/// is an error, and so are workers of different sizes. With nothing reported or
/// configured: 16.
pub fn resolve_block_size(
    registry: &Registry,
    reports: &HashMap<WorkerId, EngineReport>,
    configured: Option<usize>,
) -> Result<usize, BlockSizeError> {
    let mut sizes: Vec<(String, usize)> = Vec::new();
    for w in registry.all().iter() {
        let reported = reports.get(&w.id).and_then(|r| r.block_size);
        let (set, key) = match w.spec.kv_block_size {
            Some(b) => (Some(b), format!("workers.{}.kv_block_size", w.spec.name)),
            None => (configured, "router.kv_block_size".to_owned()),
        };
        if let (Some(engine), Some(configured)) = (reported, set) {
            if engine != configured {
                return Err(BlockSizeError::Disagrees {
                    worker: w.spec.name.clone(),
                    engine,
                    configured,
                    key,
                });
            }
        }
        if let Some(b) = reported.or(set) {
            sizes.push((w.spec.name.clone(), b));
        }
    }
    match sizes.first() {
        Some(&(_, first)) if sizes.iter().all(|(_, b)| *b == first) => Ok(first),
        Some(_) => Err(BlockSizeError::Mixed {
            sizes: sizes
                .iter()
                .map(|(name, b)| format!("{name}: {b}"))
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => {
            tracing::info!(
                block_size = DEFAULT_KV_BLOCK_SIZE,
                "no engine reported its KV block size and none is configured: hashing 16-token blocks (set router.kv_block_size)"
            );
            Ok(DEFAULT_KV_BLOCK_SIZE)
        }
    }
}

/// Subscribes to the KV events of `w`, a worker that joined at run time, into the local
/// index (with the Redis fan-out, a joined worker's blocks are approximate); the
/// subscriber stops when `cancel` fires or the worker is retired.
pub fn subscribe_joined(
    kv: &Arc<KvRouting>,
    w: &Arc<Worker>,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) {
    let Some(endpoint) = w.spec.kv_events.clone() else {
        return;
    };
    let stats: Arc<SubscriberStats> = Arc::default();
    kv.subscribers
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .push((w.id, stats.clone()));
    let sink: Arc<dyn EventSink> = kv.index.clone();
    let cfg = kv.subscriber_config(w, endpoint);
    let stop = cancel.child_token();
    let (retired, stopper) = (w.retired().clone(), stop.clone());
    tracker.spawn(async move {
        tokio::select! {
            () = retired.cancelled() => stopper.cancel(),
            () = stopper.cancelled() => {}
        }
    });
    tracker.spawn(supervise(
        cfg,
        stats,
        sink,
        stop,
        w.spec.name.clone(),
        tracker.clone(),
    ));
}

/// Starts one `/metrics` scraper per worker: its load, and the KV capacity its engine
/// reports.
pub fn spawn_scrapers(
    registry: &Arc<Registry>,
    client: &HttpClient,
    interval: Duration,
    timeout: Duration,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) {
    for w in registry.all().iter() {
        spawn_scraper(w, client, (interval, timeout), tracker, cancel);
    }
}

/// Starts `w`'s `/metrics` scraper (every `interval`, each within `timeout`); it stops when
/// `cancel` fires or the worker is retired.
pub fn spawn_scraper(
    w: &Arc<Worker>,
    client: &HttpClient,
    (interval, timeout): (Duration, Duration),
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) {
    let (w, client, cancel) = (w.clone(), client.clone(), cancel.clone());
    tracker.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = cancel.cancelled() => return,
                () = w.retired().cancelled() => return,
            }
            let text = match get_small(&client, &w.spec.base_url, "/metrics", timeout).await {
                Ok((status, body)) if status.is_success() => String::from_utf8(body.to_vec()).ok(),
                _ => None,
            };
            w.set_load(text.as_deref().and_then(|t| parse_load(t).ok()));
            // The capacity an engine reports changes only with a restart: a failed
            // scrape keeps the last one.
            if let Some(t) = &text {
                w.set_reported_kv_tokens(kv_capacity_tokens(t));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ownerserve_planner::ids::{EngineKind, Role};

    use super::*;
    use crate::config::WorkerSpec;

    #[tokio::test(flavor = "current_thread")]
    async fn the_tick_expires_in_batches_and_serves_other_tasks_between_them() {
        let index = SharedIndex::new(KvIndexConfig {
            block_size: 16,
            ..KvIndexConfig::default()
        });
        // Five 1,000-block prompts routed at 0 s with a 120 s TTL (a whole number of 7.5 s
        // grains): 5,000 entries due at 120 s, five batches.
        for c in 0..5u64 {
            let hashes: Vec<u64> = (1..=1_000).map(|i| c << 32 | i).collect();
            index.lock().insert_routed(WorkerId(0), &hashes, 0, 120_000);
        }
        assert_eq!(index.lock().len(), 5_000);
        // Another task on the same thread, as a request would be.
        let turns = Arc::new(AtomicUsize::new(0));
        let counted = turns.clone();
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let halt = stop.clone();
        tasks.spawn(async move {
            while !halt.is_cancelled() {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        });
        tick_index(&index, 119_999).await;
        assert_eq!(index.lock().len(), 5_000, "nothing is due before its TTL");
        tick_index(&index, 120_000).await;
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        assert!(index.lock().is_empty());
        assert!(
            turns.load(Ordering::Relaxed) >= 4,
            "the other task ran between the batches"
        );
    }

    #[test]
    fn a_down_workers_blocks_leave_the_index_once_and_it_is_forgotten_until_back() {
        let registry = Registry::new(vec![
            WorkerSpec::new("a", "http://127.0.0.1:1", Role::Hybrid, EngineKind::Sim),
            WorkerSpec::new("b", "http://127.0.0.1:2", Role::Hybrid, EngineKind::Sim),
        ]);
        let cfg = KvIndexConfig {
            block_size: 16,
            ..KvIndexConfig::default()
        };
        let kv = KvRouting::new(cfg, Duration::from_secs(60), &registry);
        let (a, b) = (registry.all()[0].clone(), registry.all()[1].clone());
        a.mark_healthy(vec!["m".into()]);
        b.mark_healthy(vec!["m".into()]);
        kv.record_routed(&a, &[1, 2, 3]);
        kv.record_routed(&b, &[1, 2]);
        let blocks = |w: &Worker| kv.index.lock().worker_blocks(w.id);
        let mut forgotten = HashSet::new();
        kv.forget_down_workers(&registry.all(), &mut forgotten);
        assert_eq!((blocks(&a), blocks(&b)), (3, 2));
        a.mark_down("killed");
        kv.forget_down_workers(&registry.all(), &mut forgotten);
        assert_eq!((blocks(&a), blocks(&b)), (0, 2));
        assert!(forgotten.contains(&a.id));
        a.mark_healthy(vec!["m".into()]);
        kv.forget_down_workers(&registry.all(), &mut forgotten);
        assert!(forgotten.is_empty());
        kv.record_routed(&a, &[1]);
        kv.forget_down_workers(&registry.all(), &mut forgotten);
        assert_eq!(blocks(&a), 1);
    }
}
