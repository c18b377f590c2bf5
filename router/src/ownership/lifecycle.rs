//! The KV lifecycle sweep (`[router.sessions] lifecycle`): for each session parked on a
//! tool call it takes, and every second revises, the planner's decision ([`ownerserve_planner::lifecycle::decide`])
//! from the owner's KV (capacity, usage, how fast new KV turns its LRU over) and the
//! session's gaps, then carries it out: touches that keep a session warm, a prefetch or
//! restore just before its predicted return, pins and unpins where the engine has them.
//! A touch, prefetch or restore is the same request on every engine here: the session's
//! last prompt as token ids, one token out, marked ahead of new prompts (the engine's
//! prefix cache serves what it still holds and computes or restores the rest).
//!
//! It reads the KV index to learn that a kept session was evicted anyway. Pure decisions,
//! thin IO: what to do and when comes from `planner::lifecycle` and [`Sessions`]; this
//! file only measures the churn and sends.
//!
//! [`Sessions`]: super::sessions::Sessions

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue};
use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::lifecycle::{
    decide, Churn, Effect, LifecycleWeights, OwnerKv, Parked, Prices, EVICTED_BELOW,
};
use ownerserve_shim::engines::protocol;

use super::session_life::Due;
use super::sessions::now_ms;
use crate::fleet::registry::Worker;
use crate::server::state::AppState;

/// How often the sweep runs.
const SWEEP_EVERY: Duration = Duration::from_millis(250);
/// Touches, prefetches and restores in flight at once, fleet-wide.
const MAX_IN_FLIGHT: usize = 16;
/// Each worker's churn.
#[derive(Default)]
struct Churns(HashMap<WorkerId, Churn>);

impl Churns {
    /// Samples every worker's computed tokens at `now_ms`.
    fn sample(&mut self, workers: &[Arc<Worker>], now_ms: u64) {
        for w in workers {
            let total = w.ledger().computed_total();
            self.0
                .entry(w.id)
                .or_default()
                .sample(total, now_ms as f64 / 1e3);
        }
    }

    fn of(&self, w: WorkerId) -> f64 {
        self.0.get(&w).map_or(0.0, |c| c.rate())
    }
}

/// Sweeps until `cancel` fires; its sends run on `tasks`.
pub async fn run(st: Arc<AppState>, tasks: TaskTracker, cancel: CancellationToken) {
    let sends = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let sweep = async {
        let mut churn = Churns::default();
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            let now = now_ms();
            let fleet = st.registry.all();
            churn.sample(&fleet, now);
            decide_parked(&st, &churn, now);
            note_evictions(&st);
            // Only as many as can be sent now are taken: the rest stay due.
            for (owner, session, due) in st.sessions.due(now, sends.available_permits()) {
                let (Some(worker), Ok(permit)) =
                    (st.registry.get(owner), sends.clone().try_acquire_owned())
                else {
                    continue;
                };
                let st = st.clone();
                tasks.spawn(async move {
                    let _permit = permit;
                    resend(&st, &worker, &session, due).await;
                });
            }
            for (_owner, _session, effect) in st.sessions.take_effects() {
                // Pins, unpins and explicit offloads: no engine here takes them (their
                // levers say so, and the decision never asks); counted if one is asked.
                st.metrics.lifecycle.acted(effect, "unsupported");
            }
        }
    };
    tokio::select! {
        () = cancel.cancelled() => {}
        () = sweep => {}
    }
}

/// Decides each newly parked session on its owner's KV now.
fn decide_parked(st: &AppState, churn: &Churns, now: u64) {
    for u in st.sessions.undecided(now) {
        let Some(worker) = st.registry.get(u.owner) else {
            continue;
        };
        let levers = protocol(worker.spec.engine).levers();
        let view = worker.view();
        let (Some(capacity), Some(load)) = (worker.kv_capacity_tokens(), view.load) else {
            // Nothing known of its KV: the LRU decides.
            continue;
        };
        let planner = &st.cfg.planner;
        let prices = Prices::of(
            planner.roofline_of(worker.id),
            planner.model_for(&u.model),
            u.tokens,
            planner.step_budget_of(worker.id).tokens,
            // No host tier the router drives on these engines (`Levers::host_tier`).
            0.0,
        );
        let kv = OwnerKv {
            levers,
            capacity_tokens: capacity,
            usage: load.kv_usage,
            churn_tokens_per_s: churn.of(worker.id),
            host_free_tokens: 0,
            kept_tokens: u.kept_tokens,
        };
        let parked = Parked {
            context_tokens: u.tokens,
            gap: u.gap,
            idle_s: u.idle_s,
            p_return: u.p_return,
            resident: u.resident,
        };
        let l = decide(&parked, &kv, &prices, &LifecycleWeights::default());
        // Counted when its course changes (a revision that keeps it is no new decision).
        if st.sessions.decide(&u.session, l, levers.retention, now) == Some(true) {
            st.metrics.lifecycle.decided(l.hold);
            tracing::debug!(session = %u.session, hold = l.hold.name(), costs = ?l.costs, "parked session decided");
        }
    }
}

/// Marks kept sessions whose prefix the KV index no longer finds on their owner.
fn note_evictions(st: &AppState) {
    for (owner, session, prompt) in st.sessions.resident() {
        let Some(worker) = st.registry.get(owner) else {
            continue;
        };
        if prompt.hashes.is_empty() {
            continue;
        }
        let mut v = [worker.view()];
        st.kv.fill_cached(&prompt.hashes, &mut v);
        let held = f64::from(v[0].cached_blocks) / prompt.hashes.len() as f64;
        if held < EVICTED_BELOW {
            st.sessions.evicted(&session);
        }
    }
}

/// Sends a touch, prefetch or restore: the session's prompt as token ids, one token out.
async fn resend(st: &AppState, worker: &Worker, session: &str, due: Due) {
    let body = serde_json::json!({
        "model": &*due.model,
        "prompt": due.prompt.tokenized.tokens,
        "max_tokens": 1,
        "temperature": 0,
    });
    let Ok(body) = serde_json::to_vec(&body) else {
        return;
    };
    let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
    if let Some(a) = &st.cfg.engine_authorization {
        headers.push((header::AUTHORIZATION, a.clone()));
    }
    // A restore is a returning interactive step's work.
    let rank = crate::proxy::admission::Class::Interactive.engine_rank(true);
    if let Some((name, value)) = protocol(worker.spec.engine).priority_header(rank) {
        headers.push((HeaderName::from_static(name), HeaderValue::from(value)));
    }
    let sent = st
        .engines
        .post(
            &worker.spec.base_url,
            "/v1/completions",
            &headers,
            Bytes::from(body),
        )
        .await;
    let ok = matches!(&sent, Ok(a) if a.0.is_success());
    st.metrics
        .lifecycle
        .acted(due.effect, if ok { "ok" } else { "failed" });
    if ok {
        st.kv.record_routed(worker, &due.prompt.hashes);
        if matches!(due.effect, Effect::Recompute | Effect::Restore) {
            st.sessions.brought_back(session);
        }
    } else {
        tracing::debug!(session, worker = %worker.spec.name, effect = ?due.effect, "lifecycle resend failed");
    }
}
