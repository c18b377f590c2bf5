//! The fleet as the router sees it, read at scrape time: each worker's health, drain,
//! in-flight requests and predicted KV blocks, the load and KV usage scraped from its
//! engine, its KV-event stream (batches, events, gaps, replays, restarts), and the KV
//! index (blocks per worker, distinct blocks, HBM duplicate factor).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use ownerserve_shim::kv_events::subscriber::SubscriberStats;

use crate::fleet::kv::{IndexMode, KvRouting};
use crate::fleet::registry::{Registry as Workers, RECEIPT_OUTCOMES};
use ownerserve_edge::exposition::{
    counter, counter_vec, gauge, gauge_vec, int_gauge, int_gauge_vec, sync_counter,
};

/// A counter read from a subscriber's stats.
type EventCounter = (
    &'static str,
    &'static str,
    fn(&SubscriberStats) -> &AtomicU64,
);

const EVENT_COUNTERS: [EventCounter; 7] = [
    (
        "ownerserve_kv_event_batches_total",
        "KV-event batches received from the worker's engine.",
        |s| &s.batches,
    ),
    (
        "ownerserve_kv_events_total",
        "KV events received from the worker's engine.",
        |s| &s.events,
    ),
    (
        "ownerserve_kv_event_gaps_total",
        "Sequence gaps detected in the worker's KV-event stream.",
        |s| &s.gaps,
    ),
    (
        "ownerserve_kv_event_malformed_total",
        "KV-event messages that could not be decoded.",
        |s| &s.malformed,
    ),
    (
        "ownerserve_kv_event_replayed_batches_total",
        "KV-event batches recovered through the engine's replay socket after a gap.",
        |s| &s.replayed_batches,
    ),
    (
        "ownerserve_kv_event_missing_history_total",
        "Gaps the replay socket could no longer fill (the worker's index was rebuilt).",
        |s| &s.missing_history,
    ),
    (
        "ownerserve_kv_engine_restarts_total",
        "Engine restarts detected in the worker's KV-event stream.",
        |s| &s.restarts,
    ),
];

/// The fleet's gauges and counters.
#[derive(Debug, Clone)]
pub struct FleetMetrics {
    healthy: IntGaugeVec,
    draining: IntGaugeVec,
    in_flight: IntGaugeVec,
    active_blocks: IntGaugeVec,
    running: GaugeVec,
    waiting: GaugeVec,
    kv_usage: GaugeVec,
    indexed_blocks: IntGaugeVec,
    index_mode: IntGaugeVec,
    receipts: IntCounterVec,
    promised: IntCounterVec,
    reported: IntCounterVec,
    index_blocks: IntGauge,
    index_gpu_blocks: IntGauge,
    duplicate_factor: Gauge,
    events: Vec<IntCounterVec>,
    index_changes: IntCounterVec,
    index_rejected: IntCounter,
}

impl FleetMetrics {
    /// Registers the fleet metrics.
    #[expect(
        clippy::too_many_lines,
        reason = "one registration per metric family, in exposition order"
    )]
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let per_worker = &["worker", "role"];
        let events = EVENT_COUNTERS
            .iter()
            .map(|(name, help, _)| counter_vec(registry, name, help, &["worker"]))
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(Self {
            healthy: int_gauge_vec(
                registry,
                "ownerserve_worker_healthy",
                "1 while the worker passes its health checks.",
                per_worker,
            )?,
            draining: int_gauge_vec(
                registry,
                "ownerserve_worker_draining",
                "1 while an operator drains the worker.",
                per_worker,
            )?,
            in_flight: int_gauge_vec(
                registry,
                "ownerserve_worker_in_flight_requests",
                "Requests the router has sent to the worker that have not finished.",
                per_worker,
            )?,
            active_blocks: int_gauge_vec(
                registry,
                "ownerserve_worker_active_kv_blocks",
                "KV blocks of the router's requests in flight at the worker (the router's prediction).",
                per_worker,
            )?,
            running: gauge_vec(
                registry,
                "ownerserve_worker_running_requests",
                "Requests running on the worker's engine, as last scraped from its /metrics.",
                per_worker,
            )?,
            waiting: gauge_vec(
                registry,
                "ownerserve_worker_waiting_requests",
                "Requests queued on the worker's engine, as last scraped from its /metrics.",
                per_worker,
            )?,
            kv_usage: gauge_vec(
                registry,
                "ownerserve_worker_kv_usage_ratio",
                "KV-cache usage of the worker's engine (0..1), as last scraped from its /metrics.",
                per_worker,
            )?,
            indexed_blocks: int_gauge_vec(
                registry,
                "ownerserve_kv_index_worker_blocks",
                "Blocks the router's KV index holds for the worker (any tier).",
                &["worker"],
            )?,
            index_mode: int_gauge_vec(
                registry,
                "ownerserve_kv_index_mode",
                "1 for the mode the router's index of the worker's cache is in (exact: events flowing; degraded: none yet, lost, refused or its receipts diverging; approximate: no event stream), 0 for the others.",
                &["worker", "mode"],
            )?,
            receipts: counter_vec(
                registry,
                "ownerserve_cache_receipts_total",
                "Answered steps by worker, its model and what the engine's cached_tokens said of the cache the router promised: kept (within a block), missed (less), surplus (more: the router did not see that cache), unreported (no usage in the answer), unchecked (a transfer leg, whose reuse the decode engine reports its own way, or a Responses follow-up, whose prompt the engine builds from its stored conversation).",
                &["worker", "model", "outcome"],
            )?,
            promised: counter_vec(
                registry,
                "ownerserve_cache_promised_tokens_total",
                "Prompt tokens the router predicted the worker would find cached, on steps whose answer reported cached_tokens, by worker and its model.",
                &["worker", "model"],
            )?,
            reported: counter_vec(
                registry,
                "ownerserve_cache_reported_tokens_total",
                "Prompt tokens the worker's engine reported cached (usage.prompt_tokens_details.cached_tokens) on those steps, by worker and its model.",
                &["worker", "model"],
            )?,
            index_blocks: int_gauge(
                registry,
                "ownerserve_kv_index_blocks",
                "Distinct blocks in the router's KV index (any tier).",
            )?,
            index_gpu_blocks: int_gauge(
                registry,
                "ownerserve_kv_index_gpu_blocks",
                "Distinct blocks of the router's KV index held in some worker's GPU memory.",
            )?,
            duplicate_factor: gauge(
                registry,
                "ownerserve_hbm_duplicate_factor",
                "GPU copies per distinct KV block across the fleet, from the KV index (1: no duplication; 0: empty).",
            )?,
            events,
            index_changes: counter_vec(
                registry,
                "ownerserve_kv_index_block_changes_total",
                "Blocks the KV index stored, removed, pruned (over its size cap) or expired (approximate entries).",
                &["change"],
            )?,
            index_rejected: counter(
                registry,
                "ownerserve_kv_index_events_rejected_total",
                "KV events the index refused (unknown parent, wrong block size).",
            )?,
        })
    }

    /// Reads the workers and the KV index into the metrics.
    pub fn refresh(&self, workers: &Workers, kv: &KvRouting) {
        let ix = kv.index.lock();
        for w in workers.all().iter() {
            let labels = [w.spec.name.as_str(), w.spec.role.as_str()];
            self.healthy
                .with_label_values(&labels)
                .set(i64::from(w.is_healthy()));
            self.draining
                .with_label_values(&labels)
                .set(i64::from(w.is_draining()));
            self.in_flight
                .with_label_values(&labels)
                .set(i64::from(w.in_flight()));
            self.active_blocks
                .with_label_values(&labels)
                .set(i64::try_from(w.active_blocks()).unwrap_or(i64::MAX));
            match w.load() {
                Some(load) => {
                    self.running.with_label_values(&labels).set(load.running);
                    self.waiting.with_label_values(&labels).set(load.waiting);
                    self.kv_usage.with_label_values(&labels).set(load.kv_usage);
                }
                // An unknown load is no sample, not a stale or zero one.
                None => {
                    for g in [&self.running, &self.waiting, &self.kv_usage] {
                        let _ = g.remove_label_values(&labels);
                    }
                }
            }
            self.indexed_blocks
                .with_label_values(&[&w.spec.name])
                .set(i64::try_from(ix.worker_blocks(w.id)).unwrap_or(i64::MAX));
            let counts = w.receipts();
            // The model its receipts are of: the base model it serves (adapters share its
            // cache).
            let models = w.models();
            let model = models
                .iter()
                .find(|m| m.parent.is_none())
                .or(models.first())
                .map_or("", |m| m.id.as_str());
            let who = [w.spec.name.as_str(), model];
            for (outcome, n) in RECEIPT_OUTCOMES.iter().zip(counts) {
                sync_counter(
                    &self.receipts.with_label_values(&[who[0], who[1], outcome]),
                    n,
                );
            }
            let n = RECEIPT_OUTCOMES.len();
            sync_counter(&self.promised.with_label_values(&who), counts[n]);
            sync_counter(&self.reported.with_label_values(&who), counts[n + 1]);
            let mode = kv.mode_of(w);
            for m in IndexMode::ALL {
                self.index_mode
                    .with_label_values(&[&w.spec.name, m.name()])
                    .set(i64::from(m == mode));
            }
        }
        let replication = ix.gpu_replication();
        self.index_gpu_blocks
            .set(i64::try_from(replication.blocks).unwrap_or(i64::MAX));
        self.index_blocks
            .set(i64::try_from(ix.len()).unwrap_or(i64::MAX));
        self.duplicate_factor.set(replication.duplicate_factor());
        let stats = ix.stats();
        drop(ix);
        for (change, total) in [
            ("stored", stats.blocks_stored),
            ("removed", stats.blocks_removed),
            ("pruned", stats.blocks_pruned),
            ("expired", stats.blocks_expired),
        ] {
            sync_counter(&self.index_changes.with_label_values(&[change]), total);
        }
        sync_counter(&self.index_rejected, stats.events_rejected);
        for (id, s) in kv.event_stats() {
            let Some(w) = workers.get(id) else { continue };
            for (vec, (_, _, read)) in self.events.iter().zip(EVENT_COUNTERS) {
                sync_counter(
                    &vec.with_label_values(&[&w.spec.name]),
                    read(&s).load(Ordering::Relaxed),
                );
            }
        }
    }
}
